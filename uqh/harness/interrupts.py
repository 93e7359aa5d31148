"""SIGINT and SIGTERM as a request to stop, not a crash.

While :func:`stop_signals` is active (the CLI activates it for every command; the batch runner for its own
duration), the first SIGINT or SIGTERM is recorded and handed to the callbacks registered with :func:`on_stop`
(the batch runner cancels its episodes, tells its workers to stop and stops the local model server; the
summary and the resume hint are then printed as after any unfinished run). When nobody has registered a callback
(e.g. during start-up), the signal raises :class:`Interrupted` in the main thread, which unwinds through every
``with`` block (a local model server being started is stopped) to the CLI's one line. Further signals while
stopping are ignored: stopping is bounded (seconds), and a second Ctrl-C must not skip the cleanup that stops
the children.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator

__all__ = ["Interrupted", "STOP_SIGNALS", "exit_code", "on_stop", "reinstall", "requested", "signal_name",
           "stop_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """Raised by a stop signal when nothing registered to handle it (a BaseException, like KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(signum: int) -> int:
    """The shell's convention for a command stopped by a signal: 128 + the signal number (130, 143)."""
    return 128 + int(signum)


class _State:
    def __init__(self) -> None:
        self.depth = 0
        self.previous: dict[int, object] = {}
        self.signum: int | None = None
        self.at: float | None = None
        self.callbacks: list[Callable[[int], None]] = []


_state = _State()


def _handler(signum: int, frame) -> None:
    if _state.signum is not None:
        return  # already stopping
    _state.signum, _state.at = signum, time.time()
    callbacks = list(_state.callbacks)
    if not callbacks:
        raise Interrupted(signum)
    for callback in callbacks:
        callback(signum)


def requested() -> int | None:
    """The stop signal received while :func:`stop_signals` was active, or None."""
    return _state.signum


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Handle SIGINT and SIGTERM as described in the module docstring for the block (re-entrant; outside the
    main thread it does nothing, as signal handlers can only be installed there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _state.depth == 0:
        _state.signum = _state.at = None
        _state.previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        for s in STOP_SIGNALS:
            signal.signal(s, _handler)
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.depth == 0:
            for s, previous in _state.previous.items():
                signal.signal(s, previous)
            _state.previous = {}


def reinstall() -> None:
    """Take SIGINT and SIGTERM back after a library installed its own handlers (``ray.init`` sets one for
    SIGTERM) while :func:`stop_signals` is active; nothing otherwise."""
    if _state.depth and threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, _handler)


@contextlib.contextmanager
def on_stop(callback: Callable[[int], None]) -> Iterator[None]:
    """Call ``callback(signum)`` (from the main thread's signal handler: keep it short and non-blocking) on the
    first stop signal received during the block; at once if one was received before the block started."""
    _state.callbacks.append(callback)
    try:
        if _state.signum is not None:
            callback(_state.signum)
        yield
    finally:
        _state.callbacks.remove(callback)
