"""`uqh run --samples K --stop-on-consensus DELTA`: the runner stops drawing a task's samples once its mode is
certified, records what it skipped and why, resumes with the same decisions, and never decides on a label."""
from __future__ import annotations

import json

import pytest

from certify_agents import arithmetic_agent, four_tags
from uqh.cli import main
from uqh.harness.episode.loop import derive_seed, episode_id_for
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import SKIPPED_SAMPLES_FILE
from uqh.harness.config.settings import BatchSettings
from run_files import read_episodes


def uqh_run(srv, out, *extra):
    return main(["run", "--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url,
                 "--out", str(out), "--no-progress", "--step-budget", "3", *extra])


# anytime rule at delta = 0.2 (threshold 2/delta = 10): unanimous -> E_5 = 63/6 = 10.5 stops at 5; one dissent
# first -> E at (8 of 9) = 1013/90 = 11.3 stops at 9 (E at (7 of 8) = 502/72 = 7.0 does not); alternating: never.
PLAN = {
    "arith-0000": ["R"] * 10,  # right and unanimous
    "arith-0001": ["R", "W"] * 5,  # split vote
    "arith-0002": ["W"] * 10,  # unanimous and wrong: stopped exactly as the right one (Proposition 9.3)
    "arith-0003": ["W"] + ["R"] * 9,
}
EXPECTED_DRAWN = {"arith-0000": 5, "arith-0001": 10, "arith-0002": 5, "arith-0003": 9}


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")


def test_anytime_rule_stops_certified_tasks_and_records_why(fake_server, tmp_path, capsys, env_key):
    out = tmp_path / "run"
    with fake_server(arithmetic_agent(PLAN)) as srv:
        rc = uqh_run(srv, out, "--tasks", "4", "--samples", "10", "--stop-on-consensus", "0.2")
        n_requests = len(srv.requests)
    assert rc == 0
    text = capsys.readouterr().out
    assert "11/40 samples skipped (27.5% saved; anytime rule, delta=0.2" in text
    assert "29/29 finished (29 this run, 0 before; 11 of 40 planned samples skipped by sequential sampling)" in text
    eps = read_episodes(out)
    drawn = {t: sorted(e.sample_index for e in eps if e.task_id == t) for t in PLAN}
    assert {t: len(v) for t, v in drawn.items()} == EXPECTED_DRAWN
    assert all(v == list(range(len(v))) for v in drawn.values())  # the first samples, none past the stop
    assert n_requests == 29  # one call per drawn sample: nothing was drawn and then thrown away
    skipped = RunDir.open(out).skipped_samples()
    assert sorted(s.episode_id for s in skipped) == sorted(
        [f"arith-0000#{k}" for k in range(5, 10)] + [f"arith-0002#{k}" for k in range(5, 10)] + ["arith-0003#9"])
    by_task = {s.task_id: s for s in skipped}
    assert by_task["arith-0000"].samples_drawn == 5 and by_task["arith-0000"].statistic == pytest.approx(10.5)
    assert by_task["arith-0000"].threshold == 10 and by_task["arith-0000"].rule == "anytime"
    assert "mode certified after 5 samples (anytime rule, delta=0.2: e-value 10.5 vs 10)" == by_task["arith-0000"].reason
    assert by_task["arith-0003"].samples_drawn == 9 and by_task["arith-0003"].statistic == pytest.approx(1013 / 90)
    from uqh.domains.arithmetic import make_question

    assert by_task["arith-0002"].mode == str(make_question("arith-0002")[1] + 1)  # the wrong answer, certified
    manifest = RunDir.open(out).manifest
    assert manifest.config.consensus_stopping.rule == "anytime" and manifest.config.consensus_stopping.delta == 0.2
    summary = manifest.info["consensus_stopping"]
    assert summary["samples_planned"] == 40 and summary["samples_drawn"] == 29 and summary["samples_skipped"] == 11
    assert summary["tasks_certified"] == 3 and summary["tasks_undecided"] == 0
    assert RunDir.open(out).planned == 29


def test_resume_keeps_the_decisions_and_draws_nothing_more(fake_server, tmp_path, capsys, env_key):
    out = tmp_path / "run"
    args = ("--tasks", "4", "--samples", "10", "--stop-on-consensus", "0.2")
    with fake_server(arithmetic_agent(PLAN)) as srv:
        assert uqh_run(srv, out, *args) == 0
        first = (out / SKIPPED_SAMPLES_FILE).read_bytes()
        # a crash between a decision and its record: the decisions are re-derived from the recorded samples
        (out / SKIPPED_SAMPLES_FILE).unlink()
        n = len(srv.requests)
        capsys.readouterr()
        assert uqh_run(srv, out, *args) == 0
        assert len(srv.requests) == n
    assert (out / SKIPPED_SAMPLES_FILE).read_bytes() == first
    assert "0 this run, 29 before" in capsys.readouterr().out


def test_printed_hoeffding_rule_needs_20_unanimous_samples(fake_server, tmp_path, env_key):
    plan = {"arith-0000": ["R"] * 22, "arith-0001": ["W"] + ["R"] * 21}
    out = tmp_path / "run"
    with fake_server(arithmetic_agent(plan)) as srv:
        rc = uqh_run(srv, out, "--tasks", "2", "--samples", "22", "--stop-on-consensus", "0.05", "--stop-rule",
                     "hoeffding")
    assert rc == 0
    eps = read_episodes(out)
    assert sum(e.task_id == "arith-0000" for e in eps) == 20  # tau = 20 (the threshold first drops below 1)
    assert sum(e.task_id == "arith-0001" for e in eps) == 22  # tau = 26 > 22: every sample drawn
    (rec,) = {s.task_id: s for s in RunDir.open(out).skipped_samples()}.values()
    assert rec.task_id == "arith-0000" and rec.statistic == 1.0 and rec.threshold == pytest.approx(0.98389, abs=1e-5)


