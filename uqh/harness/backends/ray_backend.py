"""The Ray backend (``uqh run|continue --backend ray [--ray-address auto|ray://HOST:PORT]``): episodes on a cluster.

The driver -- the ``uqh`` process -- stays the only writer of the run directory (:class:`uqh.harness.backends.BatchHooks`
over the same :class:`uqh.harness.store.writer.RunStore`): the files, their crash safety, resume and the config-hash refusal
are the local backend's, and a resumed run may switch backends. The cluster only runs episodes:

- **Actors.** One :class:`uqh.harness.backends.ray_actor.EpisodeActor` per CPU of the cluster (``--workers N``: N of
  them), spread over the nodes, each with its own model client. The domain is pickled into the object store once,
  its data loaded first (:meth:`uqh.domains.base.Domain.load_data`: tasks, catalogs, indexes), and every actor
  unpickles that copy, so no node reads the data from its own disk and no episode ships it.
- **Scheduling.** The driver keeps the queue; each episode goes to the live actor with the fewest in flight, and
  at most ``--concurrency`` are in flight across the cluster (the total, as with ``--workers``).
- **Checkpoints** stay in the actors' memory until the driver collects them, every ``checkpoint_interval_s``, and
  writes them to ``checkpoints/`` as the local backend does (a driver that dies resumes from them).
- **Faults.** An actor or node that dies mid-episode loses only its attempts: each episode it was running is
  queued again -- as a :class:`uqh.harness.episode.loop.Resume` from its last collected checkpoint where the domain replays,
  else as planned -- and a replacement actor is started (used if the cluster can place it). An episode is
  written once: the first finished attempt wins, later ones are dropped. After :data:`MAX_ATTEMPTS` lost
  attempts an episode counts as an infrastructure error (re-run the command to try again).
- **Stopping.** SIGINT/SIGTERM (:mod:`uqh.harness.interrupts`), a write failure or an unreachable endpoint kill the actors
  at once (no model request after that), keep the checkpoints and return; re-running the command resumes.
- **Code and secrets.** Every actor checks that it imports the driver's uqh code (a digest of the sources and
  prompts) and refuses to start otherwise. Actors receive the driver's provider variables (API keys and
  endpoints: :func:`forwarded_environment`) as an argument, not through Ray's runtime environment, which the
  dashboard shows.

Without ``--ray-address`` a local Ray instance is started for the command and stopped afterwards; ``auto`` joins
the cluster this machine belongs to; ``ray://HOST:PORT`` connects through Ray Client. See docs/scale-out.md.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import re
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqh.harness import interrupts
from uqh.harness.backends.backend import BackendResult, BatchHooks
from uqh.harness.model.endpoints import merge_counts
from uqh.harness.episode.loop import EpisodeSpec, Resume
from uqh.harness.backends.context import RunContext, StopCause
from uqh.rundir.errors import RunDirWriteError, UserError, require_extra
from uqh.rundir.schema import PartialEpisode, RunConfig
from uqh.rundir.secrets import redact

log = logging.getLogger(__name__)

__all__ = ["MAX_ATTEMPTS", "RayBackend", "forwarded_environment"]

#: Lost attempts (the actor or its node died) after which an episode counts as an infrastructure error.
MAX_ATTEMPTS = 3
#: How long the first actor may take to start (scheduling, runtime environment, unpickling the domain).
ACTOR_START_TIMEOUT_S = 300.0
#: How long the driver waits for the actors' CPU time and endpoint counts at the end of a batch.
STATS_TIMEOUT_S = 10.0
#: Actor calls beyond the episodes in flight (checkpoint collection, statistics) that must never queue behind them.
_CONTROL_CALLS = 4
#: Environment variables handed to the actors: provider keys, endpoints and uqh's own settings.
_FORWARD_PREFIXES = ("OPENAI_", "ANTHROPIC_", "OPENROUTER_", "LITELLM_", "AZURE_", "AWS_", "VERTEX", "GOOGLE_",
                     "GEMINI_", "MISTRAL_", "GROQ_", "DEEPSEEK_", "TOGETHER", "FIREWORKS_", "COHERE_", "XAI_",
                     "HF_", "HUGGINGFACE_", "UQH_")
_FORWARD_SUFFIXES = ("_API_KEY", "_API_BASE", "_BASE_URL", "_API_VERSION")
_FATAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def forwarded_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default: this process's, ``.env`` included) that the actors need to call the
    models as the driver would: names with a provider prefix (``OPENAI_``, ``ANTHROPIC_``, ``AWS_`` ...) or ending
    in ``_API_KEY`` / ``_API_BASE`` / ``_BASE_URL`` / ``_API_VERSION``. Nothing else: paths, ``PYTHONPATH`` and
    device settings belong to each node."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith(_FORWARD_PREFIXES) or k.endswith(_FORWARD_SUFFIXES)}


def _import_ray():
    require_extra("ray", "ray", "--backend ray")
    import ray

    return ray


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def _remote_error_line(exc: BaseException) -> str:
    """One line for an exception; for a Ray error that carries a remote traceback, the remote exception's line
    (``RuntimeError: ...``), else the first line."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    raised = [ln for ln in lines[1:] if _EXCEPTION_LINE.match(ln)]
    return redact(raised[-1] if raised else lines[0])[:300]


