"""The backend interface: what a driver hands a backend (:class:`BatchHooks`), what a backend reports
(:class:`BackendResult`), and :class:`Backend` itself."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol, Union

from uqh.harness.backends.context import RunContext, StopCause
from uqh.harness.episode.loop import EpisodeResult, EpisodeSpec
from uqh.harness.model.endpoints import EndpointCounts
from uqh.harness.progress import BatchStats, CallTotals, EpisodeSummary
from uqh.rundir.schema import RunConfig

#: The episodes of a batch: a list, or a source to pull them from one at a time (None: no more), as consensus
#: sampling schedules a task's next sample from its finished ones.
SpecSource = Union[list[EpisodeSpec], Callable[[], Awaitable[Union[EpisodeSpec, None]]]]


@dataclass(frozen=True)
class BatchHooks:
    """The driver's side of a batch (built by :func:`uqh.harness.runner.run_batch`; the only writer)."""

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
    #: Replaces :func:`uqh.harness.model.client.make_model_client` (tests; in-process runs only).
    client_factory: Callable[[str, str | None], Any] | None = None
    #: The progress line's counters (calls as they return, in-process runs only).
    stats: BatchStats | None = None
    #: Count the calls (:class:`uqh.harness.progress.CallTotals`) of an episode that ended without a result in another
    #: process (failed, or cut short by a stop): made and paid for in this session, never written.
    unfinished_calls: Callable[[CallTotals], None] = lambda calls: None


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
    """Where a batch's episodes run. A backend is a context manager (what it holds -- a cluster connection, a
    local Ray instance -- lives for the block, and may serve several batches) and checks a config before anything
    is written."""

    name: str
    #: True when the episodes run on this process's event loop (what consensus sampling needs).
    in_process: bool

    def check(self, config: RunConfig) -> None:
        """Refuse (``UserError``, one line) a config this backend cannot run, before anything is written."""
        ...

    def __enter__(self) -> "Backend": ...

    def __exit__(self, *exc: object) -> None: ...

    def run(self, ctx: RunContext, specs: Any, domain: Any, hooks: BatchHooks) -> BackendResult:
        """Run ``specs`` (none finished yet; some may resume from a checkpoint) and hand every finished or failed
        episode to ``hooks``; stop early on a stop signal (:mod:`uqh.harness.interrupts`), a write failure or an
        unreachable endpoint."""
        ...


