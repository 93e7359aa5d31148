"""`uqh judge`: Agent GPA judges over recorded traces, into a judge directory (resumable), and their analysis.

    uqh judge RUN_DIR... --judge-model MODEL [--api-base URL] [--metrics GF,LC,EE,PQ,PA,TS,TC] [--repeats R]
              --out JUDGE_DIR [--limit N] [--concurrency C] [--dry-run]
    uqh judge --report --out JUDGE_DIR [--labels FILE] [--format table|md|json|csv] [--tables DIR]

Re-running the same judging command resumes it (finished judgments are kept); more metrics or repeats add to the
same directory. ``--report`` calls no model: it analyses the judgments in JUDGE_DIR (with ``--judge-model`` as
well, it judges first). Every user mistake is one line on stderr, exit 2, nothing written.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from uqh.cli import arg_types
from uqh.cli.arg_types import finite_float
from uqh.cli.arguments import sidecar_summary_lines
from uqh.harness.config.build import check_endpoint_url, validate_model_string
from uqh.harness.model.llama_server import check_credentials
from uqh.reports.render import emit
from uqh.rundir.errors import UserError
from uqh.rundir.judgments import JudgeDir, JudgeMetric, parse_metrics
from uqh.rundir.schema import DecodingConfig

#: Every judge, in the order JudgeMetric (the one place the set is defined) lists them.
ALL_METRICS = ",".join(m.value for m in JudgeMetric)
#: Judges write a rationale: the completion cap is larger than an agent step's.
DEFAULT_MAX_TOKENS = 1024


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="run directories to judge (read only)")
    p.add_argument("--out", required=True, metavar="JUDGE_DIR",
                   help="judge directory (created, or resumed if it holds these judgments); never inside a run")
    j = p.add_argument_group("judging")
    j.add_argument("--judge-model", metavar="MODEL", help="litellm model string of the judge (openai/NAME with "
                   "--api-base for an OpenAI-compatible server, or local:smollm2)")
    j.add_argument("--api-base", metavar="URL", help="OpenAI-compatible endpoint for --judge-model")
    j.add_argument("--metrics", default=ALL_METRICS, metavar="LIST",
                   help=f"comma-separated judges (default all: {ALL_METRICS})")
    j.add_argument("--repeats", type=arg_types.count, default=1, metavar="R", help="independent judgments per episode and judge "
                   "(default 1; 2+ for the stability analysis)")
    j.add_argument("--limit", type=arg_types.count, metavar="N",
                   help="judge only the first N episodes of each run (canonical order)")
    j.add_argument("--concurrency", type=arg_types.count, metavar="C", help="judge calls in flight (default 8; 2 for local:)")
    j.add_argument("--timeout", type=arg_types.timeout, metavar="S",
                   help="seconds one judge call may take before it counts as failed (default 600; retried)")
    j.add_argument("--temperature", type=finite_float, metavar="T", help="judge sampling temperature (default 0.2)")
    j.add_argument("--max-tokens", type=arg_types.count, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=f"judge completion cap (default {DEFAULT_MAX_TOKENS})")
    j.add_argument("--seed", type=arg_types.seed, metavar="N",
                   help="judge seed (default 42); each judgment's seed derives from it")
    j.add_argument("--reasoning", action="store_true", help="ask the provider to enable reasoning")
    j.add_argument("--dry-run", action="store_true", help="validate and print the plan; call no model, write nothing")
    j.add_argument("--no-progress", action="store_true", help="no progress bar / lines")
    r = p.add_argument_group("analysis")
    r.add_argument("--report", action="store_true", help="analyse the judgments in --out (no model call)")
    r.add_argument("--labels", metavar="FILE",
                   help="human labels (CSV with header, or JSONL): episode_id, metric, score 0-3 [, run]")
    r.add_argument("--format", choices=("table", "md", "json", "csv"), default="table",
                   help="report output: table (rich), md (Markdown), json or csv (every table stacked)")
    r.add_argument("--markdown", action="store_const", const="md", dest="format", help="alias for --format md")
    r.add_argument("--tables", metavar="DIR", help="also write every report table as CSV + Markdown, and the JSON")
    r.add_argument("--bootstrap", type=arg_types.resamples_or_none, default=1000, metavar="N", help="bootstrap resamples of the CIs")
    r.add_argument("--bootstrap-seed", type=arg_types.seed, default=0, metavar="N", help="bootstrap seed (default 0)")


def _validate(args: argparse.Namespace) -> None:
    if args.temperature is not None and args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if not args.judge_model and not args.report:
        raise UserError("give --judge-model MODEL to judge, or --report to analyse the judgments in --out")
    if args.judge_model and not args.run_dirs:
        raise UserError("give the run directories to judge: uqh judge RUN_DIR... --judge-model MODEL --out DIR")
    if (args.labels or args.tables) and not args.report:
        raise UserError("--labels and --tables belong to --report")
    if args.labels:
        from uqh.rundir.judgments import read_labels_file

        read_labels_file(args.labels)  # a bad labels file fails before any judging
    if args.tables:  # before any judging: not in a run, writable, new or empty or an earlier --tables output
        from uqh.reports.judge_tables import JSON_FILE
        from uqh.rundir.output_dir import check_output_dir

        check_output_dir(args.tables, "--tables", is_own=lambda p: (p / JSON_FILE).is_file())


def _judge(args: argparse.Namespace) -> int:
    from uqh.harness.judge.judge_runner import build_judge_config, check_judge_out, check_judge_resumable, open_runs, plan_tasks
    from uqh.harness.runner import default_concurrency

    metrics = parse_metrics(args.metrics)
    check_endpoint_url("--api-base", args.api_base)
    validate_model_string(args.judge_model, args.api_base)
    check_credentials(args.judge_model, args.api_base)
    readers = open_runs(args.run_dirs)
    decoding = DecodingConfig(logprobs=False, top_logprobs=0, max_tokens=args.max_tokens, reasoning=args.reasoning,
                              **{k: v for k, v in (("temperature", args.temperature), ("seed", args.seed))
                                 if v is not None})
    config = build_judge_config(readers, args.judge_model, args.api_base, decoding)
    out = Path(args.out)
    check_judge_out(out, [r.path for r in readers])
    check_judge_resumable(out, config)
    concurrency = args.concurrency or default_concurrency(args.judge_model)
    if args.dry_run:
        tasks = plan_tasks(config, readers, metrics, args.repeats, limit=args.limit)
        done = {j.key for j in JudgeDir.open(out).judgments()} if (out / "judge_manifest.json").exists() else set()
        todo = sum(t.key not in done for t in tasks)
        for reader in readers:
            n = len(reader.episodes()) if args.limit is None else min(args.limit, len(reader.episodes()))
            print(f"judged run    {reader.path} ({reader.config.domain}, agent {reader.config.model}): {n} episodes")
        d = config.decoding
        print(f"judge         {config.judge_model}" + (f" via {config.api_base}" if config.api_base else ""))
        print(f"decoding      temperature={d.temperature} max_tokens={d.max_tokens} seed={d.seed} "
              f"reasoning={d.reasoning}")
        print(f"judges        {','.join(m.value for m in metrics)} x {args.repeats} repeat(s)")
        print(f"judgments     {len(tasks)} planned, {len(tasks) - todo} already in {out}, {todo} to make")
        print(f"judge calls   <= {2 * todo:,} (one repair at most); concurrency {concurrency}")
        print("dry run: no model was called, nothing was written.")
        return 0

    from uqh.harness.judge.judge_runner import run_judges

    summary = run_judges(config, readers, out, metrics=metrics, repeats=args.repeats, limit=args.limit,
                         concurrency=concurrency, progress=not args.no_progress, timeout_s=args.timeout)
    s = summary.stats
    print("\n".join(sidecar_summary_lines(summary, kind="judge", records="judgments")))
    missing_line = _missing_summary(summary.out)
    if missing_line:
        print(missing_line)
    if not summary.ok:
        reasons = "; ".join(f"{m} (x{n})" for m, n in s.error_messages.most_common(3)) or "interrupted"
        print(f"uqh judge: {summary.remaining} judgments not made ({reasons}); re-run the same command to resume",
              file=sys.stderr)
        return 1
    return 0


def _missing_summary(out) -> str | None:
    """``missing   N of M judgments missing; most common reason: ... (xK)``, or None when none is missing: a judge
    whose every reply failed to parse must not look like a success."""

    judgments = JudgeDir.open(out).judgments()
    reasons = Counter((j.missing_reason or "no reason recorded")[:160] for j in judgments if j.score is None)
    if not reasons:
        return None
    (reason, n), = reasons.most_common(1)
    return (f"missing          {sum(reasons.values())} of {len(judgments)} judgments have no score; most common "
            f"reason: {reason} (x{n})")


def _report(args: argparse.Namespace) -> int:
    from uqh.reports.judge_tables import judge_output, write_files
    from uqh.scoring.judges.analysis import analyse_judgments

    jd = JudgeDir.open(args.out)
    if args.run_dirs:
        judged = sorted(str(Path(r.path).resolve()) for r in jd.config.runs)
        if sorted(str(Path(p).resolve()) for p in args.run_dirs) != judged:
            raise UserError(f"{args.out} judges {', '.join(judged)}; pass those run directories or none")
    analysis = analyse_judgments(args.out, labels_file=args.labels, n_bootstrap=args.bootstrap,
                                 seed=args.bootstrap_seed)
    emit(judge_output(analysis), args.format)
    if args.tables:
        from uqh.rundir.errors import OutputWriteError
        from uqh.rundir.output_dir import writing

        try:
            with writing(args.tables, "--tables"):
                paths = write_files(analysis, Path(args.tables))
        except OSError as exc:  # --tables was checked first: a fault on the way (disk full), exit 1 as elsewhere
            raise OutputWriteError(args.tables, exc) from None
        print(f"wrote {len(paths)} files to {args.tables}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    _validate(args)
    code = 0
    if args.judge_model:
        code = _judge(args)
        if args.dry_run or code != 0:
            return code
    if args.report:
        code = _report(args)
    return code
