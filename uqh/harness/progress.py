"""Batch progress: a rich bar on a terminal, timestamped plain lines otherwise. Knows nothing about episodes'
contents.

What is shown: finished/planned for the whole run (episodes finished before a resume included; samples that
sequential sampling skipped taken out of the plan), the whole run's stop reasons, calls/s and the ETA of this
invocation, retries, infrastructure errors, and the tokens and cost of this invocation's calls (cost ``n/a`` until
a priced call: an unpriced run never reads ``$0``); the calls of an episode that ends without being written count
when it ends. On a terminal the bar fits 80 columns (the stop reasons are cut with an ellipsis first); otherwise a
start line is printed at once and a status line every ``plain_every_s`` seconds (also while no episode finishes)
and at the end.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from uqh.rundir.schema import CallRecord, Episode


@dataclass
class CallTotals:
    """Totals over model calls that returned: tokens, cost (unpriced calls counted apart: they never add a fake
    $0), calls without logprobs or with null content, and the retries before them; small and picklable."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    calls_without_logprobs: int = 0
    retries: int = 0
    content_null_calls: int = 0

    def minus(self, other: "CallTotals") -> "CallTotals":
        """These totals less ``other``'s, field by field (the calls of a process not accounted for elsewhere)."""
        return CallTotals(**{f: getattr(self, f) - getattr(other, f) for f in CALL_TOTAL_FIELDS})

    def add_call(self, call: CallRecord) -> None:
        self.calls += 1
        self.retries += call.retries
        self.content_null_calls += call.content_null
        self.prompt_tokens += call.usage.prompt_tokens or 0
        self.completion_tokens += call.usage.completion_tokens or 0
        if call.cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd += call.cost_usd
        if not call.has_logprobs:
            self.calls_without_logprobs += 1


#: The fields of :class:`CallTotals` (what :meth:`CallTotals.minus` subtracts).
CALL_TOTAL_FIELDS = ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "unpriced_calls",
                     "calls_without_logprobs", "retries", "content_null_calls")


@dataclass(kw_only=True)
class EpisodeSummary(CallTotals):
    """A finished episode's stop reason and the totals of the calls it made in this session: a copied prefix
    (continuation branches) and steps restored from a checkpoint (made before a crash, counted by that session)
    excluded."""

    stop_reason: str

    @classmethod
    def of(cls, episode: Episode) -> "EpisodeSummary":
        out = cls(stop_reason=episode.stop_reason.value)
        first = max(episode.prefix_steps, int(episode.info.get("resumed_after_step", 0) or 0))
        for att in [a for s in episode.steps[first:] for a in s.attempts] + list(episode.failed_step or []):
            out.add_call(att.call)
        return out


