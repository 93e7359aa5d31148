"""The agent interface: the policy that turns an episode's history into its next step (docs/agents.md).

The loop (:mod:`uqh.harness.episode.loop`) owns what is the same for every agent -- the step budget, the repair
budget, the environment, endings, checkpoints, the sidecar -- and asks the agent four things: the conversation a
history gives (:meth:`Agent.conversation`, also after a resume or for a continuation's prefix), one model answer
(:meth:`Agent.ask`), what that answer decides (:meth:`Agent.decide`: the action with its verbal confidence, or
what is wrong with it), and the messages an answered attempt adds (:meth:`Agent.rejected_messages`,
:meth:`Agent.step_messages`). Every attempt's token log-probabilities go to the sidecar as the model returned
them; :attr:`Decision.action_token_range` says which of them spell the action, when the agent knows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from uqh.harness.model.types import Completion, ModelClient
from uqh.rundir.schema import Attempt, Step


@dataclass(frozen=True)
class Decision:
    """An accepted answer: the domain action to step and what the step records of it. ``verbal_confidence`` is
    None when the answer gave none that reads as a number (recorded missing, never imputed)."""

    action: str
    verbal_confidence: float | None
    confidence_raw: str | None
    think: str = ""
    explanation: str = ""
    action_token_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class Rejection:
    """An answer that cannot be stepped: ``problem`` is what the model is told in its repair."""

    problem: str


class Agent(Protocol):
    """A policy: ``name`` is what ``uqh run --agent`` calls it and the manifest records (``RunConfig.agent``)."""

    name: str
    system_prompt: str

    def conversation(self, task_prompt: str, steps: list[Step]) -> list[dict]:
        """The messages sent for the step after ``steps`` (system prompt and task first)."""
        ...

    async def ask(self, client: ModelClient, messages: list[dict], seed: int | None) -> Completion:
        """One model call for the next step."""
        ...

    def decide(self, completion: Completion) -> Decision | Rejection:
        """What an answer decides."""
        ...

    def invalid_action_problem(self, action: str, reason: str) -> str:
        """What the model is told when the environment rejects a decided action (``InvalidAction``)."""
        ...

    def rejected_messages(self, attempt: Attempt) -> list[dict]:
        """The messages a rejected attempt adds: its answer and what was wrong (``attempt.error``)."""
        ...

    def step_messages(self, attempt: Attempt, observation: str) -> list[dict]:
        """The messages an accepted attempt adds: its answer and the environment's observation."""
        ...
