"""The tools agent (``uqh run --agent tools``): native function calling (docs/agents.md).

The request offers the domain's actions as OpenAI function schemas (:class:`uqh.domains.tool_offer.ToolOffer`;
Tau2: tau2's own), each with one more **required** argument, ``confidence``: the verbal confidence is elicited at
every step in the same call that acts, under the same definition as the react agent's ``<confidence>`` tag (the
paragraph :data:`CONFIDENCE_PROMPT` appended to the system prompt). A reply without a tool call is an action only
where the domain has one for it (Tau2: a message to the user); it then states its confidence on a last line
``Confidence: 0.xx``, which is taken off the message before the user sees it.

One call per answer: the call becomes the domain's action string (the react agent's grammar), so the
environment, replay, resume and continuations are the same for both agents. A confidence that is absent or not
a number is recorded as missing (``verbal_confidence`` null, its raw text kept), never imputed and never a reason
for a repair; a call to no offered tool, unreadable arguments, several calls at once or an empty answer are
repaired as the react agent repairs a malformed output (the model is told what was wrong, at most ``MAX_REPAIRS``
times per step).
"""
from __future__ import annotations

import json
import re
from typing import Any

from uqh.domains.tool_offer import ToolCallRejected, ToolOffer
from uqh.harness.episode.agent_protocol import Decision, Rejection
from uqh.harness.episode.parsing import char_span_to_token_range, invalid_action_problem, parse_confidence
from uqh.harness.model.types import Completion, ModelClient
from uqh.prompts import PROMPTS_DIR
from uqh.rundir.schema import Attempt, Step, ToolCallRecord

CONFIDENCE_ARGUMENT = "confidence"
CONFIDENCE_PROMPT = (PROMPTS_DIR / "tool_confidence.txt").read_text()
CONFIDENCE_SCHEMA = {
    "type": "number",
    "description": "Your confidence, a number between 0.0 and 1.0: the probability that the task will eventually be "
                   "solved correctly from the current state.",
}
#: The confidence line that ends a plain reply (a message to the user): "Confidence: 0.8".
_CONFIDENCE_LINE = re.compile(r"(?:\A|\n)[ \t]*confidence[ \t]*[:=][ \t]*(?P<value>[^\n]*?)[ \t]*\s*\Z", re.IGNORECASE)


