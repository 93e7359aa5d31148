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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from uqh.harness.judge.prompts import TRACE_FORMAT, ReplyError, judge_messages, parse_reply, prompts_sha256, repair_request
from uqh.harness.episode.loop import derive_seed
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


def check_judge_out(out: Path, run_paths: list[Path]) -> None:
    """UserError unless ``out`` can hold a judge directory (new, empty or an existing one) outside every judged
    run. Writes nothing."""
    out = Path(out)
    target = out.resolve()
    for run in run_paths:
        run = Path(run).resolve()
        if target == run or run in target.parents:
            raise UserError(f"--out {out} is inside the judged run {run}; judgments go into a directory of their "
                            "own (the judged run is never modified)")
    if out.exists():
        if not out.is_dir():
            raise UserError(f"--out {out} exists and is not a directory; choose a new directory")
        if not os.access(out, os.R_OK | os.W_OK | os.X_OK):
            raise UserError(f"--out {out} is not readable and writable; choose another directory")
        if (out / MANIFEST_FILE).exists():
            raise UserError(f"--out {out} is a run directory; judgments go into a directory of their own")
        if not (out / JUDGE_MANIFEST_FILE).exists() and any(p.name != run_lock.LOCK_FILE for p in out.iterdir()):
            raise UserError(f"--out {out} is a non-empty directory that is not a judge directory; choose a new one")
        return
    check_creatable(out)


def check_judge_resumable(out: Path, config: JudgeConfig) -> None:
    """UserError (writing nothing) unless an existing judge directory in ``out`` has exactly this config."""
    if not (Path(out) / JUDGE_MANIFEST_FILE).exists():
        return
    manifest = JudgeDir.open(out).manifest
    if manifest.config_hash != config.config_hash():
        diffs = judge_config_differences(manifest.config, config) or ["(hash only)"]
        raise UserError(f"{out} holds judgments made with a different judge config (differs in: {', '.join(diffs)}); "
                        "re-run with the original settings to resume, or use a new --out directory")


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


class JudgmentStore:
    """A judge directory opened for appending (single writer)."""

    def __init__(self, path: Path, manifest: JudgeManifest, done: set[Key], notes: list[str], lock):
        self.path = Path(path)
        self.manifest = manifest
        self.done = done
        self.notes = notes
        self._lock = lock  # the writer lock (uqh.harness.store.lock), held until close
        self._fd: int | None = os.open(self.path / JUDGMENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                       0o644)

    @classmethod
    def open_or_create(cls, out: Path, config: JudgeConfig) -> "JudgmentStore":
        out = Path(out)
        check_judge_out(out, [Path(r.path) for r in config.runs])
        check_judge_resumable(out, config)
        notes: list[str] = []
        out.mkdir(parents=True, exist_ok=True)
        lock = run_lock.hold(out)  # one writer per judge directory, as for run directories
        lock.__enter__()
        try:
            if not (out / JUDGE_MANIFEST_FILE).exists():
                manifest = JudgeManifest(config=config, config_hash=config.config_hash(),
                                         created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
                atomic_write_text(out / JUDGE_MANIFEST_FILE, manifest.model_dump_json(indent=2) + "\n")
                return cls(out, manifest, set(), notes, lock)
            reader = JudgeDir.open(out)
            cut = truncate_to(out / JUDGMENTS_FILE, reader.complete_length())
            if cut:
                notes.append(f"{JUDGMENTS_FILE}: removed a torn last line ({cut} bytes) left by an interrupted write")
                log.warning("%s: %s", out, notes[-1])
            done = {j.key for j in reader.judgments()}
            return cls(out, reader.manifest, done, notes, lock)
        except BaseException:
            lock.__exit__(None, None, None)
            raise

    def append(self, judgment: Judgment) -> None:
        if judgment.key in self.done:
            raise ValueError(f"judgment {judgment.key} is already in {JUDGMENTS_FILE}")
        append_fsync(self._fd, judgment.model_dump_json().encode() + b"\n")
        self.done.add(judgment.key)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._lock.__exit__(None, None, None)

    def __enter__(self) -> "JudgmentStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------------------- judging


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
                        n_steps=ep.n_steps, seed=task.seed, attempts=attempts, judged_at=_now())
    return Judgment(run=task.run, episode_id=ep.episode_id, metric=task.metric, repeat=task.repeat, score=None,
                    missing_reason=f"the reply did not parse after one repair: {error}", n_steps=ep.n_steps,
                    seed=task.seed, attempts=attempts, judged_at=_now())


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


async def judge_tasks(
    tasks: list[JudgeTask],
    client,
    store: JudgmentStore,
    *,
    concurrency: int,
    on_done: Callable[[Judgment], None],
    on_error: Callable[[JudgeTask, str], None],
) -> None:
    """Judge ``tasks`` with at most ``concurrency`` calls in flight; each finished judgment is appended (fsynced)
    by one I/O thread, so the event loop never blocks on the disk."""
    from uqh.harness.model.errors import ModelCallFailed

    loop = asyncio.get_running_loop()
    io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uqh-judge-io")
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(task: JudgeTask) -> None:
        async with sem:
            try:
                judgment = await judge_one(client, task)
            except ModelCallFailed as exc:
                on_error(task, f"judge call failed: {first_line(exc, 300)}")
                return
            except Exception as exc:  # noqa: BLE001 - any other crash: reported, not written, re-queued on re-run
                log.debug("judgment %s crashed", task.key, exc_info=True)
                on_error(task, f"{type(exc).__name__}: {first_line(exc, 300)}")
                return
        await loop.run_in_executor(io, store.append, judgment)
        on_done(judgment)

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
) -> JudgeSummary:
    """Make (or resume) every planned judgment into ``out``; return the summary.

    ``client_factory(litellm_model, api_base)`` replaces :func:`uqh.harness.model.client.make_model_client` (tests).
    """
    out = Path(out)
    tasks = plan_tasks(config, readers, metrics, repeats, limit=limit)
    with JudgmentStore.open_or_create(out, config) as store:
        todo = [t for t in tasks if t.key not in store.done]
        stats = BatchStats(total=len(tasks), already_done=len(tasks) - len(todo))
        summary = JudgeSummary(out, len(tasks), len(tasks) - len(todo), stats, notes=list(store.notes))
        if not todo:
            return summary
        with contextlib.ExitStack() as stack:
            from uqh.harness.model.local import resolve_model

            model, api_base = stack.enter_context(resolve_model(config.judge_model, config.api_base,
                                                                parallel=concurrency))
            bar = stack.enter_context(Progress(stats, enabled=progress, label="uqh judge"))

            def done(j: Judgment) -> None:
                stats.add(judgment_summary(j))
                bar.update()

            def error(task: JudgeTask, message: str) -> None:
                stats.add_error(message)
                bar.update()

            async def main() -> None:
                if client_factory is not None:
                    client = client_factory(model, api_base)
                else:
                    from uqh.harness.model.client import make_model_client

                    client = make_model_client(model, api_base=api_base, decoding=config.decoding)
                try:
                    await judge_tasks(todo, client, store, concurrency=concurrency, on_done=done, on_error=error)
                finally:
                    with contextlib.suppress(Exception):
                        await client.aclose()

            asyncio.run(main())
    return summary
