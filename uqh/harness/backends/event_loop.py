"""Episodes on one event loop: :func:`run_specs` runs many under a semaphore, writing through the driver's
``persist`` in one I/O thread; :func:`run_in_process` is that loop with its model client, as the local backend and
consensus sampling run it. Used by every backend (in this process, in worker processes, in Ray actors)."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from uqh.domains.base import EnvironmentUnavailable
from uqh.harness import interrupts
from uqh.harness.backends.backend import BatchHooks
from uqh.harness.backends.context import BatchStopped, RunContext, StopCause
from uqh.harness.config.build import build_client
from uqh.harness.episode.agent_registry import make_agent
from uqh.harness.episode.loop import EpisodeResult, EpisodeSpec, PartialEpisode, Resume, open_episode, run_episode
from uqh.harness.model.call_errors import EndpointsDown, EndpointUnreachable, ModelCallFailed
from uqh.harness.progress import CallTotals, CountingClient, EpisodeSummary, TotallingClient
from uqh.harness.sampling.scheduler import annotate_canonical_answer
from uqh.harness.store.writer import CheckpointEncoder, SidecarBytes, write_checkpoint_json
from uqh.rundir.errors import RunDirWriteError, first_line

log = logging.getLogger(__name__)

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
    batch = _Batch(ctx, domain, client, persist, on_done, on_error, checkpoint_sink, on_unfinished_calls)
    await batch.run(specs)


class _Batch:
    """The state :func:`run_specs` shares between its episodes: the slots, the I/O thread, the checkpoint
    throttle and why the batch stopped."""

    def __init__(self, ctx: RunContext, domain, client, persist, on_done, on_error, checkpoint_sink,
                 on_unfinished_calls) -> None:
        self.ctx, self.domain, self.client = ctx, domain, client
        self.persist, self.on_done, self.on_error = persist, on_done, on_error
        self.checkpoint_sink, self.on_unfinished_calls = checkpoint_sink, on_unfinished_calls
        self.loop = asyncio.get_running_loop()
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uqh-io")
        self.sem = asyncio.Semaphore(max(1, ctx.concurrency))
        self.use_checkpoints = ctx.checkpoints and getattr(domain, "supports_replay", False)
        self.tasks: list[asyncio.Task] = []
        self.causes: list[StopCause] = []  # appended from the I/O thread too (list.append is atomic)
        self.encoder = CheckpointEncoder()
        self.last_write: dict[str, float] = {}
        self.agent = make_agent(ctx.config.agent, domain, ctx.system_prompt)

    async def run(self, specs) -> None:
        try:
            if callable(specs):  # pull specs from a shared source (worker processes): ``concurrency`` slots
                self.tasks.extend(asyncio.ensure_future(self.slot(specs)) for _ in range(max(1, self.ctx.concurrency)))
            else:
                self.tasks.extend(asyncio.ensure_future(self.one(s)) for s in specs)
            results = await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            self.io.shutdown(wait=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r
        if self.causes:
            raise BatchStopped(self.causes[0])

    def stop_all(self, cause: StopCause) -> None:
        if not self.causes:
            self.causes.append(cause)
        for task in self.tasks:
            task.cancel()

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_written(self, fut) -> None:  # runs in the I/O thread
        exc = fut.exception()
        if exc is None:
            return
        if isinstance(exc, OSError) and exc.errno in _FATAL_CHECKPOINT_ERRNOS:
            cause = StopCause.write_failure(RunDirWriteError(self.ctx.run_dir, exc))
            self.causes.append(cause)
            with contextlib.suppress(RuntimeError):  # the loop may be closing already
                self.loop.call_soon_threadsafe(self.stop_all, cause)
        else:
            log.warning("checkpoint write failed: %s", exc)

    def checkpoint(self, partial: PartialEpisode) -> None:
        now = time.monotonic()
        eid = partial.episode_id
        if eid in self.last_write and now - self.last_write[eid] < self.ctx.checkpoint_interval_s:
            return  # wrote one moments ago: with fast models, at most one checkpoint per interval
        self.last_write[eid] = now
        data = self.encoder.dumps(partial)  # snapshot now; the thread only writes bytes
        if self.checkpoint_sink is not None:
            fut = self.io.submit(self.checkpoint_sink, eid, data)
        else:
            fut = self.io.submit(write_checkpoint_json, self.ctx.run_dir, eid, data)
        fut.add_done_callback(self.checkpoint_written)

    # ------------------------------------------------------------------ episodes

    async def slot(self, pull) -> None:
        while (spec := await pull()) is not None:
            await self.one(spec)

    async def one(self, spec: EpisodeSpec) -> None:
        calls = CallTotals()  # this episode's calls in this process (for on_unfinished_calls)
        client = TotallingClient(self.client, calls) if self.on_unfinished_calls is not None else self.client
        handed_over: list[bool] = []  # persist took the finished episode: its record accounts for its calls
        try:
            async with self.sem:
                result = await self.episode(spec, client)
                if result is not None:
                    await self.write(result, handed_over)
        finally:
            if not handed_over and calls.calls and self.on_unfinished_calls is not None:
                self.on_unfinished_calls(calls)

    async def episode(self, spec: EpisodeSpec, client) -> EpisodeResult | None:
        """Run one episode; None when it failed on infrastructure (reported) or stopped the batch."""
        env = None
        try:
            env, task_prompt, spec = await open_episode(self.domain, spec)
            result = await run_episode(
                env, client, spec=spec, task_prompt=task_prompt, system_prompt=self.ctx.system_prompt,
                step_budget=spec.step_budget or self.ctx.config.step_budget,
                on_step=self.checkpoint if self.use_checkpoints else None, agent=self.agent,
            )
            if isinstance(spec.start, Resume):  # record that a crash split this episode
                result.episode.info["resumed_after_step"] = len(spec.start.steps)
            annotate_canonical_answer(self.domain, result.episode)
            cached = self.encoder.cached_rows(spec.episode_id)
            if len(cached) <= len(result.sidecar):
                result.sidecar_json_prefix = cached
            return result
        except EndpointUnreachable as exc:
            self.stop_all(StopCause.unreachable(exc))
        except EndpointsDown as exc:
            self.stop_all(StopCause.endpoints_down(exc))
        except (ModelCallFailed, EnvironmentUnavailable) as exc:
            self.on_error(spec, f"model call failed: {first_line(exc, 300)}", getattr(exc, "retries", 0))
        except Exception as exc:  # noqa: BLE001 - any other crash is an infra error, reported, re-queued
            log.debug("episode %s crashed", spec.episode_id, exc_info=True)
            self.on_error(spec, f"{type(exc).__name__}: {first_line(exc, 300)}", 0)
        finally:
            self.encoder.forget(spec.episode_id)
            self.last_write.pop(spec.episode_id, None)
            if env is not None:
                with contextlib.suppress(Exception):
                    env.close()
        return None

    async def write(self, result: EpisodeResult, handed_over: list[bool]) -> None:
        """Hand a finished episode to ``persist`` in the I/O thread; ``handed_over`` gets a True once it was written
        (and counted), also when the batch is cancelled while the write is under way."""
        written = self.io.submit(self.persist, result)
        # If the batch is cancelled, the shielded future still gets the write's outcome, which is read from
        # `written` below; mark it read too, or asyncio logs "Future exception was never retrieved" at exit.
        shielded = asyncio.wrap_future(written)
        shielded.add_done_callback(_mark_retrieved)
        try:
            value = await asyncio.shield(shielded)
        except asyncio.CancelledError:
            # Stopping: the episode is finished, so let its write (milliseconds) complete and count it.
            try:
                value = written.result()
            except RunDirWriteError as exc:
                self.causes.append(StopCause.write_failure(exc))
            else:
                self.done(value, handed_over)
            raise
        except RunDirWriteError as exc:
            self.stop_all(StopCause.write_failure(exc))
            return
        self.done(value, handed_over)

    def done(self, value, handed_over: list[bool]) -> None:
        handed_over.append(True)
        if self.on_done is not None:
            self.on_done(value)


def _mark_retrieved(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


async def run_cancellable(coro: Awaitable[None]) -> None:
    """Await ``coro`` as a task that a stop signal cancels (see :mod:`uqh.harness.interrupts`); return normally when it
    was cancelled that way."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    with interrupts.on_stop(lambda signum: loop.call_soon_threadsafe(task.cancel)):
        try:
            await task
        except asyncio.CancelledError:
            if interrupts.requested() is None:
                raise


