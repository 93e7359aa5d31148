"""`uqh regenerate [PRESET...] [--quick] [--set PRESET:KEY=VALUE ...] [--out DIR]`: the paper's protocol in one go.

Every preset's run, then the continuations of the censored prefixes of the continued runs (a seeded sample), then
ONE report over every run and continuation under ``--out`` (:mod:`uqh.harness.regenerate`). Progress is shown
throughout; the same command again resumes where it stopped and, once everything is done, runs no episode and
only rewrites the report. ``--quick``: the four benchmarks and their continuations on the local model in minutes.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from uqh.cli import arg_types

EPILOG = """per-preset options:
  --set PRESET:KEY=VALUE (repeatable; PRESET `all` for every preset). KEY is a
  `uqh run` option by its field name: tasks, task_ids, samples, step_budget,
  model, api_base, user_model, user_api_base, observation_chars, decoding.NAME
  (temperature, max_tokens, grammar, ...), domain_options.NAME; `-D NAME=VALUE`
  is short for domain_options.NAME=VALUE. VALUE is JSON when it parses.
examples:
  uqh regenerate --quick                        # offline, local model, minutes
  uqh regenerate --dry-run                      # the paper's plan; no model
  uqh regenerate paper-webshop paper-tau2-retail \\
      --set "paper-webshop:-D goal_source=synthetic" \\
      --set paper-tau2-retail:user_model=local:smollm2"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("presets", nargs="*", metavar="PRESET",
                   help="presets or groups (paper-all, paper-tau2); default paper-all, or with --quick its four")
    p.add_argument("--quick", action="store_true",
                   help="the quick offline protocol: StrategyQA, HotpotQA, WebShop (synthetic goals) and Tau2-retail "
                        "on local:smollm2 with small task counts and budgets, each run continued (2 prefixes x 3 "
                        "branches, extra steps up to the run's budget; --min-valid 1), into runs/quick")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="PRESET:KEY=VALUE",
                   help="an option of one preset's run (see below)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="where the runs go: DIR/PRESET, DIR/PRESET-continue, the report in DIR/report-paper "
                        "(default runs, with --quick runs/quick)")
    p.add_argument("--report", type=Path, metavar="DIR", help="the report's directory (default OUT/report-paper)")
    c = p.add_argument_group("continuations (Appendix H.2)")
    c.add_argument("--continue", dest="continue_presets", nargs="+", metavar="PRESET",
                   help="the presets whose runs are continued (default paper-hotpotqa; with --quick all four)")
    c.add_argument("--sample", type=int, metavar="N", help="censored prefixes drawn per run (default 100; --quick 2)")
    c.add_argument("--seed", type=arg_types.seed, metavar="S", help="seed of the draw (default 42)")
    c.add_argument("--branches", type=int, metavar="M", help="branches per prefix (default 10; --quick 3)")
    c.add_argument("--extra-steps", type=int, metavar="K", help="extra step budget per branch (default: the run's)")
    c.add_argument("--min-valid", type=int, metavar="N",
                   help="resolved branches a continued prefix needs to be retained in the report (default 5; "
                        "--quick 1)")
    x = p.add_argument_group("execution")
    x.add_argument("--concurrency", type=arg_types.count, metavar="C", help="episodes in flight (default 8; 4 for local:)")
    x.add_argument("--bootstrap", type=arg_types.resamples, default=1000, metavar="N", help="the report's bootstrap resamples (default 1000)")
    x.add_argument("--dry-run", action="store_true", help="print the plan; call no model, write nothing")


def run(args: argparse.Namespace) -> int:
    import sys

    from uqh.harness.regenerate import (QUICK_MIN_VALID, REPORT_DIR, build_plan, check_plan, continuation_bound,
                                        report_inputs, run_plan)
    from uqh.rundir.errors import UserError

    min_valid = args.min_valid if args.min_valid is not None else (QUICK_MIN_VALID if args.quick else 5)
    if min_valid < 1:
        raise UserError("--min-valid must be at least 1")
    plan = build_plan(args.presets, quick=args.quick, settings=args.settings, out=args.out,
                      continuation=dict(presets=args.continue_presets, sample=args.sample, seed=args.seed,
                                        branches=args.branches, extra_steps=args.extra_steps),
                      concurrency=args.concurrency)
    report_dir = args.report or plan.out / REPORT_DIR
    from uqh.reports.report.write_report import ReportOptions, build_report, check_out_writable

    check_out_writable(report_dir, "--report")
    if args.dry_run:
        from uqh.harness.config.plan import plan as preset_plan

        for name in plan.presets:
            print(preset_plan(name, overrides=plan.runs[name].model_copy(update={"out": plan.run_dir(name)})), end="")
        for line in continuation_bound(plan):
            print(line)
        print(f"report   every run and continuation under {plan.out} -> {report_dir} (--min-valid {min_valid})")
        return 0
    prepared = check_plan(plan)  # every preset prepared before the first episode runs
    result = run_plan(plan, prepared, announce=lambda line: print(f"uqh regenerate: {line}", flush=True))
    if result.stopped is not None:
        print(f"uqh regenerate: stopped at {result.stopped}; run the same command again to resume", file=sys.stderr)
        return result.exit_code
    runs, conts, notes = report_inputs(plan)
    for note in notes:
        print(f"uqh regenerate: note: {note}", file=sys.stderr)
    print(f"uqh regenerate: report of {len(runs)} runs and {len(conts)} continuations -> {report_dir}", flush=True)
    opts = ReportOptions(n_bootstrap=args.bootstrap, pool=True, continuation_dirs=tuple(conts), min_valid=min_valid,
                         title=f"uqh regenerate: {plan.label}")
    res = build_report(runs, report_dir, opts)
    print(f"uqh regenerate: {result.new_episodes} episodes and branches this call; "
          f"{sum(s.finished for s in result.steps)} in all")
    print(f"open {res.html}")
    return 0
