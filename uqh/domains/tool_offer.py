"""A domain's actions offered as native function-calling tools (``uqh run --agent tools``, docs/agents.md).

A :class:`ToolOffer` says which OpenAI function schemas the model is offered, what the agent is told, and how a
call (or, where the domain allows it, a plain reply) becomes the domain's own action string: the environment is
stepped, recorded, replayed and resumed with the same actions as under the react agent. The verbal confidence is
not part of these schemas: the agent adds it to every tool (:mod:`uqh.harness.episode.tool_calling_agent`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


class ToolCallRejected(Exception):
    """A call that names no offered tool or lacks a required argument: the message is what the model is told in
    its repair (the environment is not stepped)."""


@dataclass(frozen=True)
class BracketTool:
    """A tool that is a bracket action ``Action[argument]`` of the react grammar: one string parameter, or none."""

    action: str  # the react action name: "Calc"
    name: str  # the function name offered: "calc"
    description: str
    parameter: str | None = None  # the one argument's name: "expression"
    parameter_description: str = ""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (``{"type": "function", "function": {...}}``)."""
        properties: dict[str, Any] = {}
        required: list[str] = []
        if self.parameter is not None:
            properties[self.parameter] = {"type": "string", "description": self.parameter_description}
            required.append(self.parameter)
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": properties, "required": required}}}

    def action_text(self, arguments: dict[str, Any]) -> str:
        if self.parameter is None:
            return f"{self.action}[]"
        value = arguments.get(self.parameter)
        if value is None:
            raise ToolCallRejected(f"{self.name} needs the argument {self.parameter!r}")
        return f"{self.action}[{value if isinstance(value, str) else _plain(value)}]"


def _plain(value: Any) -> str:
    """A non-string argument as the react grammar would spell it (``42``, not ``42.0`` for whole floats)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class ToolOffer:
    """What the tools agent offers the model in one domain: ``schemas`` (OpenAI function schemas, without the
    confidence argument), ``instructions`` (the system prompt, before the agent's confidence paragraph), and the
    translation of a call into the domain's action string. Subclasses override the conversation hooks where the
    domain's own agent sees its history differently (Tau2: the greeting and the user's turns)."""

    #: A reply without a tool call is an action (:meth:`text_action`; Tau2: a message to the user).
    accepts_replies: ClassVar[bool] = False

    def __init__(self, tools: list[BracketTool], instructions: str):
        self.tools = {t.name: t for t in tools}
        self.schemas = [t.schema() for t in tools]
        self.instructions = instructions

    @property
    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]

    def action(self, name: str, arguments: dict[str, Any]) -> str:
        """The domain action of a call (the confidence argument already taken out); ToolCallRejected if none."""
        tool = self.tools.get(name)
        if tool is None:
            raise ToolCallRejected(f"there is no tool {name!r}; call one of: {', '.join(self.names)}")
        return tool.action_text(arguments)

    def text_action(self, text: str) -> str | None:
        """The domain action of a reply without a tool call, or None: here every action is a tool call."""
        return None

    def opening_messages(self, task_prompt: str) -> list[dict[str, Any]]:
        """The messages after the system prompt that state the task."""
        return [{"role": "user", "content": task_prompt}]

    def reply_message(self, observation: str) -> dict[str, Any]:
        """The message that answers a plain reply (:meth:`text_action`) with the step's observation."""
        return {"role": "user", "content": observation}