async def run_in_process(ctx: RunContext, specs, domain, hooks: BatchHooks, endpoint_calls: list | None = None) -> None:
    """Run the episodes (a list, or a source to pull them from) on this event loop, handing each to ``hooks``;
    the client's per-endpoint counts (several endpoints) are appended to ``endpoint_calls``, also when the batch
    stops early."""
    client = build_client(ctx.config, ctx.agent_model, ctx.client, hooks.client_factory)
    unfinished_calls = None
    if hooks.stats is not None:  # calls/s in the progress line while episodes are still running
        client = CountingClient(client, hooks.stats)
        unfinished_calls = hooks.stats.add_unfinished_calls
    try:
        await run_cancellable(run_specs(ctx, specs, domain=domain, client=client, persist=hooks.persist,
                                        on_done=hooks.counted, on_error=hooks.error,
                                        on_unfinished_calls=unfinished_calls))
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


def serialize(result: EpisodeResult) -> tuple[str, bytes, bytes | SidecarBytes, EpisodeSummary]:
    """A finished episode as (id, episode line, sidecar bytes, accounting), ready for the store; the sidecar bytes
    are :class:`SidecarBytes` when the episode has user-sidecar rows."""
    ep = result.episode
    line = ep.model_dump_json().encode() + b"\n"
    k = len(result.sidecar_json_prefix)
    rows = "".join(j + "\n" for j in result.sidecar_json_prefix).encode()
    rows += b"".join(r.model_dump_json().encode() + b"\n" for r in result.sidecar[k:])
    if result.user_sidecar:
        rows = SidecarBytes(rows, b"".join(r.model_dump_json().encode() + b"\n" for r in result.user_sidecar))
    return ep.episode_id, line, rows, EpisodeSummary.of(ep)
