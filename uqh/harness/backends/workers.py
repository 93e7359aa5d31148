"""Worker processes of a batch (``uqh run --workers N``): N event loops in N processes, one writer.

The workers are forked from a fork server that preloaded the harness (spawned where there is none), so they never
inherit the parent's open files -- the run directory's writer lock included. Each has its own event loop, model
client and its share of the ``concurrency`` slots (the total stays ``concurrency``); every slot pulls the next
episode from one shared job queue as it frees up (dynamic load balance). Workers write only their own checkpoint
files; they send finished episodes (already serialized) to the parent, the single writer of the JSONL files, and the
calls of every episode that ends without a result (failed, or cut short by a stop), which the parent counts.

Stopping: the parent's first SIGINT/SIGTERM (or a fatal cause: a write failure, an unreachable endpoint) sends
SIGTERM to every worker; a worker treats SIGINT and SIGTERM alike (a Ctrl-C reaches the whole process group):
it cancels its episodes at once (no request after the signal, no traceback), sends what has finished and exits.
The parent writes what arrives and, after :data:`STOP_GRACE_S`, kills a worker that has not exited. A worker whose
parent died exits at once (a thread waits on the parent from its first line), so nothing runs on unsupervised.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue as queue_mod
import resource
import signal
import threading
import time

from uqh.harness import interrupts
from uqh.harness.config.build import build_client, build_domain
from uqh.harness.episode.loop import EpisodeResult, EpisodeSpec
from uqh.harness.model.endpoints import EndpointCounts, merge_counts
from uqh.harness.backends.backend import BackendResult
from uqh.harness.backends.context import BatchStopped, RunContext, StopCause, gc_tuned
from uqh.harness.backends.event_loop import endpoint_counts, run_cancellable, run_specs, serialize
from uqh.rundir.errors import RunDirWriteError
from uqh.rundir.schema import RunConfig

__all__ = ["STOP_GRACE_S", "run_workers"]

#: Seconds the workers get to exit after being told to stop, before they are killed.
STOP_GRACE_S = 1.0

#: Queues of batches that ended with items unread (stopped early, or a worker died): kept until this process exits.
#: A queue's named semaphores are unlinked by whichever thread drops the last reference; left to the queue's feeder
#: thread, an exit right after a stop could freeze that daemon thread between unlinking a semaphore and telling
#: the resource tracker, which then warns of a "leaked semaphore" on the terminal. Held here, they are released by
#: the main thread's exit finalizers.
_QUEUES_UNTIL_EXIT: list = []

#: Imported once by the fork server, so each worker starts as a fork of a process that already has them.
_WORKER_PRELOAD = [
    "uqh", "uqh.harness.backends.event_loop", "uqh.harness.backends.workers", "uqh.harness.store.writer",
    "uqh.harness.model.client", "uqh.harness.model.transports", "uqh.harness.model.endpoints",
    "uqh.domains.domain_registry", "aiohttp", "tenacity",
]


def run_workers(ctx: RunContext, specs: list[EpisodeSpec], workers: int, write, error, unfinished_calls
                ) -> BackendResult:
    """Run the episodes in worker processes; return the CPU seconds the workers reported, why the batch stopped
    early (None: every episode was attempted) and the workers' per-endpoint counts (several endpoints).

    ``write(episode_id, line, rows, summary)`` appends and counts a finished episode; ``error(spec, message,
    retries)`` counts an infrastructure failure, and ``unfinished_calls(totals)`` the calls of an episode that
    ended without a result (:class:`uqh.harness.backends.backend.BatchHooks`)."""
    pool = _WorkerPool(ctx, specs, workers, write, error, unfinished_calls)
    with interrupts.on_stop(lambda signum: pool.request_stop(StopCause.signal(signum))):
        try:
            pool.start()
            pool.serve()
        finally:
            pool.close()
    if pool.cause is None:
        for spec in pool.pending.values():  # a worker died before reporting these
            error(spec, "worker process exited unexpectedly", 0)
    return BackendResult(stopped=pool.cause, worker_cpu_s=pool.cpu_s, endpoint_calls=pool.endpoint_calls)


class _WorkerPool:
    """The parent's side of ``--workers N``: the processes, the two queues, and what the workers reported."""

    def __init__(self, ctx: RunContext, specs: list[EpisodeSpec], workers: int, write, error, unfinished_calls):
        self.ctx, self.write, self.error, self.unfinished_calls = ctx, write, error, unfinished_calls
        self.mp_ctx = _mp_context(worker_preload(ctx.config, ctx.agent_model.model, ctx.agent_model.api_base))
        self.results = self.mp_ctx.Queue()  # children -> parent: finished episodes, errors, exits
        self.jobs = self.mp_ctx.Queue()  # parent -> children: specs pulled as slots free up (dynamic load balance)
        # --concurrency is the total in flight (a provider's rate limit does not grow with --workers): split it.
        # The backend already capped workers at concurrency.
        self.workers = min(workers, len(specs))
        total = ctx.concurrency
        self.shares = [total // self.workers + (1 if w < total % self.workers else 0) for w in range(self.workers)]
        for spec in specs:
            self.jobs.put(spec)
        for _ in range(sum(self.shares)):  # one end marker per slot
            self.jobs.put(None)
        self.procs: list = []
        self.cause: StopCause | None = None
        self.stop_deadline: float | None = None
        self.cpu_s = 0.0
        self.endpoint_calls: list[EndpointCounts] = []
        self.pending = {s.episode_id: s for s in specs}
        self.drained = 0  # workers whose slots all read their end marker

    def request_stop(self, why: StopCause) -> None:  # also called from the signal handler: short, non-blocking
        if self.stop_deadline is not None:
            return
        self.cause, self.stop_deadline = why, time.monotonic() + STOP_GRACE_S
        for p in self.procs:
            if p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)

    def start(self) -> None:
        for w in range(self.workers):
            p = self.mp_ctx.Process(
                target=_worker_main,
                args=(w, dataclasses.replace(self.ctx, concurrency=self.shares[w]), self.jobs, self.results,
                      os.getpid(), dict(os.environ)),
                daemon=True,
                name=f"uqh-worker-{w}",
            )
            p.start()
            self.procs.append(p)
            if self.stop_deadline is not None:  # a signal arrived while starting them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)

    def serve(self) -> None:
        """Read the workers' messages until every worker exited (or the grace period after a stop ran out)."""
        alive = set(range(self.workers))
        while alive:
            if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                break
            try:
                msg = self.results.get(timeout=0.1 if self.stop_deadline is not None else 1.0)
            except queue_mod.Empty:
                for w in list(alive):
                    if not self.procs[w].is_alive():
                        alive.discard(w)  # died without saying goodbye (crash): its episodes are counted later
                continue
            if msg[0] == "exit":
                alive.discard(msg[1])
            self.handle(msg)

    def handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "done":
            _, eid, line, rows, ep_summary = msg
            try:  # after a write failure the store refuses every append (its calls still count)
                self.write(eid, line, rows, ep_summary)
            except RunDirWriteError as exc:
                self.request_stop(StopCause.write_failure(exc))
                return
            self.pending.pop(eid, None)
        elif kind == "error":
            _, eid, message, retries = msg
            self.error(self.pending.pop(eid, None), message, retries)
        elif kind == "unfinished_calls":
            self.unfinished_calls(msg[1])
        elif kind == "stopped":
            self.request_stop(msg[1])
        elif kind == "exit":
            self.drained += bool(msg[4])
            self.cpu_s += msg[2]
            self.endpoint_calls = merge_counts(self.endpoint_calls, msg[3])

    def close(self) -> None:
        """Join (or kill) the workers and release the queues without ever blocking on unread specs."""
        deadline = self.stop_deadline if self.stop_deadline is not None else time.monotonic() + 5.0
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=1.0)
        unread = self.stop_deadline is not None or self.drained < len(self.procs)
        if unread:  # unread specs may remain: never block this process's exit on them
            self.jobs.cancel_join_thread()
            self.results.cancel_join_thread()
        self.jobs.close()
        self.results.close()
        if unread:
            _QUEUES_UNTIL_EXIT.append((self.jobs, self.results))
        else:  # every slot read its end marker, so every spec before it: the feeder has nothing left to write
            self.jobs.join_thread()


