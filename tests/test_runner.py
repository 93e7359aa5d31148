"""The batch runner against the fake OpenAI-compatible server and the real model client."""
from __future__ import annotations

import hashlib
import re
from collections import Counter

import pytest

from uqh.domains.domain_registry import register_domain
from uqh.domains.arithmetic import ArithmeticDomain, make_question
from uqh.harness.episode.loop import derive_seed
from uqh.rundir.schema import PartialEpisode
from uqh.harness.runner import plan_specs, run_batch
from uqh.harness.config.build import prompt_sha256
from uqh.rundir.schema import CANONICAL_ANSWER_KEY, DecodingConfig, RunConfig, StopReason
from run_files import read_episodes, read_manifest, read_sidecar
from uqh.harness.store.writer import RunStore, checkpoint_path
from uqh.harness.config.settings import BatchSettings

SYSTEM = ArithmeticDomain().system_prompt()


def step_text(action: str, conf: str = "0.6") -> str:
    return f"<think>t</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n<explanation>e</explanation>"


def solver(body: dict) -> str:
    """Solves an arithmetic task in two steps: Calc[the expression], then Finish[the result]."""
    msgs = body["messages"]
    expr = re.search(r"What is (.*)\?", msgs[1]["content"]).group(1)
    if not any(m["role"] == "assistant" for m in msgs):
        return step_text(f"Calc[{expr}]", "0.5")
    return step_text(f"Finish[{msgs[-1]['content'].split()[-1]}]", "0.9")


def make_config(n_tasks=3, samples=1, **kw) -> RunConfig:
    base = dict(
        domain="arithmetic", task_ids=ArithmeticDomain().all_task_ids()[:n_tasks], samples_per_task=samples,
        model="openai/fake", api_base=None, step_budget=4, prompt_sha256=prompt_sha256(SYSTEM),
        package_version="0.1.0", decoding=DecodingConfig(max_tokens=64),
    )
    base.update(kw)
    return RunConfig(**base)


def fast_client_factory(max_retries=0, fail_after=None, max_tokens=64, **client_kwargs):
    """Real client, no backoff waits; optionally raising ModelCallFailed after ``fail_after`` calls."""
    from uqh.harness.model.client import make_model_client
    from uqh.harness.model.call_errors import ModelCallFailed

    calls = Counter()

    def factory(model, api_base):
        client = make_model_client(model, api_base=api_base, decoding=DecodingConfig(max_tokens=max_tokens),
                                   max_retries=max_retries, backoff_initial_s=0.01, backoff_max_s=0.02, timeout_s=10,
                                   **client_kwargs)
        if fail_after is None:
            return client
        inner = client.complete

        async def complete(messages, *, seed=None):
            calls["n"] += 1
            if calls["n"] > fail_after:
                raise ModelCallFailed("injected outage")
            return await inner(messages, seed=seed)

        client.complete = complete
        return client

    return factory


def test_plan_specs_ids_and_seeds():
    specs = plan_specs(make_config(n_tasks=2, samples=2))
    assert [s.episode_id for s in specs] == ["arith-0000#0", "arith-0000#1", "arith-0001#0", "arith-0001#1"]
    assert specs[3].seed == derive_seed(42, "arith-0001#1") and specs[3].sample_index == 1


def test_batch_writes_run_dir_and_resume_skips(fake_server, tmp_path):
    config = make_config(n_tasks=3, samples=2)
    with fake_server(solver) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=4, progress=False))
        n_first = len(srv.requests)
        again = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=4, progress=False))
        assert len(srv.requests) == n_first  # nothing re-run
    assert summary.ok and summary.stats.done == 6 and summary.stats.stop_reasons == {"clean": 6}
    assert again.ok and again.finished_before == 6 and again.stats.done == 0
    eps = read_episodes(tmp_path / "run")
    assert sorted(e.episode_id for e in eps) == sorted(s.episode_id for s in plan_specs(config))
    assert all(e.outcome == 1 and e.n_steps == 2 for e in eps)
    rows = list(read_sidecar(tmp_path / "run"))
    assert len(rows) == 12 == n_first and all(r.tokens and r.action_token_range for r in rows)
    assert read_manifest(tmp_path / "run").config_hash == config.config_hash()
    assert summary.stats.calls == 12 and summary.stats.completion_tokens > 0
    assert summary.stats.unpriced_calls == 12  # a fake model has no price: cost is null, not 0
    assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").iterdir())


