"""The react agent (``uqh run --agent react``, the default): the paper's four-tag ReAct text loop (Appendix K).

Each answer is plain text with ``<think>``, ``<action>``, ``<confidence>`` and ``<explanation>``
(:mod:`uqh.harness.episode.parsing`); a malformed one is answered with a repair message that repeats the
domain prompt's format lines, and every observation is a user message ``Observation: ...``.
"""
from __future__ import annotations

from typing import Any

from uqh.harness.episode.agent_protocol import Decision, Rejection
from uqh.harness.episode.parsing import (
    ParseError,
    char_span_to_token_range,
    invalid_action_problem,
    parse_react,
    repair_message,
)
from uqh.harness.model.types import Completion, ModelClient
from uqh.rundir.schema import Attempt, Step

OBSERVATION_PREFIX = "Observation: "


def observation_message(observation: str) -> dict:
    return {"role": "user", "content": OBSERVATION_PREFIX + observation}


class ReactAgent:
    """The four-tag text loop over a domain's Appendix K ``system_prompt``."""

    name = "react"
    description = "the paper's four-tag ReAct text loop (default)"

    def __init__(self, system_prompt: str):
        self.system_prompt = system_prompt

    @classmethod
    def system_prompt_for(cls, domain: Any) -> str:
        return domain.system_prompt()

    @classmethod
    def for_domain(cls, domain: Any, system_prompt: str) -> "ReactAgent":
        return cls(system_prompt)

    def conversation(self, task_prompt: str, steps: list[Step]) -> list[dict]:
        """System, user task prompt, then for each step: every rejected attempt (assistant raw text + user repair
        message) followed by the accepted assistant raw text and the user ``Observation: ...`` message. Steps of
        another agent's run (the probes replay any run this way) show their native calls as text
        (:attr:`Attempt.text_with_calls`; a react attempt has none, so its raw text is unchanged)."""
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task_prompt}]
        for step in steps:
            for att in step.attempts:
                messages.append({"role": "assistant", "content": att.text_with_calls})
                if att.error is not None:
                    messages.append({"role": "user", "content": repair_message(att.error, self.system_prompt)})
            messages.append(observation_message(step.observation))
        return messages

    async def ask(self, client: ModelClient, messages: list[dict], seed: int | None) -> Completion:
        return await client.complete(messages, seed=seed)

    def decide(self, completion: Completion) -> Decision | Rejection:
        raw = completion.text
        parsed = parse_react(raw)
        if isinstance(parsed, ParseError):
            return Rejection(parsed.message)
        token_texts = [tok.token for tok in completion.tokens] if completion.tokens is not None else None
        return Decision(
            action=parsed.action, verbal_confidence=parsed.verbal_confidence, confidence_raw=parsed.confidence_raw,
            think=parsed.think, explanation=parsed.explanation,
            action_token_range=char_span_to_token_range(parsed.action_span, token_texts, raw),
        )

    def invalid_action_problem(self, action: str, reason: str) -> str:
        return invalid_action_problem(action, reason)

    def rejected_messages(self, attempt: Attempt) -> list[dict]:
        return [{"role": "assistant", "content": attempt.raw_text},
                {"role": "user", "content": repair_message(attempt.error or "", self.system_prompt)}]

    def step_messages(self, attempt: Attempt, observation: str) -> list[dict]:
        return [{"role": "assistant", "content": attempt.raw_text}, observation_message(observation)]
