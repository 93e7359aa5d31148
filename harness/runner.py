"""The batch runner: many episodes concurrently into one run directory, resumable.

Layers (as in tau2-bench): :func:`harness.loop.run_episode` runs one episode; :func:`run_specs` runs many on one
event loop under a semaphore; :func:`run_batch` owns the run directory (:class:`harness.store.RunStore`), the
model server/client lifetime, progress, resume and the optional worker processes. What the processes share about
the run is one :class:`RunContext`, built once by :func:`run_batch`.

Resume: finished episode ids are skipped; an in-flight episode with a checkpoint continues from its last
checkpointed step (the last completed step, or at most ``CHECKPOINT_INTERVAL_S`` older) as a
:class:`harness.loop.Resume` when the domain supports replay (``Domain.supports_replay``), otherwise it restarts
from scratch (its checkpoint is discarded); a checkpoint that no longer replays restarts it as planned
(:func:`harness.loop.open_episode`). An episode whose model call failed after retries (``ModelCallFailed``) or
that crashed on an unexpected error is an *infrastructure error*: it is not written, it is counted, and re-running
the same command picks it up again.

Workers (``workers > 1``, :mod:`harness.workers`): N processes, each with its own event loop, model client and
its share of the ``concurrency`` slots; the parent stays the single writer of the JSONL files.

Stopping early -- the batch ends before its last episode, with a :class:`StopCause` in the summary, and re-running
the same command resumes -- on
- SIGINT or SIGTERM (:mod:`harness.stop`): in-flight episodes are cancelled at once (no model request is sent
  after the signal; their checkpoints stay, and the summary counts their calls), episodes already finished are
  still written, worker processes and the local model server are stopped, and the summary is returned within
  about a second;
- a run-directory write failure (:class:`rundir.errors.RunDirWriteError`: disk full, read-only file system): the
  store has cut its files back to the last whole episode;
- an endpoint that cannot be reached on the first call (:class:`harness.model_types.EndpointUnreachable`: a wrong
  address or a server that is not up): no retries, no point in trying the other episodes.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from harness import stop
from harness.build import build_client, build_domain
from harness.loop import (
    EpisodeResult,
    EpisodeSpec,
    PartialEpisode,
    Resume,
    derive_seed,
    episode_id_for,
    open_episode,
    run_episode,
)
from harness.progress import BatchStats, CallTotals, CountingClient, EpisodeSummary, Progress, TotallingClient
from rundir.errors import RunDirWriteError, UserError
from rundir.schema import ExecutionSettings, RunConfig

log = logging.getLogger(__name__)

__all__ = ["EpisodeSpec", "BatchStopped", "BatchSummary", "RunContext", "StopCause", "plan_specs", "run_batch",
           "run_specs"]

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
    import gc

    old = gc.get_threshold()
    if old[0] and old[0] < gen0:  # 0 means the caller switched automatic collection off: leave it so
        gc.set_threshold(gen0, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def default_concurrency(model: str) -> int:
    """8 for API models; 2 for the local llama.cpp model (one CPU-bound server)."""
    return 2 if model.startswith("local:") else 8


def prompt_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


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


@dataclass(frozen=True)
class StopCause:
    """Why a batch stopped before its end: ``message`` and ``hint`` are one phrase each (``uqh run`` prints
    ``message; N episodes not finished; hint``); ``signum`` when a signal stopped it."""

    message: str
    hint: str = "re-run the same command to resume"
    signum: int | None = None

    @classmethod
    def signal(cls, signum: int) -> "StopCause":
        return cls(f"interrupted by {stop.signal_name(signum)}", signum=signum)

    @classmethod
    def write_failure(cls, exc: RunDirWriteError) -> "StopCause":
        return cls(str(exc), exc.hint)

    @classmethod
    def unreachable(cls, exc: BaseException) -> "StopCause":
        return cls(_first_line(exc), "start the server or correct the address (--api-base), then re-run the same "
                                     "command to resume")

    @property
    def exit_code(self) -> int:
        return stop.exit_code(self.signum) if self.signum is not None else 1


class BatchStopped(Exception):
    """Raised out of :func:`run_specs` when a :class:`StopCause` (other than a signal) stopped it."""

    def __init__(self, cause: StopCause) -> None:
        super().__init__(cause.message)
        self.cause = cause


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
    #: Requests per endpoint when the model is served by several (:class:`harness.endpoints.EndpointCounts`).
    endpoint_calls: list = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return self.planned - self.finished_before - self.stats.done - self.skipped

    @property
    def ok(self) -> bool:
        return self.remaining == 0


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

    def domain_runtime(self) -> dict[str, Any]:
        """The run-time facts for :meth:`domains.base.Domain.prepare_runtime`."""
        runtime: dict[str, Any] = {"run_dir": self.run_dir}
        if self.config.user_model:
            runtime.update(
                user_model=self.user_model, user_api_base=self.user_api_base, user_decoding=self.config.user_decoding,
                user_timeout_s=self.timeout_s,  # --timeout bounds the simulated user's calls too
            )
        return runtime


# --------------------------------------------------------------------------------------- one event loop

#: Write failures of a checkpoint that stop the batch (the disk is full or gone: the next append fails too);
#: others (e.g. a name the file system refuses) only cost the checkpoint and are logged.
_FATAL_CHECKPOINT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


async def run_specs(
    ctx: RunContext,
    specs: "list[EpisodeSpec] | Callable[[], Awaitable[EpisodeSpec | None]]",
    *,
    domain,
    client,
    persist: Callable[[EpisodeResult], Any],
    on_done: Callable[[Any], None] | None = None,
    on_error: Callable[[EpisodeSpec, str, int], None],
    checkpoint_sink: Callable[[str, str], None] | None = None,
    on_unfinished_calls: Callable[[CallTotals], None] | None = None,
) -> None:
    """Run episodes concurrently (at most ``ctx.concurrency`` at a time) on the current event loop.

    File I/O never blocks the event loop: checkpoint writes and ``persist(result)`` (which appends the finished
    episode, with its fsyncs) run in one dedicated I/O thread, in submission order -- so an episode's last
    checkpoint write always precedes its append (which deletes the checkpoint). ``on_done(persist's return
    value)`` then runs on the event loop; ``on_error(spec, message, retries)`` for an episode that failed on
    infrastructure. An episode that has finished is written and counted even when the batch is cancelled while
    its write is under way. ``checkpoint_sink(episode_id, json)`` receives the checkpoints instead of the files in
    ``ctx.run_dir`` (a process that does not write the run directory, e.g. a Ray actor on another machine).
    ``on_unfinished_calls(totals)`` receives the calls of each episode that made some but ended without
    ``persist`` taking its result (it failed on infrastructure, the batch was cancelled or stopped, or its write
    failed): they were paid for, though no record of them is written.

    Raises :class:`BatchStopped` (after cancelling the other episodes) when a write to the run directory fails or
    the first call cannot reach the endpoint.
    """
    from concurrent.futures import ThreadPoolExecutor

    from domains.base import EnvironmentUnavailable
    from harness.model_types import EndpointUnreachable, ModelCallFailed
    from harness.sequential import annotate_canonical_answer
    from harness.store import CheckpointEncoder, write_checkpoint_json

    loop = asyncio.get_running_loop()
    io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uqh-io")
    sem = asyncio.Semaphore(max(1, ctx.concurrency))
    use_checkpoints = ctx.checkpoints and getattr(domain, "supports_replay", False)
    interval_s = ctx.checkpoint_interval_s
    run_dir = ctx.run_dir
    tasks: list[asyncio.Task] = []
    causes: list[StopCause] = []  # appended from the I/O thread too (list.append is atomic)

    def stop_all(cause: StopCause) -> None:
        if not causes:
            causes.append(cause)
        for task in tasks:
            task.cancel()

    encoder = CheckpointEncoder()

    last_write: dict[str, float] = {}

    def checkpoint_written(fut) -> None:  # runs in the I/O thread
        exc = fut.exception()
        if exc is None:
            return
        if isinstance(exc, OSError) and exc.errno in _FATAL_CHECKPOINT_ERRNOS:
            cause = StopCause.write_failure(RunDirWriteError(run_dir, exc))
            causes.append(cause)
            with contextlib.suppress(RuntimeError):  # the loop may be closing already
                loop.call_soon_threadsafe(stop_all, cause)
        else:
            log.warning("checkpoint write failed: %s", exc)

    def checkpoint(partial: PartialEpisode) -> None:
        now = time.monotonic()
        eid = partial.episode_id
        if eid in last_write and now - last_write[eid] < interval_s:
            return  # wrote one moments ago: with fast models, at most one checkpoint per interval
        last_write[eid] = now
        data = encoder.dumps(partial)  # snapshot now; the thread only writes bytes
        if checkpoint_sink is not None:
            io.submit(checkpoint_sink, partial.episode_id, data).add_done_callback(checkpoint_written)
            return
        io.submit(write_checkpoint_json, run_dir, partial.episode_id, data).add_done_callback(checkpoint_written)

    async def one(spec: EpisodeSpec) -> None:
        calls = CallTotals()  # this episode's calls in this process (for on_unfinished_calls)
        episode_client = TotallingClient(client, calls) if on_unfinished_calls is not None else client
        handed_over = False  # persist took the finished episode: its record accounts for its calls
        try:
            async with sem:
                env = None
                try:
                    env, task_prompt, spec = await open_episode(domain, spec)
                    result = await run_episode(
                        env,
                        episode_client,
                        spec=spec,
                        task_prompt=task_prompt,
                        system_prompt=ctx.system_prompt,
                        step_budget=spec.step_budget or ctx.config.step_budget,
                        on_step=checkpoint if use_checkpoints else None,
                    )
                    if isinstance(spec.start, Resume):  # record that a crash split this episode
                        result.episode.info["resumed_after_step"] = len(spec.start.steps)
                    annotate_canonical_answer(domain, result.episode)
                    cached = encoder.cached_rows(spec.episode_id)
                    if len(cached) <= len(result.sidecar):
                        result.sidecar_json_prefix = cached
                except EndpointUnreachable as exc:
                    stop_all(StopCause.unreachable(exc))
                    return
                except (ModelCallFailed, EnvironmentUnavailable) as exc:
                    on_error(spec, f"model call failed: {_first_line(exc)}", getattr(exc, "retries", 0))
                    return
                except Exception as exc:  # noqa: BLE001 - any other crash is an infra error, reported, re-queued
                    log.debug("episode %s crashed", spec.episode_id, exc_info=True)
                    on_error(spec, f"{type(exc).__name__}: {_first_line(exc)}", 0)
                    return
                finally:
                    encoder.forget(spec.episode_id)
                    last_write.pop(spec.episode_id, None)
                    if env is not None:
                        with contextlib.suppress(Exception):
                            env.close()
                written = io.submit(persist, result)
                # If the batch is cancelled, the shielded future still gets the write's outcome, which is read
                # from `written` below; mark it read too, or asyncio logs "Future exception was never retrieved"
                # at exit.
                shielded = asyncio.wrap_future(written)
                shielded.add_done_callback(_mark_retrieved)
                try:
                    value = await asyncio.shield(shielded)
                except asyncio.CancelledError:
                    # Stopping: the episode is finished, so let its write (milliseconds) complete and count it.
                    try:
                        value = written.result()
                    except RunDirWriteError as exc:
                        causes.append(StopCause.write_failure(exc))
                    else:
                        handed_over = True
                        if on_done is not None:
                            on_done(value)
                    raise
                except RunDirWriteError as exc:
                    stop_all(StopCause.write_failure(exc))
                    return
                handed_over = True
                if on_done is not None:
                    on_done(value)
        finally:
            if not handed_over and calls.calls and on_unfinished_calls is not None:
                on_unfinished_calls(calls)

    async def slot(pull) -> None:
        while (spec := await pull()) is not None:
            await one(spec)

    try:
        if callable(specs):  # pull specs from a shared source (worker processes): ``concurrency`` slots
            tasks.extend(asyncio.ensure_future(slot(specs)) for _ in range(max(1, ctx.concurrency)))
        else:
            tasks.extend(asyncio.ensure_future(one(s)) for s in specs)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        io.shutdown(wait=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
            raise r
    if causes:
        raise BatchStopped(causes[0])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# --------------------------------------------------------------------------------------- batch


def run_batch(
    config: RunConfig,
    run_dir: Path | str,
    *,
    specs: list[EpisodeSpec] | None = None,
    concurrency: int | None = None,
    workers: int = 1,
    progress: bool = True,
    checkpoints: bool = True,
    client_factory: Callable[[str, str | None], Any] | None = None,
    checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_retries: int = DEFAULT_MAX_RETRIES,
    progress_label: str = "uqh run",
    backend: Any = None,
) -> BatchSummary:
    """Run (or resume) every planned episode of ``config`` into ``run_dir``; return the summary.

    ``backend`` (:mod:`harness.backends`) runs the episodes: None is this machine (in this process, or in
    ``workers`` processes); the Ray backend runs them on a cluster. Whichever runs them, this process is the only
    writer of ``run_dir``.

    ``client_factory(litellm_model, api_base)`` replaces :func:`harness.model_client.make_model_client` (tests).
    ``timeout_s`` / ``max_retries``: the agent's model client's per-call timeout and retries (recorded in the
    manifest's ``execution``, outside the config hash). SIGINT / SIGTERM during the batch stop it (see the module
    docstring): the summary then says so in ``stopped``.
    """
    from harness.store import RunStore, write_checkpoint_json

    run_dir = Path(run_dir)
    domain = build_domain(config)
    system_prompt = domain.system_prompt()
    if prompt_sha256(system_prompt) != config.prompt_sha256:
        raise UserError(
            f"the {config.domain} system prompt changed since the config was made (sha256 differs); "
            "rebuild the config (uqh run) or restore the prompt file"
        )
    specs = plan_specs(config) if specs is None else list(specs)
    ids = [s.episode_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("episode ids in specs are not unique")
    concurrency = concurrency or default_concurrency(config.model)
    # Sequential sampling (`uqh run --stop-on-consensus`) schedules a task's samples from its finished ones
    # (harness/sequential.py); continuation branches are never stopped by consensus.
    sequential = config.consensus_stopping is not None and config.continuation is None
    if sequential and (workers > 1 or getattr(backend, "name", "local") != "local"):
        raise UserError("--stop-on-consensus schedules samples from earlier samples in one process; use --workers 1 "
                        "and the local backend")
    workers = max(1, min(int(workers), concurrency))  # each worker needs at least one of the slots
    execution = ExecutionSettings(timeout_s=timeout_s, max_retries=max_retries)

    with stop.stop_signals(), RunStore.open_or_create(
        run_dir, config, system_prompt=system_prompt, info=domain.manifest_info(), execution=execution
    ) as store:
        finished_before = sum(1 for i in ids if i in store.finished_ids)
        todo = _resume_from_checkpoints(store, domain, [s for s in specs if s.episode_id not in store.finished_ids])
        before = Counter(store.finished_stop_reasons[i] for i in ids if i in store.finished_stop_reasons)
        stats = BatchStats(total=len(specs), already_done=finished_before, stop_reasons_before=before)
        summary = BatchSummary(run_dir, len(specs), finished_before, stats, notes=list(store.notes),
                               missing_sidecar_episodes=len(store.missing_sidecar_rows))
        scheduler = None
        if sequential:
            from harness.sequential import ConsensusScheduler

            scheduler = ConsensusScheduler.for_batch(config, store, specs, todo, domain)
            summary.skipped = scheduler.n_skipped
            stats.skipped = lambda: scheduler.n_skipped  # the progress total leaves skipped samples out
        if not todo:
            if scheduler is not None:
                store.update_manifest_info(consensus_stopping=scheduler.summary())
            return summary  # nothing to run: nothing more is written
        store.record_execution(execution)

        def persist(result: EpisodeResult) -> EpisodeSummary:  # runs in the I/O thread
            eid, line, rows, ep_summary = serialize(result)
            store.append_serialized(eid, line, rows)
            return ep_summary

        def write(episode_id: str, episode_line: bytes, sidecar_bytes: bytes, ep_summary: EpisodeSummary) -> None:
            try:
                store.append_serialized(episode_id, episode_line, sidecar_bytes)
            except RunDirWriteError:
                stats.add_unfinished_calls(ep_summary)  # made (and paid for) in this session, just not written
                raise
            counted(ep_summary)

        def counted(ep_summary: EpisodeSummary) -> None:
            stats.add(ep_summary)
            bar.update()

        def error(spec: EpisodeSpec | None, message: str, retries: int = 0) -> None:
            stats.add_error(message, retries=retries)
            bar.update()

        def write_checkpoint(episode_id: str, data: str) -> None:  # from a process that cannot write run_dir
            if episode_id not in store.finished_ids:  # a late checkpoint must not outlive its episode
                write_checkpoint_json(run_dir, episode_id, data)

        try:
            with contextlib.ExitStack() as stack:
                model, api_base = _resolve(stack, config.model, config.api_base)
                user_model = user_base = None
                if config.user_model:
                    user_model, user_base = _resolve(stack, config.user_model, config.user_api_base)
                ctx = RunContext(
                    config=config, system_prompt=system_prompt, model=model, api_base=api_base, run_dir=run_dir,
                    user_model=user_model, user_api_base=user_base, checkpoints=checkpoints,
                    checkpoint_interval_s=checkpoint_interval_s, concurrency=concurrency, timeout_s=timeout_s,
                    max_retries=max_retries, api_bases=tuple(config.api_bases or ()),
                )
                domain.prepare_runtime(ctx.domain_runtime())
                bar = stack.enter_context(Progress(stats, enabled=progress, label=progress_label))
                if scheduler is not None:
                    stack.enter_context(gc_tuned())
                    hooks = scheduler.hooks(persist, counted, error)
                    try:
                        asyncio.run(_run_in_process(ctx, scheduler.pull, domain, *hooks, client_factory,
                                                    summary.endpoint_calls, stats))
                    finally:
                        summary.skipped = scheduler.n_skipped
                        store.update_manifest_info(consensus_stopping=scheduler.summary())
                else:
                    from harness.backends import BatchHooks, LocalBackend

                    hooks = BatchHooks(persist=persist, counted=counted, write=write, error=error,
                                       write_checkpoint=write_checkpoint, client_factory=client_factory,
                                       stats=stats, unfinished_calls=stats.add_unfinished_calls)
                    ran = (backend or LocalBackend(workers)).run(ctx, todo, domain, hooks)
                    summary.stopped, summary.worker_cpu_s = ran.stopped, ran.worker_cpu_s
                    summary.endpoint_calls = ran.endpoint_calls
                    summary.notes += ran.notes
        except BatchStopped as exc:
            summary.stopped = exc.cause
        except RunDirWriteError as exc:
            summary.stopped = StopCause.write_failure(exc)
        except stop.Interrupted as exc:
            summary.stopped = StopCause.signal(exc.signum)
        if stop.requested() is not None and (summary.stopped is None or summary.stopped.signum is None):
            summary.stopped = StopCause.signal(stop.requested())
        return summary


def _resolve(stack: contextlib.ExitStack, model: str, api_base: str | None) -> tuple[str, str | None]:
    from harness.local_model import resolve_model

    return stack.enter_context(resolve_model(model, api_base))


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


def serialize(result: EpisodeResult) -> tuple[str, bytes, bytes, EpisodeSummary]:
    """A finished episode as (id, episode line, sidecar bytes, accounting), ready for the store."""
    ep = result.episode
    line = ep.model_dump_json().encode() + b"\n"
    k = len(result.sidecar_json_prefix)
    rows = "".join(j + "\n" for j in result.sidecar_json_prefix).encode()
    rows += b"".join(r.model_dump_json().encode() + b"\n" for r in result.sidecar[k:])
    return ep.episode_id, line, rows, EpisodeSummary.of(ep)


def _mark_retrieved(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


async def run_cancellable(coro: Awaitable[None]) -> None:
    """Await ``coro`` as a task that a stop signal cancels (see :mod:`harness.stop`); return normally when it
    was cancelled that way."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    with stop.on_stop(lambda signum: loop.call_soon_threadsafe(task.cancel)):
        try:
            await task
        except asyncio.CancelledError:
            if stop.requested() is None:
                raise