def test_infra_errors_not_written_then_requeued(fake_server, tmp_path):
    config = make_config(n_tasks=2)
    with fake_server(solver, faults=["500"]) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        first = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=1, progress=False),
                          client_factory=fast_client_factory(max_retries=0))
        assert not first.ok and first.remaining == 1 and first.stats.infra_errors == 1
        assert "model call failed" in next(iter(first.stats.error_messages))
        assert len(read_episodes(tmp_path / "run")) == 1
        second = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=1, progress=False),
                           client_factory=fast_client_factory(max_retries=0))
    assert second.ok and second.stats.done == 1
    eps = read_episodes(tmp_path / "run")
    assert sorted(e.episode_id for e in eps) == ["arith-0000#0", "arith-0001#0"]


def test_checkpointed_episode_resumes_from_last_step(fake_server, tmp_path):
    config = make_config(n_tasks=1)
    run = tmp_path / "run"
    with fake_server(solver) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        first = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False), client_factory=fast_client_factory(fail_after=1))
        assert first.remaining == 1 and read_episodes(run) == []
        cp = checkpoint_path(run, "arith-0000#0")
        partial = PartialEpisode.model_validate_json(cp.read_text())
        assert [s.t for s in partial.steps] == [1] and [r.t for r in partial.sidecar] == [1]
        assert list(read_sidecar(run)) == []  # prefix rows live in the checkpoint until the episode is written
        n_before = len(srv.requests)
        second = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False))
        resumed_requests = srv.requests[n_before:]
    assert second.ok
    assert len(resumed_requests) == 1  # only step 2 was asked for
    # its one call counts in the session that made it, though its episode did not finish there
    assert (first.stats.calls, first.stats.unfinished_calls) == (1, 1)
    assert second.stats.calls == 1  # the call restored from the checkpoint is not counted again
    assert [m["role"] for m in resumed_requests[0]["messages"]] == ["system", "user", "assistant", "user"]
    (ep,) = read_episodes(run)
    assert [s.t for s in ep.steps] == [1, 2] and ep.steps[0] == partial.steps[0] and ep.prefix_steps == 0
    assert ep.stop_reason == StopReason.clean and ep.outcome == 1 and ep.started_at == partial.started_at
    # the canonical answer (Domain.canonical_answer) is recorded with every finished episode
    assert ep.info == {"resumed_after_step": 1, CANONICAL_ANSWER_KEY: str(make_question("arith-0000")[1])}
    assert [(r.t, r.attempt) for r in read_sidecar(run)] == [(1, 0), (2, 0)]
    assert not cp.exists()


@register_domain("arithmetic-noreplay-test")
class _NoReplayArithmetic(ArithmeticDomain):
    supports_replay = False


def test_checkpoint_restarted_when_domain_cannot_replay(fake_server, tmp_path):
    config = make_config(n_tasks=1, domain="arithmetic-noreplay-test")
    run = tmp_path / "run"
    with fake_server(solver) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        RunStore.open_or_create(run, config, system_prompt=SYSTEM).close()
        stale = PartialEpisode(episode_id="arith-0000#0", task_id="arith-0000", step_budget=4, task_prompt="old",
                               steps=[], sidecar=[])
        from uqh.harness.store.writer import write_checkpoint

        write_checkpoint(run, stale)
        summary = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False))
        assert len(srv.requests) == 2
    assert summary.ok and any("restarted" in n for n in summary.notes)
    (ep,) = read_episodes(run)
    assert ep.task_prompt.startswith("Question:") and ep.n_steps == 2


