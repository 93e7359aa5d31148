"""`uqh view` on a large run: time to first byte of each page and a full trajectory page, against reading the
episode straight from disk, in the same process on the same run.

Workload (issue 32): a synthetic run of 10,000 episodes x 20 steps, each step with one sidecar row of
``--tokens`` tokens and their top-5 alternatives, generated in a temporary directory (one Episode and one
LogprobRow built with the schema, copied with new ids: every line is a valid record).

Measured (best of ``--repeat``, wall and CPU seconds; the viewer in a thread of this process, requests through
HTTP on 127.0.0.1):

- **baseline** -- one episode "straight from disk" without an index: read episodes.jsonl until its line, parse it,
  then scan the whole sidecar for its rows and parse those (what every trajectory request would cost without the
  index); with ``--full-read`` also the full-run read the report does (RunDir.episodes + RunDir.sidecar);
- **cold** -- the first trajectory request, and the first trajectory-list chunk, of a just-started viewer (the
  line indexes of both files built), each on a fresh viewer;
- **first byte** of the run list page, the run list JSON, the run page, the trajectory page (HTML shell);
- **full trajectory page (warm)** -- the HTML shell plus its JSON (episode, every predictor, transcript, tokens),
  for episodes spread over the run.

Usage (from the repository root): PYTHONPATH=. .venv/bin/python benchmarks/view.py [--episodes 10000] [--steps 20]
[--tokens 12] [--repeat 3] [--full-read]
Writes benchmarks/results/view.md.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from uqh.rundir.reader import RunDir, line_episode_id
from uqh.rundir.schema import (
    EPISODES_FILE,
    MANIFEST_FILE,
    SIDECAR_FILE,
    Attempt,
    CallRecord,
    DecodingConfig,
    Episode,
    LogprobRow,
    Manifest,
    RunConfig,
    Step,
    StopReason,
    TokenLogprob,
    TopLogprob,
)

from uqh.reports.view.server import ViewServer

PLACEHOLDER = "EPISODE-PLACEHOLDER"


def template_lines(steps: int, tokens: int) -> tuple[str, list[str]]:
    """One episode line and its sidecar lines, with PLACEHOLDER where the episode id goes."""
    call = CallRecord(model="openai/synthetic", has_logprobs=True, cost_usd=0.0001)
    step_list = [Step(t=t, think=f"thinking about step {t} " * 4, action=f"search[query number {t}]",
                      verbal_confidence=round(0.3 + 0.6 * ((t * 7) % 10) / 10, 2), confidence_raw="0.5",
                      explanation="because the observation said so", observation=f"observation {t} " * 20,
                      attempts=[Attempt(attempt=0, raw_text="<think>..</think><action>..</action>" * 3, call=call)])
                 for t in range(1, steps + 1)]
    ep = Episode(episode_id=PLACEHOLDER, task_id=PLACEHOLDER, stop_reason=StopReason.max_steps, n_steps=steps,
                 step_budget=steps, task_prompt="Find the item that matches the description. " * 8, steps=step_list)
    rows = []
    for t in range(1, steps + 1):
        toks = [TokenLogprob(token=f"tok{i}", logprob=math.log(0.5 + 0.4 * ((i + t) % 5) / 5),
                             top_logprobs=[TopLogprob(token=f"alt{i}{j}", logprob=math.log(0.5 / (j + 1)))
                                           for j in range(5)]) for i in range(tokens)]
        rows.append(LogprobRow(episode_id=PLACEHOLDER, t=t, attempt=0, accepted=True, tokens=toks,
                               action_token_range=(2, min(tokens, 6))).model_dump_json())
    return ep.model_dump_json(), rows


def make_run(run_dir: Path, n: int, steps: int, tokens: int) -> list[str]:
    run_dir.mkdir(parents=True)
    ids = [f"task-{i:05d}#0" for i in range(n)]
    config = RunConfig(domain="synthetic", task_ids=[i.split("#")[0] for i in ids], model="openai/synthetic",
                       decoding=DecodingConfig(), step_budget=steps, prompt_sha256="0" * 64, package_version="0")
    manifest = Manifest(config=config, config_hash=config.config_hash(), created_at="2026-01-01T00:00:00Z",
                        system_prompt="synthetic")
    (run_dir / MANIFEST_FILE).write_text(manifest.model_dump_json())
    ep_line, row_lines = template_lines(steps, tokens)
    with open(run_dir / EPISODES_FILE, "w") as eps, open(run_dir / SIDECAR_FILE, "w") as side:
        for i, eid in enumerate(ids):
            line = ep_line.replace(PLACEHOLDER + "\"", eid + "\"", 1).replace(PLACEHOLDER, eid.split("#")[0], 1)
            if i % 3 == 0:  # a third succeed, a third fail, a third censored
                line = line.replace('"stop_reason":"max_steps","outcome":null', '"stop_reason":"clean","outcome":1')
            elif i % 3 == 1:
                line = line.replace('"stop_reason":"max_steps","outcome":null', '"stop_reason":"clean","outcome":0')
            eps.write(line + "\n")
            side.write("".join(r.replace(PLACEHOLDER, eid) + "\n" for r in row_lines))
    return ids


def straight_from_disk(run_dir: Path, episode_id: str) -> tuple[Episode, list[LogprobRow]]:
    """The baseline: the episode's line found by reading the file, and its rows by scanning the sidecar."""
    episode = None
    with open(run_dir / EPISODES_FILE, "rb") as f:
        for line in f:
            if line_episode_id(line) == episode_id:
                episode = Episode.model_validate_json(line)
                break
    rows = []
    with open(run_dir / SIDECAR_FILE, "rb") as f:
        for line in f:
            if line_episode_id(line) == episode_id:
                rows.append(LogprobRow.model_validate_json(line))
    return episode, rows


