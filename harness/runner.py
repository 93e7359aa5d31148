"""The batch runner: many episodes concurrently into one run directory, resumable.

Layers (as in tau2-bench): :func:`harness.loop.run_episode` runs one episode; :func:`run_specs` runs many on one
event loop under a semaphore; :func:`run_batch` owns the run directory (:class:`harness.store.RunStore`), the
model server/client lifetime, progress, resume and the optional worker processes.

Resume: finished episode ids are skipped; an in-flight episode with a checkpoint continues from its last
checkpointed step (the last completed step, or at most ``CHECKPOINT_INTERVAL_S`` older) when the domain supports replay (``Domain.supports_replay``), otherwise it restarts from scratch (its
checkpoint is discarded). An episode whose model call failed after retries (``ModelCallFailed``) or that crashed
on an unexpected error is an *infrastructure error*: it is not written, it is counted, and re-running the same
command picks it up again.

Workers (``workers > 1``): N processes (forked from a fork server that preloaded the harness; spawned where
there is none), each with its own event loop, model client and its share of the ``concurrency`` slots (the total
stays ``concurrency``; N is capped at it); every slot pulls the next episode from one shared job queue as it frees up
(dynamic load balance). Children write only their own checkpoint files; they send
finished episodes (already serialized) to the parent, the single writer of the JSONL files.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from rundir.errors import UserError
from harness.loop import (
    EpisodeResult,
    EpisodeSpec,
    PartialEpisode,
    derive_seed,
    episode_id_for,
    recorded_steps,
    run_episode,
)
from harness.progress import BatchStats, EpisodeSummary, Progress
from rundir.schema import RunConfig

log = logging.getLogger(__name__)

__all__ = ["EpisodeSpec", "BatchSummary", "plan_specs", "build_domain", "run_batch", "run_specs"]


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


def build_domain(config: RunConfig):
    """The configured domain instance (options = domain_options, plus ``split`` when the config sets one)."""
    from domains import get_domain_class

    cls = get_domain_class(config.domain)
    options = dict(config.domain_options)
    if config.split is not None:
        options.setdefault("split", config.split)
    return cls(options, observation_chars=config.observation_chars)


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

    @property
    def remaining(self) -> int:
        return self.planned - self.finished_before - self.stats.done

    @property
    def ok(self) -> bool:
        return self.remaining == 0


# --------------------------------------------------------------------------------------- one event loop


@dataclass
class _Job:
    spec: EpisodeSpec
    resumed: bool = False  # prefix comes from this episode's own checkpoint


async def run_specs(
    jobs: "list[_Job] | Callable[[], Awaitable[_Job | None]]",
    *,
    domain,
    client,
    system_prompt: str,
    step_budget: int,
    concurrency: int,
    run_dir: Path | None,
    checkpoints: bool,
    persist: Callable[[EpisodeResult], Any],
    on_done: Callable[[Any], None] | None = None,
    on_error: Callable[[EpisodeSpec, str], None],
    checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
) -> None:
    """Run jobs concurrently (at most ``concurrency`` at a time) on the current event loop.

    File I/O never blocks the event loop: checkpoint writes and ``persist(result)`` (which appends the finished
    episode, with its fsyncs) run in one dedicated I/O thread, in submission order -- so an episode's last
    checkpoint write always precedes its append (which deletes the checkpoint). ``on_done(persist's return
    value)`` then runs on the event loop.
    """
    from concurrent.futures import ThreadPoolExecutor

    from domains.base import EnvironmentUnavailable
    from harness.model_types import ModelCallFailed
    from harness.store import CheckpointEncoder, write_checkpoint_json

    loop = asyncio.get_running_loop()
    io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uqh-io")
    sem = asyncio.Semaphore(max(1, concurrency))
    use_checkpoints = checkpoints and run_dir is not None and getattr(domain, "supports_replay", False)

    encoder = CheckpointEncoder()

    last_write: dict[str, float] = {}

    def checkpoint(partial: PartialEpisode) -> None:
        now = time.monotonic()
        eid = partial.episode_id
        if eid in last_write and now - last_write[eid] < checkpoint_interval_s:
            return  # wrote one moments ago: with fast models, at most one checkpoint per interval
        last_write[eid] = now
        data = encoder.dumps(partial)  # snapshot now; the thread only writes bytes
        io.submit(write_checkpoint_json, run_dir, partial.episode_id, data).add_done_callback(_log_io_failure)

    async def one(job: _Job) -> None:
        async with sem:
            spec = job.spec
            env = None
            try:
                env = domain.make_env(spec.task_id, episode_seed=spec.seed)
                task_prompt = await env.reset()
                if spec.prefix is not None and spec.prefix.steps:
                    from domains.base import ReplayMismatch

                    try:
                        await env.replay(recorded_steps(spec.prefix.steps))
                        # Continue the recorded conversation: a reset whose opening is sampled (Tau2's simulated
                        # user) may differ from the recorded one, which the replayed state already holds.
                        task_prompt = spec.prefix.task_prompt
                    except ReplayMismatch as exc:
                        if not job.resumed:
                            raise
                        log.warning("%s: checkpoint replay failed (%s); restarting the episode", spec.episode_id, exc)
                        env.close()
                        env = domain.make_env(spec.task_id, episode_seed=spec.seed)
                        task_prompt = await env.reset()
                        spec = dataclasses.replace(
                            spec, prefix=None, prefix_steps=None, prefix_sidecar=[], started_at=None
                        )
                spec = dataclasses.replace(spec, task_prompt=task_prompt)
                result = await run_episode(
                    env,
                    client,
                    spec=spec,
                    system_prompt=system_prompt,
                    step_budget=spec.step_budget or step_budget,
                    on_step=checkpoint if use_checkpoints else None,
                )
                if job.resumed and spec.prefix is not None:  # record that a crash split this episode
                    result.episode.info["resumed_after_step"] = len(spec.prefix.steps)
                cached = encoder.cached_rows(spec.episode_id)
                if len(cached) <= len(result.sidecar):
                    result.sidecar_json_prefix = cached
            except (ModelCallFailed, EnvironmentUnavailable) as exc:
                on_error(spec, f"model call failed: {_first_line(exc)}")
                return
            except Exception as exc:  # noqa: BLE001 - any other crash is an infra error, reported, re-queued
                log.debug("episode %s crashed", spec.episode_id, exc_info=True)
                on_error(spec, f"{type(exc).__name__}: {_first_line(exc)}")
                return
            finally:
                encoder.forget(spec.episode_id)
                last_write.pop(spec.episode_id, None)
                if env is not None:
                    with contextlib.suppress(Exception):
                        env.close()
            value = await loop.run_in_executor(io, persist, result)
            if on_done is not None:
                on_done(value)

    async def slot(pull) -> None:
        while (job := await pull()) is not None:
            await one(job)

    try:
        if callable(jobs):  # pull jobs from a shared source (worker processes): ``concurrency`` slots
            await asyncio.gather(*(slot(jobs) for _ in range(max(1, concurrency))))
        else:
            await asyncio.gather(*(one(j) for j in jobs))
    finally:
        io.shutdown(wait=True)


def _log_io_failure(fut) -> None:
    exc = fut.exception()
    if exc is not None:
        log.warning("checkpoint write failed: %s", exc)


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
) -> BatchSummary:
    """Run (or resume) every planned episode of ``config`` into ``run_dir``; return the summary.

    ``client_factory(litellm_model, api_base)`` replaces :func:`harness.model_client.make_model_client` (tests).
    """
    from harness.store import RunStore

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
    workers = max(1, min(int(workers), concurrency))  # each worker needs at least one of the slots

    with RunStore.open_or_create(run_dir, config, system_prompt=system_prompt, info=domain.manifest_info()) as store:
        finished_before = sum(1 for i in ids if i in store.finished_ids)
        jobs = _jobs_with_checkpoints(store, domain, [s for s in specs if s.episode_id not in store.finished_ids])
        stats = BatchStats(total=len(specs), already_done=finished_before)
        summary = BatchSummary(run_dir, len(specs), finished_before, stats, notes=list(store.notes))
        if not jobs:
            return summary

        def persist(result: EpisodeResult) -> EpisodeSummary:  # runs in the I/O thread
            eid, line, rows, ep_summary = _serialize(result)
            store.append_serialized(eid, line, rows)
            return ep_summary

        def write(episode_id: str, episode_line: bytes, sidecar_bytes: bytes, ep_summary: EpisodeSummary) -> None:
            store.append_serialized(episode_id, episode_line, sidecar_bytes)
            counted(ep_summary)

        def counted(ep_summary: EpisodeSummary) -> None:
            stats.add(ep_summary)
            bar.update()

        def error(spec: EpisodeSpec, message: str) -> None:
            stats.add_error(message)
            bar.update()

        with contextlib.ExitStack() as stack:
            model, api_base = _resolve(stack, config.model, config.api_base)
            runtime: dict[str, Any] = {"run_dir": run_dir}
            if config.user_model:
                user_model, user_base = _resolve(stack, config.user_model, config.user_api_base)
                runtime.update(user_model=user_model, user_api_base=user_base, user_decoding=config.user_decoding)
            domain.prepare_runtime(runtime)
            bar = stack.enter_context(Progress(stats, enabled=progress))
            if workers == 1 or len(jobs) == 1:
                stack.enter_context(gc_tuned())
                asyncio.run(
                    _run_in_process(
                        jobs, config, domain, system_prompt, model, api_base, concurrency, run_dir, checkpoints,
                        persist, counted, error, client_factory, checkpoint_interval_s,
                    )
                )
            else:
                summary.worker_cpu_s = _run_workers(
                    jobs, config, system_prompt, model, api_base, runtime, concurrency, workers, run_dir,
                    checkpoints, write, error, checkpoint_interval_s,
                )
        return summary


def _resolve(stack: contextlib.ExitStack, model: str, api_base: str | None) -> tuple[str, str | None]:
    from harness.local_model import resolve_model

    return stack.enter_context(resolve_model(model, api_base))


def _jobs_with_checkpoints(store, domain, specs: list[EpisodeSpec]) -> list[_Job]:
    saved = store.load_checkpoints()
    jobs = []
    for spec in specs:
        partial = saved.pop(spec.episode_id, None)
        if partial is None:
            jobs.append(_Job(spec))
        elif not getattr(domain, "supports_replay", False):
            store.delete_checkpoint(spec.episode_id)
            store.notes.append(f"{spec.episode_id}: restarted (the domain cannot replay a checkpoint)")
            jobs.append(_Job(spec))
        else:
            jobs.append(
                _Job(
                    dataclasses.replace(
                        spec,
                        prefix=partial,
                        prefix_steps=partial.prefix_steps,
                        prefix_sidecar=list(partial.sidecar),
                        started_at=partial.started_at,
                    ),
                    resumed=True,
                )
            )
    for stale in saved:  # checkpoints of episodes this batch does not plan
        log.info("ignoring checkpoint of unplanned episode %s", stale)
    return jobs


def _make_client(model: str, api_base: str | None, config: RunConfig, client_factory):
    if client_factory is not None:
        return client_factory(model, api_base)
    from domains import get_domain_class
    from harness.model_client import make_model_client

    action_grammar = get_domain_class(config.domain).action_gbnf if config.decoding.grammar else None
    return make_model_client(model, api_base=api_base, decoding=config.decoding, action_grammar=action_grammar)


def _serialize(result: EpisodeResult) -> tuple[str, bytes, bytes, EpisodeSummary]:
    ep = result.episode
    line = ep.model_dump_json().encode() + b"\n"
    k = len(result.sidecar_json_prefix)
    rows = "".join(j + "\n" for j in result.sidecar_json_prefix).encode()
    rows += b"".join(r.model_dump_json().encode() + b"\n" for r in result.sidecar[k:])
    return ep.episode_id, line, rows, EpisodeSummary.of(ep)


async def _run_in_process(
    jobs, config, domain, system_prompt, model, api_base, concurrency, run_dir, checkpoints, persist, counted, error,
    client_factory, checkpoint_interval_s,
) -> None:
    client = _make_client(model, api_base, config, client_factory)
    try:
        await run_specs(
            jobs,
            domain=domain,
            client=client,
            system_prompt=system_prompt,
            step_budget=config.step_budget,
            concurrency=concurrency,
            run_dir=run_dir,
            checkpoints=checkpoints,
            persist=persist,
            on_done=counted,
            on_error=error,
            checkpoint_interval_s=checkpoint_interval_s,
        )
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


# --------------------------------------------------------------------------------------- worker processes


def _run_workers(
    jobs, config, system_prompt, model, api_base, runtime, concurrency, workers, run_dir, checkpoints, write, error,
    checkpoint_interval_s,
) -> float:
    """Run the jobs in worker processes; return the CPU seconds the workers reported."""
    ctx = _mp_context(_worker_preload(config, model, api_base))
    queue = ctx.Queue()  # children -> parent: finished episodes, errors, exits
    job_queue = ctx.Queue()  # parent -> children: jobs pulled as slots free up (dynamic load balance)
    # --concurrency is the total in flight (a provider's rate limit does not grow with --workers): split it.
    # run_batch already capped workers at concurrency.
    workers = min(workers, len(jobs))
    shares = [concurrency // workers + (1 if w < concurrency % workers else 0) for w in range(workers)]
    for job in jobs:
        job_queue.put(job)
    for _ in range(sum(shares)):  # one end marker per slot
        job_queue.put(None)
    procs = []
    config_json = config.model_dump_json()
    for w in range(workers):
        p = ctx.Process(
            target=_worker_main,
            args=(w, config_json, system_prompt, model, api_base, runtime, shares[w], str(run_dir), checkpoints,
                  job_queue, queue, os.getpid(), checkpoint_interval_s, dict(os.environ)),
            daemon=True,
            name=f"uqh-worker-{w}",
        )
        p.start()
        procs.append(p)
    alive = set(range(workers))
    cpu_s = 0.0
    pending = {j.spec.episode_id: j.spec for j in jobs}
    try:
        import queue as queue_mod

        while alive:
            try:
                msg = queue.get(timeout=1.0)
            except queue_mod.Empty:
                for w in list(alive):
                    if not procs[w].is_alive():
                        alive.discard(w)  # died without saying goodbye (crash): its episodes are counted below
                continue
            kind = msg[0]
            if kind == "done":
                _, eid, line, rows, ep_summary = msg
                pending.pop(eid, None)
                write(eid, line, rows, ep_summary)
            elif kind == "error":
                _, eid, message = msg
                spec = pending.pop(eid, None)
                error(spec, message)
            elif kind == "exit":
                alive.discard(msg[1])
                cpu_s += msg[2] if len(msg) > 2 else 0.0
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    for eid, spec in pending.items():  # a worker died before reporting these
        error(spec, "worker process exited unexpectedly")
    return cpu_s


#: Imported once by the fork server, so each worker starts as a fork of a process that already has them.
_WORKER_PRELOAD = ["harness", "harness.runner", "harness.store", "harness.model_client", "domains", "aiohttp", "tenacity"]


def _worker_preload(config: RunConfig, model: str, api_base: str | None) -> list[str]:
    """The modules the workers of this run need: the harness, the run's domain module and, when any model call
    of the run goes through litellm (the agent's, or a user simulator's), litellm itself (a ~3 s CPU import that
    would otherwise be paid once per worker)."""
    from domains import get_domain_class
    from harness.model_client import is_openai_compatible_url

    modules = list(_WORKER_PRELOAD)
    cls = get_domain_class(config.domain)
    if cls.__module__.startswith("domains."):  # not a class registered from elsewhere (tests, notebooks)
        modules.append(cls.__module__)
        # What a domain's workers would each load on first use (e.g. Tau2: the tau2 package and its DBs).
        modules.extend(getattr(cls, "worker_preload", ()))
    if not is_openai_compatible_url(model, api_base) or config.user_model:
        modules.append("litellm")
    return modules


def _mp_context(preload: list[str]):
    """Worker processes come from a fork server (POSIX) that imported ``preload`` once, else are spawned.

    A forked child of the (single-threaded) fork server starts in milliseconds instead of re-importing pydantic,
    aiohttp, the harness and maybe litellm (0.3-3 s of CPU per worker); the parent itself is never forked, so its
    threads do not matter. The server is started on first use and lives as long as this process, so the first
    run with workers decides what it preloads (one run per ``uqh`` process).
    """
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(preload)  # only effective before the server has started
        return ctx
    return mp.get_context("spawn")


def _worker_main(index, config_json, system_prompt, model, api_base, runtime, concurrency, run_dir, checkpoints,
                 job_queue, queue, parent_pid, checkpoint_interval_s, environ=None) -> None:
    if environ is not None:  # the fork server's environment is from when it started: use the parent's current one
        os.environ.clear()
        os.environ.update(environ)
    import harness  # noqa: F401 - sets LITELLM_LOCAL_MODEL_COST_MAP before litellm is imported

    config = RunConfig.model_validate_json(config_json)
    domain = build_domain(config)
    domain.prepare_runtime(runtime)

    def done(result: EpisodeResult) -> None:  # runs in the I/O thread, after the episode's checkpoint writes
        eid, line, rows, ep_summary = _serialize(result)
        queue.put(("done", eid, line, rows, ep_summary))

    def failed(spec: EpisodeSpec, message: str) -> None:
        queue.put(("error", spec.episode_id, message))

    async def main() -> None:
        import multiprocessing as mp

        parent = mp.parent_process()  # a fork server's child is not the parent's child: watch its sentinel

        async def watch_parent() -> None:
            while True:
                await asyncio.sleep(1.0)
                gone = not parent.is_alive() if parent is not None else os.getppid() != parent_pid
                if gone:  # the parent was killed: stop, do not run on unsupervised
                    os._exit(1)

        from concurrent.futures import ThreadPoolExecutor

        watcher = asyncio.create_task(watch_parent())
        client = _make_client(model, api_base, config, None)
        loop = asyncio.get_running_loop()
        pullers = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="uqh-pull")

        def pull():  # each slot takes the next job from the shared queue; None ends the slot
            return loop.run_in_executor(pullers, job_queue.get)

        try:
            await run_specs(
                pull,
                domain=domain,
                client=client,
                system_prompt=system_prompt,
                step_budget=config.step_budget,
                concurrency=concurrency,
                run_dir=Path(run_dir),
                checkpoints=checkpoints,
                persist=done,
                on_error=failed,
                checkpoint_interval_s=checkpoint_interval_s,
            )
        finally:
            watcher.cancel()
            pullers.shutdown(wait=False)
            with contextlib.suppress(Exception):
                await client.aclose()

    try:
        with gc_tuned():
            asyncio.run(main())
    finally:
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF)
        queue.put(("exit", index, r.ru_utime + r.ru_stime))
