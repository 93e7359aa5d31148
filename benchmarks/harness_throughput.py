"""Model-call throughput of the harness against a fake OpenAI-compatible server with fixed latency.

    .venv/bin/python benchmarks/harness_throughput.py [--latency 0.2] [--levels 1,8,32,64,128,256,512]
        [--rounds 6] [--workers 2] [--modes ...] [--out benchmarks/results/harness_throughput.md]

The fake server (tests/fake_openai_server.py) runs in a separate process and answers every request after
``latency`` seconds with the same four-tag step (top-5 logprobs included), so with C requests in flight the best
possible rate is C / L calls/s (the "bound"). For each concurrency C it measures:

- ``bare litellm``: ``litellm.acompletion`` with logprobs, the baseline everybody starts from;
- ``client (litellm)``: :func:`uqh.harness.model.client.make_model_client` forced onto its litellm path;
- ``client (direct)``: the same client on its direct path (the default for OpenAI-compatible URLs);
- ``harness``: the full batch runner (:func:`uqh.harness.runner.run_batch`, ``arithmetic`` domain, every step
  parsed, stepped and checkpointed, episodes + sidecar written with fsync) on the direct path;
- ``harness --no-checkpoints``: the same without the per-step checkpoint files (shows what they cost);
- ``harness --workers N``: the harness spread over N worker processes;
- ``harness (litellm)`` [``--workers N``]: the same on the litellm path (``hosted_vllm/fake`` + URL).

Reported per cell: calls/s end to end (whole cell, start-up included) and in steady state (between the first and
last 10% of the cell's calls, by the server's clock), each as a fraction of the bound, and CPU milliseconds per
call (``time.process_time`` of this process, plus the CPU each worker reports). "harness extra" is the harness's
CPU per call minus its client's own. Request counts are bounded (``rounds`` x C calls per cell, x
``harness-scale`` for harness rows); the default run takes about 8 minutes. Results depend on the machine's
load: they are measured, not asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fake_server_process import FakeServerProcess

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import uqh  # noqa: E402,F401 - sets the litellm env before litellm is imported
from uqh.harness.config.settings import BatchSettings

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
    started_at: float = 0.0  # wall clock (time.time) when the measured part began
    steady: float = float("nan")  # calls/s in the middle of the cell, by the server's clock (see steady_rate)

    @property
    def ok(self) -> bool:
        return self.error is None and self.calls > 0

    @property
    def rate(self) -> float:
        return self.calls / self.wall_s if self.ok else float("nan")

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu_s / self.calls if self.ok else float("nan")


def steady_rate(answered_at: list[float], since: float, trim: float = 0.1) -> float:
    """Calls/s over the middle of a cell: the least-squares slope of "calls answered so far" against time, fitted
    between the first and last ``trim`` fraction of the calls answered after ``since`` -- the rate once processes
    have started and before the last wave drains (start-up is a fixed cost a long run amortises). A slope, not
    (count / span), because calls arrive in waves and a span's two ends would each land on a wave edge."""
    import numpy as np

    times = np.sort(np.asarray([t for t in answered_at if t >= since], dtype=float))
    lo, hi = int(trim * len(times)), int((1 - trim) * len(times))
    window = times[lo:hi]
    if len(window) < 3 or window[-1] <= window[0]:
        return float("nan")
    t = window - window.mean()
    count = np.arange(len(window)) - (len(window) - 1) / 2
    return float((t * count).sum() / (t * t).sum())


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def ServerProcess(latency: float) -> FakeServerProcess:
    """tests/fake_openai_server.py in another process, answering every call with STEP_TEXT."""
    script = ROOT / "tests" / "fake_openai_server.py"
    return FakeServerProcess([sys.executable, str(script), "--port", "0", "--latency", str(latency), "--text", STEP_TEXT])


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
        started = time.time()
        c0 = time.process_time()
        wall = await _drive(call, concurrency, n_calls)
        return wall, time.process_time() - c0, started

    wall, cpu, started = asyncio.run(main())
    return Cell("bare litellm", concurrency, n_calls, wall, cpu, started_at=started)