def first_byte(url: str) -> float:
    """Seconds until the response's status line and headers arrived."""
    host, _, rest = url.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host, timeout=600)
    start = time.perf_counter()
    conn.request("GET", "/" + rest)
    resp = conn.getresponse()
    elapsed = time.perf_counter() - start
    assert resp.status == 200, (url, resp.status, resp.read()[:300])
    resp.read()
    conn.close()
    return elapsed


def full(url: str) -> float:
    """Seconds until the whole response body arrived."""
    host, _, rest = url.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host, timeout=600)
    start = time.perf_counter()
    conn.request("GET", "/" + rest)
    resp = conn.getresponse()
    body = resp.read()
    elapsed = time.perf_counter() - start
    assert resp.status == 200 and body, (url, resp.status)
    conn.close()
    return elapsed


def best(fn, repeat: int) -> float:
    """The least of ``repeat`` values of ``fn()`` (each a duration in seconds)."""
    return min(fn() for _ in range(repeat))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cpu_timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: every thread, the viewer's included) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


@contextlib.contextmanager
def viewer(root: Path):
    """A just-started viewer over ``root`` (nothing indexed yet) in a thread of this process."""
    srv = ViewServer([root], port=0, follow="poll")
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    srv.ready.wait(60)
    try:
        yield srv.url
    finally:
        srv.stop()
        thread.join(10)


