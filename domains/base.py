"""What a domain (benchmark) provides to the harness.

A :class:`Domain` knows its tasks and system prompt and builds one :class:`Environment` per episode.
An environment knows nothing about models, files or concurrency: the loop sends it actions and it
answers with observations, and it can be *replayed* to a recorded prefix (for continuations and
mid-episode crash recovery).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rundir.schema import StopReason

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"


class InvalidAction(Exception):
    """The action is outside the domain's grammar or not possible in the current state.

    The environment state must be unchanged when this is raised. The message is shown to the model
    in a repair request, so it must say precisely what was wrong and what is allowed.
    """


class EnvironmentUnavailable(Exception):
    """The environment could not answer for a reason outside the episode (e.g. the simulated user's model
    endpoint failed after retries): an infrastructure failure, not an outcome. The episode is not written and a
    resumed run re-queues it."""


class ReplayMismatch(Exception):
    """Replaying a recorded prefix produced a different observation than the one recorded."""


@dataclass
class EnvResponse:
    observation: str
    done: bool = False
    outcome: int | None = None  # Y in {0, 1} when done with a clean label
    reward: float | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    # When done without a clean label (Tau2 only): env_terminated or tool_error.
    stop_reason: StopReason | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RecordedStep:
    """What replay needs from one recorded step."""

    action: str
    observation: str
    info: dict[str, Any] = field(default_factory=dict)


class Environment(abc.ABC):
    """One episode's environment."""

    @abc.abstractmethod
    async def reset(self) -> str:
        """Start the episode; return the first user message (task statement + initial observation)."""

    @abc.abstractmethod
    async def step(self, action: str) -> EnvResponse:
        """Apply the content of the <action> tag. Raise InvalidAction (state unchanged) to ask for a repair."""

    async def replay(self, steps: list[RecordedStep]) -> None:
        """Bring a freshly reset environment to the state after ``steps``.

        The default re-executes every action and compares observations; domains whose steps call
        other models (Tau2's user simulator) override this to restore state from the record.
        """
        for i, rec in enumerate(steps, start=1):
            resp = await self.step(rec.action)
            if resp.observation != rec.observation:
                raise ReplayMismatch(
                    f"step {i}: replayed observation differs from the recorded one "
                    f"(recorded {rec.observation[:80]!r}, replayed {resp.observation[:80]!r})"
                )
            if resp.done:
                raise ReplayMismatch(f"step {i}: the episode ended during replay; the prefix is not censored")

    def close(self) -> None:
        """Release resources (override if needed)."""


class Domain(abc.ABC):
    """A benchmark: its tasks, its prompt, and a factory for environments."""

    name: ClassVar[str]
    prompt_file: ClassVar[str]
    default_step_budget: ClassVar[int]
    default_split: ClassVar[str | None] = None
    supports_replay: ClassVar[bool] = True
    #: GBNF rule body for the <action> field used with ``--grammar`` (llama.cpp servers): it constrains the
    #: action to the domain's tool syntax so a small local model yields actions the environment can run.
    #: None keeps the generic length-capped free-text rule of ``prompts/four_tags.gbnf``.
    action_gbnf: ClassVar[str | None] = None
    #: The observation cut `uqh run` records when --observation-chars is not given; None for a domain that shows
    #: observations whole (it ignores ``observation_chars``), so the manifest says what the domain does.
    default_observation_chars: ClassVar[int | None] = 420

    def __init__(self, options: dict[str, Any] | None = None, *, observation_chars: int | None = 420):
        self.options: dict[str, Any] = dict(options or {})
        self.observation_chars = observation_chars

    @abc.abstractmethod
    def all_task_ids(self) -> list[str]:
        """Every task id of the configured split, in the benchmark's canonical order."""

    def select_task_ids(self, n: int | None, seed: int) -> list[str]:
        """The first ``n`` tasks (domains that sample, like HotpotQA, override this deterministically)."""
        ids = self.all_task_ids()
        return ids if n is None else ids[:n]

    def system_prompt(self) -> str:
        return (PROMPTS_DIR / self.prompt_file).read_text()

    @abc.abstractmethod
    def make_env(self, task_id: str, *, episode_seed: int) -> Environment:
        """A fresh environment for one episode of ``task_id``."""

    def prepare_runtime(self, runtime: dict[str, Any]) -> None:
        """Receive run-time facts that are not part of the config hash, before any env is made.

        Keys the runner may pass: ``user_model`` / ``user_api_base`` (a resolved litellm model string and
        endpoint for a simulated user, e.g. when ``local:smollm2`` was started on a free port),
        ``user_decoding`` (DecodingConfig), ``run_dir`` (Path).
        """
        self.runtime = dict(runtime)

    def manifest_info(self) -> dict[str, Any]:
        """Extra facts for the manifest (corpus, goals file hash, data source...)."""
        return {}

    def truncate(self, text: str) -> str:
        if self.observation_chars is None or len(text) <= self.observation_chars:
            return text
        return text[: self.observation_chars]