def worker_preload(config: RunConfig, model: str, api_base: str | None) -> list[str]:
    """The modules the workers of this run need: the harness, the run's domain module and, when any model call
    of the run goes through litellm (the agent's, or a user simulator's), litellm itself (a ~3 s CPU import that
    would otherwise be paid once per worker)."""
    from uqh.domains.domain_registry import get_domain_class
    from uqh.harness.model.client import is_openai_compatible_url

    modules = list(_WORKER_PRELOAD)
    cls = get_domain_class(config.domain)
    if cls.__module__.startswith("uqh.domains."):  # not a class registered from elsewhere (tests, notebooks)
        modules.append(cls.__module__)
        # What a domain's workers would each load on first use (e.g. Tau2: the tau2 package and its DBs).
        modules.extend(cls.worker_preload)
    if not is_openai_compatible_url(model, api_base) or config.user_model:
        modules.append("litellm")
    return modules


def _mp_context(preload: list[str]):
    """Worker processes come from a fork server (POSIX) that imported ``preload`` once, else are spawned.

    A forked child of the (single-threaded) fork server starts in milliseconds instead of re-importing pydantic,
    aiohttp, the harness and maybe litellm (0.3-3 s of CPU per worker); the parent itself is never forked, so its
    threads (and its open files) do not matter. The server is started on first use and lives as long as this
    process, so the first run with workers decides what it preloads (one run per ``uqh`` process).
    """
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(preload)  # only effective before the server has started
        return ctx
    return mp.get_context("spawn")


