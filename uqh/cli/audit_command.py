"""`uqh audit RUN_DIR...`: termination audit (Table 6) and selection diagnostic (Fig. 2B)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from uqh.cli import arg_types
from uqh.cli.arguments import check_distinct_runs, check_runs_have_episodes, print_reading_notes
from uqh.reports.render import Output, add_format_argument, emit, tables_json
from uqh.rundir.errors import OutputWriteError, UserError
from uqh.rundir.output_dir import WRITING_MARK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by `uqh run`")
    p.add_argument("--out", type=Path, default=None, help="also write CSV + Markdown tables into this directory")
    p.add_argument("--bootstrap", type=arg_types.resamples, default=2000, help="bootstrap resamples for the intervals (default 2000)")
    add_format_argument(p)


#: The files ``uqh audit --out`` writes (tables of uqh.reports.termination_tables, CSV + Markdown): a directory
#: holding only these is an earlier audit's output, replaced.
AUDIT_FILES = frozenset(f"{name}.{ext}" for name in ("termination_audit", "selection_diagnostic") for ext in ("csv", "md"))


def holds_only_audit_tables(path: Path) -> bool:
    return all(p.name in AUDIT_FILES or p.name == WRITING_MARK for p in path.iterdir())


def run(args: argparse.Namespace) -> int:
    from uqh.reports.termination_tables import audit

    check_distinct_runs(args.run_dirs)
    check_runs_have_episodes(args.run_dirs)
    if args.out is not None:  # before the tables are computed and printed: a bad --out writes nothing
        from uqh.rundir.output_dir import check_output_dir

        check_output_dir(args.out, "--out", is_own=holds_only_audit_tables)
    tables = audit(args.run_dirs, n_boot=args.bootstrap)
    print_reading_notes("uqh audit", args.run_dirs)
    emit(Output(tables=tables, json_text=tables_json(tables)), args.format)
    if args.out is not None:
        from uqh.rundir.output_dir import writing

        try:
            with writing(args.out, "--out"):
                written = [p for t in tables for p in t.write(args.out)]
        except OSError as exc:  # --out was checked first: a fault on the way (disk full), with its path, exit 1
            raise OutputWriteError(args.out, exc) from None
        print(f"wrote {len(written)} files to {args.out}", file=sys.stderr if args.format in ("json", "csv")
              else sys.stdout)
    return 0
