"""The circuit breaker: stop calling a model whose every endpoint has been failing for a sustained window.

Retries cure a blip; they do not cure a dead server. Against an endpoint that always answers 500 a run used to
retry for as long as it had episodes (a 40-episode run was still at it after 5 minutes and 270 requests), and a
hanging one cost ``--timeout`` per attempt. The breaker trips when *both* hold: at least ``failures`` transient
failures in a row across all the client's calls (with several endpoints the pool rotates between them, so a row
of failures means every endpoint failed), and no success for ``window_s`` seconds. The client then raises
:class:`~uqh.harness.model.call_errors.EndpointsDown` and the batch stops with one line and the resume hint.
Both thresholds are recorded in the manifest's execution settings.
"""
from __future__ import annotations

import time
from typing import Callable

#: Transient failures in a row (all calls of one client) before the breaker may trip.
DEFAULT_BREAKER_FAILURES = 12
#: Seconds without any success before the breaker may trip.
DEFAULT_BREAKER_WINDOW_S = 120.0


class CircuitBreaker:
    """Counts consecutive failed attempts and the time since the last success of one model client."""

    def __init__(self, failures: int = DEFAULT_BREAKER_FAILURES, window_s: float = DEFAULT_BREAKER_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures, self.window_s, self._clock = int(failures), float(window_s), clock
        self.consecutive = 0
        self.last_success = clock()  # the window starts when the client is made
        self.last_error = ""

    def success(self) -> None:
        self.consecutive = 0
        self.last_success = self._clock()

    def failure(self, error: str) -> None:
        self.consecutive += 1
        self.last_error = error

    @property
    def open(self) -> bool:
        """Tripped: the model is not to be called any more in this session."""
        return self.consecutive >= self.failures and self._clock() - self.last_success >= self.window_s

    def reason(self) -> str:
        quiet = self._clock() - self.last_success
        return (f"every endpoint failed {self.consecutive} times in a row with no success for {quiet:.0f} s "
                f"(circuit breaker: {self.failures} failures, {self.window_s:g} s); last error: {self.last_error}")
