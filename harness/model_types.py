"""Typed model output shared by every client implementation and the loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rundir.schema import CallRecord, TokenLogprob


@dataclass
class Completion:
    """One successful model call."""

    text: str  # the full raw generated text the parser must see (a leading <think> block included)
    tokens: list[TokenLogprob] | None  # None when the provider returned no logprobs
    call: CallRecord


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


class ModelClient(Protocol):
    model: str

    async def complete(self, messages: list[dict], *, seed: int | None = None) -> Completion: ...

    async def aclose(self) -> None: ...
