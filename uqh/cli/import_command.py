"""`uqh import tau2 RESULTS.json --out DIR`: another harness's results as a uqh run directory.

The converter is :mod:`uqh.harness.importers.tau2_results` (a tau2-bench or agentuq results file; docs/import.md).
The imported run is scored, audited, exported and reported like any other (`uqh score DIR`); it has no verbal
confidence, and its token-signal predictors have values where the file embeds token logprobs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

FORMATS = {"tau2": "a tau2-bench (or agentuq) results JSON file, as `tau2 run` writes it"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source_format", choices=tuple(FORMATS), metavar="FORMAT",
                   help="the results file's format: " + "; ".join(f"{k}: {v}" for k, v in FORMATS.items()))
    p.add_argument("results", type=Path, metavar="RESULTS", help="the results file to import")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="the run directory to create (new, or an empty directory)")


def run(args: argparse.Namespace) -> int:
    from uqh.harness.importers.tau2_results import import_tau2_results

    imported = import_tau2_results(args.results, args.out)
    counts, config = imported.counts, imported.config
    origin = imported.origin
    stops: dict[str, int] = {}
    for item in imported.episodes:
        stops[item.episode.stop_reason.value] = stops.get(item.episode.stop_reason.value, 0) + 1
    print(f"run directory  {args.out}")
    print(f"imported       {counts.episodes} episodes ({counts.steps} steps) of {counts.simulations} simulations "
          f"from {args.results} ({origin['harness']}, sha256 {origin['source_sha256'][:12]})")
    print(f"domain, model  {config.domain} · {config.model}")
    print("stop reasons   " + " ".join(f"{k}={v}" for k, v in sorted(stops.items())))
    print(f"token logprobs {counts.steps_with_tokens} of {counts.steps} steps ({counts.assistant_tokens:,} tokens)")
    if config.user_logprobs is not None:
        with_tokens = counts.user_rows - counts.user_rows_without_tokens
        print(f"user logprobs  {with_tokens} of {counts.user_rows} generated user messages "
              f"({counts.user_tokens:,} tokens) -> user_logprobs.jsonl")
    else:
        print("user logprobs  none in the source: user and combined per-role predictors have no values")
    print("verbal conf.   none in the source (missing, not 0 or 0.5): verbal-confidence predictors have no values")
    for note in counts.notes():
        print(f"uqh import: note: {note}", file=sys.stderr)
    print(f"next           uqh score {args.out}   (then: uqh audit {args.out}; uqh report {args.out} --out ...)")
    return 0
