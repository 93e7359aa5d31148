"""The run summary counts every model call the session made -- with its tokens and cost -- also the calls of
episodes that did not finish in it: failed on infrastructure, cut short by a stop signal, or not written because
the disk was full. In one process and with worker processes, against the fake server and the real client."""
from __future__ import annotations

import errno
import os
import signal
import threading
import time

import pytest
from fake_openai_server import count_prompt_tokens, tokenize
from run_files import read_episodes, read_sidecar
from test_runner import make_config, solver

from uqh.domains.arithmetic import make_question
from uqh.cli.run_command import summary_rows
from uqh.harness.runner import run_batch
from uqh.harness.config.settings import BatchSettings

#: USD the fake server reports in ``usage.cost`` for every answer (as OpenRouter does): a priced run.
COST_PER_CALL = 0.001


class CountingSolver:
    """:func:`test_runner.solver` that records the tokens of every answer it serves; the request for the second
    step of ``fail_task`` fails (a 400: not retried, an infrastructure error), and the request after the first
    ``stop_after`` answers sends SIGINT to this process and fails, as does every later one -- so each answer served
    before the stop reached its client before the stop."""

    def __init__(self, fail_task: str | None = None, stop_after: int | None = None) -> None:
        self.fail_task = fail_task
        self.stop_after = stop_after
        self.stopped = False
        self.unblocked = threading.Event()  # the stopping request has been refused
        self.answered: list[tuple[int, int]] = []  # (prompt tokens, completion tokens) of each answer served

    def __call__(self, body: dict) -> str:
        msgs = body["messages"]
        if self.stopped:
            raise RuntimeError("stopped")
        if self.stop_after is not None and len(self.answered) == self.stop_after:
            self.stopped = True
            time.sleep(0.5)  # the answers served before this one are read by their clients
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # the server answers nothing while the batch stops
            self.unblocked.set()
            raise RuntimeError("stopped")
        second_step = any(m["role"] == "assistant" for m in msgs)
        if second_step and self.fail_task is not None and make_question(self.fail_task)[0] in msgs[1]["content"]:
            raise RuntimeError("injected failure")
        text = solver(body)
        self.answered.append((count_prompt_tokens(msgs), len(tokenize(text))))
        return text


def assert_counts_every_answer(stats, answered: list[tuple[int, int]]) -> None:
    assert stats.calls == len(answered)
    assert stats.prompt_tokens == sum(p for p, _ in answered)
    assert stats.completion_tokens == sum(c for _, c in answered)
    assert stats.unpriced_calls == 0 and stats.cost_usd == pytest.approx(COST_PER_CALL * len(answered))


def model_calls_row(summary) -> str:
    return dict(summary_rows(summary))["model calls"]


@pytest.mark.parametrize("workers", [1, 2])
def test_calls_of_an_episode_that_failed_on_infrastructure_are_counted(fake_server, tmp_path, workers):
    config = make_config(n_tasks=3)
    responder = CountingSolver(fail_task=config.task_ids[0])
    with fake_server(responder, usage_cost=COST_PER_CALL) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=2, workers=workers, progress=False))
        assert len(srv.requests) == 6 and len(srv.responder_errors) == 1
    s = summary.stats
    assert s.done == 2 and s.infra_errors == 1 and summary.remaining == 1
    assert_counts_every_answer(s, responder.answered)  # 5: the failed episode's first call included
    assert s.unfinished_calls == 1
    row = model_calls_row(summary)
    assert row.startswith("5 (0 without logprobs, 1 by episodes not finished); ") and "cost $0.0050" in row


@pytest.mark.parametrize("workers", [1, 2])
def test_calls_of_episodes_cut_short_by_a_stop_signal_are_counted(fake_server, tmp_path, workers):
    """Stopped after 3 answers: at least one episode has made one call of its two and is not written. Every step
    is checkpointed, so the run's calls over both sessions are exactly its sidecar rows."""
    config = make_config(n_tasks=4)
    run = tmp_path / "run"
    responder = CountingSolver(stop_after=3)
    with fake_server(responder, usage_cost=COST_PER_CALL) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        first = run_batch(config, run, settings=BatchSettings(concurrency=2, workers=workers, progress=False, checkpoint_interval_s=0.0))
        assert first.stopped is not None and first.stopped.signum == signal.SIGINT
        assert len(responder.answered) == 3
        assert_counts_every_answer(first.stats, responder.answered)
        # a written episode made two calls; three is odd, so some episode is half done
        assert first.stats.unfinished_calls == 3 - 2 * len(read_episodes(run)) >= 1
        assert "by episodes not finished" in model_calls_row(first)

        responder.unblocked.wait(10)
        time.sleep(0.3)  # requests sent before the stop, queued behind the stopping one, are refused too
        responder.stopped, responder.stop_after = False, None
        second = run_batch(config, run, settings=BatchSettings(concurrency=2, workers=workers, progress=False))
    assert second.ok and second.stats.unfinished_calls == 0
    assert first.stats.calls + second.stats.calls == len(list(read_sidecar(run))) == len(responder.answered) == 8


@pytest.mark.parametrize("workers", [1, 2])
def test_calls_of_an_episode_whose_write_failed_are_counted(fake_server, tmp_path, monkeypatch, workers):
    """The disk fills up under the second episode's append: the batch stops, and its two calls still count."""
    from uqh.harness.store import writer as store

    appended = []
    real_append = store.append_fsync

    def append_fsync(fd: int, data: bytes) -> None:  # two appends per episode: sidecar rows, then the episode
        appended.append(fd)
        if len(appended) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(fd, data)

    monkeypatch.setattr(store, "append_fsync", append_fsync)
    config = make_config(n_tasks=2)
    responder = CountingSolver()
    with fake_server(responder, usage_cost=COST_PER_CALL) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=workers, workers=workers, progress=False))
        assert len(srv.requests) == 4
    assert summary.stopped is not None and "No space left" in summary.stopped.message
    assert summary.stats.done == 1 and len(read_episodes(tmp_path / "run")) == 1
    assert_counts_every_answer(summary.stats, responder.answered)
    assert summary.stats.unfinished_calls == 2