@register_domain("arithmetic-aclose-test")
class _ClosingArithmetic(ArithmeticDomain):
    """Records each ``aclose``: the runner releases the domain's loop-bound resources on the batch's own loop."""

    closed: list[int] = []

    async def aclose(self) -> None:
        import asyncio

        type(self).closed.append(id(asyncio.get_running_loop()))


def test_domain_aclose_runs_once_on_the_batch_loop(fake_server, tmp_path):
    _ClosingArithmetic.closed.clear()
    config = make_config(n_tasks=2, domain="arithmetic-aclose-test")
    with fake_server(solver) as srv:
        summary = run_batch(config.model_copy(update={"api_base": srv.base_url}), tmp_path / "run", settings=BatchSettings(concurrency=2, progress=False))
    assert summary.ok and len(read_episodes(tmp_path / "run")) == 2
    assert len(_ClosingArithmetic.closed) == 1


def test_replay_mismatch_in_checkpoint_restarts(fake_server, tmp_path):
    config = make_config(n_tasks=1)
    run = tmp_path / "run"
    with fake_server(solver) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False), client_factory=fast_client_factory(fail_after=1))
        cp = checkpoint_path(run, "arith-0000#0")
        partial = PartialEpisode.model_validate_json(cp.read_text())
        partial.steps[0].observation = "Result: -1"  # not what the environment says: replay must fail
        cp.write_text(partial.model_dump_json())
        summary = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False))
    assert summary.ok
    (ep,) = read_episodes(run)
    assert ep.n_steps == 2 and ep.steps[0].observation != "Result: -1"
    assert ep.info == {CANONICAL_ANSWER_KEY: str(make_question("arith-0000")[1])}  # restarted, not resumed
    assert [(r.t, r.attempt) for r in read_sidecar(run)] == [(1, 0), (2, 0)]


def test_prompt_change_refused(tmp_path):
    from uqh.rundir.errors import UserError

    with pytest.raises(UserError, match="system prompt changed"):
        run_batch(make_config(prompt_sha256=hashlib.sha256(b"other").hexdigest()), tmp_path / "run", settings=BatchSettings(progress=False))
    assert not (tmp_path / "run").exists()


def test_two_workers_single_writer(fake_server, tmp_path):
    config = make_config(n_tasks=5, samples=2)
    with fake_server(solver) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=4, workers=2, progress=False))
        assert len(srv.requests) == 20
    assert summary.ok and summary.stats.done == 10 and summary.stats.calls == 20
    eps = read_episodes(tmp_path / "run")
    assert sorted(e.episode_id for e in eps) == sorted(s.episode_id for s in plan_specs(config))
    rows = list(read_sidecar(tmp_path / "run"))
    assert len({(r.episode_id, r.t, r.attempt) for r in rows}) == len(rows) == 20


@pytest.mark.parametrize("concurrency,workers", [(1, 2), (3, 2)])
def test_workers_share_the_total_concurrency(fake_server, tmp_path, concurrency, workers):
    """--concurrency bounds the calls in flight across all workers (a provider rate limit does not double)."""
    config = make_config(n_tasks=6)
    with fake_server(solver, latency_s=0.05) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=concurrency, workers=workers, progress=False))
        assert summary.ok and summary.stats.done == 6
        assert srv.max_in_flight <= concurrency
        assert srv.max_in_flight >= min(concurrency, 2)  # and the workers did run side by side


def test_worker_preload_matches_the_model_path():
    """The fork server preloads litellm only when some call of the run goes through litellm."""
    from uqh.harness.backends.workers import worker_preload as _worker_preload

    direct = _worker_preload(make_config(), "openai/fake", "http://127.0.0.1:1/v1")
    assert "litellm" not in direct and "uqh.domains.arithmetic" in direct and "uqh.harness.backends.event_loop" in direct
    assert "litellm" in _worker_preload(make_config(), "hosted_vllm/fake", "http://127.0.0.1:1/v1")
    assert "litellm" in _worker_preload(make_config(), "openai/gpt-4o-mini", None)
    with_user = make_config(user_model="openai/gpt-4o-mini")
    assert "litellm" in _worker_preload(with_user, "openai/fake", "http://127.0.0.1:1/v1")


