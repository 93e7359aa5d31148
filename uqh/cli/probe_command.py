"""`uqh probe`: per-step probes (reflexive P(True), observation surprise) over recorded traces, into a probe
directory (resumable).

    uqh probe RUN_DIR... --probe p_true|observation_surprise --model MODEL [--api-base URL] --out PROBE_DIR [--limit N]
              [--top-logprobs K] [--concurrency C] [--timeout S] [--surprise-method auto|echo|forced|replay]
              [--dry-run]

The probed runs are only read. Re-running the same command resumes (finished values are kept); a changed
config is refused with the fields that differ. ``uqh score RUN --probes PROBE_DIR`` scores the values as the
predictor of the probe's name. Every user mistake is one line on stderr, exit 2, nothing written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from uqh.cli import arg_types
from uqh.cli.arguments import sidecar_summary_lines
from uqh.harness.config.build import check_endpoint_url, validate_model_string
from uqh.harness.model.llama_server import check_credentials
from uqh.rundir.errors import UserError
from uqh.rundir.probes import ProbeDir, ProbeKind


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to probe (read only)")
    p.add_argument("--out", required=True, metavar="PROBE_DIR",
                   help="probe directory (created, or resumed if it holds these values); never inside a run")
    p.add_argument("--probe", required=True, choices=("p_true", "observation_surprise"),
                   help="p_true: ask the model whether the task will succeed; P(yes) from the answer's logprobs. "
                        "observation_surprise: mean NLL per token of each observation the agent received "
                        "(teacher-forced by /v1/completions echo, else by a grammar on a local: model, else an "
                        "exact chat replay; see --surprise-method); agent mode when --model is the run's model, "
                        "auxiliary mode otherwise")
    p.add_argument("--model", required=True, metavar="MODEL",
                   help="model that answers the probe (usually the agent's own: openai/NAME with --api-base, or "
                        "local:smollm2)")
    p.add_argument("--api-base", metavar="URL", help="OpenAI-compatible endpoint for --model")
    p.add_argument("--limit", type=arg_types.count, metavar="N", help="probe only the first N episodes of each run")
    p.add_argument("--top-logprobs", type=arg_types.top_logprobs, default=10, metavar="K",
                   help="alternatives asked for at the answer token (default 10)")
    p.add_argument("--concurrency", type=arg_types.count, metavar="C", help="calls in flight (default 8; 2 for local:)")
    p.add_argument("--timeout", type=arg_types.timeout, metavar="S",
                   help="seconds one probe call (echo, forced or chat) may take before it counts as failed "
                        "(default 600; retried)")
    p.add_argument("--surprise-method", choices=("auto", "echo", "forced", "replay"), metavar="METHOD",
                   help="observation_surprise only: how observations are teacher-forced. auto (default): "
                        "/v1/completions echo, else grammar-forced decoding on a local: model (llama-server), else "
                        "the exact chat replay; echo, forced (any server taking a llama.cpp GBNF 'grammar') or "
                        "replay: that method only")
    p.add_argument("--seed", type=arg_types.seed, default=42, metavar="N", help="probe seed; each call's seed derives from it")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; call no model, write nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar / lines")


def run(args: argparse.Namespace) -> int:
    from uqh.harness.probes.probe_runner import (PROBE_LAYOUT, build_probe_config, plan_probes, probe_decoding, run_probes,
                                         surprise_methods)
    from uqh.harness.judge.judge_runner import check_judge_out, check_judge_resumable, open_runs
    from uqh.harness.runner import default_concurrency

    if args.top_logprobs < 1:  # the probe reads the answer token's alternatives: it needs some
        raise UserError(f"--top-logprobs must be >= 1 for a probe, got {args.top_logprobs}")
    if args.surprise_method is not None and args.probe != "observation_surprise":
        raise UserError("--surprise-method applies to --probe observation_surprise only")
    check_endpoint_url("--api-base", args.api_base)  # no credentials or query string: they would be recorded
    validate_model_string(args.model, args.api_base)
    check_credentials(args.model, args.api_base)
    readers = open_runs(args.run_dirs)
    config = build_probe_config(readers, ProbeKind(args.probe), args.model, args.api_base,
                                probe_decoding(args.top_logprobs, args.seed, ProbeKind(args.probe)),
                                args.surprise_method)
    out = Path(args.out)
    check_judge_out(out, [r.path for r in readers], PROBE_LAYOUT)
    check_judge_resumable(out, config, PROBE_LAYOUT)
    concurrency = args.concurrency or default_concurrency(args.model)
    if args.dry_run:
        tasks = plan_probes(config, readers, limit=args.limit)
        done = {v.key for v in ProbeDir.open(out).values()} if (out / PROBE_LAYOUT.manifest_file).exists() else set()
        todo = sum(t.key not in done for t in tasks)
        print(f"probe         {config.probe.value} with {config.model}" + (f" via {config.api_base}" if config.api_base else "")
              + (f"; methods {' -> '.join(surprise_methods(config.surprise_method, config.model))}"
                 if config.surprise_method else ""))
        print(f"values        {len(tasks)} planned (one per recorded step), {len(tasks) - todo} already in {out}, "
              f"{todo} to make; calls {todo}; concurrency {concurrency}")
        print("dry run: no model was called, nothing was written.")
        return 0
    summary = run_probes(config, readers, out, limit=args.limit, concurrency=concurrency,
                         progress=not args.no_progress, timeout_s=args.timeout)
    s = summary.stats
    print("\n".join(sidecar_summary_lines(summary, kind="probe", records="values")))
    if not summary.ok:
        reasons = "; ".join(f"{m} (x{n})" for m, n in s.error_messages.most_common(3)) or "interrupted"
        print(f"uqh probe: {summary.remaining} probe values not made ({reasons}); re-run the same command to resume",
              file=sys.stderr)
        return 1
    return 0
