"""The react path before and after a change, in one run: the ``harness`` row of ``harness_throughput.py`` (the
full batch runner on the arithmetic domain, direct path, checkpoints on) for a baseline commit's tree and for this
tree, alternated so that machine load falls on both alike.

    .venv/bin/python benchmarks/agent_overhead.py --baseline 913f207 [--rounds 3] [--level 32] [--latency 0.05]

The baseline is exported with ``git archive`` into a temporary directory; each measurement is one child process
running that tree's ``benchmarks/harness_throughput.py --modes harness`` (which imports ``uqh`` from its own tree).
Printed: the CPU milliseconds per call of each run and the ratio after/before of their medians (below 1: faster).
Measured, not asserted: other work on the machine moves every number, the ratio is what compares.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CPU = re.compile(r"harness\s+.*?([0-9.]+) ms CPU/call")


def export_tree(ref: str, into: Path) -> Path:
    """The tree of ``ref`` as plain files under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def cpu_ms_per_call(tree: Path, level: int, latency: float, calls_rounds: int, report: Path) -> float:
    out = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / "harness_throughput.py"), "--modes", "harness", "--levels",
         str(level), "--latency", str(latency), "--rounds", str(calls_rounds), "--out", str(report)],
        cwd=tree, capture_output=True, text=True, check=True)
    m = _CPU.search(out.stdout)
    if m is None:
        raise RuntimeError(f"no harness row in the output of {tree}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return float(m.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the git ref to compare with (e.g. the commit before a change)")
    p.add_argument("--rounds", type=int, default=3, help="measurements of each tree (alternated)")
    p.add_argument("--level", type=int, default=32, help="episodes in flight")
    p.add_argument("--latency", type=float, default=0.05, help="the fake server's seconds per call")
    p.add_argument("--calls-rounds", type=int, default=6, help="harness_throughput --rounds (calls = 3 x this x C)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        before = export_tree(args.baseline, Path(tmp) / "before")
        cpu: dict[str, list[float]] = {"before": [], "after": []}
        for i in range(args.rounds):
            order = [("before", before), ("after", ROOT)] if i % 2 == 0 else [("after", ROOT), ("before", before)]
            for name, tree in order:
                value = cpu_ms_per_call(tree, args.level, args.latency, args.calls_rounds, Path(tmp) / "report.md")
                cpu[name].append(value)
                print(f"round {i + 1} {name:<6} {value:6.2f} ms CPU/call", flush=True)
    b, a = statistics.median(cpu["before"]), statistics.median(cpu["after"])
    print(f"median before {b:.2f} ms, after {a:.2f} ms CPU/call; ratio after/before {a / b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
