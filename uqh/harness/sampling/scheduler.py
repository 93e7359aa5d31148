"""Sequential sampling in the runner (``uqh run --samples K --stop-on-consensus DELTA``, Mouzouni, "Black-box reliability certification", §9).

:class:`ConsensusScheduler` replaces the runner's fixed list of episodes with a pull source: every task's samples
are released in sample order, only as many as can still be needed -- up to the earliest sample count at which the
stopping rule (:mod:`uqh.harness.sampling.consensus`) could certify the task's mode whatever the next samples are -- so no sample
is drawn that a certificate makes unnecessary. After each finished sample the rule is asked about every new prefix
of the task's canonical answers (``Domain.canonical_answer``, recorded in ``Episode.info``), in sample order; once
it certifies at k samples, the task's remaining planned samples are skipped and recorded, with the certificate, in
``skipped_samples.jsonl`` (:class:`uqh.rundir.schema.SkippedSample`; appended and fsynced per decision). The rule sees
canonical answers only, never an outcome: stopping depends on the agent's samples alone (Proposition 9.3).

An infrastructure error leaves a hole in a task's sample sequence: the rule cannot look past it, so the task is
not decided in this batch -- only the samples needed whatever happens (below the bound computed before the hole)
are still drawn, nothing is skipped -- and re-running the command resumes it. Resume re-derives every decision from the
recorded episodes (the rule is deterministic), so a crash between a decision and its record loses nothing.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from uqh.harness.sampling.consensus import Certificate, certify, earliest_stop
from uqh.harness.episode.loop import EpisodeResult, EpisodeSpec
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import (
    CANONICAL_ANSWER_KEY,
    SKIPPED_SAMPLES_FILE,
    ConsensusStopping,
    Episode,
    RunConfig,
    SkippedSample,
)

log = logging.getLogger(__name__)


def annotate_canonical_answer(domain: Any, episode: Episode) -> None:
    """Record the episode's canonical answer class in ``episode.info`` (domains without one: nothing)."""
    if not type(domain).has_canonical_answer():
        return
    try:
        episode.info[CANONICAL_ANSWER_KEY] = type(domain).canonical_answer(episode)
    except Exception as exc:  # noqa: BLE001 - a canonicaliser bug must not turn a finished episode into an infra error
        log.warning("%s: canonical answer not recorded (%s: %s)", episode.episode_id, type(exc).__name__, exc)


def canonical_of(domain_cls: Any, episode: Episode) -> str | None:
    """The recorded canonical class, or the domain's when the episode predates the record."""
    if CANONICAL_ANSWER_KEY in episode.info:
        return episode.info[CANONICAL_ANSWER_KEY]
    return domain_cls.canonical_answer(episode)


@dataclass
class _Task:
    task_id: str
    order: int  # position in the plan: tasks are served in plan order
    k_max: int = 0
    waiting: dict[int, EpisodeSpec] = field(default_factory=dict)  # planned, not started, by sample index
    classes: dict[int, str | None] = field(default_factory=dict)  # finished samples' canonical classes
    in_flight: set[int] = field(default_factory=set)
    checked: int = 0  # prefix length the rule has been asked about
    stopped_at: int | None = None
    bound: int = 0  # samples with a smaller index are needed whatever comes next (recomputed as the prefix grows)

    def releasable(self) -> bool:
        return self.stopped_at is None and bool(self.waiting) and min(self.waiting) < self.bound

    def prefix(self) -> int:
        m = 0
        while m in self.classes:
            m += 1
        return m

    def counts(self, k: int) -> list[int]:
        return list(Counter(self.classes[i] for i in range(k)).values())