def _exit_with_parent(parent_pid: int) -> None:
    """Exit this worker as soon as its parent dies, whatever its other threads are blocked on.

    A daemon thread, started before anything else: a watcher on the event loop would only run once start-up (domain
    data, imports) is over and only while the loop is not blocked, and a worker whose parent was killed early could
    wait forever on a queue's lock (found by benchmarks/fault_campaign.py).
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    parent = mp.parent_process()  # a fork server's child is not the parent's child: wait on the parent's sentinel

    def watch() -> None:
        if parent is not None:
            wait([parent.sentinel])  # readable (EOF) when the parent is gone
        else:
            while os.getppid() == parent_pid:
                time.sleep(0.2)
        os._exit(1)  # do not run on unsupervised, and do not block on a flush to a queue nobody reads

    threading.Thread(target=watch, name="uqh-parent-watch", daemon=True).start()


@contextlib.contextmanager
def worker_stop_signals():
    """SIGINT and SIGTERM stop a worker quietly, whenever they arrive: the signal is only recorded (a callback for
    the worker's whole life, so :mod:`~uqh.harness.interrupts` never raises ``Interrupted``). Raised, it could land
    inside an asyncio task between the event loop's own stop callbacks -- its client being built, closed -- and
    asyncio printed the task's ~40-line traceback (``Interrupted: SIGTERM``) before the parent's one line. The
    work checks :func:`~uqh.harness.interrupts.requested` before each start-up step, and the event loop's stop
    callback (:func:`run_cancellable`) cancels the episodes at once if the signal came first."""
    with interrupts.stop_signals(), interrupts.on_stop(lambda signum: None):
        yield


def _worker_main(index: int, ctx: RunContext, jobs, results, parent_pid: int, environ=None) -> None:
    _exit_with_parent(parent_pid)
    endpoint_calls: list[EndpointCounts] = []
    drained = False  # every slot of this worker read its end marker
    with worker_stop_signals():  # SIGINT and SIGTERM stop this worker quietly (see the module docstring)
        try:
            _work(ctx, jobs, results, parent_pid, environ, endpoint_calls)
            drained = interrupts.requested() is None  # a stop signal ends the loop early without an error
        except interrupts.Interrupted:
            pass  # stopped before its event loop ran: nothing in flight
        except BatchStopped as exc:
            _ignore_stop_signals()
            results.put(("stopped", exc.cause))
        finally:
            _ignore_stop_signals()  # done: a late stop signal (the parent's) must not interrupt the goodbye
    _ignore_stop_signals()
    r = resource.getrusage(resource.RUSAGE_SELF)
    results.put(("exit", index, r.ru_utime + r.ru_stime, endpoint_calls, drained))


def _ignore_stop_signals() -> None:
    for s in interrupts.STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def _work(ctx: RunContext, jobs, results, parent_pid: int, environ, endpoint_calls: list) -> None:
    if environ is not None:  # the fork server's environment is from when it started: use the parent's current one
        os.environ.clear()
        os.environ.update(environ)
    import uqh  # noqa: F401 - sets LITELLM_LOCAL_MODEL_COST_MAP before litellm is imported

    if interrupts.requested() is not None:  # stopped while starting: do not load the domain for nothing
        return
    domain = build_domain(ctx.config)
    domain.prepare_runtime(ctx.domain_runtime())
    if interrupts.requested() is not None:
        return

    def done(result: EpisodeResult) -> None:  # runs in the I/O thread, after the episode's checkpoint writes
        eid, line, rows, ep_summary = serialize(result)
        results.put(("done", eid, line, rows, ep_summary))

    def failed(spec: EpisodeSpec, message: str, retries: int = 0) -> None:
        results.put(("error", spec.episode_id, message, retries))

    def unfinished(calls) -> None:  # sent at once: a worker killed after the stop grace still reported them
        results.put(("unfinished_calls", calls))

    async def main() -> None:
        from concurrent.futures import ThreadPoolExecutor

        client = build_client(ctx.config, ctx.agent_model, ctx.client)
        loop = asyncio.get_running_loop()
        pullers = ThreadPoolExecutor(max_workers=max(1, ctx.concurrency), thread_name_prefix="uqh-pull")

        def pull():  # each slot takes the next spec from the shared queue; None ends the slot
            return loop.run_in_executor(pullers, jobs.get)

        try:
            await run_cancellable(run_specs(ctx, pull, domain=domain, client=client, persist=done, on_error=failed,
                                            on_unfinished_calls=unfinished))
        finally:
            pullers.shutdown(wait=False)
            endpoint_calls.extend(endpoint_counts(client))
            with contextlib.suppress(Exception):
                await client.aclose()
            with contextlib.suppress(Exception):
                await domain.aclose()

    with gc_tuned():
        asyncio.run(main())

