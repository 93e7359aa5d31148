"""What several commands share: argument groups and output lines (a command never imports another command)."""
from __future__ import annotations

import sys
from pathlib import Path

from uqh.harness.store.lock import holder_text, is_held
from uqh.rundir.errors import UserError
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import IMPORTED_FROM_KEY


def add_backend_arguments(group) -> None:
    """``--backend`` and ``--ray-address`` (`uqh run`, `uqh continue`)."""
    group.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="where episodes run: local (this machine; default) or ray (a Ray cluster; the run "
                            "directory is still written by this process only)")
    group.add_argument("--ray-address", metavar="ADDR",
                       help="with --backend ray: auto (the cluster this machine belongs to) or ray://HOST:PORT; "
                            "default: start a local Ray instance for this command")


def check_runs_have_episodes(paths) -> None:
    """UserError for a run directory without a finished episode (a manifest only): every command that reads runs
    -- score, certify, audit, report, export, judge, probe -- refuses it the same way (exit 2), before any output."""
    from uqh.rundir.errors import UserError
    from uqh.rundir.reader import RunDir

    for p in paths:
        if not RunDir.open(p).episodes():
            raise UserError(f"{p} has no finished episodes yet; run `uqh run` first (or drop it from the list)")


def print_endpoint_lines(summary) -> None:
    """The per-endpoint call counts of a batch over several endpoints (nothing for one endpoint)."""
    from uqh.harness.model.endpoints import endpoint_summary_lines

    lines = endpoint_summary_lines(summary.endpoint_calls if summary is not None else [])
    if lines:
        print("\n".join(lines), flush=True)


def check_distinct_runs(paths) -> None:
    """UserError when one run directory is given twice (it would be counted twice, in a pool too)."""

    seen: dict[Path, str] = {}
    for p in paths:
        key = Path(p).resolve()
        if key in seen:
            raise UserError(f"run directory {p} is given twice (also as {seen[key]}); list each run once")
        seen[key] = str(p)


def run_notes(path) -> list[str]:
    """What a reader of the run must be told: its reading notes (ids not planned, duplicates, a torn last line)
    and, while another process writes it, "N of M planned episodes, run in progress"."""

    run = RunDir.open(path)
    notes = run.reading_notes()
    notes += imported_run_notes(path, run.manifest)
    if is_held(Path(path)):
        notes.append(f"{path}: {len(run.episodes())} of {run.planned} planned episodes, run in progress "
                     f"({holder_text(Path(path))})")
    return notes


def imported_run_notes(path, manifest) -> list[str]:
    """For a run made by `uqh import`: where it came from, that its source has no verbal confidence (so the
    verbal predictor has no values), and what of the source was not imported."""

    origin = manifest.info.get(IMPORTED_FROM_KEY)
    if not isinstance(origin, dict):
        return []
    source = str(origin.get("source_file", "?")).rsplit("/", 1)[-1]
    notes = [f"{path}: imported from {origin.get('harness', '?')} results {source} (sha256 "
             f"{str(origin.get('source_sha256', '?'))[:12]}); no verbal confidence exists in the source: the verbal "
             "predictor has no values (missing, not 0 or 0.5)"]
    notes += [f"{path}: import: {note}" for note in origin.get("notes", [])]
    return notes


def print_reading_notes(prog: str, paths) -> None:
    """Each run's :func:`run_notes` as ``PROG: note: ...`` on stderr."""

    for p in paths:
        for note in run_notes(p):
            print(f"{prog}: note: {note}", file=sys.stderr)


def sidecar_summary_lines(summary, *, kind: str, records: str) -> list[str]:
    """The summary of a `uqh judge` / `uqh probe` run (a sidecar runner's summary): directory, records made,
    endings, calls and cost, notes. ``kind``: "judge" or "probe"; ``records``: what the records are called."""
    s = summary.stats
    lines = [f"{kind + ' directory':<17}{summary.out}",
             f"{records:<17}{summary.done_before + s.done}/{summary.planned} made ({s.done} this run, "
             f"{summary.done_before} before)"]
    if s.stop_reasons:
        lines.append("this run         " + ", ".join(f"{k}={v}" for k, v in sorted(s.stop_reasons.items())))
    lines.append(f"{kind + ' calls':<17}{s.calls}; tokens {s.prompt_tokens:,} prompt + {s.completion_tokens:,} "
                 f"completion; {s.cost_text()}")
    lines += [f"note             {note}" for note in summary.notes]
    return lines
