"""`uqh export RUN_DIR... --to DIR [--format parquet|csv] [--tokens]`: the runs as tables for pandas.

Writes ``episodes``, ``steps``, ``scores`` (and with ``--tokens`` the per-token ``tokens``) as Parquet (pyarrow)
or CSV into DIR; the frames are :mod:`uqh.scoring.export`'s (``episodes_df``, ``steps_df``, ``tokens_df``,
``scores_df``: the same as a Python call). Every input and DIR are checked before anything is written: a mistake
is one line and exit 2.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from uqh.cli import arg_types
from uqh.cli.arguments import check_distinct_runs, check_runs_have_episodes, print_reading_notes
from uqh.rundir.atomic import atomic_write_with
from uqh.rundir.errors import OutputWriteError, UserError
from uqh.rundir.output_dir import WRITING_MARK, check_output_dir, writing
from uqh.rundir.probes import ProbeDir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by `uqh run`")
    p.add_argument("--to", required=True, metavar="DIR", help="output directory (created; our files overwritten)")
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="file format (default parquet)")
    p.add_argument("--tokens", action="store_true", help="also write one row per generated token (large)")
    p.add_argument("--bootstrap", type=arg_types.resamples_or_none, default=1000, metavar="N",
                   help="bootstrap resamples of the scores' CIs (default 1000; 0: none)")
    p.add_argument("--seed", type=arg_types.seed, default=0, help="bootstrap seed")
    p.add_argument("--probes", action="append", metavar="DIR",
                   help="probe directory written by `uqh probe` (repeatable): its values fill the p_true column")
    p.add_argument("--censoring", choices=("exclude", "simple"), default="exclude",
                   help="max_steps trajectories in the scores: exclude (default) or simple (q_Z ≈ 0)")


def check_destination(to) -> None:
    """UserError unless ``to`` may receive the tables: not a run directory nor inside one, empty or new, or an
    earlier export's output (only its table files)."""

    check_output_dir(to, "--to", is_own=holds_only_exported_tables)


def holds_only_exported_tables(path) -> bool:
    from uqh.scoring.export import FRAMES

    names = {f"{name}.{ext}" for name in FRAMES for ext in ("parquet", "csv")} | {WRITING_MARK}
    return all(p.name in names or (p.name.startswith(".") and p.name.endswith(".tmp")) for p in path.iterdir())


def run(args: argparse.Namespace) -> int:
    from uqh.scoring.export import FRAMES, export_frames
    from uqh.scoring.pipeline import ScoreOptions

    check_distinct_runs(args.run_dirs)
    check_runs_have_episodes(args.run_dirs)
    print_reading_notes("uqh export", args.run_dirs)
    to = Path(args.to)
    check_destination(to)
    for d in args.run_dirs:
        if Path(d).resolve() == to.resolve():
            raise UserError(f"--to {to} is one of the run directories; export into a directory of its own")

    probes = [ProbeDir.open(d) for d in args.probes or []]
    frames = export_frames(args.run_dirs, tokens=args.tokens, probes=probes,
                           options=ScoreOptions(n_bootstrap=args.bootstrap, seed=args.seed, censoring=args.censoring))
    try:
        with writing(to, "--to"):
            written = []
            for name in FRAMES:
                if name not in frames:
                    continue
                path = to / f"{name}.{args.format}"
                write = (lambda p, f=frames[name]: f.to_parquet(p, index=False)) if args.format == "parquet" else (
                    lambda p, f=frames[name]: f.to_csv(p, index=False))
                atomic_write_with(path, write)  # a full disk leaves no empty or torn file
                written.append(f"{path.name} ({len(frames[name]):,} rows)")
    except OSError as exc:  # --to was checked before any work: this is a fault on the way (disk full), exit 1
        raise OutputWriteError(to, exc) from None
    print(f"wrote {', '.join(written)} to {to}")
    print(f"read them with pandas: pd.read_{args.format}('{to / ('steps.' + args.format)}'), or in Python: "
          "from uqh.scoring.export import steps_df")
    return 0
