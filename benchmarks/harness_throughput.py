"""Model-call throughput of the harness against a fake OpenAI-compatible server with fixed latency.

    .venv/bin/python benchmarks/harness_throughput.py [--latency 0.2] [--levels 1,8,32,64,128] [--rounds 6]
        [--workers 2] [--out benchmarks/results/harness_throughput.md]

The fake server (tests/fake_openai_server.py) runs in a separate process and answers every request after
``latency`` seconds with the same four-tag step (top-5 logprobs included), so with C requests in flight the best
possible rate is C / L calls/s (the "bound"). For each concurrency C it measures, in this one process:

- ``bare litellm``: ``litellm.acompletion`` with logprobs, the baseline everybody starts from;
- ``client (litellm)``: :func:`harness.model_client.make_model_client` forced onto its litellm path;
- ``client (direct)``: the same client on its direct ``openai`` path (the default for OpenAI-compatible URLs);
- ``harness``: the full batch runner (:func:`harness.runner.run_batch`, ``arithmetic`` domain, every step
  parsed, stepped and checkpointed, episodes + sidecar written with fsync) on the direct path;
- ``harness --no-checkpoints``: the same without the per-step checkpoint files (shows what they cost);
- ``harness --workers N``: the harness spread over N worker processes.

Reported per row: calls/s, that as a fraction of the bound, and CPU milliseconds per call of this process
(``time.process_time``; plus finished children's CPU for worker runs). "harness extra CPU" is the harness's CPU
per call minus its client's own. Request counts are bounded (``rounds`` x C calls per cell) so the default run
takes a few minutes. Results depend on the machine's load: they are measured, not asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import harness  # noqa: E402,F401 - sets the litellm env before litellm is imported

STEP_TEXT = (
    "<think>Compute it.</think>\n<action>Calc[2+3]</action>\n<confidence>0.7</confidence>\n"
    "<explanation>Simple sum.</explanation>"
)
MESSAGES = [
    {"role": "system", "content": "Answer with four tags."},
    {"role": "user", "content": "Question: What is (2 + 3) * 4?"},
]


@dataclass
class Cell:
    mode: str
    concurrency: int
    calls: int
    wall_s: float
    cpu_s: float

    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.calls > 0

    @property
    def rate(self) -> float:
        return self.calls / self.wall_s if self.ok else float("nan")

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu_s / self.calls if self.ok else float("nan")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class ServerProcess:
    def __init__(self, latency: float):
        self.latency = latency
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> "ServerProcess":
        script = ROOT / "tests" / "fake_openai_server.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), "--port", "0", "--latency", str(self.latency), "--text", STEP_TEXT],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            raise RuntimeError(f"fake server did not start: {line!r}")
        self.base_url = line.split(" ", 1)[1]
        return self

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)


# ------------------------------------------------------------------------------------- call drivers


async def _drive(call, concurrency: int, n_calls: int) -> float:
    """Run n_calls through ``call()`` with exactly ``concurrency`` in flight; return wall seconds."""
    remaining = n_calls

    async def worker():
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await call()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


def bench_bare_litellm(base_url: str, concurrency: int, n_calls: int) -> Cell:
    import litellm

    litellm.suppress_debug_info = True

    async def call():
        await litellm.acompletion(
            model="openai/fake", api_base=base_url, api_key="sk-x", messages=MESSAGES, logprobs=True, top_logprobs=5,
            temperature=0.2, top_p=1.0, seed=42, max_tokens=512, timeout=60,
        )

    async def main():
        await _drive(call, min(concurrency, 4), min(8, n_calls))  # warm-up: imports, connection pool
        c0 = time.process_time()
        wall = await _drive(call, concurrency, n_calls)
        return wall, time.process_time() - c0

    wall, cpu = asyncio.run(main())
    return Cell("bare litellm", concurrency, n_calls, wall, cpu)


def bench_client(base_url: str, concurrency: int, n_calls: int, *, direct: bool) -> Cell:
    from harness.model_client import make_model_client
    from harness.schema import DecodingConfig

    async def main():
        client = make_model_client("openai/fake", api_base=base_url, decoding=DecodingConfig(), timeout_s=60, direct=direct)

        async def call():
            c = await client.complete(MESSAGES, seed=42)
            assert c.tokens is not None

        await _drive(call, min(concurrency, 4), min(8, n_calls))
        c0 = time.process_time()
        wall = await _drive(call, concurrency, n_calls)
        cpu = time.process_time() - c0
        await client.aclose()
        return wall, cpu

    wall, cpu = asyncio.run(main())
    return Cell(f"client ({'direct' if direct else 'litellm'})", concurrency, n_calls, wall, cpu)


def bench_harness(
    base_url: str, concurrency: int, n_calls: int, *, workers: int, step_budget: int = 3, checkpoints: bool = True
) -> Cell:
    from domains import get_domain_class
    from harness.runner import prompt_sha256, run_batch
    from harness.schema import DecodingConfig, RunConfig, read_episodes

    domain = get_domain_class("arithmetic")({}, observation_chars=420)
    # Whole waves of C episodes (every step of every episode is one call), so the C/L bound is reachable.
    n_episodes = concurrency * max(1, round(n_calls / (concurrency * step_budget)))
    config = RunConfig(
        domain="arithmetic",
        task_ids=domain.all_task_ids()[:n_episodes],
        model="openai/fake",
        api_base=base_url,
        decoding=DecodingConfig(),
        step_budget=step_budget,
        prompt_sha256=prompt_sha256(domain.system_prompt()),
        package_version=harness.__version__,
    )
    with tempfile.TemporaryDirectory(prefix="uqh-bench-") as tmp:
        c0, k0 = time.process_time(), _children_cpu()
        t0 = time.perf_counter()
        summary = run_batch(
            config, Path(tmp) / "run", concurrency=concurrency, workers=workers, progress=False, checkpoints=checkpoints
        )
        wall = time.perf_counter() - t0
        # Worker processes are forked by a fork server (not our children): they report their own CPU.
        cpu = time.process_time() - c0 + (summary.worker_cpu_s or (_children_cpu() - k0))
        episodes = read_episodes(Path(tmp) / "run")
    calls = sum(len(s.attempts) for e in episodes for s in e.steps) + sum(len(e.failed_step or []) for e in episodes)
    if summary.stats.infra_errors:
        print(f"  warning: {summary.stats.infra_errors} infrastructure errors: {dict(summary.stats.error_messages)}",
              file=sys.stderr)
    mode = "harness" if workers == 1 else f"harness --workers {workers}"
    if not checkpoints:
        mode += " --no-checkpoints"
    return Cell(mode, concurrency, calls, wall, cpu)


# ------------------------------------------------------------------------------------- report


def render(
    cells: list[Cell], latency: float, levels: list[int], rounds: int, harness_scale: int, load: tuple[float, float]
) -> str:
    modes = list(dict.fromkeys(c.mode for c in cells))
    by = {(c.mode, c.concurrency): c for c in cells}
    lines = [
        "# Harness throughput",
        "",
        f"Fake OpenAI-compatible server in a separate process, latency {latency * 1000:.0f} ms, "
        f"{len(__import__('fake_openai_server').tokenize(STEP_TEXT))}-token four-tag response with top-5 logprobs; "
        f"{rounds} x C calls per cell (harness: waves of C episodes of 3 steps, arithmetic domain; "
        f"harness rows x{harness_scale} calls to amortise start-up). "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"1-min load average {load[0]:.1f} at start, {load[1]:.1f} at end (other work on the machine lowers "
        f"every rate; compare rows measured in the same run). "
        f"Worker rows include starting the processes (forked from a fork server that preloaded the harness; the "
        f"first worker cell of the run also pays the fork server's own start and imports); CPU of worker rows is "
        f"parent + workers (each worker reports its own CPU); "
        f"each of N workers runs ceil(C/N) >= 1 episodes at a time, so below C = N the effective concurrency is N.",
        "",
        "Calls/s (fraction of the C/L bound):",
        "",
        "| mode | " + " | ".join(f"C={c}" for c in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    for m in modes:
        row = []
        for c in levels:
            cell = by.get((m, c))
            row.append(("failed" if not cell.ok else f"{cell.rate:.0f} ({cell.rate / (c / latency):.0%})") if cell else "-")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    lines += ["", "CPU ms per call in this process (worker runs: parent + workers):", ""]
    lines += ["| mode | " + " | ".join(f"C={c}" for c in levels) + " |", "|---|" + "---|" * len(levels)]
    for m in modes:
        row = [("failed" if not by[(m, c)].ok else f"{by[(m, c)].cpu_ms:.2f}") if (m, c) in by else "-" for c in levels]
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    if any(m == "harness" for m in modes) and any(m == "client (direct)" for m in modes):
        row = []
        for c in levels:
            h, d = by.get(("harness", c)), by.get(("client (direct)", c))
            row.append(f"{h.cpu_ms - d.cpu_ms:+.2f}" if h and d and h.ok and d.ok else "-")
        lines += ["", "Harness CPU ms per call beyond its client's own (harness - client (direct)):", ""]
        lines += ["| | " + " | ".join(f"C={c}" for c in levels) + " |", "|---|" + "---|" * len(levels)]
        lines.append("| harness extra | " + " | ".join(row) + " |")
        row = []
        for c in levels:
            h, b = by.get(("harness", c)), by.get(("bare litellm", c))
            row.append(f"{h.rate / b.rate:.2f}x" if h and b and h.ok and b.ok else "-")
        lines += ["", "| harness / bare litellm calls/s | " + " | ".join(row) + " |", "|---|" + "---|" * len(levels)]
        row = []
        for c in levels:
            h, d = by.get(("harness", c)), by.get(("client (direct)", c))
            row.append(f"{h.rate / d.rate:.2f}x" if h and d and h.ok and d.ok else "-")
        lines.append("| harness / client (direct) calls/s | " + " | ".join(row) + " |")
        for m in modes:
            if m.startswith("harness --workers"):
                row = []
                for c in levels:
                    w, h = by.get((m, c)), by.get(("harness", c))
                    row.append(f"{w.rate / h.rate:.2f}x" if w and h and w.ok and h.ok else "-")
                lines.append(f"| {m} / harness calls/s | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--levels", default="1,8,32,64,128")
    p.add_argument("--rounds", type=int, default=6, help="calls per cell = rounds x C (at least 12)")
    p.add_argument("--workers", type=int, default=2, help="also run the harness with this many workers (0: skip)")
    p.add_argument("--harness-scale", type=int, default=2, help="harness cells make this many times more calls")
    p.add_argument("--modes", default="bare,litellm,direct,harness,nockpt,workers",
                   help="bare, litellm, direct, harness, nockpt (harness without checkpoints), workers")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "harness_throughput.md"))
    args = p.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    modes = set(args.modes.split(","))
    sys.path.insert(0, str(ROOT / "tests"))

    cells: list[Cell] = []
    load_start = os.getloadavg()[0]
    with ServerProcess(args.latency) as srv:
        # One-time lazy initialisation (litellm loads modules and starts its logging worker on first use) must
        # not be charged to the first cell.
        if "bare" in modes or "litellm" in modes:
            bench_bare_litellm(srv.base_url, 4, 16)
            bench_client(srv.base_url, 4, 16, direct=False)
        if "direct" in modes:
            bench_client(srv.base_url, 4, 16, direct=True)
        for c in levels:
            n = max(12, args.rounds * c)
            runs = []

            def named(mode, fn):
                fn.mode = mode
                return fn

            if "bare" in modes:
                runs.append(named("bare litellm", lambda c=c, n=n: bench_bare_litellm(srv.base_url, c, n)))
            if "litellm" in modes:
                runs.append(named("client (litellm)", lambda c=c, n=n: bench_client(srv.base_url, c, n, direct=False)))
            if "direct" in modes:
                runs.append(named("client (direct)", lambda c=c, n=n: bench_client(srv.base_url, c, n, direct=True)))
            if "harness" in modes:
                runs.append(named("harness", lambda c=c, n=n: bench_harness(srv.base_url, c, n * args.harness_scale, workers=1)))
            if "nockpt" in modes:
                runs.append(named("harness --no-checkpoints", lambda c=c, n=n: bench_harness(
                    srv.base_url, c, n * args.harness_scale, workers=1, checkpoints=False)))
            if "workers" in modes and args.workers > 1:
                runs.append(named(f"harness --workers {args.workers}", lambda c=c, n=n: bench_harness(
                    srv.base_url, c, n * args.harness_scale, workers=args.workers)))
            for run in runs:
                try:
                    cell = run()
                except Exception as exc:  # noqa: BLE001 - report the failed cell, keep measuring the others
                    cell = Cell(getattr(run, "mode", "?"), c, 0, 0.0, 0.0, error=f"{type(exc).__name__}: {exc}")
                if cell.calls == 0 and cell.error is None:
                    cell.error = "no calls completed"
                cells.append(cell)
                if not cell.ok:
                    print(f"C={c:<4} {cell.mode:<22} FAILED: {cell.error}", flush=True)
                    continue
                print(
                    f"C={c:<4} {cell.mode:<22} {cell.calls:>5} calls {cell.wall_s:6.2f}s "
                    f"{cell.rate:7.1f}/s ({cell.rate / (c / args.latency):5.0%} of bound)  {cell.cpu_ms:6.2f} ms CPU/call",
                    flush=True,
                )
    table = render(cells, args.latency, levels, args.rounds, args.harness_scale, (load_start, os.getloadavg()[0]))
    print()
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