@pytest.mark.parametrize("interval,expected_steps", [(0.0, [1, 2, 3]), (1000.0, [1])])
def test_checkpoint_interval_bounds_writes(fake_server, tmp_path, interval, expected_steps):
    """First step always checkpointed; later ones only when the last checkpoint is older than the interval."""
    config = make_config(n_tasks=1)
    always_calc = step_text("Calc[1+1]")
    with fake_server(always_calc) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=1, progress=False, checkpoint_interval_s=interval),
                  client_factory=fast_client_factory(fail_after=3))
    partial = PartialEpisode.model_validate_json(checkpoint_path(tmp_path / "run", "arith-0000#0").read_text())
    assert [s.t for s in partial.steps] == expected_steps
    assert [r.t for r in partial.sidecar] == expected_steps


def test_episode_summary_counts_own_calls_and_cost_is_never_fake_zero():
    from uqh.harness.progress import BatchStats, EpisodeSummary
    from uqh.rundir.schema import Attempt, CallRecord, Episode, Step, Usage

    def step(t, cost):
        call = CallRecord(model="m", usage=Usage(prompt_tokens=100, completion_tokens=10), cost_usd=cost,
                          has_logprobs=cost is not None)
        return Step(t=t, think="", action="Calc[1]", verbal_confidence=0.5, explanation="e", observation="o",
                    attempts=[Attempt(attempt=0, raw_text="r", call=call)])

    ep = Episode(episode_id="a#0@b0", task_id="a", stop_reason=StopReason.parse_error, n_steps=3, step_budget=5,
                 task_prompt="q", steps=[step(1, 9.0), step(2, 0.5), step(3, None)], prefix_steps=1,
                 failed_step=[Attempt(attempt=0, raw_text="x", error="bad", call=CallRecord(model="m", cost_usd=0.25))])
    s = EpisodeSummary.of(ep)  # the copied prefix step (cost 9.0) is not this run's
    assert (s.calls, s.prompt_tokens, s.completion_tokens, s.cost_usd, s.unpriced_calls) == (3, 200, 20, 0.75, 1)
    assert s.calls_without_logprobs == 2
    resumed = ep.model_copy(update={"info": {"resumed_after_step": 2}, "prefix_steps": 0})  # steps 1-2 restored
    assert (EpisodeSummary.of(resumed).calls, EpisodeSummary.of(resumed).cost_usd) == (2, 0.25)
    stats = BatchStats(total=4, already_done=1)
    stats.add(s)
    stats.add_error("model call failed: boom")
    line = stats.line()
    assert line.startswith("[2/4] parse_error=1 | ") and line.endswith(
        "| retries 0 | infra errors 1 | tokens 220 | cost $0.7500 (+1 unpriced calls)")
    only_unpriced = BatchStats(total=1)
    only_unpriced.add(EpisodeSummary(stop_reason="clean", calls=2, unpriced_calls=2))
    assert only_unpriced.cost_text() == "cost n/a (unpriced model)"


def test_retries_counted_for_finished_and_failed_calls(fake_server, tmp_path):
    config = make_config(n_tasks=2)
    with fake_server(solver, faults=["500", "500", "429"]) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=1, progress=False),
                            client_factory=fast_client_factory(max_retries=1))
    # episode 1: its first call fails after 1 retry (2 x 500); episode 2: its first call succeeds after a 429
    assert summary.stats.infra_errors == 1 and summary.stats.done == 1
    assert summary.stats.retries == 2


