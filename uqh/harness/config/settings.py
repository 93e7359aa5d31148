"""The typed settings of a run, built once (by ``uqh run``'s flags or by a caller of :func:`uqh.run`) and passed
down unchanged: :class:`RunSettings` holds what to run (:class:`RunOverrides` on top of an optional preset, which
:func:`uqh.harness.config.build.resolve_config` turns into the :class:`uqh.rundir.schema.RunConfig`) and how
(:class:`BatchSettings`: concurrency, processes, progress, checkpoints, and the :class:`ClientSettings` that reach
the model client as they are).

Every numeric flag's range is one :class:`Bounds` here, used by the command line's argument types
(:mod:`uqh.cli.arg_types`, every command) and by these models' validation, so a value means and is refused the same
everywhere, with the same words.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from uqh.harness.model.breaker import DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_WINDOW_S
from uqh.rundir.errors import UserError

#: Per-call request timeout (seconds) and retries of a transient failure, unless ``--timeout`` /
#: ``--max-retries`` say otherwise.
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MAX_RETRIES = 6

#: An in-flight episode is checkpointed after its first step, then after a step only if its last checkpoint is at
#: least this old: with real models (seconds per call) that is every step; with a fast local endpoint it bounds
#: the I/O to a few writes per second per episode. A resume repeats at most this much work per episode.
CHECKPOINT_INTERVAL_S = 1.0

#: What providers accept: OpenAI's chat API takes at most 20 top logprobs; seeds are 32-bit on llama.cpp / vLLM
#: and a signed 32-bit integer is the range every provider takes. Seeds of the other commands (bootstrap, sample
#: draws, judges, probes) take the same range, so one seed works everywhere.
MAX_TOP_LOGPROBS = 20
MAX_SEED = 2**31 - 1


@dataclass(frozen=True)
class Bounds:
    """The range of a numeric flag; :meth:`problem` says what is wrong with a value in the one wording every
    command uses (``must be >= 1, got 0``), :meth:`check` raises it as a UserError naming the flag."""

    low: float | None = None
    high: float | None = None
    #: ``> low`` rather than ``>= low`` (a timeout of 0 seconds is no timeout).
    low_open: bool = False
    unit: str = ""
    #: Why the range is what it is, when that is not obvious (shown after the range).
    why: str = ""

    def problem(self, value: float) -> str | None:
        """None when ``value`` is in range, else ``must be ..., got VALUE``."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value}"
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and value > self.high
        if not (too_low or too_high):
            return None
        unit = f" {self.unit}" if self.unit else ""
        why = f" ({self.why})" if self.why else ""
        if self.low is not None and self.high is not None:
            rng = f"between {_num(self.low)} and {_num(self.high)}{unit}"
        elif self.low is not None:
            rng = f"{'>' if self.low_open else '>='} {_num(self.low)}{unit}"
        else:
            rng = f"<= {_num(self.high)}{unit}"
        return f"must be {rng}{why}, got {_num(value)}"

    def check(self, flag: str, value: float | None) -> None:
        """UserError ``FLAG must be ..., got VALUE`` unless ``value`` is None or in range."""
        problem = None if value is None else self.problem(value)
        if problem:
            raise UserError(f"{flag} {problem}")


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


#: A seed of any command (run, continue --sample, judge, probe, and every bootstrap).
SEED = Bounds(0, MAX_SEED, why="a 32-bit seed, as providers take")
#: ``--top-logprobs`` of every command that asks a model for them.
TOP_LOGPROBS = Bounds(0, MAX_TOP_LOGPROBS, why="the most providers return")
#: A count of at least one: tasks, samples, steps, tokens, concurrency, workers, breaker failures, resamples.
AT_LEAST_ONE = Bounds(1)
#: A count that may be zero: retries, resamples where 0 means none.
AT_LEAST_ZERO = Bounds(0)
#: A duration that must pass: a per-call timeout.
POSITIVE_SECONDS = Bounds(0, low_open=True, unit="seconds")
#: A duration that may be zero: the breaker's window.
SECONDS = Bounds(0, unit="seconds")


