"""Tau2's tools as tau2's own LLM agent offers them (``uqh run --agent tools``): the schemas are each tool's
``openai_schema`` and the system prompt is tau2's ``LLMAgent.system_prompt`` (tau2's code, called, not copied); a
call becomes ``Tool[name, {...}]`` and a plain reply ``Respond["..."]``, the actions the react agent writes, so the
environment, its record and its replay are the same for both agents."""
from __future__ import annotations

import json
from typing import Any

from uqh.domains.tau2.access import GREETING
from uqh.domains.tool_offer import ToolOffer

#: How the Tau2 task prompt starts (``uqh.domains.tau2.episode.task_prompt_for``): tau2's greeting, then the user.
_OPENING = f"Assistant: {GREETING}\nUser: "
_USER_TURN = "User: "


class Tau2ToolOffer(ToolOffer):
    """tau2's agent tools; any name is passed on (tau2's environment answers an unknown one with an error result,
    as it does for its own agent), and a plain reply is a message to the user."""

    accepts_replies = True

    def __init__(self, tools: list[Any], policy: str):
        from tau2.agent.llm_agent import LLMAgent

        super().__init__([], LLMAgent(tools=tools, domain_policy=policy).system_prompt)
        self.schemas = [t.openai_schema for t in tools]

    def action(self, name: str, arguments: dict[str, Any]) -> str:
        return f"Tool[{name}, {json.dumps(arguments, ensure_ascii=False)}]"

    def text_action(self, text: str) -> str | None:
        return f"Respond[{json.dumps(text, ensure_ascii=False)}]"

    def opening_messages(self, task_prompt: str) -> list[dict[str, Any]]:
        """tau2's agent history starts with its greeting and the user's opening turn (both in the task prompt)."""
        if not task_prompt.startswith(_OPENING):
            return super().opening_messages(task_prompt)
        return [{"role": "assistant", "content": GREETING},
                {"role": "user", "content": task_prompt[len(_OPENING):]}]

    def reply_message(self, observation: str) -> dict[str, Any]:
        """The user's answer, as tau2's agent sees it (without the ``User:`` our observation shows)."""
        text = observation[len(_USER_TURN):] if observation.startswith(_USER_TURN) else observation
        return {"role": "user", "content": text}
