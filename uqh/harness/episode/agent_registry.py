"""The built-in agents by name (``uqh run --agent NAME``; ``RunConfig.agent``) and the system prompt each records."""
from __future__ import annotations

from typing import Any

from uqh.harness.episode.agent_protocol import Agent
from uqh.harness.episode.react_agent import ReactAgent
from uqh.harness.episode.tool_calling_agent import ToolCallingAgent, tools_system_prompt
from uqh.rundir.errors import UserError
from uqh.rundir.schema import DEFAULT_AGENT

#: Name -> one line on what it is (``uqh run --help``); ``react`` is the default and the paper's loop.
AGENTS = {
    DEFAULT_AGENT: "the paper's four-tag ReAct text loop (default)",
    "tools": "native function calling: the domain's actions as tools, each with a required confidence argument",
}


def check_agent(name: str) -> str:
    if name not in AGENTS:
        raise UserError(f"unknown --agent {name!r}; choose one of: {', '.join(AGENTS)}")
    return name


def agent_system_prompt(domain: Any, name: str) -> str:
    """The system prompt a run of ``domain`` with agent ``name`` sends and records (its sha256 is in the config)."""
    if check_agent(name) == DEFAULT_AGENT:
        return domain.system_prompt()
    return tools_system_prompt(domain.tool_offer())


def make_agent(name: str, domain: Any, system_prompt: str) -> Agent:
    """The agent ``name`` for episodes of ``domain``; ``system_prompt`` is the run's (the react agent's prompt)."""
    if check_agent(name) == DEFAULT_AGENT:
        return ReactAgent(system_prompt)
    return ToolCallingAgent(domain.tool_offer())
