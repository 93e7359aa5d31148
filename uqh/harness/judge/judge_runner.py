"""`uqh judge`'s write path: GPA judges over the episodes of recorded runs, into a judge directory (resumable).

Layers, as in the runner: :func:`judge_one` makes one judgment (a call, the reply parsed, at most one repair);
:func:`judge_tasks` runs many on one event loop under a semaphore; :func:`run_judges` owns the judge directory
(:class:`JudgmentStore`), the model's lifetime, progress and resume.

- The judged run directories are only read (through :class:`rundir.RunDir`); the judge directory must be a
  directory of its own, outside every judged run.
- Every judge call goes through :func:`uqh.harness.model.client.make_model_client`: the same retries, backoff,
  concurrency limit and usage/cost accounting as a run. A call that still fails (``ModelCallFailed``) is an
  infrastructure error: nothing is written, and re-running the command judges that episode again.
- Crash safety as in :class:`uqh.harness.store.writer.RunStore`: ``judgments.jsonl`` is append-only, one line per finished
  judgment, each append fsynced by one I/O thread; a torn last line is cut on reopen; finished keys
  ``(run, episode_id, metric, repeat)`` are skipped on resume; a changed judge config is refused with the
  fields that differ.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from uqh.harness.judge.prompts import TRACE_FORMAT, ReplyError, judge_messages, parse_reply, prompts_sha256, repair_request
from uqh.harness.episode.loop import derive_seed, now_iso
from uqh.harness.progress import BatchStats, EpisodeSummary, Progress
from uqh.harness.store import lock as run_lock
from uqh.harness.store.writer import append_fsync, truncate_to
from uqh.rundir.atomic import atomic_write_text, check_creatable
from uqh.rundir.errors import UserError, first_line
from uqh.rundir.judgments import (
    JUDGE_MANIFEST_FILE,
    JUDGMENTS_FILE,
    JudgeAttempt,
    JudgeConfig,
    JudgeDir,
    JudgedRun,
    JudgeManifest,
    JudgeMetric,
    Judgment,
    judge_config_differences,
)
from uqh.rundir.output_dir import enclosing_run_dir
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import MANIFEST_FILE, DecodingConfig, Episode

log = logging.getLogger(__name__)

Key = tuple[int, str, str, int]


@dataclass(frozen=True)
class JudgeTask:
    """One judgment to make: judge ``metric`` on ``episode`` of judged run ``run``, repeat ``repeat``."""

    run: int
    episode: Episode
    metric: JudgeMetric
    repeat: int
    seed: int
    system_prompt: str  # the judged run's system prompt (the agent's instructions and tool catalogue)

    @property
    def key(self) -> Key:
        return (self.run, self.episode.episode_id, self.metric.value, self.repeat)


# --------------------------------------------------------------------------------------- config and plan


def open_runs(paths: list[str | Path]) -> list[RunDir]:
    """The judged run directories, opened for reading; UserError for a bad or repeated path."""
    readers = [RunDir.open(p) for p in paths]
    resolved = [r.path.resolve() for r in readers]
    if len(set(resolved)) != len(resolved):
        raise UserError("a run directory is given twice; list each judged run once")
    for r in readers:
        if not r.has_episodes_file:
            raise UserError(f"{r.path} has no finished episode yet; run `uqh run` first")
    return readers


def build_judge_config(
    readers: list[RunDir], judge_model: str, api_base: str | None, decoding: DecodingConfig
) -> JudgeConfig:
    from uqh import __version__

    runs = [JudgedRun(path=str(r.path.resolve()), config_hash=r.manifest.config_hash, domain=r.config.domain,
                      model=r.config.model) for r in readers]
    return JudgeConfig(runs=runs, judge_model=judge_model, api_base=api_base, decoding=decoding,
                       prompts_sha256=prompts_sha256(), trace_format=TRACE_FORMAT, package_version=__version__)


@dataclass(frozen=True)
class SidecarLayout:
    """What a directory of calls over recorded runs is called and holds: ``uqh judge``'s judge directory or
    ``uqh probe``'s probe directory. Both are written by :class:`SidecarStore` and run by :func:`run_sidecar`."""

    label: str  # "judge directory"
    noun: str  # what its lines are: "judgments"
    role: str  # what the recorded runs are to it: "judged"
    manifest_file: str
    records_file: str
    open_reader: Callable[[Path], Any]  # the rundir reader: .manifest, .complete_length()
    done_keys: Callable[[Any], set]  # reader -> the keys of the records it holds
    make_manifest: Callable[[Any], Any]  # config -> the manifest written on creation
    differences: Callable[[Any, Any], list[str]]  # (old config, new config) -> the hashed fields that differ


