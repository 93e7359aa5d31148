"""One writer per run directory: an OS-level lock held for the whole run.

The writer (``uqh run``, ``uqh continue --out``, ``uqh repair``) takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
``<run dir>/writer.lock`` before it writes anything and keeps it until it is done. The kernel releases the lock
when the holder's process dies, however it dies (``kill -9`` included), so a stale lock never blocks a resume.
The holder writes who it is (pid, host, command, start time) into the lock file; a second writer is refused with
one line naming the holder (:class:`uqh.rundir.errors.UserError`), before it has written anything.

The lock file descriptor is close-on-exec and the worker processes are forked from a fork server (never from the
holder), so no child inherits the lock: it goes away with the holder, not with the last child.

Within one process the lock is re-entrant (a continuation run holds it across its replay check, its branches and
the q_Z files; the batch runner inside takes it again): :func:`hold` keeps one open lock per directory and a
count of holders.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from uqh.rundir.errors import RunDirWriteError, UserError
from uqh.rundir.schema import LOCK_FILE
from uqh.rundir.secrets import redact

__all__ = ["LOCK_FILE", "check_not_held", "hold", "holder_text", "is_held"]


@dataclass
class _Held:
    fd: int
    count: int


_held: dict[Path, _Held] = {}
_guard = threading.Lock()


def _key(run_dir: Path) -> Path:
    return Path(os.path.realpath(run_dir))


def holder_text(run_dir: Path) -> str:
    """Who holds (or last held) the lock of ``run_dir``, from the lock file, as one phrase."""
    try:
        info = json.loads((Path(run_dir) / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not recorded itself yet)"
    command = str(info.get("command", ""))
    if len(command) > 120:
        command = command[:117] + "..."
    return f"pid {info.get('pid')} on {info.get('host', '?')} since {info.get('started_at', '?')} ({command})"


def _refused(run_dir: Path) -> UserError:
    return UserError(
        f"{run_dir} is being written by {holder_text(run_dir)}; one writer per run directory: wait for it to "
        "finish (or stop it), or use another --out"
    )


def is_held(run_dir: Path) -> bool:
    """Whether another process holds the lock of ``run_dir`` now (writes nothing; False when there is no lock
    file or this process holds it)."""
    path = Path(run_dir) / LOCK_FILE
    if _key(run_dir) in _held or not path.is_file():
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    finally:
        os.close(fd)  # also releases the probe's lock
    return False


def check_not_held(run_dir: Path) -> None:
    """UserError naming the holder when another process writes ``run_dir`` (an early, write-free check)."""
    if is_held(run_dir):
        raise _refused(run_dir)


def _command_line() -> str:
    """This process's command line as a user would recognise it (``uqh run ...``), URL credentials masked."""
    argv = list(sys.argv) or ["python"]
    if argv[0].endswith(("uqh/cli/__init__.py", "uqh/cli/__main__.py", "/uqh", "uqh")):
        argv[0] = "uqh"
    return redact(" ".join(argv))


def _record_holder(fd: int) -> None:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": _command_line(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    data = (json.dumps(info) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


@contextlib.contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Hold the writer lock of ``run_dir`` (an existing directory) for the block.

    Raises UserError naming the holder when another process holds it, and :class:`RunDirWriteError` when the
    lock file cannot be written (e.g. a full disk: then nothing else could be written either).
    """
    run_dir = Path(run_dir)
    key = _key(run_dir)
    with _guard:
        held = _held.get(key)
        if held is not None:
            held.count += 1
        else:
            try:
                fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise RunDirWriteError(run_dir, exc) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise _refused(run_dir) from None
                raise RunDirWriteError(run_dir, exc) from None
            try:
                _record_holder(fd)
            except OSError as exc:
                os.close(fd)
                raise RunDirWriteError(run_dir, exc) from None
            _held[key] = _Held(fd, 1)
    try:
        yield
    finally:
        with _guard:
            held = _held[key]
            held.count -= 1
            if held.count == 0:
                del _held[key]
                os.close(held.fd)  # releases the lock; the file stays (removing it would race a new holder)
