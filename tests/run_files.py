"""Raw readers of run-directory files for tests that check what is on disk.

They parse every complete line (torn-line safe) but, unlike :class:`rundir.RunDir`, do not de-duplicate: a test
that asserts "no duplicate episode line" must see the file as it is.
"""
from __future__ import annotations

from pathlib import Path

from uqh.rundir.reader import RunDir, read_jsonl
from uqh.rundir.schema import EPISODES_FILE, SIDECAR_FILE, Episode, LogprobRow, Manifest


def read_manifest(run_dir: Path) -> Manifest:
    return RunDir.open(run_dir).manifest


def read_episodes(run_dir: Path) -> list[Episode]:
    return list(read_jsonl(Path(run_dir) / EPISODES_FILE, Episode))


def read_sidecar(run_dir: Path) -> list[LogprobRow]:
    return list(read_jsonl(Path(run_dir) / SIDECAR_FILE, LogprobRow))


def wait_for_lines(path: Path, n: int, proc, timeout: float = 120, what: str = "lines") -> None:
    """Wait until ``path`` holds ``n`` complete lines written by the subprocess ``proc`` (fails if it exits)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"{' '.join(map(str, proc.args[:4]))} exited early: "
                                 f"{proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {n} {what} in {path}")
