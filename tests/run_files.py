"""Raw readers of run-directory files for tests that check what is on disk.

They parse every complete line (torn-line safe) but, unlike :class:`rundir.RunDir`, do not de-duplicate: a test
that asserts "no duplicate episode line" must see the file as it is.
"""
from __future__ import annotations

from pathlib import Path

from rundir.reader import RunDir, read_jsonl
from rundir.schema import EPISODES_FILE, SIDECAR_FILE, Episode, LogprobRow, Manifest


def read_manifest(run_dir: Path) -> Manifest:
    return RunDir.open(run_dir).manifest


def read_episodes(run_dir: Path) -> list[Episode]:
    return list(read_jsonl(Path(run_dir) / EPISODES_FILE, Episode))


def read_sidecar(run_dir: Path) -> list[LogprobRow]:
    return list(read_jsonl(Path(run_dir) / SIDECAR_FILE, LogprobRow))