class BatchStats:
    """Running totals of a batch: this invocation's finished episodes by stop reason, infra errors, and every call
    it made with its tokens, cost and retries (those of episodes that did not finish included); and the stop
    reasons of the planned episodes finished before it (a resume)."""

    def __init__(self, total: int, already_done: int = 0, stop_reasons_before: dict[str, int] | None = None):
        self.total = total
        self.already_done = already_done
        self.stop_reasons_before: Counter[str] = Counter(stop_reasons_before or {})
        #: Planned samples sequential sampling decided not to draw (``--stop-on-consensus``); set by the runner.
        self.skipped: Callable[[], int] = lambda: 0
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
        #: Of ``calls``: those of episodes that ended in this invocation without being written (failed on
        #: infrastructure, cut short by a stop, or their write failed). Paid for all the same.
        self.unfinished_calls = 0
        self.infra_errors = 0
        self.error_messages: Counter[str] = Counter()
        self.started = time.monotonic()
        #: When the latest episode of this invocation finished (the ETA counts down from there).
        self.last_done_at: float | None = None
        #: Calls answered so far in this process, counted as they return (:class:`CountingClient`): the rate while
        #: long episodes are still running. Worker processes' calls count when their episodes end.
        self.live_calls = 0

    def add(self, summary: EpisodeSummary) -> None:
        """A finished episode, with the calls it made in this session."""
        self.done += 1
        self.last_done_at = time.monotonic()
        self.stop_reasons[summary.stop_reason] += 1
        self._add_calls(summary)

    def add_unfinished_calls(self, calls: CallTotals) -> None:
        """The calls of an episode that ended in this session without being written."""
        self._add_calls(calls)
        self.unfinished_calls += calls.calls

    def _add_calls(self, calls: CallTotals) -> None:
        self.calls += calls.calls
        self.prompt_tokens += calls.prompt_tokens
        self.completion_tokens += calls.completion_tokens
        self.cost_usd += calls.cost_usd
        self.unpriced_calls += calls.unpriced_calls
        self.calls_without_logprobs += calls.calls_without_logprobs
        self.retries += calls.retries
        self.content_null_calls += calls.content_null_calls

    def add_error(self, message: str, *, retries: int = 0) -> None:
        """An episode that failed on infrastructure; ``retries``: the transient failures its last call retried."""
        self.infra_errors += 1
        self.error_messages[message] += 1
        self.retries += retries

    # ------------------------------------------------------------------ derived

    @property
    def finished(self) -> int:
        """Planned episodes finished, before this invocation and in it."""
        return self.already_done + self.done

    @property
    def planned(self) -> int:
        """Episodes the run will finish: the plan less the samples sequential sampling skipped."""
        return self.total - self.skipped()

    @property
    def run_stop_reasons(self) -> Counter[str]:
        """Stop reasons of every finished planned episode of the run (before this invocation and in it)."""
        return self.stop_reasons_before + self.stop_reasons

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def calls_per_s(self) -> float | None:
        elapsed = self.elapsed_s()
        calls = max(self.calls, self.live_calls)
        return calls / elapsed if elapsed > 0 and calls else None

    def eta_s(self) -> float | None:
        """Seconds until the rest of the plan is finished at this invocation's episode rate (None before the
        first episode finished; 0 when nothing is left). Episodes that failed on infrastructure are not waited for.

        The rate is measured up to the latest finished episode and the estimate counts down from that moment: while
        no episode finishes the ETA falls (to 0 at the least), it never climbs (elapsed / done did)."""
        left = max(0, self.planned - self.finished - self.infra_errors)
        if left == 0:
            return 0.0
        if not self.done or self.last_done_at is None:
            return None
        per_episode = (self.last_done_at - self.started) / self.done
        return max(0.0, left * per_episode - (time.monotonic() - self.last_done_at))

    def cost_text(self) -> str:
        if not self.calls:
            return "cost n/a (no calls)"  # never "$0.0000": that would read as a priced model's free run
        if self.unpriced_calls == self.calls:
            return "cost n/a (unpriced model)"
        extra = f" (+{self.unpriced_calls} unpriced calls)" if self.unpriced_calls else ""
        return f"cost ${self.cost_usd:.4f}{extra}"

    def reasons_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.run_stop_reasons.items())) or "-"

    def rate_text(self) -> str:
        rate = self.calls_per_s()
        return "- calls/s" if rate is None else f"{rate:.2f} calls/s"

    def line(self) -> str:
        """One status line: ``[done/planned] stop reasons | calls/s | ETA | retries | infra errors | tokens | cost``."""
        return (
            f"[{self.finished}/{self.planned}] {self.reasons_text()} | {self.rate_text()} | "
            f"ETA {duration_text(self.eta_s())} | retries {self.retries} | infra errors {self.infra_errors} | "
            f"tokens {self.prompt_tokens + self.completion_tokens:,} | {self.cost_text()}"
        )


