"""`uqh report RUN_DIR... --out DIR`: tables (CSV + Markdown), figures (PNG + SVG) and one HTML page."""
from __future__ import annotations

import argparse
from pathlib import Path

from uqh.cli import arg_types
from uqh.cli.arguments import check_distinct_runs, check_runs_have_episodes, print_reading_notes
from uqh.rundir.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by `uqh run`")
    p.add_argument("--out", type=Path, required=True, help="output directory (created; files are overwritten)")
    p.add_argument("--bootstrap", type=arg_types.resamples, default=1000, help="paired bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=arg_types.seed, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--max-traces", type=int, default=300, help="trajectories per run in the HTML trace explorer")
    p.add_argument("--pool", action="store_true", help="also score runs of the same dataset pooled (Tau2's domains)")
    p.add_argument("--q-z", dest="q_z", type=Path, action="append", default=[], metavar="FILE",
                   help="q_Z file from `uqh continue` (repeatable): adds the exact censored score")
    p.add_argument("--continuations", type=Path, nargs="+", default=[], metavar="CONT_DIR",
                   help="continuation runs from `uqh continue` of the runs given: adds the 'Censored prefixes: exact "
                        "vs simple' section (Tables 7-9 over the retained prefixes)")
    p.add_argument("--min-valid", type=int, default=5,
                   help="resolved branches a continued prefix needs to be retained (default 5, Appendix H.2)")
    p.add_argument("--judgments", type=Path, metavar="DIR",
                   help="judge directory (the --out of `uqh judge`) of these runs: adds the judge analysis, and each "
                        "trajectory's judgments in the trace explorer")
    p.add_argument("--certify", type=Path, action="append", default=[], metavar="FILE",
                   help="certificate JSON (`uqh certify RUN... --format json > FILE`; repeatable): adds the "
                        "certificate tables")
    p.add_argument("--probes", type=Path, action="append", default=[], metavar="DIR",
                   help="probe directory from `uqh probe` (repeatable): adds its values as the p_true predictor")
    p.add_argument("--title", default="uqh report", help="page title")


def run(args: argparse.Namespace) -> int:
    from uqh.reports.report.write_report import ReportOptions, build_report

    check_distinct_runs(args.run_dirs)
    check_runs_have_episodes(args.run_dirs)
    if args.max_traces < 0:
        raise UserError("--max-traces must be >= 0")
    if args.min_valid < 1:
        raise UserError("--min-valid must be at least 1")
    opts = ReportOptions(n_bootstrap=args.bootstrap, seed=args.seed, max_traces=args.max_traces, pool=args.pool,
                         q_z_files=tuple(args.q_z), continuation_dirs=tuple(args.continuations),
                         min_valid=args.min_valid, judgments_dir=args.judgments,
                         certify_files=tuple(args.certify), probe_dirs=tuple(args.probes), title=args.title)
    res = build_report(args.run_dirs, args.out, opts)
    print_reading_notes("uqh report", args.run_dirs)
    print(f"wrote {len(res.files)} files to {res.out_dir}")
    print(f"open {res.html}")
    return 0