class ConsensusScheduler:
    """The pull source and hooks :func:`uqh.harness.runner.run_batch` uses for a run with ``consensus_stopping``."""

    def __init__(self, stopping: ConsensusStopping, planned: list[EpisodeSpec], todo: list[EpisodeSpec],
                 finished: dict[str, str | None], *, store: Any, skipped: list[SkippedSample]):
        """``store``: the run's :class:`uqh.harness.store.writer.RunStore` (writes ``skipped_samples.jsonl`` and
        deletes checkpoints; the scheduler never writes the run directory itself)."""
        self.rule, self.delta = stopping.rule, stopping.delta
        self._store = store
        self._skipped = {s.episode_id: s for s in skipped}
        todo_ids = {s.episode_id: s for s in todo}
        self.tasks: dict[str, _Task] = {}
        for spec in planned:
            task = self.tasks.get(spec.task_id)
            if task is None:
                task = self.tasks[spec.task_id] = _Task(spec.task_id, len(self.tasks))
            task.k_max = max(task.k_max, spec.sample_index + 1)
            if spec.episode_id in finished:
                task.classes[spec.sample_index] = finished[spec.episode_id]
            elif spec.episode_id in todo_ids:
                task.waiting[spec.sample_index] = todo_ids[spec.episode_id]
        self._changed: asyncio.Event | None = None  # made on the batch's event loop (pull)
        self._in_flight = 0
        self._new_skips: list[SkippedSample] = []
        self._rewritten = False
        self._by_order = list(self.tasks.values())
        self._ready: list[int] = []  # heap of the plan positions of tasks that may have a sample to release
        self._queued: set[int] = set()
        for task in self.tasks.values():
            self._advance(task)
        self._flush_skips()

    @classmethod
    def for_batch(cls, config: RunConfig, store: Any, planned: list[EpisodeSpec], todo: list[EpisodeSpec],
                  domain: Any) -> "ConsensusScheduler":
        """The scheduler of a (possibly resumed) batch: finished samples' classes read back through RunDir."""
        reader = RunDir(store.run_dir, store.manifest)
        finished = {}
        if reader.has_episodes_file:
            finished = {ep.episode_id: canonical_of(type(domain), ep) for ep in reader.episodes()}
        return cls(config.consensus_stopping, planned, todo, finished, store=store,
                   skipped=reader.skipped_samples())

    # ------------------------------------------------------------------ decisions

    def _advance(self, task: _Task) -> None:
        """Ask the rule about every prefix of ``task`` not yet asked, in order; on a certificate skip the rest,
        else renew the task's bound and queue it when it has a sample to release."""
        m = task.prefix()
        while task.stopped_at is None and task.checked < m:
            task.checked += 1
            cert = certify(self.rule, task.counts(task.checked), self.delta)
            if cert.certified:
                task.stopped_at = task.checked
                self._skip(task, cert)
        if task.stopped_at is None:
            k = earliest_stop(task.counts(m), self.rule, self.delta, task.k_max)
            task.bound = task.k_max if k is None else k
            if task.releasable() and task.order not in self._queued:
                heapq.heappush(self._ready, task.order)
                self._queued.add(task.order)

    def _skip(self, task: _Task, cert: Certificate) -> None:
        k = task.stopped_at
        mode = Counter(task.classes[i] for i in range(k)).most_common(1)[0][0]
        what = "margin" if self.rule == "hoeffding" else "e-value"
        reason = (f"mode certified after {k} samples ({self.rule} rule, delta={self.delta}: {what} "
                  f"{cert.statistic:.4g} vs {cert.threshold:.4g})")
        for idx, spec in sorted(task.waiting.items()):
            self._store.delete_checkpoint(spec.episode_id)
            if spec.episode_id in self._skipped:
                continue
            rec = SkippedSample(episode_id=spec.episode_id, task_id=task.task_id, sample_index=idx, reason=reason,
                                rule=self.rule, delta=self.delta, samples_drawn=k, mode=mode,
                                statistic=cert.statistic, threshold=cert.threshold)
            self._skipped[spec.episode_id] = rec
            self._new_skips.append(rec)
        task.waiting.clear()

    def _flush_skips(self) -> None:
        """Hand the new records to the store (one write + fsync per decision). The first flush of a batch rewrites
        the file from the records read back, so a torn last line of a crash is dropped first."""
        if not self._new_skips and self._rewritten:
            return
        if not self._rewritten:
            self._rewritten = True
            self._store.write_skipped_samples(list(self._skipped.values()), rewrite=True)
        else:
            self._store.write_skipped_samples(self._new_skips, rewrite=False)
        self._new_skips = []

    def _next(self) -> EpisodeSpec | None:
        """The lowest-index needed sample of the first task (in plan order) that has one."""
        while self._ready:
            task = self._by_order[self._ready[0]]
            if not task.releasable():
                self._queued.discard(heapq.heappop(self._ready))
                continue
            idx = min(task.waiting)
            spec = task.waiting.pop(idx)
            task.in_flight.add(idx)
            self._in_flight += 1
            return spec
        return None

    # ------------------------------------------------------------------ the runner's hooks

    async def pull(self) -> EpisodeSpec | None:
        """The next sample to draw; waits while only finishing samples can release more; None when done."""
        if self._changed is None:
            self._changed = asyncio.Event()
        while True:
            spec = self._next()
            if spec is not None:
                return spec
            if self._in_flight == 0:
                self._changed.set()  # wake the other slots: they end too
                return None
            self._changed.clear()
            await self._changed.wait()

    def _done(self, task_id: str, sample_index: int, canonical: str | None) -> None:
        task = self.tasks[task_id]
        task.in_flight.discard(sample_index)
        task.classes[sample_index] = canonical
        self._in_flight -= 1
        self._advance(task)
        self._flush_skips()
        self._wake()

    def _failed(self, spec: EpisodeSpec) -> None:
        task = self.tasks[spec.task_id]
        task.in_flight.discard(spec.sample_index)  # a hole: the rule cannot look past it in this batch
        self._in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def hooks(self, persist: Callable[[EpisodeResult], Any], on_done: Callable[[Any], None],
              on_error: Callable[..., None]):
        """``persist``, ``on_done`` and ``on_error`` for :func:`uqh.harness.runner.run_specs` that also tell the
        scheduler what finished (after the episode is written) or failed."""

        def persist_and_note(result: EpisodeResult):
            ep = result.episode
            return persist(result), (ep.task_id, ep.sample_index, ep.info.get(CANONICAL_ANSWER_KEY))

        def done(value) -> None:
            inner, key = value
            self._done(*key)
            on_done(inner)

        def error(spec: EpisodeSpec, message: str, retries: int = 0) -> None:
            self._failed(spec)
            on_error(spec, message, retries)

        return persist_and_note, done, error

    # ------------------------------------------------------------------ accounting

    @property
    def n_skipped(self) -> int:
        return len(self._skipped)

    def summary(self) -> dict[str, Any]:
        """What the manifest records about the batch's sequential sampling (``info.consensus_stopping``)."""
        planned = sum(t.k_max for t in self.tasks.values())
        drawn = sum(len(t.classes) for t in self.tasks.values())
        return {
            "rule": self.rule,
            "delta": self.delta,
            "tasks": len(self.tasks),
            "tasks_certified": sum(t.stopped_at is not None for t in self.tasks.values()),
            "tasks_undecided": sum(t.stopped_at is None and len(t.classes) < t.k_max for t in self.tasks.values()),
            "samples_planned": planned,
            "samples_drawn": drawn,
            "samples_skipped": self.n_skipped,
            "savings": (self.n_skipped / planned) if planned else 0.0,
            "skipped_file": SKIPPED_SAMPLES_FILE,
        }
