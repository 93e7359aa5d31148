"""Atomic file replacement, shared by every writer of run-directory files (store, continuation, reports)."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator


def atomic_write_text(path: Path, text: str, *, fsync: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory + ``os.replace``)."""
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


@contextlib.contextmanager
def _temp_beside(path: Path) -> Iterator[tuple[int, Path]]:
    """A temp file (descriptor, path) in ``path``'s directory, so ``os.replace``/``os.link`` onto ``path`` is atomic.
    Its name is removed on the way out: a no-op once replaced, the leftover name after a link, and the half-written
    file after a fault."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        yield fd, Path(tmp)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def atomic_write_bytes(path: Path, data: bytes, *, fsync: bool = True,
                       before_replace: Callable[[], None] | None = None) -> None:
    """Write ``data`` to ``path`` atomically. ``before_replace`` runs once the temp file is written and before it
    replaces ``path`` (e.g. saving what the new content drops); if it raises, ``path`` is left as it was."""
    path = Path(path)
    with _temp_beside(path) as (fd, tmp):
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)


def atomic_create_text(path: Path, text: str) -> None:
    """Create ``path`` with ``text``, whole or not at all, never replacing a file: temp file + ``os.link`` (which
    fails with FileExistsError when ``path`` exists). A fault half-way (disk full) leaves no file, empty or torn."""
    path = Path(path)
    with _temp_beside(path) as (fd, tmp):
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)


def atomic_write_with(path: Path, write: Callable[[Path], None]) -> None:
    """``write(temp_path)`` (a library's writer: pandas' ``to_parquet``, ``to_csv``), then ``os.replace`` onto
    ``path``: a fault half-way (disk full) leaves ``path`` as it was and no temp file."""
    path = Path(path)
    with _temp_beside(path) as (fd, tmp):
        os.close(fd)
        write(tmp)
        os.replace(tmp, path)


def check_creatable(path: Path, flag: str = "--out") -> None:
    """Raise UserError unless ``path`` could be created: its nearest existing ancestor is a writable directory.
    Writes nothing (an ``--out`` that does not exist yet is checked before any work starts)."""
    from uqh.rundir.errors import UserError

    path = Path(path)
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"cannot create {flag} {path}: {ancestor} is not writable; choose another directory")
