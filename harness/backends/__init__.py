"""Where a batch's episodes run: this machine (in this process, or ``--workers N`` processes) or a Ray cluster.

:func:`harness.runner.run_batch` owns the run directory and hands the episodes still to run to a backend together
with :class:`BatchHooks`, the driver's side of the batch: whichever backend runs the episodes, the driver is the
only writer of the run directory (the same :class:`harness.store.RunStore`, files, crash safety and resume), so a
resumed run may switch backends. A backend returns a :class:`BackendResult`.

- :class:`LocalBackend`: one event loop in this process, or the worker processes of :mod:`harness.workers`.
- :class:`harness.backends.ray_backend.RayBackend` (``uqh run --backend ray``): per-CPU actors on a Ray cluster;
  Ray is imported only when it is used.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from harness.endpoints import EndpointCounts
from harness.loop import EpisodeResult, EpisodeSpec
from harness.progress import EpisodeSummary
from harness.runner import RunContext, StopCause, _run_in_process, gc_tuned
from rundir.errors import UserError

__all__ = ["BACKENDS", "Backend", "BackendResult", "BatchHooks", "LocalBackend", "make_backend"]

#: The names ``uqh run --backend`` accepts.
BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class BatchHooks:
    """The driver's side of a batch (built by :func:`harness.runner.run_batch`; the only writer)."""

    #: An episode finished in this process: append it (runs in the batch's I/O thread); returns its accounting.
    persist: Callable[[EpisodeResult], EpisodeSummary]
    #: Count an episode that ``persist`` wrote.
    counted: Callable[[EpisodeSummary], None]
    #: An episode finished in another process, already serialized: append it and count it.
    write: Callable[[str, bytes, bytes, EpisodeSummary], None]
    #: An episode failed on infrastructure (not written; re-queued by the next run).
    error: Callable[[EpisodeSpec | None, str, int], None]
    #: A checkpoint (JSON) of an episode running in a process that does not write the run directory.
    write_checkpoint: Callable[[str, str], None]
    #: Replaces :func:`harness.model_client.make_model_client` (tests; in-process runs only).
    client_factory: Callable[[str, str | None], Any] | None = None
    #: The progress line's counters (calls as they return, in-process runs only).
    stats: Any = None
    #: Count the calls (:class:`harness.progress.CallTotals`) of an episode that ended without a result in another
    #: process (failed, or cut short by a stop): made and paid for in this session, never written.
    unfinished_calls: Callable[[Any], None] = lambda calls: None


@dataclass
class BackendResult:
    """What a backend reports besides the episodes it handed to the hooks."""

    #: Why the batch stopped early (None: every episode was attempted).
    stopped: StopCause | None = None
    #: CPU seconds (user + system) of the processes that ran episodes, when they are not this one.
    worker_cpu_s: float = 0.0
    #: Requests per endpoint (several endpoints), summed over the processes that made them.
    endpoint_calls: list[EndpointCounts] = field(default_factory=list)
    #: Lines for the run summary (e.g. episodes re-queued after a worker died).
    notes: list[str] = field(default_factory=list)


class Backend(Protocol):
    name: str

    def run(self, ctx: RunContext, specs: list[EpisodeSpec], domain: Any, hooks: BatchHooks) -> BackendResult:
        """Run ``specs`` (none finished yet; some may resume from a checkpoint) and hand every finished or failed
        episode to ``hooks``; stop early on a stop signal (:mod:`harness.stop`), a write failure or an
        unreachable endpoint."""
        ...


class LocalBackend:
    """This machine: one event loop in this process, or ``workers`` processes (:mod:`harness.workers`)."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        self.workers = max(1, int(workers))

    def run(self, ctx: RunContext, specs: list[EpisodeSpec], domain: Any, hooks: BatchHooks) -> BackendResult:
        result = BackendResult()
        if self.workers == 1 or len(specs) == 1:
            with gc_tuned():
                asyncio.run(_run_in_process(ctx, specs, domain, hooks.persist, hooks.counted, hooks.error,
                                            hooks.client_factory, result.endpoint_calls, hooks.stats))
            return result
        from harness.workers import run_workers

        result.worker_cpu_s, result.stopped, result.endpoint_calls = run_workers(
            ctx, specs, self.workers, hooks.write, hooks.error, hooks.unfinished_calls)
        return result


def make_backend(name: str, *, workers: int | None = None, ray_address: str | None = None) -> Backend | None:
    """The backend of ``--backend NAME`` (None: the local one, which :func:`harness.runner.run_batch` makes with
    its ``workers``). ``workers``: with Ray, the number of actors (default: one per CPU of the cluster)."""
    if name == "local":
        if ray_address is not None:
            raise UserError("--ray-address needs --backend ray")
        return None
    if name == "ray":
        from harness.backends.ray_backend import RayBackend

        return RayBackend(address=ray_address, actors=workers)
    raise UserError(f"unknown --backend {name!r}; use one of {', '.join(BACKENDS)}")