def with_confidence(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAI function schema with the required ``confidence`` argument added."""
    function = dict(schema["function"])
    parameters = dict(function.get("parameters") or {"type": "object", "properties": {}})
    parameters["properties"] = {**parameters.get("properties", {}), CONFIDENCE_ARGUMENT: CONFIDENCE_SCHEMA}
    parameters["required"] = [*[r for r in parameters.get("required", []) if r != CONFIDENCE_ARGUMENT],
                              CONFIDENCE_ARGUMENT]
    function["parameters"] = parameters
    return {**schema, "function": function}


def read_confidence(value: Any) -> tuple[float | None, str | None]:
    """(confidence clipped to [0, 1] or None, its raw text or None) of a ``confidence`` argument as sent."""
    if value is None:
        return None, None
    if isinstance(value, bool):
        return None, json.dumps(value)
    raw = value if isinstance(value, str) else json.dumps(value)
    return parse_confidence(raw), raw


def split_confidence_line(text: str) -> tuple[str, float | None, str | None]:
    """A plain reply without its last ``Confidence: x`` line: (message, confidence or None, raw text or None)."""
    m = _CONFIDENCE_LINE.search(text)
    if m is None:
        return text.strip(), None, None
    raw = m.group("value").strip()
    return text[: m.start()].strip(), parse_confidence(raw), raw


def call_token_range(name: str, arguments: dict[str, Any], tokens: list[str] | None) -> tuple[int, int] | None:
    """The tokens that spell the call in the generated text (a server that returns logprobs for a call returns the
    text it generated, e.g. ``{"name": "calc", "arguments": {"expression": "6*7", ...}}``): from the function's
    name to the end of its last argument value other than the confidence, as the react agent's range covers
    ``Calc[6*7]``. None without tokens, or when the name or a value is not found as JSON spells it."""
    if not tokens:
        return None
    text = "".join(tokens)
    start = text.find(name)
    if start < 0:
        return None
    end = start + len(name)
    for value in arguments.values():  # the confidence is already taken out
        spelled = json.dumps(value, ensure_ascii=False)
        spelled = spelled[1:-1] if isinstance(value, str) else spelled
        found = text.find(spelled, end)
        if found < 0:
            return None
        end = found + len(spelled)
    return char_span_to_token_range((start, end), tokens, text)


def _assistant_message(attempt: Attempt) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": attempt.raw_text or None}
    if attempt.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in attempt.tool_calls]
    return message


class ToolCallingAgent:
    """Native function calling over a domain's :class:`ToolOffer`."""

    name = "tools"
    description = "native function calling: the domain's actions as tools, each with a required confidence argument"

    def __init__(self, offer: ToolOffer):
        self.offer = offer
        self.system_prompt = tools_system_prompt(offer)
        self.tools = [with_confidence(s) for s in offer.schemas]

    @classmethod
    def system_prompt_for(cls, domain: Any) -> str:
        return tools_system_prompt(domain.tool_offer())

    @classmethod
    def for_domain(cls, domain: Any, system_prompt: str) -> "ToolCallingAgent":
        return cls(domain.tool_offer())

    def conversation(self, task_prompt: str, steps: list[Step]) -> list[dict]:
        messages = [{"role": "system", "content": self.system_prompt}, *self.offer.opening_messages(task_prompt)]
        for step in steps:
            for att in step.attempts:
                if att.error is not None:
                    messages.extend(self.rejected_messages(att))
                else:
                    messages.extend(self.step_messages(att, step.observation))
        return messages

    async def ask(self, client: ModelClient, messages: list[dict], seed: int | None) -> Completion:
        completion = await client.complete(messages, seed=seed, tools=self.tools)
        if completion.tool_calls:  # a provider without call ids: ours, so the result can name its call
            for i, call in enumerate(completion.tool_calls):
                if not call.id:
                    call.id = f"call_{i}"
        return completion

    def decide(self, completion: Completion) -> Decision | Rejection:
        calls = completion.tool_calls or []
        if len(calls) > 1:
            return Rejection(f"you called {len(calls)} tools at once; call exactly one tool per turn")
        if not calls:
            return self._decide_reply(completion.text)
        tokens = [t.token for t in completion.tokens] if completion.tokens else None
        return self._decide_call(calls[0], completion.text, tokens)

    def _decide_call(self, call: ToolCallRecord, content: str, tokens: list[str] | None = None
                     ) -> Decision | Rejection:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as e:
            return Rejection(f"the arguments of {call.name} are not valid JSON ({e.msg} at position {e.pos})")
        if not isinstance(arguments, dict):
            return Rejection(f"the arguments of {call.name} must be a JSON object")
        confidence, raw = read_confidence(arguments.pop(CONFIDENCE_ARGUMENT, None))
        try:
            action = self.offer.action(call.name, arguments)
        except ToolCallRejected as exc:
            return Rejection(str(exc))
        return Decision(action=action, verbal_confidence=confidence, confidence_raw=raw, think=content.strip(),
                        action_token_range=call_token_range(call.name, arguments, tokens))

    def _decide_reply(self, text: str) -> Decision | Rejection:
        message, confidence, raw = split_confidence_line(text)
        action = self.offer.text_action(message) if message else None
        if action is None:
            what = "your answer was empty" if not message else "your answer called no tool"
            return Rejection(f"{what}; call exactly one of the tools: {', '.join(self.offer.names)}")
        return Decision(action=action, verbal_confidence=confidence, confidence_raw=raw)

    def invalid_action_problem(self, action: str, reason: str) -> str:
        return invalid_action_problem(action, reason)

    def rejected_messages(self, attempt: Attempt) -> list[dict]:
        problem = f"Your previous answer could not be used: {attempt.error}"
        if attempt.tool_calls:  # every call is answered (the API requires it), each with what was wrong
            return [_assistant_message(attempt),
                    *({"role": "tool", "tool_call_id": c.id, "content": problem} for c in attempt.tool_calls)]
        return [_assistant_message(attempt), {"role": "user", "content": problem}]

    def step_messages(self, attempt: Attempt, observation: str) -> list[dict]:
        if attempt.tool_calls:
            return [_assistant_message(attempt),
                    {"role": "tool", "tool_call_id": attempt.tool_calls[0].id, "content": observation}]
        return [_assistant_message(attempt), self.offer.reply_message(observation)]


def tools_system_prompt(offer: ToolOffer) -> str:
    """The tools agent's system prompt: the domain's instructions, then how to give the confidence (for a plain
    reply too, where the domain takes one)."""
    calls, replies = CONFIDENCE_PROMPT.strip().split("\n\n", 1)
    parts = [offer.instructions.rstrip(), calls, *([replies] if offer.accepts_replies else [])]
    return "\n\n".join(parts) + "\n"