def test_an_infrastructure_error_leaves_the_task_undecided_until_resumed(fake_server, tmp_path):
    from uqh.harness.model.call_errors import ModelCallFailed
    from uqh.harness.runner import run_batch
    from test_runner import make_config

    from uqh.rundir.schema import ConsensusStopping

    plan = {"arith-0000": ["R"] * 8}
    fail_seed = derive_seed(42, episode_id_for("arith-0000", 2))
    failing = {"on": True}

    def factory(model, api_base):
        from uqh.harness.model.client import make_model_client
        from uqh.rundir.schema import DecodingConfig

        client = make_model_client(model, api_base=api_base, decoding=DecodingConfig(max_tokens=64), max_retries=0)
        inner = client.complete

        async def complete(messages, *, seed=None):
            if failing["on"] and seed == fail_seed:
                raise ModelCallFailed("injected outage")
            return await inner(messages, seed=seed)

        client.complete = complete
        return client

    out = tmp_path / "run"
    with fake_server(arithmetic_agent(plan)) as srv:
        config = make_config(n_tasks=1, samples=8, api_base=srv.base_url,
                             consensus_stopping=ConsensusStopping(rule="anytime", delta=0.2))
        first = run_batch(config, out, settings=BatchSettings(concurrency=4, progress=False), client_factory=factory)
        assert not first.ok and first.stats.infra_errors == 1 and first.skipped == 0
        assert sorted(e.sample_index for e in read_episodes(out)) == [0, 1, 3, 4]  # the hole at 2 blocks the rule
        failing["on"] = False
        second = run_batch(config, out, settings=BatchSettings(concurrency=4, progress=False), client_factory=factory)
    assert second.ok and second.skipped == 3
    assert sorted(e.sample_index for e in read_episodes(out)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("extra,fragment", [
    (["--samples", "5", "--stop-on-consensus", "0.2", "--workers", "2"], "use --workers 1"),
    (["--samples", "5", "--stop-on-consensus", "1.5"], "--stop-on-consensus must be in (0, 1)"),
    (["--samples", "5", "--stop-on-consensus", "0"], "--stop-on-consensus must be in (0, 1)"),
    (["--samples", "1", "--stop-on-consensus", "0.1"], "needs --samples K with K >= 2"),
    (["--samples", "5", "--stop-rule", "hoeffding"], "--stop-rule needs --stop-on-consensus"),
])
def test_bad_sequential_flags_one_line_exit_2_nothing_written(extra, fragment, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--domain", "arithmetic", "--tasks", "2", "--model", "openai/x", "--api-base",
               "http://127.0.0.1:9/v1", "--out", str(out), "--no-progress", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("uqh run: error: ") and fragment in err, err
    assert not out.exists()


def test_dry_run_says_when_a_task_can_stop(tmp_path, capsys):
    rc = main(["run", "--domain", "arithmetic", "--tasks", "2", "--samples", "10", "--model", "openai/x",
               "--api-base", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "r"), "--stop-on-consensus", "0.05",
               "--stop-rule", "hoeffding", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "hoeffding rule, delta=0.05: no task can stop within 10 samples at this level" in out
    main(["run", "--domain", "arithmetic", "--tasks", "2", "--samples", "10", "--model", "openai/x",
          "--api-base", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "r"), "--stop-on-consensus", "0.05",
          "--dry-run"])
    assert "anytime rule, delta=0.05: a task can stop after 8 unanimous samples" in capsys.readouterr().out


def test_without_stopping_every_episode_records_its_canonical_answer(fake_server, tmp_path, env_key):
    out = tmp_path / "run"
    with fake_server(arithmetic_agent({"arith-0000": ["R", "W", "N"]})) as srv:
        assert uqh_run(srv, out, "--task-ids", "arith-0000", "--samples", "3") == 0
    from uqh.domains.arithmetic import make_question

    answer = make_question("arith-0000")[1]
    got = {e.sample_index: e.info.get("canonical_answer", "missing") for e in read_episodes(out)}
    assert got == {0: str(answer), 1: str(answer + 1), 2: None}
    assert json.loads((out / "manifest.json").read_text())["config"].get("consensus_stopping") is None
    assert not (out / SKIPPED_SAMPLES_FILE).exists()


def test_four_tags_helper_is_parseable():
    from uqh.harness.episode.parsing import parse_react

    assert parse_react(four_tags("Finish[3]")).action == "Finish[3]"


def test_the_progress_total_leaves_out_the_samples_sequential_sampling_skips(fake_server, tmp_path, capsys, env_key):
    with fake_server(arithmetic_agent(PLAN)) as srv:
        rc = main(["run", "--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url,
                   "--out", str(tmp_path / "run"), "--step-budget", "3", "--tasks", "4", "--samples", "10",
                   "--stop-on-consensus", "0.2", "--concurrency", "1"])
    assert rc == 0
    err = capsys.readouterr().err.splitlines()
    assert "40 episodes to run (40 planned)" in err[0]  # nothing is skipped before the first samples
    assert " uqh run [29/29] " in err[-1]  # 11 skipped samples left the total: the bar ends full
