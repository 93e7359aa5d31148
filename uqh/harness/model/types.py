"""Typed model output shared by every client implementation and the loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from uqh.rundir.schema import CallRecord, TokenLogprob, ToolCallRecord


@dataclass
class Completion:
    """One successful model call."""

    text: str  # the full raw generated text the parser must see (a leading <think> block included)
    tokens: list[TokenLogprob] | None  # None when the provider returned no logprobs
    call: CallRecord
    #: The native function calls of the answer (a request that offered ``tools``); None when it made none.
    tool_calls: list[ToolCallRecord] | None = None


class ModelClient(Protocol):
    model: str

    async def complete(self, messages: list[dict], *, seed: int | None = None,
                       tools: list[dict] | None = None) -> Completion: ...

    async def aclose(self) -> None: ...
