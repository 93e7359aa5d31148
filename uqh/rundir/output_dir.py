"""May a command write its output files here? The one answer for ``report --out``, ``export --to``, ``audit --out``,
``judge --report --tables`` and ``index --out`` (judge and probe directories add their own resume rule on top).

:func:`check_output_dir` (writes nothing; before any work) refuses, with one line naming the flag (UserError, exit 2):

- a run directory, or a path inside one: only the run's writer adds files there (``uqh.harness.store``);
- a file; a directory that cannot be written (read-only file system, permissions);
- a non-empty directory that holds no earlier output of the same command (``is_own`` says what that looks like):
  a command never mixes its files into someone else's;
- a directory that another uqh command is writing now (:func:`writing` holds it).

:func:`writing` creates the directory and holds it for the block: of two commands writing to the same directory at
once, the second is refused with one line naming the first (exit 2), instead of failing half-way on files the other
moved. A fault *while* writing (disk full) is not a location mistake: the command raises
:class:`~uqh.rundir.errors.OutputWriteError` (exit 1, naming the path). Files are written atomically
(:mod:`uqh.rundir.atomic`), so a fault leaves no empty or torn file.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Callable, Iterator

from uqh.rundir.atomic import check_creatable
from uqh.rundir.errors import UserError
from uqh.rundir.reader import is_run_dir

#: The mark a command holds (flock) in its output directory while it writes; removed when it is done.
WRITING_MARK = ".uqh-writing"


def enclosing_run_dir(path: str | Path) -> Path | None:
    """The run directory that ``path`` is or lies inside (``path`` need not exist), or None."""
    target = Path(os.path.abspath(path))
    for d in (target, *target.parents):
        if is_run_dir(d):
            return d
    return None


def access_reason(path: Path) -> str:
    """Why ``path`` cannot be written, in words: a read-only file system, else a permission."""
    try:
        return "read-only file system" if os.statvfs(path).f_flag & os.ST_RDONLY else "permission denied"
    except OSError:
        return "permission denied"


def check_output_dir(path: str | Path, flag: str, is_own: Callable[[Path], bool] | None = None) -> None:
    """UserError (one line, naming ``flag``) unless ``path`` may receive the command's output files: see the module
    docstring. ``is_own(path)``: whether a non-empty ``path`` holds this command's earlier output (then its files
    are replaced). Writes nothing."""
    path = Path(path)
    run = enclosing_run_dir(path)
    if run is not None and run == Path(os.path.abspath(path)):
        raise UserError(f"{flag} {path} is a run directory; write into a directory of its own")
    if run is not None:
        raise UserError(f"{flag} {path} is inside the run directory {run}, where only the run's writer adds files; "
                        "write into a directory outside it")
    if not path.exists():
        check_creatable(path, flag)
        return
    if not path.is_dir():
        raise UserError(f"{flag} {path} exists and is not a directory; pick a directory path")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {flag} {path}: {access_reason(path)}; pick a writable directory")
    if being_written(path):
        raise busy(path, flag)
    if any(p.name != WRITING_MARK for p in path.iterdir()) and not (is_own is not None and is_own(path)):
        raise UserError(f"{flag} {path} is a non-empty directory that holds no earlier output of this command; "
                        "choose a new or empty directory")


def busy(path: Path, flag: str) -> UserError:
    try:
        who = f"pid {int((path / WRITING_MARK).read_text().split()[0])}"
    except (OSError, ValueError, IndexError):
        who = "another process"
    return UserError(f"{flag} {path} is being written by another uqh command ({who}); wait for it to finish, or "
                     "choose another directory")


def being_written(path: Path) -> bool:
    """Whether another process holds ``path``'s :data:`WRITING_MARK` now (writes nothing)."""
    try:
        fd = os.open(path / WRITING_MARK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def writing(path: str | Path, flag: str) -> Iterator[Path]:
    """Create ``path`` (checked before by :func:`check_output_dir`) and hold it for the block; UserError naming the
    other writer when another uqh command holds it. OSError (disk full) propagates for the caller to report."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mark = path / WRITING_MARK
    fd = os.open(mark, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise busy(path, flag) from None
        raise
    try:
        with contextlib.suppress(OSError):  # who holds it, for the other's message; nothing if the disk is full
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(mark)
        os.close(fd)  # releases the lock
