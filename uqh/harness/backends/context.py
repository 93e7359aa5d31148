"""What every process that runs a batch's episodes shares (:class:`RunContext`), and why a batch stopped early
(:class:`StopCause`). Built once by :func:`uqh.harness.runner.run_batch`, handed to a backend."""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from pathlib import Path

from uqh.domains.base import Runtime
from uqh.harness import interrupts
from uqh.harness.config.settings import CHECKPOINT_INTERVAL_S, ClientSettings
from uqh.harness.model.llama_server import ServedModel
from uqh.rundir.errors import RunDirWriteError, first_line
from uqh.rundir.schema import RunConfig

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
    in-process loop or, pickled once, to each worker process (or Ray actor)."""

    config: RunConfig
    system_prompt: str
    #: The agent's model, resolved (a ``local:`` model is already serving): its litellm string, endpoint(s) and
    #: their capacity; :func:`uqh.harness.config.build.build_client` takes it as it is.
    agent_model: ServedModel
    run_dir: Path
    #: How the agent's model client calls (timeout, retries, breaker): the run's settings, unchanged.
    client: ClientSettings = ClientSettings()
    #: The simulated user's model, resolved (``config.user_model`` set), else None.
    user: ServedModel | None = None
    checkpoints: bool = True
    checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S
    #: Episodes in flight in this process: the whole ``--concurrency``, or one worker's share of it.
    concurrency: int = 1

    def domain_runtime(self) -> Runtime:
        """The run-time facts for :meth:`uqh.domains.base.Domain.prepare_runtime`."""
        runtime: Runtime = {"run_dir": self.run_dir}
        if self.config.user_model:
            runtime.update(
                user_model=self.user.model, user_api_base=self.user.api_base, user_decoding=self.config.user_decoding,
                user_timeout_s=self.client.timeout_s,  # --timeout bounds the simulated user's calls too
            )
            if self.config.user_logprobs is not None:
                runtime["user_logprobs"] = self.config.user_logprobs
        return runtime