class DecodingOverrides(BaseModel):
    """The :class:`DecodingConfig` fields given on the command line (None: not given)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    top_logprobs: int | None = None
    logprobs: bool | None = None
    grammar: bool | None = None
    reasoning: bool | None = None


class RunOverrides(BaseModel):
    """What the command line sets on top of a preset (None / empty: not given). Built by the CLI from its flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    domain: str | None = None
    split: str | None = None
    tasks: int | None = Field(None, description="the domain's first (or sampled) N tasks")
    task_ids: list[str] | None = Field(None, description="exactly these task ids, in this order")
    samples: int | None = None
    step_budget: int | None = None
    observation_chars: int | None = None
    model: str | None = None
    api_base: str | None = None
    api_bases: list[str] | None = Field(
        None, description="two or more endpoints serving the model (--api-base repeated, --endpoints FILE); "
        "api_base is then the first")
    user_model: str | None = None
    user_api_base: str | None = None
    user_logprobs: bool | None = Field(
        None, description="ask the simulated user's model for logprobs (top-k: the run's top_logprobs)")
    decoding: DecodingOverrides = DecodingOverrides()
    domain_options: dict[str, Any] = Field(
        default_factory=dict, description="-D key=value and the QA alias flags (--data, --top-k, ...), as given")
    out: Path | None = None
    stop_on_consensus: float | None = Field(
        None, description="sequential sampling: stop a task's samples once its mode is certified at this level")
    stop_rule: str | None = Field(None, description="the stopping rule of --stop-on-consensus (uqh/harness/sampling/consensus.py)")
    agent: str | None = Field(None, description="the agent (uqh run --agent): react (default) or tools")


class ClientSettings(BaseModel):
    """How the agent's model client calls: per-call timeout and retries, and the circuit breaker
    (:mod:`uqh.harness.model.breaker`). Recorded in the manifest's ``execution``, outside the config hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(DEFAULT_TIMEOUT_S, description="seconds one model call may take (--timeout)")
    max_retries: int = Field(DEFAULT_MAX_RETRIES, description="retries of a transient failure (--max-retries)")
    breaker_failures: int = Field(
        DEFAULT_BREAKER_FAILURES, description="stop after this many transient failures in a row (--breaker-failures)")
    breaker_window_s: float = Field(
        DEFAULT_BREAKER_WINDOW_S, description="... once no call has succeeded for this long (--breaker-window)")

    @model_validator(mode="after")
    def _in_range(self) -> ClientSettings:
        POSITIVE_SECONDS.check("--timeout", self.timeout_s)
        AT_LEAST_ZERO.check("--max-retries", self.max_retries)
        AT_LEAST_ONE.check("--breaker-failures", self.breaker_failures)
        SECONDS.check("--breaker-window", self.breaker_window_s)
        return self


class BatchSettings(BaseModel):
    """How a batch runs: where (backend, processes), how many episodes at once, checkpoints, progress, and the
    model client's :class:`ClientSettings`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: int | None = Field(None, description="episodes in flight (None: 8; 4 for local: models)")
    workers: int | None = Field(
        None, description="local worker processes (None: 1), or with the ray backend actors (None: one per CPU)")
    backend: Literal["local", "ray"] = "local"
    ray_address: str | None = Field(None, description="with backend ray: auto or ray://HOST:PORT (None: start one)")
    progress: bool = True
    checkpoints: bool = True
    checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S
    client: ClientSettings = ClientSettings()

    @model_validator(mode="after")
    def _in_range(self) -> BatchSettings:
        AT_LEAST_ONE.check("--concurrency", self.concurrency)
        AT_LEAST_ONE.check("--workers", self.workers)
        AT_LEAST_ZERO.check("checkpoint_interval_s", self.checkpoint_interval_s)
        if self.ray_address is not None and self.backend != "ray":
            raise UserError("--ray-address needs --backend ray")
        return self


class RunSettings(BaseModel):
    """Everything a run is given: ``uqh run``'s flags, or what a caller of :func:`uqh.run` sets.

    ``preset`` (a name of :mod:`uqh.harness.config.presets`) and ``run`` make the RunConfig (flags win over the
    preset); ``batch`` says how it runs. ``uqh.run(RunSettings(run=RunOverrides(domain="arithmetic", tasks=3,
    model="openai/m", api_base=URL, out=Path("runs/a"))))`` is ``uqh run --domain arithmetic --tasks 3 --model
    openai/m --api-base URL --out runs/a``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str | None = None
    run: RunOverrides = RunOverrides()
    batch: BatchSettings = BatchSettings()
