"""The batch runner: many episodes concurrently into one run directory, resumable.

Layers (as in tau2-bench): :func:`uqh.harness.episode.loop.run_episode` runs one episode;
:func:`uqh.harness.backends.event_loop.run_specs` runs many on one event loop under a semaphore; a backend
(:mod:`uqh.harness.backends`) decides where that loop runs; :func:`run_batch` plans the batch, owns the run
directory (:class:`uqh.harness.store.writer.RunStore`), the model server's lifetime, progress and resume, and drives
the batch through a backend. What the processes share about the run is one
:class:`uqh.harness.backends.context.RunContext`, built once by :func:`run_batch`.

Resume: finished episode ids are skipped; an in-flight episode with a checkpoint continues from its last
checkpointed step (the last completed step, or at most ``CHECKPOINT_INTERVAL_S`` older) as a
:class:`uqh.harness.episode.loop.Resume` when the domain supports replay (``Domain.supports_replay``), otherwise it restarts
from scratch (its checkpoint is discarded); a checkpoint that no longer replays restarts it as planned
(:func:`uqh.harness.episode.loop.open_episode`). An episode whose model call failed after retries (``ModelCallFailed``) or
that crashed on an unexpected error is an *infrastructure error*: it is not written, it is counted, and re-running
the same command picks it up again.

Workers (``workers > 1``, :mod:`uqh.harness.backends.workers`): N processes, each with its own event loop, model client and
its share of the ``concurrency`` slots; the parent stays the single writer of the JSONL files.

Stopping early -- the batch ends before its last episode, with a :class:`uqh.harness.backends.context.StopCause` in the summary, and re-running
the same command resumes -- on
- SIGINT or SIGTERM (:mod:`uqh.harness.interrupts`): in-flight episodes are cancelled at once (no model request is sent
  after the signal; their checkpoints stay, and the summary counts their calls), episodes already finished are
  still written, worker processes and the local model server are stopped, and the summary is returned within
  about a second;
- a run-directory write failure (:class:`uqh.rundir.errors.RunDirWriteError`: disk full, read-only file system): the
  store has cut its files back to the last whole episode;
- an endpoint that cannot be reached on the first call (:class:`uqh.harness.model.call_errors.EndpointUnreachable`: a wrong
  address or a server that is not up): no retries, no point in trying the other episodes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from datetime import datetime, timezone
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from uqh.harness import interrupts
from uqh.harness.backends.backend import Backend, BatchHooks
from uqh.harness.backends.context import BatchStopped, RunContext, StopCause
from uqh.harness.backends.event_loop import serialize
from uqh.harness.backends.local import LocalBackend
from uqh.harness.config.build import build_domain, preflight, prompt_sha256
from uqh.harness.config.settings import BatchSettings
from uqh.harness.episode.agent_registry import agent_system_prompt
from uqh.harness.episode.loop import EpisodeResult, EpisodeSpec, Resume, derive_seed, episode_id_for
from uqh.harness.model.llama_server import ServedModel, resolve_model, serve_model
from uqh.harness.progress import BatchStats, EpisodeSummary, Progress
from uqh.harness.sampling.scheduler import ConsensusScheduler
from uqh.harness.store.writer import RunStore, write_checkpoint_json
from uqh.rundir.errors import RunDirWriteError, UserError
from uqh.rundir.schema import ExecutionSettings, RunConfig

log = logging.getLogger(__name__)

__all__ = ["BatchSummary", "default_concurrency", "plan_specs", "run_batch"]


def default_concurrency(model: str) -> int:
    """8 for API models; 4 for the local llama.cpp model (one CPU-bound server with 4 slots batching the
    episodes' calls: benchmarks/results/local_model.md)."""
    return 4 if model.startswith("local:") else 8


def plan_specs(config: RunConfig) -> list[EpisodeSpec]:
    """One spec per (task, sample): id ``<task_id>#<k>``, seed derived from the run seed and the id."""
    specs = []
    for task_id in config.task_ids:
        for k in range(config.samples_per_task):
            eid = episode_id_for(task_id, k)
            specs.append(
                EpisodeSpec(episode_id=eid, task_id=task_id, sample_index=k, seed=derive_seed(config.decoding.seed, eid))
            )
    return specs


@dataclass
class BatchSummary:
    run_dir: Path
    planned: int
    finished_before: int
    stats: BatchStats
    notes: list[str] = field(default_factory=list)
    #: CPU seconds (user + system) the worker processes reported at exit (``workers > 1``; 0 otherwise).
    worker_cpu_s: float = 0.0
    #: Planned samples sequential sampling did not draw (``consensus_stopping``; this batch and earlier ones).
    skipped: int = 0
    #: Why the batch stopped early (None: every planned episode was attempted).
    stopped: StopCause | None = None
    #: Finished episodes whose own calls lack sidecar rows (found when the run directory was opened).
    missing_sidecar_episodes: int = 0
    #: Requests per endpoint when the model is served by several (:class:`uqh.harness.model.endpoints.EndpointCounts`).
    endpoint_calls: list = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return self.planned - self.finished_before - self.stats.done - self.skipped

    @property
    def ok(self) -> bool:
        return self.remaining == 0


class _Driver:
    """The driver's side of a batch, handed to the backend as :class:`BatchHooks`: the only writer of the run
    directory, and the counts behind the progress line and the summary."""

    def __init__(self, store: RunStore, stats: BatchStats, client_factory: Callable | None) -> None:
        self.store, self.stats, self.client_factory = store, stats, client_factory
        self.bar: Progress | None = None

    def persist(self, result: EpisodeResult) -> EpisodeSummary:  # runs in the I/O thread
        eid, line, rows, ep_summary = serialize(result)
        self.store.append_serialized(eid, line, rows)
        return ep_summary

    def write(self, episode_id: str, episode_line: bytes, sidecar_bytes: bytes, ep_summary: EpisodeSummary) -> None:
        try:
            self.store.append_serialized(episode_id, episode_line, sidecar_bytes)
        except RunDirWriteError:
            self.stats.add_unfinished_calls(ep_summary)  # made (and paid for) in this session, just not written
            raise
        self.counted(ep_summary)

    def counted(self, ep_summary: EpisodeSummary) -> None:
        self.stats.add(ep_summary)
        self.bar.update()

    def error(self, spec: EpisodeSpec | None, message: str, retries: int = 0) -> None:
        self.stats.add_error(message, retries=retries)
        self.bar.update()

    def write_checkpoint(self, episode_id: str, data: str) -> None:  # from a process that cannot write run_dir
        if episode_id not in self.store.finished_ids:  # a late checkpoint must not outlive its episode
            write_checkpoint_json(self.store.run_dir, episode_id, data)

    def hooks(self) -> BatchHooks:
        return BatchHooks(persist=self.persist, counted=self.counted, write=self.write, error=self.error,
                          write_checkpoint=self.write_checkpoint, client_factory=self.client_factory,
                          stats=self.stats, unfinished_calls=self.stats.add_unfinished_calls)


def run_batch(
    config: RunConfig,
    run_dir: Path | str,
    settings: BatchSettings = BatchSettings(),
    *,
    specs: list[EpisodeSpec] | None = None,
    client_factory: Callable[[str, str | None], Any] | None = None,
    progress_label: str = "uqh run",
    backend: Backend | None = None,
) -> BatchSummary:
    """Run (or resume) every planned episode of ``config`` into ``run_dir``; return the summary.

    ``settings`` (:class:`uqh.harness.config.settings.BatchSettings`) say how: concurrency, checkpoints, progress,
    and the agent's model client's per-call timeout, retries and circuit breaker (``settings.client``, recorded in
    the manifest's ``execution``, outside the config hash; it reaches the client unchanged). When every endpoint
    keeps failing that often in a row with no success for that long, the batch stops.

    ``backend`` (:mod:`uqh.harness.backends`) runs the episodes: None is this machine (in this process, or in
    ``settings.workers`` processes); the Ray backend runs them on a cluster. Whichever runs them, this process is
    the only writer of ``run_dir``. ``client_factory(litellm_model, api_base)`` replaces
    :func:`uqh.harness.model.client.make_model_client` (tests). SIGINT / SIGTERM during the batch stop it (see the
    module docstring): the summary then says so in ``stopped``.
    """
    run_dir = Path(run_dir)
    domain, system_prompt = _domain_with_prompt(config)
    preflight(config, check_keys=client_factory is None)  # before the run directory and the domain's data
    specs = plan_specs(config) if specs is None else list(specs)
    ids = [s.episode_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("episode ids in specs are not unique")
    backend = backend or LocalBackend(settings.workers or 1)
    # Sequential sampling (`uqh run --stop-on-consensus`) schedules a task's samples from its finished ones
    # (uqh/harness/sampling/scheduler.py); continuation branches are never stopped by consensus.
    sequential = config.consensus_stopping is not None and config.continuation is None
    if sequential and not backend.in_process:
        raise UserError("--stop-on-consensus schedules samples from earlier samples in one process; use --workers 1 "
                        "and the local backend")
    client = settings.client
    execution = ExecutionSettings(
        timeout_s=client.timeout_s, max_retries=client.max_retries, endpoints=config.endpoints or None,
        user_api_base=config.user_api_base, breaker_failures=client.breaker_failures,
        breaker_window_s=client.breaker_window_s, started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))

    with interrupts.stop_signals(), RunStore.open_or_create(
        run_dir, config, system_prompt=system_prompt, info=domain.recorded_info(), execution=execution
    ) as store:
        finished_before = sum(1 for i in ids if i in store.finished_ids)
        todo = _resume_from_checkpoints(store, domain, [s for s in specs if s.episode_id not in store.finished_ids])
        before = Counter(store.finished_stop_reasons[i] for i in ids if i in store.finished_stop_reasons)
        stats = BatchStats(total=len(specs), already_done=finished_before, stop_reasons_before=before)
        summary = BatchSummary(run_dir, len(specs), finished_before, stats, notes=list(store.notes),
                               missing_sidecar_episodes=len(store.missing_sidecar_rows))
        scheduler = None
        if sequential:
            scheduler = ConsensusScheduler.for_batch(config, store, specs, todo, domain)
            summary.skipped = scheduler.n_skipped
            stats.skipped = lambda: scheduler.n_skipped  # the progress total leaves skipped samples out
        if not todo:
            if scheduler is not None:
                store.update_manifest_info(consensus_stopping=scheduler.summary())
            return summary  # nothing to run: nothing more is written
        store.record_execution(execution)
        batch = _Batch(config=config, system_prompt=system_prompt, run_dir=run_dir, settings=settings, domain=domain,
                       todo=todo, scheduler=scheduler, driver=_Driver(store, stats, client_factory), summary=summary,
                       progress=Progress(stats, enabled=settings.progress, label=progress_label))
        _drive(backend, batch)
        return summary


@dataclass
class _Batch:
    """One batch as :func:`run_batch` hands it to :func:`_drive`: what runs, how, and where its results go."""

    config: RunConfig
    system_prompt: str
    run_dir: Path
    settings: BatchSettings
    domain: Any
    todo: list[EpisodeSpec]
    scheduler: ConsensusScheduler | None
    driver: _Driver
    summary: BatchSummary
    progress: Progress


def _domain_with_prompt(config: RunConfig) -> tuple[Any, str]:
    """The run's domain and system prompt; refuses a prompt that changed since the config was made."""
    domain = build_domain(config)
    system_prompt = agent_system_prompt(domain, config.agent)
    if prompt_sha256(system_prompt) != config.prompt_sha256:
        raise UserError(
            f"the {config.domain} system prompt changed since the config was made (sha256 differs); "
            "rebuild the config (uqh run) or restore the prompt file"
        )
    return domain, system_prompt


def _drive(backend: Backend, batch: _Batch) -> None:
    """Resolve the models, then run the episodes through the backend (or consensus sampling); why the batch
    stopped early goes into ``batch.summary.stopped``."""
    summary, driver = batch.summary, batch.driver
    try:
        with contextlib.ExitStack() as stack:
            ctx = _run_context(stack, batch)
            batch.domain.prepare_runtime(ctx.domain_runtime())
            driver.bar = stack.enter_context(batch.progress)
            if batch.scheduler is not None:
                _run_sequential(ctx, batch.scheduler, batch.domain, driver, summary)
            else:
                ran = backend.run(ctx, batch.todo, batch.domain, driver.hooks())
                summary.stopped, summary.worker_cpu_s = ran.stopped, ran.worker_cpu_s
                summary.endpoint_calls = ran.endpoint_calls
                summary.notes += ran.notes
    except BatchStopped as exc:
        summary.stopped = exc.cause
    except RunDirWriteError as exc:
        summary.stopped = StopCause.write_failure(exc)
    except interrupts.Interrupted as exc:
        summary.stopped = StopCause.signal(exc.signum)
    if interrupts.requested() is not None and (summary.stopped is None or summary.stopped.signum is None):
        summary.stopped = StopCause.signal(interrupts.requested())


def _run_context(stack: contextlib.ExitStack, batch: _Batch) -> RunContext:
    """The batch's :class:`RunContext`, with the models resolved (a ``local:`` model starts serving for the
    lifetime of ``stack``, with one slot per concurrent episode over one server process per core: its requests
    are batched and spread, not queued)."""
    config, settings = batch.config, batch.settings
    concurrency = settings.concurrency or default_concurrency(config.model)
    served = stack.enter_context(serve_model(config.model, config.api_base, parallel=concurrency))
    if config.api_bases:
        served = dataclasses.replace(served, api_bases=tuple(config.api_bases))
    user = None
    if config.user_model:
        user = ServedModel(*stack.enter_context(resolve_model(config.user_model, config.user_api_base)))
    return RunContext(config=config, system_prompt=batch.system_prompt, agent_model=served, run_dir=batch.run_dir,
                      client=settings.client, user=user, checkpoints=settings.checkpoints,
                      checkpoint_interval_s=settings.checkpoint_interval_s, concurrency=concurrency)


def _run_sequential(ctx: RunContext, scheduler: ConsensusScheduler, domain: Any, driver: _Driver,
                    summary: BatchSummary) -> None:
    """Consensus sampling: the local backend in this process pulls each next sample from the scheduler, which
    hears of every written or failed episode first."""
    persist, counted, error = scheduler.hooks(driver.persist, driver.counted, driver.error)
    hooks = dataclasses.replace(driver.hooks(), persist=persist, counted=counted, error=error)
    try:
        ran = LocalBackend(1).run(ctx, scheduler.pull, domain, hooks)
        summary.endpoint_calls = ran.endpoint_calls
    finally:
        summary.skipped = scheduler.n_skipped
        store = driver.store
        store.update_manifest_info(consensus_stopping=scheduler.summary())


def _resume_from_checkpoints(store, domain, specs: list[EpisodeSpec]) -> list[EpisodeSpec]:
    """``specs`` with every episode that has a checkpoint set to :class:`Resume` from it (or, when the domain
    cannot replay, the checkpoint deleted and the episode restarted, with a note)."""
    saved = store.load_checkpoints()
    out = []
    for spec in specs:
        partial = saved.pop(spec.episode_id, None)
        if partial is None:
            out.append(spec)
        elif not getattr(domain, "supports_replay", False):
            store.delete_checkpoint(spec.episode_id)
            store.notes.append(f"{spec.episode_id}: restarted (the domain cannot replay a checkpoint)")
            out.append(spec)
        else:
            restart = spec.start.restart if isinstance(spec.start, Resume) else spec.start
            out.append(dataclasses.replace(spec, start=Resume(partial, restart=restart)))
    for stale in saved:  # checkpoints of episodes this batch does not plan
        log.info("ignoring checkpoint of unplanned episode %s", stale)
    return out
