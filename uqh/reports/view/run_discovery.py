"""Which directories `uqh view` shows: run directories (continuation runs among them), judge directories and probe
directories, given as themselves or found under a folder, recursively. Reading only: a directory counts as a run
when :func:`uqh.rundir.reader.is_run_dir` says so, as a judge (probe) directory when it holds a judge (probe)
manifest. The viewer calls :func:`find_directories` at start-up and again whenever the folders change
(:mod:`uqh.reports.view.follow`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from uqh.rundir.errors import UserError
from uqh.rundir.judgments import JUDGE_MANIFEST_FILE
from uqh.rundir.probes import PROBE_MANIFEST_FILE
from uqh.rundir.reader import is_run_dir

#: Folders never descended into while looking for runs (caches, VCS data, virtual environments).
SKIPPED_FOLDERS = {".git", "__pycache__", ".venv", "node_modules", ".quarantine"}


@dataclass(frozen=True)
class Found:
    """What was found: run, judge and probe directories, each sorted by path."""

    runs: list[Path]
    judges: list[Path]
    probes: list[Path] = field(default_factory=list)


def is_judge_dir(path: Path) -> bool:
    return (Path(path) / JUDGE_MANIFEST_FILE).is_file()


def is_probe_dir(path: Path) -> bool:
    return (Path(path) / PROBE_MANIFEST_FILE).is_file()


def check_given(paths: list[Path]) -> None:
    """UserError, one line, when a given path does not exist, is a file or cannot be listed."""
    for given in map(Path, paths):
        if not given.exists():
            raise UserError(f"{given} does not exist; pass run directories written by `uqh run` or a folder of them")
        if not given.is_dir():
            raise UserError(f"{given} is a file, not a run directory; pass run directories or a folder of them")
        if not os.access(given, os.R_OK | os.X_OK):
            raise UserError(f"{given} cannot be read (permission denied)")


def find_directories(paths: list[Path]) -> Found:
    """Run, judge and probe directories in ``paths`` (each a run, a judge or probe directory or a folder searched
    recursively; a run directory's sub-folders are searched too: continuations may live inside). A path that is
    gone or cannot be listed holds nothing (the viewer calls this again while it serves: a folder deleted meanwhile
    is not an error); :func:`check_given` checks them once, at start-up."""
    runs: set[Path] = set()
    judges: set[Path] = set()
    probes: set[Path] = set()
    for given in paths:
        for folder, subfolders, _files in os.walk(Path(given), onerror=None):
            subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED_FOLDERS)
            here = Path(folder)
            if is_run_dir(here):
                runs.add(here.resolve())
            elif is_judge_dir(here):
                judges.add(here.resolve())
            elif is_probe_dir(here):
                probes.add(here.resolve())
    return Found(sorted(runs), sorted(judges), sorted(probes))