class _ObservedClient:
    """Wraps a model client and hands every completion that returns to ``on_return``. Everything else is the
    wrapped client's."""

    def __init__(self, inner, on_return: Callable[[object], None]) -> None:
        self._inner = inner
        self._on_return = on_return

    async def complete(self, messages, **kwargs):
        completion = await self._inner.complete(messages, **kwargs)
        self._on_return(completion)
        return completion

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class CountingClient(_ObservedClient):
    """Every call that returns is counted into ``stats.live_calls`` (the progress rate only; the accounting is by
    episode: :class:`EpisodeSummary`, :class:`TotallingClient`)."""

    def __init__(self, inner, stats: BatchStats) -> None:
        def count(_completion) -> None:
            stats.live_calls += 1

        super().__init__(inner, count)


class TotallingClient(_ObservedClient):
    """For one episode: the record of every call that returns is added to ``totals``, so the calls of an episode
    that never finishes (whose record is never written) are still accounted."""

    def __init__(self, inner, totals: CallTotals) -> None:
        super().__init__(inner, lambda completion: totals.add_call(completion.call))


def duration_text(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def clock_text() -> str:
    return time.strftime("%H:%M:%S")


class Progress:
    """A rich progress bar when ``enabled`` and stderr is a terminal (or a ``console`` is given); timestamped plain
    lines on stderr otherwise (a heartbeat thread prints one every ``plain_every_s`` seconds)."""

    def __init__(self, stats: BatchStats, *, enabled: bool = True, plain_every_s: float = 15.0,
                 label: str = "uqh run", console=None):
        self.stats = stats
        self.enabled = enabled
        self.plain_every_s = plain_every_s
        self.label = label
        self._last_plain: float | None = None
        self._printed_final = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._bar = None
        self._task = None
        if enabled and (console is not None or sys.stderr.isatty()):
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
            from rich.progress import TextColumn, TimeElapsedColumn
            from rich.table import Column

            self._bar = RichProgress(
                TextColumn(f"[bold]{label}"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA {task.fields[eta]}"),
                TextColumn("{task.description}", table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
                transient=False,
                expand=True,
                console=console,
            )

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task(self._desc(), total=self.stats.planned, completed=self.stats.finished,
                                            eta=duration_text(self.stats.eta_s()))
        elif self.enabled:
            s = self.stats
            before = f", {s.already_done} finished before" if s.already_done else ""
            self._print(f"{clock_text()} {self.label}: {max(0, s.planned - s.finished)} episodes to run "
                        f"({s.planned} planned{before})")
            self._last_plain = time.monotonic()
            self._heartbeat = threading.Thread(target=self._beat, name="uqh-progress", daemon=True)
            self._heartbeat.start()
        return self

    def _desc(self) -> str:
        s = self.stats
        err = f" · {s.infra_errors} errors" if s.infra_errors else ""
        return f"{s.rate_text()} · {s.retries} retries{err} · {s.cost_text()} · {s.reasons_text()}"

    def _print(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def _plain_line(self) -> None:
        with self._lock:
            self._last_plain = time.monotonic()
            self._print(f"{clock_text()} {self.label} {self.stats.line()}")

    def _beat(self) -> None:
        while not self._stop.wait(max(0.05, self.plain_every_s / 4)):
            last = self._last_plain or 0.0
            if time.monotonic() - last >= self.plain_every_s:
                self._plain_line()

    def update(self) -> None:
        if not self.enabled:
            return
        s = self.stats
        if self._bar is not None:
            self._bar.update(self._task, total=s.planned, completed=s.finished, description=self._desc(),
                             eta=duration_text(s.eta_s()))
            return
        finished = s.finished + s.infra_errors >= s.planned
        if finished or self._last_plain is None or time.monotonic() - self._last_plain >= self.plain_every_s:
            self._printed_final = finished
            self._plain_line()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=2)
        if self._bar is not None:
            self._bar.stop()
        elif self.enabled and not self._printed_final:
            self._plain_line()  # the state the batch ended in (stopped, or nothing finished at all)
