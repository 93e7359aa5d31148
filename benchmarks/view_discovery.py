"""`uqh view`'s live discovery, both ways (``follow="watch"``: watchfiles/inotify; ``follow="poll"``: a scan every
2 s): the CPU it costs while nothing changes on a tree of many runs, the CPU it costs while a run writes, and the
time until a new run is listed by ``/api/runs`` (and a deleted one leaves).

Workload: ``--runs`` run directories (a manifest, a 1-episode episodes file, a sidecar, an empty checkpoints
folder) under ``--depth`` levels of folders. For each method, in this process, on a viewer in a thread:

- **idle CPU** -- CPU seconds of this process over ``--idle`` seconds with nothing changing, per second;
- **busy CPU** -- the same while one run appends a line and rewrites a checkpoint every 20 ms (a fast writer);
- **latency** -- from the moment a new run's manifest is written to the moment ``/api/runs`` lists it (polled
  every 20 ms), and the same for a deletion; best and worst of ``--repeat``.

Usage (from the repository root): PYTHONPATH=. .venv/bin/python benchmarks/view_discovery.py [--runs 1000]
[--idle 20] [--repeat 5]. Writes benchmarks/results/view_discovery.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from uqh.reports.view.follow import POLL_SECONDS, watchfiles_installed
from uqh.reports.view.server import ViewServer
from view import machine_line, write_lines  # beside this file: the view benchmarks' results footer
from uqh.rundir.schema import CHECKPOINT_DIR, EPISODES_FILE, MANIFEST_FILE, SIDECAR_FILE, DecodingConfig, Manifest, RunConfig


def manifest_text() -> str:
    config = RunConfig(domain="synthetic", task_ids=["t"], model="openai/synthetic", decoding=DecodingConfig(),
                       step_budget=4, prompt_sha256="0" * 64, package_version="0")
    return Manifest(config=config, config_hash=config.config_hash(), created_at="2026-01-01T00:00:00Z",
                    system_prompt="synthetic").model_dump_json()


def make_run(path: Path, manifest: str) -> None:
    (path / CHECKPOINT_DIR).mkdir(parents=True)
    (path / EPISODES_FILE).write_text("")
    (path / SIDECAR_FILE).write_text("")
    (path / MANIFEST_FILE).write_text(manifest)


def make_tree(root: Path, runs: int, depth: int, manifest: str) -> None:
    for i in range(runs):
        folder = root.joinpath(*[f"g{(i // 10 ** (k + 1)) % 10}" for k in range(depth)])
        make_run(folder / f"run{i:05d}", manifest)


def listed(url: str) -> set[str]:
    with urllib.request.urlopen(url + "api/runs", timeout=60) as r:
        return {row["path"] for row in json.loads(r.read())["runs"]}


def cpu_per_second(seconds: float, during=None) -> float:
    start_cpu, start = time.process_time(), time.perf_counter()
    stop = threading.Event()
    worker = threading.Thread(target=during, args=(stop,), daemon=True) if during else None
    if worker:
        worker.start()
    time.sleep(seconds)
    stop.set()
    if worker:
        worker.join()
    return (time.process_time() - start_cpu) / (time.perf_counter() - start)


def writer(run_dir: Path):
    """A fast writer: an episode line appended and a checkpoint rewritten (temp + rename) every 20 ms."""
    def write(stop: threading.Event) -> None:
        k = 0
        while not stop.is_set():
            with open(run_dir / EPISODES_FILE, "a") as f:
                f.write('{"schema_version":1,"episode_id":"x%d#0"}\n' % k)
            tmp = run_dir / CHECKPOINT_DIR / "x.json.tmp"
            tmp.write_text("{}")
            os.replace(tmp, run_dir / CHECKPOINT_DIR / "x.json")
            k += 1
            time.sleep(0.02)
    return write


def wait_listed(url: str, path: Path, present: bool, timeout: float = 60) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if (str(path) in listed(url)) == present:
            return time.perf_counter() - start
        time.sleep(0.02)
    raise RuntimeError(f"{path} not {'listed' if present else 'gone'} after {timeout} s")


def measure(root: Path, method: str, args: argparse.Namespace, manifest: str) -> dict[str, float]:
    srv = ViewServer([root], port=0, follow=method)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    srv.ready.wait(60)
    try:
        time.sleep(2)  # the watch or the first poll is set up
        assert srv.viewer.follow_method == method, srv.viewer.follow_method
        out = {"idle_cpu": cpu_per_second(args.idle)}
        out["busy_cpu"] = cpu_per_second(args.idle, writer(next(iter(srv.viewer.runs.values())).path))
        appear, leave = [], []
        for k in range(args.repeat):
            new = (root / "fresh" / f"{method}{k}").resolve()
            make_run(new, manifest)  # the manifest last, as `uqh run` writes it
            appear.append(wait_listed(srv.url, new, True))
            shutil.rmtree(new)
            leave.append(wait_listed(srv.url, new, False))
        out.update(appear_best=min(appear), appear_worst=max(appear), leave_best=min(leave), leave_worst=max(leave))
        return out
    finally:
        srv.stop()
        thread.join(10)


def write_results(path: Path, args: argparse.Namespace, results: dict[str, dict[str, float]]) -> str:
    lines = ["# `uqh view`: live discovery, watched and polled (benchmarks/view_discovery.py)", "",
             f"A tree of {args.runs:,} run directories, {args.depth} folder levels deep. CPU is this process's CPU "
             f"seconds per second over {args.idle:.0f} s: idle (nothing changes) and busy (one run appends a line and "
             "rewrites a checkpoint every 20 ms). Latency: from writing a new run's manifest (or deleting it) until "
             f"`/api/runs` lists it (or no longer does), polled every 20 ms, best / worst of {args.repeat}. Polling "
             f"scans every {POLL_SECONDS:.0f} s.", "",
             "| method | idle CPU (s/s) | busy CPU (s/s) | new run listed after (s) | deleted run gone after (s) |",
             "|---|---|---|---|---|"]
    for method, r in results.items():
        lines.append(f"| {method} | {r['idle_cpu']:.4f} | {r['busy_cpu']:.4f} | {r['appear_best']:.2f} / "
                     f"{r['appear_worst']:.2f} | {r['leave_best']:.2f} / {r['leave_worst']:.2f} |")
    lines += ["", machine_line(), ""]
    return write_lines(path, lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--idle", type=float, default=20.0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path,
                   default=Path(__file__).resolve().parent / "results" / "view_discovery.md")
    args = p.parse_args()
    methods = ["watch", "poll"] if watchfiles_installed() else ["poll"]
    manifest = manifest_text()
    results = {}
    with tempfile.TemporaryDirectory(prefix="uqh-view-discovery-") as tmp:
        root = Path(tmp) / "runs"
        make_tree(root, args.runs, args.depth, manifest)
        for method in methods:
            results[method] = measure(root, method, args, manifest)
            print(method, results[method], file=sys.stderr)
    print(write_results(args.out, args, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