async def _run_in_process(ctx: RunContext, specs, domain, persist, counted, error, client_factory,
                          endpoint_calls: list | None = None, stats: BatchStats | None = None) -> None:
    """Run the episodes on this event loop; the client's per-endpoint counts (several endpoints) are appended to
    ``endpoint_calls``, also when the batch stops early."""
    client = build_client(ctx.config, ctx.model, ctx.api_base, client_factory, timeout_s=ctx.timeout_s,
                          max_retries=ctx.max_retries, api_bases=ctx.api_bases)
    unfinished_calls = None
    if stats is not None:  # calls/s in the progress line while episodes are still running
        client = CountingClient(client, stats)
        unfinished_calls = stats.add_unfinished_calls
    try:
        await run_cancellable(run_specs(ctx, specs, domain=domain, client=client, persist=persist, on_done=counted,
                                        on_error=error, on_unfinished_calls=unfinished_calls))
    finally:
        if endpoint_calls is not None:
            endpoint_calls.extend(endpoint_counts(client))
        with contextlib.suppress(Exception):
            await client.aclose()
        with contextlib.suppress(Exception):
            await domain.aclose()


def endpoint_counts(client) -> list:
    """A client's per-endpoint counts (empty for one endpoint, or a client that does not keep them)."""
    counts = getattr(client, "endpoint_counts", None)
    return list(counts()) if callable(counts) else []
