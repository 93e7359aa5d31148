"""`uqh audit RUN_DIR...`: termination audit (Table 6) and selection diagnostic (Fig. 2B)."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by `uqh run`")
    p.add_argument("--out", type=Path, default=None, help="also write CSV + Markdown tables into this directory")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the intervals (default 2000)")


def run(args: argparse.Namespace) -> int:
    from rundir.errors import UserError
    from reports.audit import audit

    if args.bootstrap < 1:
        raise UserError("--bootstrap must be at least 1")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} exists and is not a directory; pick a directory path")
    tables = audit(args.run_dirs, n_boot=args.bootstrap)
    print("\n".join(t.to_markdown() for t in tables))
    if args.out is not None:
        written = [p for t in tables for p in t.write(args.out)]
        print(f"wrote {len(written)} files to {args.out}")
    return 0