def bench_client(base_url: str, concurrency: int, n_calls: int, *, direct: bool) -> Cell:
    from uqh.harness.model.client import make_model_client
    from uqh.rundir.schema import DecodingConfig

    async def main():
        client = make_model_client("openai/fake", api_base=base_url, decoding=DecodingConfig(), timeout_s=60, direct=direct)

        async def call():
            c = await client.complete(MESSAGES, seed=42)
            assert c.tokens is not None

        await _drive(call, min(concurrency, 4), min(8, n_calls))
        started = time.time()
        c0 = time.process_time()
        wall = await _drive(call, concurrency, n_calls)
        cpu = time.process_time() - c0
        await client.aclose()
        return wall, cpu, started

    wall, cpu, started = asyncio.run(main())
    return Cell(f"client ({'direct' if direct else 'litellm'})", concurrency, n_calls, wall, cpu, started_at=started)


def bench_harness(
    base_url: str, concurrency: int, n_calls: int, *, workers: int, step_budget: int = 3, checkpoints: bool = True,
    model: str = "openai/fake",
) -> Cell:
    from uqh.domains.domain_registry import get_domain_class
    from uqh.harness.config.build import prompt_sha256
    from uqh.harness.runner import run_batch
    from uqh.rundir import RunDir
    from uqh.rundir.schema import DecodingConfig, RunConfig

    domain = get_domain_class("arithmetic")({}, observation_chars=420)
    # Whole waves of C episodes (every step of every episode is one call), so the C/L bound is reachable.
    n_episodes = concurrency * max(1, round(n_calls / (concurrency * step_budget)))
    all_ids = domain.all_task_ids()
    samples = -(-n_episodes // len(all_ids))  # more episodes than tasks: several samples per task
    config = RunConfig(
        domain="arithmetic",
        task_ids=all_ids[: -(-n_episodes // samples)],
        samples_per_task=samples,
        model=model,
        api_base=base_url,
        decoding=DecodingConfig(),
        step_budget=step_budget,
        prompt_sha256=prompt_sha256(domain.system_prompt()),
        package_version=uqh.__version__,
    )
    with tempfile.TemporaryDirectory(prefix="uqh-bench-") as tmp:
        started = time.time()
        c0, k0 = time.process_time(), _children_cpu()
        t0 = time.perf_counter()
        summary = run_batch(
            config, Path(tmp) / "run", settings=BatchSettings(concurrency=concurrency, workers=workers, progress=False, checkpoints=checkpoints)
        )
        wall = time.perf_counter() - t0
        # Worker processes are forked by a fork server (not our children): they report their own CPU.
        cpu = time.process_time() - c0 + (summary.worker_cpu_s or (_children_cpu() - k0))
        episodes = RunDir.open(Path(tmp) / "run").episodes()
    calls = sum(len(s.attempts) for e in episodes for s in e.steps) + sum(len(e.failed_step or []) for e in episodes)
    if summary.stats.infra_errors:
        print(f"  warning: {summary.stats.infra_errors} infrastructure errors: {dict(summary.stats.error_messages)}",
              file=sys.stderr)
    mode = "harness" if model.startswith("openai/") else "harness (litellm)"
    if workers > 1:
        mode += f" --workers {workers}"
    if not checkpoints:
        mode += " --no-checkpoints"
    return Cell(mode, concurrency, calls, wall, cpu, started_at=started)


# ------------------------------------------------------------------------------------- report


def render(
    cells: list[Cell], latency: float, levels: list[int], rounds: int, harness_scale: int, load: tuple[float, float],
    workers: int,
) -> str:
    modes = list(dict.fromkeys(c.mode for c in cells))
    by = {(c.mode, c.concurrency): c for c in cells}
    header = ["| mode | " + " | ".join(f"C={c}" for c in levels) + " |", "|---|" + "---|" * len(levels)]

    def table(value) -> list[str]:
        out = list(header)
        for m in modes:
            row = []
            for c in levels:
                cell = by.get((m, c))
                row.append("-" if cell is None else "failed" if not cell.ok else value(cell))
            out.append(f"| {m} | " + " | ".join(row) + " |")
        return out

    def ratio_row(label: str, num: str, den: str, attr: str) -> str | None:
        if num not in modes or den not in modes:
            return None
        row = []
        for c in levels:
            a, b = by.get((num, c)), by.get((den, c))
            ok = a and b and a.ok and b.ok and getattr(b, attr) > 0
            row.append(f"{getattr(a, attr) / getattr(b, attr):.2f}x" if ok else "-")
        return f"| {label} | " + " | ".join(row) + " |"

    def frac(rate: float, c: int) -> str:
        return "-" if rate != rate else f"{rate:.0f} ({rate / (c / latency):.0%})"

    lines = [
        "# Harness throughput",
        "",
        f"Fake OpenAI-compatible server in a separate process, latency {latency * 1000:.0f} ms, "
        f"{len(__import__('fake_openai_server').tokenize(STEP_TEXT))}-token four-tag response with top-5 logprobs; "
        f"{rounds} x C calls per cell (harness: waves of C episodes of 3 steps, arithmetic domain; "
        f"harness rows x{harness_scale} calls). "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"1-min load average {load[0]:.1f} at start, {load[1]:.1f} at end (other work on the machine lowers "
        f"every rate; compare rows measured in the same run). "
        "`harness` rows use the direct path (`openai/fake` + URL), `harness (litellm)` rows the litellm path "
        "(`hosted_vllm/fake` + URL, the path API models take). "
        "Worker rows fork N processes from a fork server that preloaded the harness (and litellm for litellm rows); "
        "the first worker cell of a run also pays the fork server's own start and imports. The C slots are split "
        "over the workers (C in flight in all; at C=1 one worker runs).",
        "",
        "**End to end** — calls / wall time of the whole cell, start-up and last wave included (fraction of the "
        "C/L bound):",
        "",
        *table(lambda cell: frac(cell.rate, cell.concurrency)),
        "",
        "**Steady state** — calls/s between the first and last 10% of the cell's calls, by the server's clock "
        "(what a long run sustains; start-up is a fixed cost per run):",
        "",
        *table(lambda cell: frac(cell.steady, cell.concurrency)),
        "",
        "CPU ms per call (this process; worker rows: parent + workers; the fake server's CPU is not included):",
        "",
        *table(lambda cell: f"{cell.cpu_ms:.2f}"),
    ]
    if "harness" in modes and "client (direct)" in modes:
        row = []
        for c in levels:
            h, d = by.get(("harness", c)), by.get(("client (direct)", c))
            row.append(f"{h.cpu_ms - d.cpu_ms:+.2f}" if h and d and h.ok and d.ok else "-")
        lines += ["", "Harness CPU ms per call beyond its client's own (harness - client (direct)):", "", *header]
        lines.append("| harness extra | " + " | ".join(row) + " |")
    ratios = [
        ratio_row("harness / bare litellm, end to end", "harness", "bare litellm", "rate"),
        ratio_row("harness / client (direct), end to end", "harness", "client (direct)", "rate"),
        ratio_row("harness (litellm) / client (litellm), end to end", "harness (litellm)", "client (litellm)", "rate"),
    ]
    for base in ("harness", "harness (litellm)"):
        w = f"{base} --workers {workers}"
        ratios.append(ratio_row(f"{w} / {base}, end to end", w, base, "rate"))
        ratios.append(ratio_row(f"{w} / {base}, steady state", w, base, "steady"))
    ratios = [r for r in ratios if r]
    if ratios:
        lines += ["", "Ratios of calls/s:", "", "| | " + " | ".join(f"C={c}" for c in levels) + " |",
                  "|---|" + "---|" * len(levels), *ratios]
    return "\n".join(lines) + "\n"


LITELLM_MODES = ("bare", "litellm", "llharness", "llworkers")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--levels", default="1,8,32,64,128,256,512")
    p.add_argument("--litellm-max-c", type=int, default=256,
                   help="skip litellm-path cells above this concurrency (they are CPU-capped long before)")
    p.add_argument("--rounds", type=int, default=6, help="calls per cell = rounds x C (at least 12)")
    p.add_argument("--workers", type=int, default=2, help="the N of the worker rows")
    p.add_argument("--harness-scale", type=int, default=3, help="harness cells make this many times more calls")
    p.add_argument("--modes", default="bare,litellm,direct,harness,nockpt,workers,llharness,llworkers",
                   help="bare, litellm (client), direct (client), harness, nockpt (harness without checkpoints), "
                        "workers (harness --workers N), llharness / llworkers (the same on the litellm path)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "harness_throughput.md"))
    args = p.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    modes = set(args.modes.split(","))
    sys.path.insert(0, str(ROOT / "tests"))

    cells: list[Cell] = []
    load_start = os.getloadavg()[0]
    with ServerProcess(args.latency) as srv:
        url = srv.base_url
        # One-time lazy initialisation (litellm loads modules and starts its logging worker on first use; the
        # fork server starts and preloads) must not be charged to the first cell.
        if modes & set(LITELLM_MODES):
            bench_bare_litellm(url, 4, 16)
            bench_client(url, 4, 16, direct=False)
        if "direct" in modes:
            bench_client(url, 4, 16, direct=True)
        if {"workers", "llworkers"} & modes and args.workers > 1:
            # The fork server preloads what the first worker run needs: litellm, so both worker rows are served.
            bench_harness(url, 8, 48, workers=args.workers, model="hosted_vllm/fake")
        for c in levels:
            n = max(12, args.rounds * c)
            hn = n * args.harness_scale
            w = args.workers
            runs = {
                "bare": ("bare litellm", lambda: bench_bare_litellm(url, c, n)),
                "litellm": ("client (litellm)", lambda: bench_client(url, c, n, direct=False)),
                "direct": ("client (direct)", lambda: bench_client(url, c, n, direct=True)),
                "harness": ("harness", lambda: bench_harness(url, c, hn, workers=1)),
                "nockpt": ("harness --no-checkpoints", lambda: bench_harness(url, c, hn, workers=1, checkpoints=False)),
                "workers": (f"harness --workers {w}", lambda: bench_harness(url, c, hn, workers=w)),
                "llharness": ("harness (litellm)", lambda: bench_harness(url, c, hn, workers=1, model="hosted_vllm/fake")),
                "llworkers": (f"harness (litellm) --workers {w}",
                              lambda: bench_harness(url, c, hn, workers=w, model="hosted_vllm/fake")),
            }
            for key, (mode, run) in runs.items():
                if key not in modes or (key in ("workers", "llworkers") and w < 2):
                    continue
                if key in LITELLM_MODES and c > args.litellm_max_c:
                    continue
                srv.take_answered()  # forget calls of earlier cells
                try:
                    cell = run()
                except Exception as exc:  # noqa: BLE001 - report the failed cell, keep measuring the others
                    cell = Cell(mode, c, 0, 0.0, 0.0, error=f"{type(exc).__name__}: {exc}")
                if cell.calls == 0 and cell.error is None:
                    cell.error = "no calls completed"
                cells.append(cell)
                if not cell.ok:
                    print(f"C={c:<4} {cell.mode:<32} FAILED: {cell.error}", flush=True)
                    continue
                cell.steady = steady_rate(srv.take_answered(), cell.started_at)
                bound = c / args.latency
                print(
                    f"C={c:<4} {cell.mode:<32} {cell.calls:>6} calls {cell.wall_s:6.2f}s "
                    f"{cell.rate:7.1f}/s ({cell.rate / bound:4.0%}) steady {cell.steady:7.1f}/s "
                    f"({cell.steady / bound:4.0%})  {cell.cpu_ms:6.2f} ms CPU/call",
                    flush=True,
                )
    table = render(cells, args.latency, levels, args.rounds, args.harness_scale,
                   (load_start, os.getloadavg()[0]), args.workers)
    print()
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