#: Ray gives a starting node a fixed 30 s to register; a loaded machine was seen to exceed it (its message).
_NODE_START_TIMEOUT = "timed out during startup"


def init_ray(ray: Any, address: str | None, options: dict[str, Any]) -> None:
    """``ray.init``; a local instance that timed out while starting is stopped and started once more."""
    attempts = 1 if address else 2  # a remote cluster is not ours to restart
    for attempt in range(attempts):
        try:
            ray.init(address=address or "local", **options)
            return
        except Exception as exc:  # Ray raises a bare Exception for this one
            if _NODE_START_TIMEOUT not in str(exc):
                raise
            if attempt == attempts - 1:
                raise RuntimeError(str(exc)) from exc  # the caller's one line: cannot start a local instance
            log.warning("a local Ray instance timed out while starting; trying once more")
            ray.shutdown()


class RayBackend:
    """Runs a batch on Ray (module docstring). Use it as a context manager to keep one connection (or local
    instance) over several batches, e.g. the rounds of a sequential continuation; :meth:`run` alone connects
    and disconnects around its batch."""

    name = "ray"

    def __init__(self, address: str | None = None, actors: int | None = None) -> None:
        require_extra("ray", "ray", "--backend ray")  # when the command is checked, before any run directory
        self.address = address
        self.actors = actors
        self._connected = False
        self._owns_connection = False
        self._depth = 0

    # ------------------------------------------------------------------ connection

    def check(self, config: RunConfig) -> None:
        """UserError (before connecting) for what cannot run on Ray: sequential sampling, which schedules a task's
        samples from its finished ones in one process, and with ``--ray-address`` a ``local:`` model, which serves
        this machine only."""
        if config.consensus_stopping is not None and config.continuation is None:
            raise UserError("--stop-on-consensus schedules samples from earlier samples in one process; use --workers "
                            "1 and the local backend")
        if self.address is None:
            return
        for flag, model in (("--model", config.model), ("--user-model", config.user_model)):
            if model and model.startswith("local:"):
                raise UserError(f"{flag} {model} is served on this machine only; with --ray-address serve it where "
                                "the cluster can reach it (llama-server, vLLM) and pass its URL (--api-base)")

    def connect(self) -> None:
        """Connect to ``address`` (``auto``, ``ray://HOST:PORT``, ``HOST:PORT``), or start a local Ray instance;
        reuse a connection this process already has."""
        if self._connected:
            return
        ray = _import_ray()
        if not ray.is_initialized():
            root = str(Path(__file__).resolve().parents[3])  # a local instance's workers import this very code
            env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
            # Ray's own log lines below errors stay out of the command's output (ours are unaffected)
            options: dict[str, Any] = dict(logging_level=logging.ERROR, runtime_env={"env_vars": env})
            if self.address is None:  # "local": always a new instance, never one found on this machine
                options.update(include_dashboard=False)
            try:
                init_ray(ray, self.address, options)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
                raise UserError(f"--backend ray: cannot connect to {where} ({_remote_error_line(exc)}); start the cluster "
                                "(`ray start --head`) or correct --ray-address") from None
            self._owns_connection = True
            interrupts.reinstall()  # ray.init installs its own SIGTERM handler
        self._connected = True

    def close(self) -> None:
        """Disconnect; a Ray instance this backend started is stopped."""
        if self._owns_connection:
            import ray

            with contextlib.suppress(Exception):
                ray.shutdown()
        self._connected = self._owns_connection = False

    def __enter__(self) -> "RayBackend":  # re-entrant: the outermost block disconnects
        self.connect()
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.close()

    # ------------------------------------------------------------------ Backend

    def run(self, ctx: RunContext, specs: list[EpisodeSpec], domain: Any, hooks: BatchHooks) -> BackendResult:
        self.check(ctx.config)
        connected_here = not self._connected
        self.connect()
        try:
            return _RayBatch(self, ctx, specs, domain, hooks).run()
        finally:
            if connected_here:
                self.close()


