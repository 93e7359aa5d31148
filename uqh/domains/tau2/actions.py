"""The agent's action grammar: ``Tool[name, {json object}]`` or ``Respond["text"]``.

Only the *shape* is checked here. A well-formed call naming a tool the domain does not have, or carrying
arguments the tool rejects, is not a grammar error: it goes to tau2's environment, which answers with an error
tool result the agent sees and tau2 counts toward ``max_errors`` -- what tau2's orchestrator does with such a
call from its own agent.
"""
from __future__ import annotations

import json
import re
from typing import Any

from uqh.domains.base import InvalidAction

_TOOL_RE = re.compile(r"\ATool\[\s*(?P<name>[^,\[\]\s]+)\s*,\s*(?P<args>.*)\]\Z", re.DOTALL)
_TOOL_NOARGS_RE = re.compile(r"\ATool\[\s*(?P<name>[^,\[\]\s]+)\s*\]\Z", re.DOTALL)
_RESPOND_RE = re.compile(r"\ARespond\[\s*\"(?P<text>.*)\"\s*\]\Z", re.DOTALL)


def parse_action(action: str, tool_names: list[str]) -> tuple[str, Any]:
    """Parse the <action> content: ``("tool", (name, args))`` or ``("respond", text)``.

    Raises InvalidAction (a repair) only for a malformed action: no ``Tool[...]`` / ``Respond[...]`` shape,
    arguments that are not valid JSON or not a JSON object, an unquoted or empty message. ``tool_names`` only
    feeds the messages, which say precisely what is wrong and what is allowed.
    """
    a = action.strip()
    known = ", ".join(tool_names)
    m = _TOOL_RE.match(a)
    if m:
        name, raw_args = m.group("name"), m.group("args").strip()
        try:
            args = json.loads(raw_args)
        except json.JSONDecodeError as e:
            raise InvalidAction(
                f"the arguments of Tool[{name}, ...] are not valid JSON ({e.msg} at position {e.pos}); "
                'write Tool[tool_name, {"arg": "value"}] with a JSON object'
            ) from None
        if not isinstance(args, dict):
            raise InvalidAction(
                f"the arguments of Tool[{name}, ...] must be a JSON object {{...}}, got {type(args).__name__}"
            )
        return "tool", (name, args)
    m = _TOOL_NOARGS_RE.match(a)
    if m:
        raise InvalidAction(
            f"Tool[{m.group('name')}] has no arguments; write Tool[tool_name, {{...}}] with a JSON object "
            "(use {} when the tool takes no arguments)"
        )
    m = _RESPOND_RE.match(a)
    if m:
        inner = m.group("text")
        try:
            text = json.loads(f'"{inner}"')  # honour JSON escapes such as \" and \n
        except json.JSONDecodeError:
            text = inner
        if not text.strip():
            raise InvalidAction('Respond[""] is empty; write Respond["your message to the user"]')
        return "respond", text
    if a.startswith("Respond["):
        raise InvalidAction('Respond needs a double-quoted message: Respond["your message to the user"]')
    if a.startswith("Tool["):
        raise InvalidAction(
            f"a tool call must look like Tool[tool_name, {{...valid JSON object...}}]; the tools are: {known}"
        )
    raise InvalidAction(
        'the action must be exactly one of Tool[tool_name, {...valid JSON object...}] or Respond["..."]; '
        f"the tools are: {known}"
    )
