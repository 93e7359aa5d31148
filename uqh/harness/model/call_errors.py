"""Why a model call failed: the exceptions a client raises and one-line descriptions of transport errors."""
from __future__ import annotations

import asyncio
import re
import socket

from uqh.rundir.secrets import redact


class ModelCallFailed(Exception):
    """The call failed after retries (or on a non-retryable provider error).

    This is an infrastructure failure, not an outcome: the episode is not written and a resumed run re-queues it.
    ``retries``: the transient failures retried before giving up (counted in the run summary).
    """

    def __init__(self, message: str, *, retries: int = 0) -> None:
        super().__init__(message)
        self.retries = retries


class EndpointUnreachable(ModelCallFailed):
    """The very first call of a client could not connect at all (DNS lookup failed, connection refused): a wrong
    address or a server that is not running, not a transient failure. Not retried; the batch stops at once."""


class EndpointsDown(ModelCallFailed):
    """Every endpoint of the model has been failing for a sustained window (the circuit breaker,
    :mod:`uqh.harness.model.breaker`, tripped): not retried; the batch stops with the resume hint."""


_SSL_REPR = re.compile(r" ?ssl:<[^>]*>")


def error_line(exc: BaseException, timeout_s: float | None = None) -> str:
    """One line for an exception (object reprs such as aiohttp's ``ssl:<ssl.SSLContext ...>`` removed), every
    known secret redacted *before* the line is cut to 300 characters (a cut through a key would leave its head)."""
    text = redact(_SSL_REPR.sub("", " ".join(str(exc).split())))
    if not text and isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and timeout_s is not None:
        text = f"no answer within {timeout_s:g} s (--timeout)"
    return f"{type(exc).__name__}: {text[:300]}"


def _causes(exc: BaseException):
    """``exc`` and the exceptions it was raised from (``__cause__`` / ``__context__``), innermost last."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def unreachable_reason(exc: BaseException) -> str | None:
    """Why no connection could be made at all -- ``"DNS lookup failed (...)"`` or ``"connection refused"`` --
    or None for any other failure. Found in the exception chain, so it works for every transport (aiohttp
    directly; httpx under the openai SDK and litellm)."""
    for e in _causes(exc):
        if isinstance(e, socket.gaierror):
            return f"DNS lookup failed ({e.strerror or e})"
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
    return None