@dataclass(eq=False)
class _Actor:
    index: int
    handle: Any
    ready: bool = False
    dead: bool = False
    in_flight: int = 0
    polling: bool = False
    node: str = ""
    #: the calls this actor made that no finished episode accounts for, as of its last poll (or final stats)
    unaccounted: Any = None


class _RayBatch:
    """The driver of one batch (module docstring): queue, actors, attempts, checkpoints, faults, stop."""

    def __init__(self, backend: RayBackend, ctx: RunContext, specs: list[EpisodeSpec], domain: Any,
                 hooks: BatchHooks) -> None:
        self.ray = _import_ray()
        self.backend = backend
        self.ctx = ctx
        self.domain = domain
        self.hooks = hooks
        self.planned = {s.episode_id: s for s in specs}
        self.queue: deque[tuple[EpisodeSpec, int]] = deque((s, 1) for s in specs)
        self.attempt_of = {s.episode_id: 1 for s in specs}  # the current attempt of each episode
        self.finished: set[str] = set()  # written or reported as failed: nothing more is accepted for them
        self.latest: dict[str, str] = {}  # newest checkpoint JSON collected per running episode
        self.replays = ctx.checkpoints and bool(getattr(domain, "supports_replay", False))
        self.actors: list[_Actor] = []
        self.running: dict[asyncio.Future, tuple[_Actor, EpisodeSpec, int]] = {}
        self.starting: dict[asyncio.Future, _Actor] = {}
        self.polls: dict[asyncio.Future, _Actor] = {}
        self.start_errors: list[str] = []
        self.requeued = 0
        self.replacements = 0
        self.cause: StopCause | None = None
        self.result = BackendResult()
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uqh-ray-io")  # the writer's one thread
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ set-up

    def run(self) -> BackendResult:
        from uqh.harness.backends.ray_actor import EpisodeActor, code_digest

        ray = self.ray
        self.domain.load_data()
        domain_ref = ray.put(self.domain)  # once: every actor unpickles this copy
        cpus = float(ray.cluster_resources().get("CPU", 1.0)) or 1.0
        n = self.backend.actors or max(1, int(cpus))
        n = max(1, min(n, self.ctx.concurrency, len(self.planned)))
        remote = ray.remote(EpisodeActor).options(
            num_cpus=min(1.0, cpus / n), max_concurrency=self.ctx.concurrency + _CONTROL_CALLS,
            scheduling_strategy="SPREAD", max_restarts=0, max_task_retries=0,
        )
        args = (self.ctx, domain_ref, forwarded_environment(), code_digest())
        self._make_actor = lambda: remote.remote(*args)
        self.replacement_budget = n
        try:
            with interrupts.on_stop(self._on_signal):
                asyncio.run(self._main(n))
        finally:
            self.io.shutdown(wait=True)  # every write handed over is done before the summary
        if self.requeued:
            self.result.notes.append(
                f"{self.requeued} episode attempts re-queued after their Ray worker died"
                + (" (resumed from their last checkpoint)" if self.replays else ""))
        return self.result

    def _on_signal(self, signum: int) -> None:  # the main thread's signal handler: short, non-blocking
        if self.loop is not None:  # else _main sees interrupts.requested() when it starts
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._stop, StopCause.signal(signum))

    def _start_actor(self) -> None:
        actor = _Actor(len(self.actors), self._make_actor())
        self.actors.append(actor)
        self.starting[asyncio.ensure_future(self._await(actor.handle.ready.remote()))] = actor

    @staticmethod
    async def _await(ref):
        return await ref

    # ------------------------------------------------------------------ the loop

    async def _main(self, n: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        if interrupts.requested() is not None:  # a signal arrived before the loop existed
            self._stop(StopCause.signal(interrupts.requested()))
        for _ in range(n):
            self._start_actor()
        stop_wait = asyncio.ensure_future(self.stopping.wait())
        without_actors = time.monotonic()  # since when no actor has been ready (start-up, or all died)
        next_poll = time.monotonic() + self.ctx.checkpoint_interval_s
        try:
            while (self.queue or self.running) and self.cause is None:
                self._dispatch()
                live = any(a.ready and not a.dead for a in self.actors)
                if self.queue and not live and not self.starting and not self._replace():
                    last = self.start_errors[-1] if self.start_errors else "every worker died"
                    self._stop(StopCause(f"no Ray worker is left to run episodes (last: {last})",
                                         "check the cluster (`ray status`), then re-run the same command to resume"))
                    break
                if live or self.running:
                    without_actors = time.monotonic()
                elif time.monotonic() - without_actors > ACTOR_START_TIMEOUT_S:
                    self._stop(StopCause(f"no Ray worker started within {ACTOR_START_TIMEOUT_S:.0f} s (does the "
                                         "cluster have a free CPU?)", "check `ray status`, then re-run the same "
                                         "command to resume"))
                    break
                timeout = max(0.0, next_poll - time.monotonic())
                waiting = {stop_wait, *self.running, *self.starting, *self.polls}
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    if fut in self.running:
                        self._attempt_ended(fut, *self.running.pop(fut))
                    elif fut in self.starting:
                        self._actor_started(fut, self.starting.pop(fut))
                    elif fut in self.polls:
                        self._collected(fut, self.polls.pop(fut))
                if time.monotonic() >= next_poll:
                    self._poll()
                    next_poll = time.monotonic() + self.ctx.checkpoint_interval_s
            if self.cause is None:
                await self._collect_stats()
        finally:
            stop_wait.cancel()
            await self._shutdown()
            for actor in self.actors:  # made and paid for, never written: counted like the local backend's
                if actor.unaccounted is not None and actor.unaccounted.calls:
                    self.hooks.unfinished_calls(actor.unaccounted)

    def _stop(self, cause: StopCause) -> None:
        if self.cause is None:
            self.cause = cause
            self.result.stopped = cause
        self.stopping.set()

    def _dispatch(self) -> None:
        live = [a for a in self.actors if a.ready and not a.dead]
        while self.queue and live and len(self.running) < self.ctx.concurrency:
            spec, attempt = self.queue.popleft()
            if spec.episode_id in self.finished:
                continue
            actor = min(live, key=lambda a: (a.in_flight, a.index))
            actor.in_flight += 1
            fut = asyncio.ensure_future(self._await(actor.handle.run.remote(spec, attempt)))
            self.running[fut] = (actor, spec, attempt)

    # ------------------------------------------------------------------ outcomes

    def _actor_started(self, fut: asyncio.Future, actor: _Actor) -> None:
        try:
            info = fut.result()
        except Exception as exc:  # noqa: BLE001 - the actor could not start (placement, import, code check)
            actor.dead = True
            self.start_errors.append(_remote_error_line(exc))
            log.warning("a Ray worker could not start: %s", self.start_errors[-1])
            return
        actor.ready, actor.node = True, str(info.get("host", ""))

    def _attempt_ended(self, fut: asyncio.Future, actor: _Actor, spec: EpisodeSpec, attempt: int) -> None:
        actor.in_flight -= 1
        ray_exc = self.ray.exceptions
        try:
            outcome = fut.result()
        except ray_exc.RayTaskError as exc:  # the actor's method raised: a bug, reported like a crash
            self._failed(spec, attempt, f"Ray worker error: {_remote_error_line(exc)}", 0)
            return
        except (ray_exc.RayError, ConnectionError) as exc:  # the actor, its process or its node is gone
            self._lost(actor, spec, attempt, exc)
            return
        eid = outcome.episode_id
        if outcome.kind == "done":
            if eid in self.finished:
                return  # an earlier attempt was written already
            self.finished.add(eid)
            self.latest.pop(eid, None)
            self._write(self.hooks.write, eid, outcome.line, outcome.rows, outcome.summary)
        elif outcome.kind == "stopped":
            self._stop(outcome.cause)
        else:
            if outcome.checkpoint is not None and attempt == self.attempt_of.get(eid):
                self._write_checkpoint(eid, outcome.checkpoint)
            self._failed(spec, attempt, outcome.message, outcome.retries)

    def _failed(self, spec: EpisodeSpec, attempt: int, message: str, retries: int) -> None:
        eid = spec.episode_id
        if eid in self.finished or attempt != self.attempt_of.get(eid):
            return
        self.finished.add(eid)
        self._write(self.hooks.error, self.planned.get(eid, spec), message, retries)

    def _lost(self, actor: _Actor, spec: EpisodeSpec, attempt: int, exc: BaseException) -> None:
        if not actor.dead:
            actor.dead = True
            log.warning("Ray worker %d (%s) is gone: %s", actor.index, actor.node or "?", _remote_error_line(exc))
            with contextlib.suppress(Exception):  # unreachable but maybe alive: make sure it stops working
                self.ray.kill(actor.handle, no_restart=True)
            self._replace()
        eid = spec.episode_id
        if eid in self.finished or attempt != self.attempt_of.get(eid):
            return
        if attempt >= MAX_ATTEMPTS:
            self._failed(spec, attempt, f"its Ray worker died {attempt} times (last: {_remote_error_line(exc)})", 0)
            return
        self.attempt_of[eid] = attempt + 1
        self.queue.appendleft((self._resumable(eid), attempt + 1))
        self.requeued += 1

    def _resumable(self, eid: str) -> EpisodeSpec:
        """The planned spec of ``eid``, resumed from its newest checkpoint when there is one and it replays."""
        spec = self.planned[eid]
        data = self.latest.get(eid)
        if data is None or not self.replays:
            return spec
        restart = spec.start.restart if isinstance(spec.start, Resume) else spec.start
        return dataclasses.replace(spec, start=Resume(PartialEpisode.model_validate_json(data), restart=restart))

    def _replace(self) -> bool:
        """Start a replacement actor while the budget lasts (placed when the cluster has room); False if not."""
        if self.replacements >= self.replacement_budget:
            return False
        self.replacements += 1
        self._start_actor()
        return True

    # ------------------------------------------------------------------ checkpoints and writes

    def _poll(self) -> None:
        for actor in self.actors:  # checkpoints (domains that replay) and the calls not yet accounted for
            if actor.ready and not actor.dead and actor.in_flight and not actor.polling:
                actor.polling = True
                self.polls[asyncio.ensure_future(self._await(actor.handle.take_checkpoints.remote()))] = actor

    def _collected(self, fut: asyncio.Future, actor: _Actor) -> None:
        actor.polling = False
        try:
            items, actor.unaccounted = fut.result()
        except Exception:  # noqa: BLE001 - a dead actor: its episodes report it themselves
            return
        for eid, attempt, data in items:
            if eid not in self.finished and attempt == self.attempt_of.get(eid):
                self._write_checkpoint(eid, data)

    def _write_checkpoint(self, eid: str, data: str) -> None:
        self.latest[eid] = data
        self.io.submit(self.hooks.write_checkpoint, eid, data).add_done_callback(self._checkpoint_written)

    def _checkpoint_written(self, fut) -> None:  # the I/O thread
        exc = fut.exception()
        if exc is None:
            return
        if isinstance(exc, OSError) and exc.errno in _FATAL_ERRNOS:
            self._from_io_thread(StopCause.write_failure(RunDirWriteError(self.ctx.run_dir, exc)))
        else:
            log.warning("checkpoint write failed: %s", exc)

    def _write(self, fn, *args) -> None:
        """Hand a write (or a count) to the one I/O thread: in order, never on the event loop."""
        def written(fut) -> None:
            exc = fut.exception()
            if isinstance(exc, RunDirWriteError):
                self._from_io_thread(StopCause.write_failure(exc))
            elif exc is not None:
                log.error("writing an episode failed: %s", exc)

        self.io.submit(fn, *args).add_done_callback(written)

    def _from_io_thread(self, cause: StopCause) -> None:
        try:
            self.loop.call_soon_threadsafe(self._stop, cause)
        except RuntimeError:  # the loop has ended (the batch's last writes): record it directly
            if self.result.stopped is None:
                self.result.stopped = cause

    # ------------------------------------------------------------------ the end

    async def _collect_stats(self) -> None:
        live = [a for a in self.actors if a.ready and not a.dead]
        futs = [asyncio.ensure_future(self._await(a.handle.stats.remote())) for a in live]
        if not futs:
            return
        done, pending = await asyncio.wait(futs, timeout=STATS_TIMEOUT_S)
        for fut in pending:
            fut.cancel()
        by_actor = {f: a for f, a in zip(futs, live)}
        stats = []
        for f in done:
            if not f.cancelled() and f.exception() is None:
                cpu, counts, unaccounted = f.result()
                by_actor[f].unaccounted = unaccounted
                stats.append((cpu, counts))
        self.result.worker_cpu_s = sum(cpu for cpu, _ in stats)
        self.result.endpoint_calls = merge_counts(*(counts for _, counts in stats))
        if any(a.dead for a in self.actors) and self.result.endpoint_calls:
            self.result.notes.append("per-endpoint counts leave out the Ray workers that died")

    async def _shutdown(self) -> None:
        for actor in self.actors:  # killed at once: no model request is sent after this
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle, no_restart=True)
        leftovers = [*self.running, *self.starting, *self.polls]
        for fut in leftovers:
            fut.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=1.0)
        for fut in leftovers:  # retrieve what they raised, so nothing is logged as never retrieved
            if fut.done() and not fut.cancelled():
                fut.exception()
