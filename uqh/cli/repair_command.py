"""`uqh repair RUN_DIR`: move lines that are not valid records out of a run directory's JSONL files.

Thin: :func:`uqh.harness.store.repair.repair_run_dir` does the work (under the writer lock); this prints what moved.
"""
from __future__ import annotations

import argparse

from uqh.rundir.schema import QUARANTINE_SUFFIX

#: Moved lines listed one by one up to this many; beyond, only counted.
SHOW = 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by `uqh run` or `uqh continue`")
    p.add_argument("--dry-run", action="store_true", help="only list the lines that would move")


def run(args: argparse.Namespace) -> int:
    from uqh.harness.store.repair import repair_run_dir

    report = repair_run_dir(args.run_dir, dry_run=args.dry_run)
    if not report.n_moved:
        print(f"nothing to repair in {report.run_dir}: every complete line is a valid record")
        return 0
    verb = "would move" if report.dry_run else "moved"
    for name, bad in report.moved.items():
        target = name + QUARANTINE_SUFFIX
        for b in bad[:SHOW]:
            print(f"{name}:{b.lineno}: {b.reason} -> {target}")
        if len(bad) > SHOW:
            print(f"{name}: ... and {len(bad) - SHOW} more lines -> {target}")
    print(f"{verb} {report.n_moved} lines to quarantine files in {report.run_dir}; "
          + ("run without --dry-run to move them" if report.dry_run
             else "re-run the same `uqh run` command to run the affected episodes again"))
    return 0
