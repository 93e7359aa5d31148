"""`uqh view` on a large run: time to first byte of each page and a full trajectory page, against reading the
episode straight from disk, in the same process on the same run.

Workload (issue 32): a synthetic run of 10,000 episodes x 20 steps, each step with one sidecar row of
``--tokens`` tokens and their top-5 alternatives, generated in a temporary directory (one Episode and one
LogprobRow built with the schema, copied with new ids: every line is a valid record).

Measured (best of ``--repeat``; the viewer in a thread of this process, requests through HTTP on 127.0.0.1):

- **baseline** -- one episode "straight from disk" without an index: read episodes.jsonl until its line, parse it,
  then scan the whole sidecar for its rows and parse those (what every trajectory request would cost without the
  index); with ``--full-read`` also the full-run read the report does (RunDir.episodes + RunDir.sidecar);
- **cold** -- the first trajectory request of a just-started viewer (the line indexes of both files built);
- **first byte** of the run list page, the run list JSON, the run page, the trajectory page (HTML shell);
- **full trajectory page (warm)** -- the HTML shell plus its JSON (episode, every predictor, transcript, tokens),
  for episodes spread over the run.

Usage (from the repository root): PYTHONPATH=. .venv/bin/python benchmarks/view.py [--episodes 10000] [--steps 20]
[--tokens 12] [--repeat 3] [--full-read]
Writes benchmarks/results/view.md.
"""
from __future__ import annotations

import argparse
import http.client
import math
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def measure(root: Path, run_dir: Path, ids: list[str], repeat: int, full_read: bool) -> dict[str, float]:
    probe = [ids[len(ids) // 2], ids[-1], ids[len(ids) // 7]]
    out = {"baseline_one_episode": best(lambda: timed(lambda: straight_from_disk(run_dir, probe[0])), repeat)}
    if full_read:
        start = time.perf_counter()
        reader = RunDir.open(run_dir)
        n_eps, n_rows = len(reader.episodes()), sum(1 for _ in reader.sidecar())
        out["baseline_full_read"] = time.perf_counter() - start
        assert n_eps == len(ids) and n_rows > 0
    srv = ViewServer([root], port=0)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    srv.ready.wait(60)
    try:
        base = srv.url
        q = lambda eid: eid.replace("#", "%23")  # noqa: E731
        out["cold_trajectory_json"] = full(base + f"api/run/0/trajectory?id={q(probe[0])}")
        out["ttfb_run_list_page"] = best(lambda: first_byte(base), repeat)
        out["ttfb_run_list_json"] = best(lambda: first_byte(base + "api/runs"), repeat)
        out["ttfb_run_page"] = best(lambda: first_byte(base + "run/0"), repeat)
        out["ttfb_trajectory_page"] = best(lambda: first_byte(base + f"run/0/trajectory?id={q(probe[1])}"), repeat)
        out["ttfb_first_trajectory_chunk"] = first_byte(base + "api/run/0/trajectories?since=0")

        def page() -> float:
            return sum(full(base + f"run/0/trajectory?id={q(e)}") + full(base + f"api/run/0/trajectory?id={q(e)}")
                       for e in probe) / len(probe)

        out["full_trajectory_page_warm"] = best(page, repeat)
    finally:
        srv.stop()
        thread.join(10)
    return out


def write_results(path: Path, args: argparse.Namespace, sizes: dict[str, int], r: dict[str, float]) -> str:
    rows = [
        ("baseline: one episode straight from disk (find its line, scan the sidecar, parse)", r["baseline_one_episode"]),
        ("viewer, cold: first trajectory JSON (builds both line indexes)", r["cold_trajectory_json"]),
        ("first byte: run list page", r["ttfb_run_list_page"]),
        ("first byte: run list JSON (manifest + line-index counts)", r["ttfb_run_list_json"]),
        ("first byte: run page", r["ttfb_run_page"]),
        ("first byte: trajectory page", r["ttfb_trajectory_page"]),
        ("first byte: first trajectory-list chunk (200 summaries)", r["ttfb_first_trajectory_chunk"]),
        ("full trajectory page, warm (HTML + its JSON; mean of 3 episodes)", r["full_trajectory_page_warm"]),
    ]
    base = r["baseline_one_episode"]
    lines = [
        "# `uqh view` on a large run (benchmarks/view.py)", "",
        f"Workload: a synthetic run of {args.episodes:,} episodes x {args.steps} steps, one sidecar row per step with "
        f"{args.tokens} tokens and their top-5 alternatives (episodes.jsonl {sizes['episodes'] / 1e6:.0f} MB, "
        f"logprobs.jsonl {sizes['sidecar'] / 1e6:.0f} MB). Best of {args.repeat} unless said; the viewer in a thread of "
        "the same process, requests over HTTP on 127.0.0.1.", "",
        "| quantity | seconds | / baseline (one episode from disk) |", "|---|---|---|",
    ]
    if "baseline_full_read" in r:
        rows.insert(1, ("baseline: whole run read as the report reads it (every record parsed)", r["baseline_full_read"]))
    lines += [f"| {name} | {sec:.4f} | {sec / base:.3g} |" for name, sec in rows]
    lines += ["", f"Speed-up of a warm trajectory page over reading the episode straight from disk: "
              f"{base / r['full_trajectory_page_warm']:.0f}x.", "",
              f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, load average at the end "
              f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (shared with other jobs), Python "
              f"{platform.python_version()}.", ""]
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