def best_pair(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """The least wall time and the least CPU time of several (wall, CPU) measurements."""
    return min(p[0] for p in pairs), min(p[1] for p in pairs)


def measure(root: Path, run_dir: Path, ids: list[str], repeat: int, full_read: bool) -> dict[str, Any]:
    """Every quantity as (wall seconds, CPU seconds or None), best of ``repeat``. Cold quantities are measured on a
    fresh viewer each time (the files are in the page cache for the baseline and the viewer alike)."""
    probe = [ids[len(ids) // 2], ids[-1], ids[len(ids) // 7]]
    q = lambda eid: eid.replace("#", "%23")  # noqa: E731
    out: dict[str, tuple] = {}
    if full_read:
        def read_all():
            reader = RunDir.open(run_dir)
            assert len(reader.episodes()) == len(ids) and sum(1 for _ in reader.sidecar()) > 0
        out["baseline_full_read"] = cpu_timed(read_all)
    baseline, cold_page, cold_chunk = [], [], []
    for _ in range(repeat):  # interleaved, so that each round's baseline and cold pages meet the same load
        baseline.append(cpu_timed(lambda: straight_from_disk(run_dir, probe[0])))
        with viewer(root) as base:
            cold_page.append(cpu_timed(lambda: full(base + f"api/run/0/trajectory?id={q(probe[0])}")))
        with viewer(root) as base:
            cold_chunk.append(cpu_timed(lambda: full(base + "api/run/0/trajectories?since=0")))
    out["baseline_one_episode"] = best_pair(baseline)
    out["cold_trajectory_json"] = best_pair(cold_page)
    out["cold_first_trajectory_chunk"] = best_pair(cold_chunk)
    out["paired"] = {name: sorted(c[0] / b[0] for c, b in zip(cold, baseline))
                     for name, cold in (("page", cold_page), ("chunk", cold_chunk))}
    with viewer(root) as base:
        full(base + f"api/run/0/trajectory?id={q(probe[0])}")  # warms the indexes
        out["ttfb_run_list_page"] = (best(lambda: first_byte(base), repeat), None)
        out["ttfb_run_list_json"] = (best(lambda: first_byte(base + "api/runs"), repeat), None)
        out["ttfb_run_page"] = (best(lambda: first_byte(base + "run/0"), repeat), None)
        out["ttfb_trajectory_page"] = (best(lambda: first_byte(base + f"run/0/trajectory?id={q(probe[1])}"),
                                            repeat), None)

        def page() -> float:
            return sum(full(base + f"run/0/trajectory?id={q(e)}") + full(base + f"api/run/0/trajectory?id={q(e)}")
                       for e in probe) / len(probe)

        out["full_trajectory_page_warm"] = (best(page, repeat), None)
    return out


def write_results(path: Path, args: argparse.Namespace, sizes: dict[str, int], r: dict[str, Any]) -> str:
    rows = [
        ("baseline: one episode straight from disk (find its line, scan the sidecar, parse)", "baseline_one_episode"),
        ("viewer, cold: first trajectory JSON of a just-started viewer (indexes both files)", "cold_trajectory_json"),
        ("viewer, cold: first trajectory-list chunk of a just-started viewer (200 summaries)",
         "cold_first_trajectory_chunk"),
        ("first byte: run list page", "ttfb_run_list_page"),
        ("first byte: run list JSON (manifest + line-index counts)", "ttfb_run_list_json"),
        ("first byte: run page", "ttfb_run_page"),
        ("first byte: trajectory page", "ttfb_trajectory_page"),
        ("full trajectory page, warm (HTML + its JSON; mean of 3 episodes)", "full_trajectory_page_warm"),
    ]
    if "baseline_full_read" in r:
        rows.insert(1, ("baseline: whole run read as the report reads it (every record parsed)", "baseline_full_read"))
    base_wall, base_cpu = r["baseline_one_episode"]
    lines = [
        "# `uqh view` on a large run (benchmarks/view.py)", "",
        f"Workload: a synthetic run of {args.episodes:,} episodes x {args.steps} steps, one sidecar row per step with "
        f"{args.tokens} tokens and their top-5 alternatives (episodes.jsonl {sizes['episodes'] / 1e6:.0f} MB, "
        f"logprobs.jsonl {sizes['sidecar'] / 1e6:.0f} MB). Best of {args.repeat} (cold ones: {args.repeat} "
        "just-started viewers); the viewer in a thread of the same process, requests over HTTP on 127.0.0.1, the "
        "files in the page cache for the baseline and the viewer alike. CPU: this process's CPU seconds (all "
        "threads), the fairer measure on a loaded machine.", "",
        "| quantity | seconds | / baseline | CPU seconds | / baseline CPU |", "|---|---|---|---|---|",
    ]
    for name, key in rows:
        wall, cpu = r[key]
        cpu_cells = f"{cpu:.4f} | {cpu / base_cpu:.3g}" if cpu is not None else "— | —"
        lines.append(f"| {name} | {wall:.4f} | {wall / base_wall:.3g} | {cpu_cells} |")
    cold = r["cold_trajectory_json"]
    paired = ", ".join(f"{x:.2f}" for x in r["paired"]["page"])
    chunk = ", ".join(f"{x:.2f}" for x in r["paired"]["chunk"])
    lines += ["", f"Cold trajectory page against reading the episode from disk: {cold[0] / base_wall:.2f}x the time "
              f"({cold[1] / base_cpu:.2f}x the CPU); in each round (baseline, then the cold page, then the cold "
              f"chunk, one after the other): {paired} (cold first chunk: {chunk}). Warm trajectory page: "
              f"{base_wall / r['full_trajectory_page_warm'][0]:.0f}x faster than reading the episode from disk.", "",
              machine_line(), ""]
    return write_lines(path, lines)


def machine_line() -> str:
    """The results file's last line: what the figures were measured on (the view benchmarks share it)."""
    return (f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, load average at the end "
            f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (shared with other jobs), Python "
            f"{platform.python_version()}.")


def write_lines(path: Path, lines: list[str]) -> str:
    text = "\n".join(lines)
    path.write_text(text)
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--full-read", action="store_true", help="also time reading the whole run (minutes at 10,000)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "view.md")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="uqh-view-bench-") as tmp:
        root = Path(tmp) / "runs"
        run_dir = root / "big"
        start = time.perf_counter()
        ids = make_run(run_dir, args.episodes, args.steps, args.tokens)
        print(f"generated in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        sizes = {"episodes": (run_dir / EPISODES_FILE).stat().st_size, "sidecar": (run_dir / SIDECAR_FILE).stat().st_size}
        results = measure(root, run_dir, ids, args.repeat, args.full_read)
        print(write_results(args.out, args, sizes, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