def test_dead_workers_episodes_counted_not_written(fake_server, tmp_path):
    """A worker that dies (here: it cannot build a domain registered only in this test process) loses no
    accounting: its episodes are infra errors, nothing is written, a re-run would pick them up."""
    config = make_config(n_tasks=3, domain="arithmetic-noreplay-test")
    with fake_server(solver) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=2, workers=2, progress=False))
        assert srv.requests == []
    assert summary.remaining == 3 and summary.stats.infra_errors == 3
    assert dict(summary.stats.error_messages) == {"worker process exited unexpectedly": 3}
    assert read_episodes(tmp_path / "run") == []


def test_progress_plain_lines_when_not_a_tty(capsys, monkeypatch):
    import uqh.harness.progress as progress
    from uqh.harness.progress import BatchStats, EpisodeSummary, Progress

    monkeypatch.setattr(progress, "clock_text", lambda: "12:00:00")
    stats = BatchStats(total=3, already_done=1, stop_reasons_before={"clean": 1})
    with Progress(stats, enabled=True, plain_every_s=3600) as bar:  # pytest's stderr is not a terminal
        stats.add(EpisodeSummary(stop_reason="clean", calls=2, prompt_tokens=5, completion_tokens=5, cost_usd=0.5))
        bar.update()  # within the interval: no line
        stats.add(EpisodeSummary(stop_reason="max_steps", calls=1, unpriced_calls=1))
        bar.update()  # finished: always printed, even inside the interval
    with Progress(stats, enabled=False) as quiet:
        quiet.update()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "12:00:00 uqh run: 2 episodes to run (3 planned, 1 finished before)"  # before any episode ends
    assert len(lines) == 2 and lines[1].startswith("12:00:00 uqh run [3/3] clean=2 max_steps=1 | ")
    assert lines[1].endswith("| ETA 0s | retries 0 | infra errors 0 | tokens 10 | cost $0.5000 (+1 unpriced calls)")
    assert re.search(r"\| [\d.]+ calls/s \|", lines[1])


def test_progress_heartbeat_prints_while_no_episode_finishes(capsys):
    import time

    from uqh.harness.progress import BatchStats, Progress

    with Progress(BatchStats(total=2), enabled=True, plain_every_s=0.2):
        time.sleep(0.75)
    lines = capsys.readouterr().err.splitlines()
    assert "uqh run: 2 episodes to run" in lines[0]
    beats = [ln for ln in lines[1:] if "[0/2] - | - calls/s | ETA - |" in ln]
    assert len(beats) >= 2 and all(re.match(r"\d\d:\d\d:\d\d uqh run \[0/2\]", ln) for ln in beats)
    assert "cost n/a (no calls)" in beats[0] and "$0" not in "".join(lines)


def test_eta_rate_and_sequential_skips_leave_the_total():
    from uqh.harness.progress import BatchStats, EpisodeSummary, duration_text

    stats = BatchStats(total=10, already_done=2)
    stats.started -= 20.0  # 20 s into this invocation
    assert stats.eta_s() is None and stats.calls_per_s() is None
    for _ in range(4):
        stats.add(EpisodeSummary(stop_reason="clean", calls=5))
    # 4 episodes in 20 s; 4 left -> 20 s; 20 calls in 20 s
    assert stats.eta_s() == pytest.approx(20.0, rel=0.01) and stats.calls_per_s() == pytest.approx(1.0, rel=0.01)
    stats.live_calls = 30  # calls returned so far, episodes still running: the rate counts them
    assert stats.calls_per_s() == pytest.approx(1.5, rel=0.01)
    stats.live_calls = 0
    stats.skipped = lambda: 3  # sequential sampling decided not to draw 3 samples
    assert stats.planned == 7 and stats.eta_s() == pytest.approx(5.0, rel=0.01)
    stats.add_error("model call failed: x")  # not waited for
    assert stats.eta_s() == 0.0
    assert [duration_text(x) for x in (None, 4.4, 65, 3720)] == ["-", "4s", "1m05s", "1h02m"]