def _judge_manifest(config: JudgeConfig) -> JudgeManifest:
    return JudgeManifest(config=config, config_hash=config.config_hash(), created_at=now_iso())


JUDGE_LAYOUT = SidecarLayout("judge directory", "judgments", "judged", JUDGE_MANIFEST_FILE, JUDGMENTS_FILE,
                             JudgeDir.open, lambda reader: {j.key for j in reader.judgments()}, _judge_manifest,
                             judge_config_differences)


def check_judge_out(out: Path, run_paths: list[Path], layout: SidecarLayout = JUDGE_LAYOUT) -> None:
    """UserError unless ``out`` can hold a judge (probe) directory (new, empty or an existing one) outside every
    judged run. Writes nothing."""
    out = Path(out)
    target = out.resolve()
    for run in run_paths:
        run = Path(run).resolve()
        if target == run or run in target.parents:
            raise UserError(f"--out {out} is inside the {layout.role} run {run}; {layout.noun} go into a directory "
                            f"of their own (the {layout.role} run is never modified)")
    inside = enclosing_run_dir(out)
    if inside is not None and inside != Path(os.path.abspath(out)):
        raise UserError(f"--out {out} is inside the run directory {inside}; {layout.noun} go into a directory of "
                        "their own")
    if out.exists():
        if not out.is_dir():
            raise UserError(f"--out {out} exists and is not a directory; choose a new directory")
        if not os.access(out, os.R_OK | os.W_OK | os.X_OK):
            raise UserError(f"--out {out} is not readable and writable; choose another directory")
        if (out / MANIFEST_FILE).exists():
            raise UserError(f"--out {out} is a run directory; {layout.noun} go into a directory of their own")
        run_lock.check_not_held(out)  # another uqh is creating it: say so, not "not a {layout.label}"
        if not (out / layout.manifest_file).exists() and any(p.name != run_lock.LOCK_FILE for p in out.iterdir()):
            raise UserError(f"--out {out} is a non-empty directory that is not a {layout.label}; choose a new one")
        return
    check_creatable(out)


def check_judge_resumable(out: Path, config, layout: SidecarLayout = JUDGE_LAYOUT) -> None:
    """UserError (writing nothing) unless an existing judge (probe) directory in ``out`` has exactly this config."""
    if not (Path(out) / layout.manifest_file).exists():
        return
    manifest = layout.open_reader(Path(out)).manifest
    if manifest.config_hash != config.config_hash():
        diffs = layout.differences(manifest.config, config) or ["(hash only)"]
        config_name = layout.label.replace(" directory", " config")
        raise UserError(f"{out} holds {layout.noun} made with a different {config_name} (differs in: "
                        f"{', '.join(diffs)}); re-run with the original settings to resume, or use a new --out "
                        "directory")


def judgment_seed(base_seed: int, run: JudgedRun, episode_id: str, metric: JudgeMetric, repeat: int) -> int:
    """Decoding seed of one judgment: repeats differ, a re-run is reproducible (derived like episode seeds)."""
    return derive_seed(base_seed, f"judge|{run.config_hash[:16]}|{episode_id}|{metric.value}|{repeat}")


def plan_tasks(
    config: JudgeConfig,
    readers: list[RunDir],
    metrics: list[JudgeMetric],
    repeats: int,
    *,
    limit: int | None = None,
) -> list[JudgeTask]:
    """Every judgment of the plan: per run, its first ``limit`` finished episodes in canonical order (all when
    None) x metrics x repeats."""
    tasks = []
    for k, (reader, run) in enumerate(zip(readers, config.runs)):
        episodes = sorted(reader.episodes(), key=reader.config.episode_sort_key())
        if limit is not None:
            episodes = episodes[:limit]
        system_prompt = reader.manifest.system_prompt
        for ep in episodes:
            for metric in metrics:
                for r in range(repeats):
                    seed = judgment_seed(config.decoding.seed, run, ep.episode_id, metric, r)
                    tasks.append(JudgeTask(k, ep, metric, r, seed, system_prompt))
    return tasks


# --------------------------------------------------------------------------------------- the store


