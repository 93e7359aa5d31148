"""What every process that runs a batch's episodes shares (:class:`RunContext`), and why a batch stopped early
(:class:`StopCause`). Built once by :func:`uqh.harness.runner.run_batch`, handed to a backend."""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from pathlib import Path

from uqh.domains.base import Runtime
from uqh.harness import interrupts
from uqh.harness.model.breaker import DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_WINDOW_S
from uqh.rundir.errors import RunDirWriteError, first_line
from uqh.rundir.schema import RunConfig

#: Per-call request timeout (seconds) and retries of a transient failure, unless ``uqh run --timeout`` /
#: ``--max-retries`` say otherwise.
DEFAULT_TIMEOUT_S = 600.0


DEFAULT_MAX_RETRIES = 6


#: An in-flight episode is checkpointed after its first step, then after a step only if its last checkpoint is at
#: least this old: with real models (seconds per call) that is every step; with a fast local endpoint it bounds
#: the I/O to a few writes per second per episode. A resume repeats at most this much work per episode.
CHECKPOINT_INTERVAL_S = 1.0


#: Generation-0 threshold of the garbage collector while a batch runs. Every model call allocates a few hundred
#: small objects (the typed logprob rows) that live until the episode is written, so with CPython's default (700)
#: the collector runs several times per call and rescans the young episodes each time: about 0.4 ms of CPU per
#: call at concurrency 64 (benchmarks/harness_throughput.py). A higher threshold keeps the same collections
#: (cycles are still freed), just in fewer, larger passes.
GC_GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def gc_tuned(gen0: int = GC_GEN0_THRESHOLD):
    """Raise the collector's generation-0 threshold (never lower it) for the block; restore it afterwards."""
    old = gc.get_threshold()
    if old[0] and old[0] < gen0:  # 0 means the caller switched automatic collection off: leave it so
        gc.set_threshold(gen0, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


@dataclass(frozen=True)
class StopCause:
    """Why a batch stopped before its end: ``message`` and ``hint`` are one phrase each (``uqh run`` prints
    ``message; N episodes not finished; hint``); ``signum`` when a signal stopped it."""

    message: str
    hint: str = "re-run the same command to resume"
    signum: int | None = None

    @classmethod
    def signal(cls, signum: int) -> StopCause:
        return cls(f"interrupted by {interrupts.signal_name(signum)}", signum=signum)

    @classmethod
    def write_failure(cls, exc: RunDirWriteError) -> "StopCause":
        return cls(str(exc), exc.hint)

    @classmethod
    def unreachable(cls, exc: BaseException) -> "StopCause":
        return cls(first_line(exc), "start the server or correct the address (--api-base), then re-run the same "
                                     "command to resume")

    @classmethod
    def endpoints_down(cls, exc: BaseException) -> "StopCause":
        return cls(first_line(exc), "check the model's endpoints (or raise --breaker-failures / --breaker-window), "
                                     "then re-run the same command to resume")

    @property
    def exit_code(self) -> int:
        return interrupts.exit_code(self.signum) if self.signum is not None else 1


class BatchStopped(Exception):
    """Raised out of :func:`run_specs` when a :class:`StopCause` (other than a signal) stopped it."""

    def __init__(self, cause: StopCause) -> None:
        super().__init__(cause.message)
        self.cause = cause


@dataclass(frozen=True)
class RunContext:
    """What every process that runs episodes of a batch needs, built once by :func:`run_batch` and handed to the
    in-process loop or, pickled once, to each worker process."""

    config: RunConfig
    system_prompt: str
    #: The agent's litellm model string and endpoint, resolved (a ``local:`` model is already serving).
    model: str
    api_base: str | None
    run_dir: Path
    #: Two or more endpoints serving the model (``config.api_bases``; ``api_base`` is the first), else empty.
    api_bases: tuple[str, ...] = ()
    #: Requests each of those serves at once, when known (a local model's slots per server process), else None.
    endpoint_capacity: int | None = None
    #: The simulated user's model and endpoint, resolved (``config.user_model`` set), else None.
    user_model: str | None = None
    user_api_base: str | None = None
    checkpoints: bool = True
    checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S
    #: Episodes in flight in this process: the whole ``--concurrency``, or one worker's share of it.
    concurrency: int = 1
    #: Per-call timeout and transient-failure retries of the agent's model client.
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES
    #: The circuit breaker of the agent's model client (:mod:`uqh.harness.model.breaker`).
    breaker_failures: int = DEFAULT_BREAKER_FAILURES
    breaker_window_s: float = DEFAULT_BREAKER_WINDOW_S

    def domain_runtime(self) -> Runtime:
        """The run-time facts for :meth:`uqh.domains.base.Domain.prepare_runtime`."""
        runtime: Runtime = {"run_dir": self.run_dir}
        if self.config.user_model:
            runtime.update(
                user_model=self.user_model, user_api_base=self.user_api_base, user_decoding=self.config.user_decoding,
                user_timeout_s=self.timeout_s,  # --timeout bounds the simulated user's calls too
            )
            if self.config.user_logprobs is not None:
                runtime["user_logprobs"] = self.config.user_logprobs
        return runtime