def test_the_eta_does_not_climb_while_no_episode_finishes():
    """Issue 33: left * elapsed / done rose with every second in which no episode finished."""
    from uqh.harness.progress import BatchStats, EpisodeSummary

    stats = BatchStats(total=10)
    stats.started -= 20.0
    for _ in range(2):
        stats.add(EpisodeSummary(stop_reason="clean", calls=1))
    first = stats.eta_s()
    assert first == pytest.approx(80.0, rel=0.01)  # 10 s per episode, 8 left
    stats.started -= 30.0  # 30 s pass and no episode finishes
    stats.last_done_at -= 30.0
    assert stats.eta_s() == pytest.approx(first - 30.0, rel=0.01)


def test_progress_bar_fits_80_columns_on_a_terminal():
    import io

    from rich.console import Console

    from uqh.harness.progress import BatchStats, EpisodeSummary, Progress

    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=True, color_system=None)
    stats = BatchStats(total=250, already_done=40, stop_reasons_before={"clean": 30, "max_steps": 10})
    with Progress(stats, enabled=True, console=console) as bar:
        for reason in ("clean", "parse_error", "env_terminated", "tool_error"):
            stats.add(EpisodeSummary(stop_reason=reason, calls=3, unpriced_calls=3, retries=1))
            bar.update()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # terminal control sequences
    lines = [ln for ln in plain.replace("\r", "\n").splitlines() if ln.strip()]
    last = [ln for ln in lines if "44/250" in ln][-1]
    assert all(len(ln) <= 80 for ln in lines)
    assert "uqh run" in last and "ETA" in last and "calls/s" in last and "…" in last  # the reasons cut, not wrapped

def test_calls_are_counted_live_for_the_progress_rate(fake_server, tmp_path):
    config = make_config(n_tasks=3)
    with fake_server(solver) as srv:
        config = config.model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=2, progress=False), client_factory=fast_client_factory())
        n_requests = len(srv.requests)
    assert summary.stats.live_calls == n_requests == summary.stats.calls == 6


def test_write_failing_after_the_batch_is_cancelled_leaves_no_unread_future(fake_server, tmp_path, caplog):
    """A batch cancelled while an episode's write is under way still takes the write's outcome (and counts a
    failure as the stop cause); asyncio must not find an unread exception when the loop's futures are collected."""
    import asyncio
    import gc
    import threading

    from uqh.harness.backends.context import RunContext
    from uqh.harness.backends.event_loop import run_specs
    from uqh.harness.model.llama_server import ServedModel
    from uqh.rundir.errors import RunDirWriteError

    config = make_config(n_tasks=1)
    writing, release = threading.Event(), threading.Event()

    def persist(result):  # the I/O thread: the write starts, the batch is cancelled, then the write fails
        writing.set()
        release.wait(10)
        raise RunDirWriteError(tmp_path / "run", OSError(28, "No space left on device"))

    async def main(base_url):
        ctx = RunContext(config=config.model_copy(update={"api_base": base_url}), system_prompt=SYSTEM,
                         agent_model=ServedModel("openai/fake", base_url), run_dir=tmp_path / "run", checkpoints=False)
        client = fast_client_factory()("openai/fake", base_url)
        batch = asyncio.ensure_future(run_specs(ctx, plan_specs(ctx.config), domain=ArithmeticDomain(),
                                                client=client, persist=persist, on_error=lambda *a: None))
        await asyncio.get_running_loop().run_in_executor(None, writing.wait, 10)
        batch.cancel()
        release.set()
        ended = "normally"
        try:
            await batch
        except BaseException as exc:  # noqa: BLE001 - only its kind is kept: its traceback holds the futures
            ended = type(exc).__name__
        await asyncio.sleep(0.05)  # the write's outcome reaches the shielded future
        await client.aclose()
        return ended

    with fake_server(solver) as srv, caplog.at_level("ERROR", logger="asyncio"):
        ended = asyncio.run(main(srv.base_url))
        gc.collect()
    assert ended in ("CancelledError", "BatchStopped")
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
