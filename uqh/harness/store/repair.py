"""The explicit repair of a run directory: lines that are not valid records move to a side file.

A resume refuses a run directory whose ``episodes.jsonl`` or ``logprobs.jsonl`` holds a line that is not a
record (one line naming file and line number; nothing is touched), because guessing would silently drop or keep
data. :func:`repair_run_dir` is the explicit step a user takes then, under the writer lock:

- every complete line of ``episodes.jsonl`` that does not validate as an Episode, and every line of
  ``logprobs.jsonl`` (and of the user sidecar, ``user_logprobs.jsonl``) that does not validate as a LogprobRow or
  belongs to an episode without an episode line (its rows would otherwise shadow the rows of the re-run), is
  appended verbatim to ``<file>.quarantine`` (fsynced);
- then the file is rewritten without those lines (temp file + ``os.replace``: the original stays whole until the
  new one is complete).

The quarantined episodes are simply unfinished afterwards: re-running the same ``uqh run`` runs them again.
Nothing is deleted: the side files keep the exact bytes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from uqh.harness.store import lock as run_lock
from uqh.rundir.atomic import atomic_write_bytes
from uqh.rundir.errors import RunDirWriteError
from uqh.rundir.integrity import BadLine
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import EPISODES_FILE, QUARANTINE_SUFFIX, SIDECAR_FILE, USER_SIDECAR_FILE

__all__ = ["RepairReport", "repair_run_dir"]


@dataclass
class RepairReport:
    run_dir: Path
    #: File name -> the lines moved (or, in a dry run, to be moved) to its quarantine file.
    moved: dict[str, list[BadLine]] = field(default_factory=dict)
    dry_run: bool = False

    @property
    def n_moved(self) -> int:
        return sum(len(v) for v in self.moved.values())


def repair_run_dir(run_dir: Path | str, *, dry_run: bool = False) -> RepairReport:
    """Quarantine the invalid lines of ``run_dir``'s JSONL files (see the module docstring); with ``dry_run``
    only report them. UserError when another process writes the directory; RunDirWriteError when writing fails
    (the files are then unchanged)."""
    reader = RunDir.open(run_dir)
    report = RepairReport(reader.path, dry_run=dry_run)
    with run_lock.hold(reader.path):
        bad_episodes = reader.invalid_lines(EPISODES_FILE)
        finished = reader.valid_episode_ids({b.lineno for b in bad_episodes})
        to_move = [(EPISODES_FILE, bad_episodes)]
        for sidecar in (SIDECAR_FILE, USER_SIDECAR_FILE):
            bad_rows = reader.invalid_lines(sidecar)
            bad_rows += reader.stray_sidecar_rows(finished, {b.lineno for b in bad_rows}, sidecar)
            to_move.append((sidecar, sorted(bad_rows, key=lambda b: b.lineno)))
        for name, bad in to_move:
            if not bad:
                continue
            report.moved[name] = bad
            if not dry_run:
                kept, moved = reader.partition(name, bad)
                try:
                    _quarantine(reader.path / name, kept, moved)
                except OSError as exc:
                    raise RunDirWriteError(reader.path, exc) from None
    return report


def _quarantine(path: Path, kept: bytes, moved: bytes) -> None:
    """Append ``moved`` to the quarantine file, then replace ``path`` by ``kept`` (atomically)."""

    def save_moved() -> None:
        with open(path.with_name(path.name + QUARANTINE_SUFFIX), "ab") as q:
            q.write(moved)
            q.flush()
            os.fsync(q.fileno())

    atomic_write_bytes(path, kept, before_replace=save_moved)