class SidecarStore:
    """A judge or probe directory opened for appending (single writer)."""

    def __init__(self, path: Path, manifest, done: set, notes: list[str], lock, layout: SidecarLayout = JUDGE_LAYOUT):
        self.path = Path(path)
        self.manifest = manifest
        self.done = done
        self.notes = notes
        self.layout = layout
        self._lock = lock  # the writer lock (uqh.harness.store.lock), held until close
        self._fd: int | None = os.open(self.path / layout.records_file,
                                       os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @classmethod
    def open_or_create(cls, out: Path, config, layout: SidecarLayout = JUDGE_LAYOUT) -> "SidecarStore":
        out = Path(out)
        check_judge_out(out, [Path(r.path) for r in config.runs], layout)
        check_judge_resumable(out, config, layout)
        notes: list[str] = []
        out.mkdir(parents=True, exist_ok=True)
        lock = run_lock.hold(out)  # one writer per directory, as for run directories
        lock.__enter__()
        try:
            if not (out / layout.manifest_file).exists():
                manifest = layout.make_manifest(config)
                atomic_write_text(out / layout.manifest_file, manifest.model_dump_json(indent=2) + "\n")
                return cls(out, manifest, set(), notes, lock, layout)
            reader = layout.open_reader(out)
            cut = truncate_to(out / layout.records_file, reader.complete_length())
            if cut:
                notes.append(f"{layout.records_file}: removed a torn last line ({cut} bytes) left by an interrupted "
                             "write")
                log.warning("%s: %s", out, notes[-1])
            return cls(out, reader.manifest, layout.done_keys(reader), notes, lock, layout)
        except BaseException:
            lock.__exit__(None, None, None)
            raise

    def append(self, record) -> None:
        if record.key in self.done:
            raise ValueError(f"{record.key} is already in {self.layout.records_file}")
        append_fsync(self._fd, record.model_dump_json().encode() + b"\n")
        self.done.add(record.key)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._lock.__exit__(None, None, None)

    def __enter__(self) -> "SidecarStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: The judge directory's store (the name the judge's callers know).
JudgmentStore = SidecarStore


# --------------------------------------------------------------------------------------- judging


async def judge_one(client, task: JudgeTask) -> Judgment:
    """One judgment: the judge's reply parsed; a reply that does not parse gets one repair request, then the
    judgment is recorded as missing (score null, the reason kept). ModelCallFailed propagates (not a judgment)."""
    ep = task.episode
    messages = judge_messages(task.metric, ep, task.system_prompt)
    attempts: list[JudgeAttempt] = []
    error = ""
    for attempt in range(2):
        completion = await client.complete(messages, seed=task.seed)
        try:
            reply = parse_reply(completion.text, ep.n_steps)
        except ReplyError as exc:
            error = str(exc)
            attempts.append(JudgeAttempt(attempt=attempt, raw_text=completion.text, error=error, call=completion.call))
            messages = messages + [{"role": "assistant", "content": completion.text},
                                   {"role": "user", "content": repair_request(error)}]
            continue
        attempts.append(JudgeAttempt(attempt=attempt, raw_text=completion.text, call=completion.call))
        return Judgment(run=task.run, episode_id=ep.episode_id, metric=task.metric, repeat=task.repeat,
                        score=reply.score, rationale=reply.rationale, cited_steps=reply.cited_steps,
                        n_steps=ep.n_steps, seed=task.seed, attempts=attempts, judged_at=now_iso())
    return Judgment(run=task.run, episode_id=ep.episode_id, metric=task.metric, repeat=task.repeat, score=None,
                    missing_reason=f"the reply did not parse after one repair: {error}", n_steps=ep.n_steps,
                    seed=task.seed, attempts=attempts, judged_at=now_iso())


def judgment_summary(j: Judgment) -> EpisodeSummary:
    """The accounting of one judgment's calls, in the runner's progress terms (``stop_reason`` scored/missing)."""
    out = EpisodeSummary(stop_reason="scored" if j.score is not None else "missing")
    for att in j.attempts:
        out.calls += 1
        out.prompt_tokens += att.call.usage.prompt_tokens or 0
        out.completion_tokens += att.call.usage.completion_tokens or 0
        if att.call.cost_usd is None:
            out.unpriced_calls += 1
        else:
            out.cost_usd += att.call.cost_usd
    return out


async def run_calls(
    tasks: list,
    work: Callable[[Any, Any], Any],
    client,
    store: SidecarStore,
    *,
    concurrency: int,
    on_done: Callable[[Any], None],
    on_error: Callable[[Any, str], None],
) -> None:
    """Run ``await work(client, task)`` for every task with at most ``concurrency`` in flight; each finished
    record (a judgment, a probe value) is appended (fsynced) by one I/O thread, so the event loop never blocks on
    the disk. A failed call (``ModelCallFailed``) or a crash is reported, not written: a re-run retries it."""
    from uqh.harness.model.call_errors import ModelCallFailed

    loop = asyncio.get_running_loop()
    io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uqh-judge-io")
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(task: JudgeTask) -> None:
        async with sem:
            try:
                record = await work(client, task)
            except ModelCallFailed as exc:
                on_error(task, f"{store.layout.label.split()[0]} call failed: {first_line(exc, 300)}")
                return
            except Exception as exc:  # noqa: BLE001 - any other crash: reported, not written, re-queued on re-run
                log.debug("task %s crashed", task.key, exc_info=True)
                on_error(task, f"{type(exc).__name__}: {first_line(exc, 300)}")
                return
        await loop.run_in_executor(io, store.append, record)
        on_done(record)

    try:
        await asyncio.gather(*(one(t) for t in tasks))
    finally:
        io.shutdown(wait=True)



@dataclass
class JudgeSummary:
    out: Path
    planned: int
    done_before: int
    stats: BatchStats
    notes: list[str] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return self.planned - self.done_before - self.stats.done

    @property
    def ok(self) -> bool:
        return self.remaining == 0


def run_judges(
    config: JudgeConfig,
    readers: list[RunDir],
    out: Path | str,
    *,
    metrics: list[JudgeMetric],
    repeats: int,
    limit: int | None = None,
    concurrency: int = 8,
    progress: bool = True,
    client_factory: Callable[[str, str | None], Any] | None = None,
    timeout_s: float | None = None,
) -> JudgeSummary:
    """Make (or resume) every planned judgment into ``out``; return the summary.

    ``client_factory(litellm_model, api_base)`` replaces :func:`uqh.harness.model.client.make_model_client` (tests).
    ``timeout_s``: seconds per call (None: the client's default).
    """
    tasks = plan_tasks(config, readers, metrics, repeats, limit=limit)
    return run_sidecar(config, JUDGE_LAYOUT, tasks, Path(out), judge_one, judgment_summary, model=config.judge_model,
                       concurrency=concurrency, progress=progress, label="uqh judge", client_factory=client_factory,
                       timeout_s=timeout_s)


def run_sidecar(
    config,
    layout: SidecarLayout,
    tasks: list,
    out: Path,
    work: Callable[[Any, Any], Any],
    summary_of: Callable[[Any], EpisodeSummary],
    *,
    model: str,
    concurrency: int,
    progress: bool,
    label: str,
    client_factory: Callable[[str, str | None], Any] | None = None,
    timeout_s: float | None = None,
) -> JudgeSummary:
    """The runner shared by ``uqh judge`` and ``uqh probe``: open (or resume) the directory, skip the tasks whose
    key it holds, start the model (a ``local:`` model is served for the duration), run the rest through
    :func:`run_calls` with progress and accounting, and return the summary. ``config`` has ``runs``, ``api_base``
    and ``decoding``; every task a ``key``."""
    with SidecarStore.open_or_create(out, config, layout) as store:
        todo = [t for t in tasks if t.key not in store.done]
        stats = BatchStats(total=len(tasks), already_done=len(tasks) - len(todo))
        summary = JudgeSummary(out, len(tasks), len(tasks) - len(todo), stats, notes=list(store.notes))
        if not todo:
            return summary
        with contextlib.ExitStack() as stack:
            from uqh.harness.model.llama_server import serve_model

            # a local model: one server process per core, the calls spread over them (as for uqh run); a
            # client_factory (tests, the observation-surprise probe's echo and forcing clients) takes one endpoint
            served = stack.enter_context(serve_model(model, config.api_base, parallel=concurrency,
                                                     servers=1 if client_factory is not None else None))
            bar = stack.enter_context(Progress(stats, enabled=progress, label=label))

            def done(record) -> None:
                stats.add(summary_of(record))
                bar.update()

            def error(task, message: str) -> None:
                stats.add_error(message)
                bar.update()

            async def main() -> None:
                if client_factory is not None:
                    client = client_factory(served.model, served.api_base)
                else:
                    from uqh.harness.model.client import make_model_client

                    timeout = {} if timeout_s is None else {"timeout_s": timeout_s}
                    client = make_model_client(served.model, api_base=served.api_base,
                                               api_bases=served.api_bases or None, endpoint_capacity=served.slots,
                                               decoding=config.decoding, **timeout)
                try:
                    await run_calls(todo, work, client, store, concurrency=concurrency, on_done=done, on_error=error)
                finally:
                    with contextlib.suppress(Exception):
                        await client.aclose()

            asyncio.run(main())
    return summary
