"""Batch progress: a rich bar on a terminal, plain lines otherwise. Knows nothing about episodes' contents."""
from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass

from rundir.schema import Episode


@dataclass
class EpisodeSummary:
    """The accounting of the calls one finished episode made in this session: a copied prefix (continuation
    branches) and steps restored from a checkpoint (made before a crash, counted by that session) excluded;
    small and picklable."""

    stop_reason: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    calls_without_logprobs: int = 0
    retries: int = 0
    content_null_calls: int = 0

    @classmethod
    def of(cls, episode: Episode) -> "EpisodeSummary":
        out = cls(stop_reason=episode.stop_reason.value)
        first = max(episode.prefix_steps, int(episode.info.get("resumed_after_step", 0) or 0))
        attempts = [a for s in episode.steps[first:] for a in s.attempts]
        attempts += list(episode.failed_step or [])
        for att in attempts:
            call = att.call
            out.calls += 1
            out.retries += call.retries
            out.content_null_calls += call.content_null
            out.prompt_tokens += call.usage.prompt_tokens or 0
            out.completion_tokens += call.usage.completion_tokens or 0
            if call.cost_usd is None:
                out.unpriced_calls += 1
            else:
                out.cost_usd += call.cost_usd
            if not call.has_logprobs:
                out.calls_without_logprobs += 1
        return out


class BatchStats:
    """Running totals of a batch: finished episodes by stop reason, tokens, cost, infra errors."""

    def __init__(self, total: int, already_done: int = 0):
        self.total = total
        self.already_done = already_done
        self.done = 0
        self.stop_reasons: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost_usd = 0.0
        self.unpriced_calls = 0
        self.calls = 0
        self.calls_without_logprobs = 0
        self.retries = 0
        self.content_null_calls = 0
        self.infra_errors = 0
        self.error_messages: Counter[str] = Counter()
        self.started = time.monotonic()

    def add(self, summary: "EpisodeSummary") -> None:
        self.done += 1
        self.stop_reasons[summary.stop_reason] += 1
        self.calls += summary.calls
        self.prompt_tokens += summary.prompt_tokens
        self.completion_tokens += summary.completion_tokens
        self.cost_usd += summary.cost_usd
        self.unpriced_calls += summary.unpriced_calls
        self.calls_without_logprobs += summary.calls_without_logprobs
        self.retries += summary.retries
        self.content_null_calls += summary.content_null_calls

    def add_error(self, message: str, *, retries: int = 0) -> None:
        """An episode that failed on infrastructure; ``retries``: the transient failures its last call retried."""
        self.infra_errors += 1
        self.error_messages[message] += 1
        self.retries += retries

    def cost_text(self) -> str:
        if not self.calls:
            return "cost n/a (no calls)"  # never "$0.0000": that would read as a priced model's free run
        if self.unpriced_calls == self.calls:
            return "cost n/a (unpriced model)"
        extra = f" (+{self.unpriced_calls} unpriced calls)" if self.unpriced_calls else ""
        return f"cost ${self.cost_usd:.4f}{extra}"

    def line(self) -> str:
        reasons = " ".join(f"{k}={v}" for k, v in sorted(self.stop_reasons.items())) or "-"
        err = f" infra_errors={self.infra_errors}" if self.infra_errors else ""
        return (
            f"[{self.already_done + self.done}/{self.total}] {reasons}{err} | "
            f"tokens {self.prompt_tokens + self.completion_tokens:,} | {self.cost_text()}"
        )


class Progress:
    """Rich progress bar when stderr is a terminal and ``enabled``; plain lines to stderr otherwise."""

    def __init__(self, stats: BatchStats, *, enabled: bool = True, plain_every_s: float = 5.0, label: str = "uqh run"):
        self.stats = stats
        self.enabled = enabled
        self.plain_every_s = plain_every_s
        self._last_plain: float | None = None
        self._bar = None
        self._task = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
            from rich.progress import TextColumn, TimeElapsedColumn

            self._bar = RichProgress(
                TextColumn(f"[bold]{label}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                transient=False,
            )

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task(self._desc(), total=self.stats.total, completed=self.stats.already_done)
        return self

    def _desc(self) -> str:
        return self.stats.line().split("] ", 1)[1]

    def update(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=self.stats.already_done + self.stats.done, description=self._desc())
            return
        now = time.monotonic()
        finished = self.stats.already_done + self.stats.done >= self.stats.total
        if finished or self._last_plain is None or now - self._last_plain >= self.plain_every_s:
            self._last_plain = now
            print(self.stats.line(), file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
