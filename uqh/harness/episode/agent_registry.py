"""The agents by name (``uqh run --agent NAME``; ``RunConfig.agent``): the ``uqh.agents`` entry points (uqh's own,
``react`` and ``tools``, are declared in pyproject.toml the same way as a plugin's; :mod:`uqh.rundir.entry_points`).

An agent entry point names a class with a ``description`` (one line for ``uqh list`` and ``--help``) and two class
methods: ``system_prompt_for(domain)`` -- the system prompt a run records (its sha256 is in the config) -- and
``for_domain(domain, system_prompt)`` -- the agent for that run's episodes (:class:`Agent`).
"""
from __future__ import annotations

from typing import Any

from uqh.harness.episode.agent_protocol import Agent
from uqh.rundir import entry_points
from uqh.rundir.errors import UserError

ENTRY_POINT_GROUP = "uqh.agents"
_CLASSES: dict[str, Any] = {}


def agent_names() -> list[str]:
    return list(entry_points.active(ENTRY_POINT_GROUP))


def agent_class(name: str) -> Any:
    """The class of agent ``name``, imported on first use; an unknown name is one line."""
    if name not in _CLASSES:
        ext = entry_points.active(ENTRY_POINT_GROUP).get(name)
        if ext is None:
            raise UserError(f"unknown --agent {name!r}; choose one of: {', '.join(agent_names())}")
        cls = entry_points.load(ext)
        if not all(callable(getattr(cls, m, None)) for m in ("system_prompt_for", "for_domain")):
            raise UserError(f"the agent entry point {name!r} (from {ext.source}) is not a uqh agent class "
                            f"(system_prompt_for, for_domain): {ext.value}")
        _CLASSES[name] = cls
    return _CLASSES[name]


def check_agent(name: str) -> str:
    agent_class(name)
    return name


def agent_system_prompt(domain: Any, name: str) -> str:
    """The system prompt a run of ``domain`` with agent ``name`` sends and records (its sha256 is in the config)."""
    return agent_class(name).system_prompt_for(domain)


def make_agent(name: str, domain: Any, system_prompt: str) -> Agent:
    """The agent ``name`` for episodes of ``domain``; ``system_prompt`` is the run's."""
    return agent_class(name).for_domain(domain, system_prompt)
