"""Tau2 `uqh run --user-logprobs`: the simulated user's tokens in their own sidecar (user_logprobs.jsonl), end to
end against the fake server, and agentuq's per-role summaries as per-role predictors."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fake_openai_server import chosen_probability, tokenize, top_logprobs_for
from scoring_fixtures import make_episode, make_row, make_tokens
from tau2_fixtures import RETAIL_TASK, SOLVED_AGENT, USER_LINES, USER_OPEN, Script
from test_tau2_run import client_factory, make_config

from uqh.harness.runner import run_batch
from uqh.harness.store.writer import RunStore, checkpoint_path
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import (
    EPISODES_FILE,
    SIDECAR_FILE,
    USER_SIDECAR_FILE,
    PartialEpisode,
    RunConfig,
    StopReason,
)
from uqh.scoring import role_signals
from uqh.scoring.export import tokens_df
from uqh.scoring.registry import PREDICTORS
from uqh.scoring.streams import run_data_from_records
from uqh.harness.config.settings import BatchSettings

REPO = Path(__file__).resolve().parents[1]
K = 5


def served(text: str, k: int = K) -> list[dict]:
    """The tokens the fake server sends for ``text`` (its logprobs are functions of the token text)."""
    return [{"token": tok, "logprob": math.log(chosen_probability(tok)),
             "top_logprobs": [{"token": a, "logprob": lp} for a, lp in top_logprobs_for(tok)[:k]]}
            for tok in tokenize(text)]


def tokens_of(row) -> list[dict]:
    return [t.model_dump() for t in row.tokens]


def user_config(srv, *, direct: bool, **update) -> RunConfig:
    config = make_config(srv).model_copy(update={"user_logprobs": K, **update})
    if direct:  # an OpenAI-compatible URL: the direct async path (uqh/domains/tau2/user_client.py)
        config = config.model_copy(update={"user_api_base": srv.base_url})
    return config


@pytest.fixture
def env_endpoint(monkeypatch):
    def set_base(srv):
        monkeypatch.setenv("OPENAI_API_BASE", srv.base_url)  # the litellm path reads the endpoint from here
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    return set_base


@pytest.mark.parametrize("direct", [True, False], ids=["direct-path", "litellm-path"])
def test_user_sidecar_rows_equal_the_served_tokens(fake_server, tmp_path, env_endpoint, direct):
    script = Script(SOLVED_AGENT, USER_LINES)
    run = tmp_path / "run"
    with fake_server(script) as srv:
        env_endpoint(srv)
        summary = run_batch(user_config(srv, direct=direct), run, settings=BatchSettings(concurrency=1, progress=False),
                            client_factory=client_factory())
    assert summary.ok
    # Every user request asked for logprobs; the agent sidecar has the agent's rows only.
    assert script.user_requests and all(r.get("logprobs") is True and r.get("top_logprobs") == K
                                        for r in script.user_requests)
    reader = RunDir.open(run)
    assert reader.manifest.config.user_logprobs == K
    (ep,) = reader.episodes()
    assert ep.stop_reason == StopReason.clean and ep.n_steps == 3
    rows = list(reader.user_sidecar())
    # t = 0: the opening turn (in the task prompt); t = 3: the reply to step 3's Respond (its observation).
    assert [(r.episode_id, r.t, r.attempt, r.accepted, r.action_token_range) for r in rows] == [
        (ep.episode_id, 0, 0, True, None), (ep.episode_id, 3, 0, True, None)]
    assert tokens_of(rows[0]) == served(USER_OPEN)
    assert tokens_of(rows[1]) == served("###STOP###")
    assert ep.steps[2].observation == "User: ###STOP###"
    assert [(r.t, r.attempt) for r in reader.sidecar()] == [(1, 0), (2, 0), (3, 0)]
    # The tokens live in the sidecar only, not in the episode record.
    assert "top_logprobs" not in (run / EPISODES_FILE).read_text()
    # `uqh export --tokens` has both roles: the agent's rows, then the user's, each as its sidecar holds them.
    toks = tokens_df([run])
    agent, user = toks[toks.role == "agent"], toks[toks.role == "user"]
    assert len(agent) + len(user) == len(toks) and list(toks.role.drop_duplicates()) == ["agent", "user"]
    assert len(agent) == sum(len(r.tokens) for r in reader.sidecar()) and agent.in_action.notna().all()
    assert user[["t", "attempt", "accepted"]].drop_duplicates().values.tolist() == [[0, 0, True], [3, 0, True]]
    assert user.token.tolist() == [t["token"] for t in served(USER_OPEN) + served("###STOP###")]
    assert user.logprob.tolist() == [t["logprob"] for t in served(USER_OPEN) + served("###STOP###")]
    assert user.in_action.isna().all() and user.position.tolist()[:3] == [0, 1, 2]
    assert json.loads(user.top_tokens.iloc[0]) == [a["token"] for a in served(USER_OPEN)[0]["top_logprobs"]]


def test_without_the_flag_there_is_no_user_sidecar_and_no_logprobs_asked(fake_server, tmp_path):
    script = Script(SOLVED_AGENT, USER_LINES)
    with fake_server(script) as srv:
        config = user_config(srv, direct=True, user_logprobs=None)
        assert config.config_hash() == make_config(srv).model_copy(
            update={"user_api_base": srv.base_url}).config_hash()  # an unset flag leaves the hash as before
        assert "user_logprobs" not in config.model_dump_json()
        assert run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=1, progress=False), client_factory=client_factory()).ok
    assert all("logprobs" not in r for r in script.user_requests)
    assert not (tmp_path / "run" / USER_SIDECAR_FILE).exists()
    reader = RunDir.open(tmp_path / "run")
    assert not reader.has_user_sidecar and list(reader.user_sidecar()) == []


def test_resume_keeps_the_checkpointed_opening_and_records_no_replayed_turn(fake_server, tmp_path, env_endpoint):
    openings = iter(f"{USER_OPEN} (take {k})" for k in range(1, 10))

    class SampledOpening(Script):
        def __call__(self, req):
            text = super().__call__(req)
            return next(openings) if text == USER_OPEN else text

    script = SampledOpening(SOLVED_AGENT, USER_LINES)
    run = tmp_path / "run"
    with fake_server(script) as srv:
        env_endpoint(srv)
        config = user_config(srv, direct=True)
        first = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False, checkpoint_interval_s=0.0), client_factory=client_factory(fail_after=2))
        assert first.remaining == 1 and not (run / USER_SIDECAR_FILE).read_bytes()
        partial = PartialEpisode.model_validate_json(checkpoint_path(run, f"{RETAIL_TASK}#0").read_text())
        assert [(r.t, tokens_of(r)) for r in partial.user_sidecar] == [(0, served(f"{USER_OPEN} (take 1)"))]
        n_user = len(script.user_requests)
        second = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False, checkpoint_interval_s=0.0), client_factory=client_factory())
    assert second.ok
    assert len(script.user_requests) - n_user == 1  # the reply to step 3: the opening was not asked again
    rows = list(RunDir.open(run).user_sidecar())
    # The replayed conversation holds "take 1": that turn's tokens come from the checkpoint.
    assert [(r.t, r.attempt) for r in rows] == [(0, 0), (3, 0)]
    assert tokens_of(rows[0]) == served(f"{USER_OPEN} (take 1)")
    lines = [json.loads(x) for x in (run / USER_SIDECAR_FILE).read_bytes().splitlines()]
    assert [(r["t"], r["attempt"]) for r in lines] == [(0, 0), (3, 0)]  # the file itself: no second opening row
    assert tokens_of(rows[1]) == served("###STOP###")


def test_continuation_branches_record_only_their_own_user_turns(fake_server, tmp_path, env_endpoint):
    from uqh.harness.continuation import run_continuations

    script = Script(SOLVED_AGENT, USER_LINES)
    with fake_server(script) as srv:
        env_endpoint(srv)
        config = user_config(srv, direct=True, step_budget=2)
        run_batch(config, tmp_path / "src", settings=BatchSettings(concurrency=1, progress=False), client_factory=client_factory())
        report = run_continuations(tmp_path / "src", tmp_path / "cont", branches=2, extra_steps=2, settings=BatchSettings(progress=False),
                                   client_factory=client_factory())
    assert report.n_branches_written == 2
    src_rows = list(RunDir.open(tmp_path / "src").user_sidecar())
    assert [(r.t, r.attempt) for r in src_rows] == [(0, 0)]  # two tool steps: only the opening turn
    cont = RunDir.open(tmp_path / "cont")
    assert cont.manifest.config.user_logprobs == K
    rows = sorted(cont.user_sidecar(), key=lambda r: r.episode_id)
    # The replayed prefix (opening turn, steps 1-2) adds no rows; each branch's step 3 reply is its own.
    assert [(r.episode_id, r.t) for r in rows] == [("73#0@b0", 3), ("73#0@b1", 3)]
    assert all(tokens_of(r) == served("###STOP###") for r in rows)


def test_kill_9_and_resume_leave_no_duplicate_user_rows(fake_server, tmp_path):
    out = tmp_path / "run"
    n = 6
    with fake_server(Script(SOLVED_AGENT, USER_LINES), latency_s=0.3) as srv:
        cmd = [sys.executable, "-m", "uqh.cli", "run", "--domain", "tau2-retail", "--task-ids", RETAIL_TASK,
               "--samples", str(n), "--model", "openai/fake-agent", "--api-base", srv.base_url,
               "--user-model", "openai/fake-user", "--user-api-base", srv.base_url, "--user-logprobs",
               "--max-tokens", "256", "--concurrency", "2", "--out", str(out), "--no-progress"]
        env = dict(os.environ, PYTHONPATH=str(REPO), OPENAI_API_KEY="sk-test")
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and proc.poll() is None:
                p = out / EPISODES_FILE
                if p.exists() and p.read_bytes().count(b"\n") >= 2:
                    break
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        killed_at = RunDir.open(out).episodes()
        assert 1 <= len(killed_at) < n  # it really died mid-run
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name in (EPISODES_FILE, SIDECAR_FILE, USER_SIDECAR_FILE):
        data = (out / name).read_bytes()
        assert data.endswith(b"\n")
        for line in data.splitlines():
            json.loads(line)  # no torn line
    eps = RunDir.open(out).episodes()
    assert len(eps) == n
    keys = Counter((r["episode_id"], r["t"], r["attempt"])
                   for r in map(json.loads, (out / USER_SIDECAR_FILE).read_bytes().splitlines()))
    # Every line of the file (not only what the reader keeps): one row per user turn, no duplicate, no orphan.
    assert keys == Counter({(e.episode_id, t, 0): 1 for e in eps for t in (0, 3)})


def test_a_crash_between_the_sidecars_and_the_episode_line_is_repaired_on_open(tmp_path):
    """The writer's order is agent rows, user rows, episode line: user rows of an unfinished episode at the end
    (and a torn last line) are removed when the run is opened for writing."""
    from scoring_fixtures import write_run_dir

    path = write_run_dir(tmp_path / "r", [make_episode("a#0", "clean", [0.5], outcome=1)],
                         [make_row("a#0", 1, make_tokens([(0.5, [0.5, 0.5])]))])
    m = json.loads((path / "manifest.json").read_text())
    m["config"]["user_logprobs"] = 5
    m["config_hash"] = RunConfig.model_validate(m["config"]).config_hash()
    (path / "manifest.json").write_text(json.dumps(m))
    kept = make_row("a#0", 0, make_tokens([(0.9, [0.9, 0.1])])).model_dump_json() + "\n"
    orphan = make_row("b#0", 0, make_tokens([(0.9, [0.9, 0.1])])).model_dump_json() + "\n"
    (path / USER_SIDECAR_FILE).write_text(kept + orphan + orphan[:20])
    store = RunStore.open(path)
    store.close()
    assert (path / USER_SIDECAR_FILE).read_text() == kept
    assert any("user_logprobs.jsonl: removed 1 rows" in n for n in store.notes)
    assert any("user_logprobs.jsonl: removed a torn last line" in n for n in store.notes)


def test_user_logprobs_on_a_domain_without_a_simulated_user_is_one_line_exit_2(tmp_path, capsys):
    from uqh.cli import main

    out = tmp_path / "r"
    code = main(["run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base",
                 "http://127.0.0.1:9/v1", "--user-logprobs", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--user-logprobs needs a domain with a simulated user" in err
    assert not out.exists()


# ------------------------------------------------------------------------------------------ per-role predictors

ROLE_NAMES = [f"{role}_{s}" for role in role_signals.ROLES for s in role_signals.SUMMARIES]


def role_run(assistant, user, *, n_steps=None, with_user=True):
    """A one-episode run: ``assistant`` = tokens of each step's accepted call, ``user`` = (t, tokens) rows."""
    n = n_steps or len(assistant)
    ep = make_episode("a#0", "clean", [0.5] * n, outcome=1)
    rows = [make_row("a#0", t, make_tokens(spec)) for t, spec in enumerate(assistant, start=1)]
    urows = [make_row("a#0", t, None if spec is None else make_tokens(spec), attempt=i)
             for i, (t, spec) in enumerate(user)] if with_user else None
    return run_data_from_records(Path("."), None, [ep], rows, user_rows=urows)


def test_fifteen_per_role_predictors_one_registry_entry_each():
    assert all(PREDICTORS[name].role is not None and not PREDICTORS[name].default for name in ROLE_NAMES)
    assert len(ROLE_NAMES) == 15


def test_per_role_closed_forms_on_hand_made_rows():
    # step 1: assistant two 50/50 tokens; the user's opening (t=0) one uniform top-4 token.
    # step 2: assistant one one-hot token; the user's reply to step 1's action (t=1, in step 2's information set)
    # one 50/50 token. The reply to step 2's action (t=2) enters no step: no prefix H_1, H_2 holds it.
    half, quarter, one_hot = (0.5, [0.5, 0.5]), (0.25, [0.25] * 4), (1.0, [1.0, 1e-30])
    run = role_run([[half, half], [one_hot]], [(0, [quarter]), (1, [half]), (2, [one_hot, one_hot])])
    s = {k: run.streams[k] for k in ROLE_NAMES}
    ln2, ln4 = math.log(2), math.log(4)
    np.testing.assert_allclose(s["assistant_traj_prob"], [0.25, 0.25])
    np.testing.assert_allclose(s["assistant_gmean_prob"], [0.5, math.exp(-2 * ln2 / 3)])
    np.testing.assert_allclose(s["assistant_min_prob"], [0.5, 0.5])
    np.testing.assert_allclose(s["assistant_entropy"], [0.0, 1 / 3], atol=1e-12)  # (1 + 1 + 0) / 3 tokens
    np.testing.assert_allclose(s["assistant_tokens"], [1 / (1 + 2 / 1000), 1 / (1 + 3 / 1000)])
    np.testing.assert_allclose(s["user_traj_prob"], [0.25, 0.125])
    np.testing.assert_allclose(s["user_gmean_prob"], [0.25, math.exp(-(ln4 + ln2) / 2)])
    np.testing.assert_allclose(s["user_min_prob"], [0.25, 0.25])
    np.testing.assert_allclose(s["user_entropy"], [0.0, 0.0], atol=1e-12)  # uniform top-k: no confidence
    np.testing.assert_allclose(s["user_tokens"], [1 / (1 + 1 / 1000), 1 / (1 + 2 / 1000)])
    np.testing.assert_allclose(s["combined_traj_prob"], [0.0625, 0.03125])
    np.testing.assert_allclose(s["combined_gmean_prob"], [math.exp(-(2 * ln2 + ln4) / 3),
                                                          math.exp(-(3 * ln2 + ln4) / 5)])
    np.testing.assert_allclose(s["combined_min_prob"], [0.25, 0.25])
    np.testing.assert_allclose(s["combined_entropy"], [0.0, 1 / 5], atol=1e-12)
    np.testing.assert_allclose(s["combined_tokens"], [1 / (1 + 3 / 1000), 1 / (1 + 5 / 1000)])
    # the assistant's running values are the completion's trajectory signals of token_signals
    for ours, theirs in (("assistant_traj_prob", "token_traj_prob"), ("assistant_gmean_prob", "token_traj_gmean_prob"),
                         ("assistant_entropy", "token_traj_entropy")):
        np.testing.assert_allclose(run.streams[ours], run.streams[theirs])


def test_user_and_combined_are_missing_without_a_user_sidecar():
    run = role_run([[(0.5, [0.5, 0.5])]], [], with_user=False)
    for name in ROLE_NAMES:
        assert np.isnan(run.streams[name]).all() != name.startswith("assistant_"), name
    assert not run.has_user_sidecar


def test_missing_user_tokens_or_top_k_make_values_missing_from_there_on():
    half = (0.5, [0.5, 0.5])
    run = role_run([[half], [half], [half]], [(0, [half]), (2, None)])  # the reply to step 2 came without logprobs
    for name in ("user_gmean_prob", "combined_traj_prob", "user_min_prob", "user_tokens"):
        v = run.streams[name]  # it is in step 3's information set: missing from step 3 on
        assert np.isfinite(v[:2]).all() and np.isnan(v[2:]).all(), name
    no_topk = role_run([[half]], [(0, [(0.5, [])])])
    assert np.isnan(no_topk.streams["user_entropy"][0]) and np.isfinite(no_topk.streams["user_gmean_prob"][0])
    assert np.isnan(no_topk.streams["combined_entropy"][0])


def test_a_step_without_a_user_turn_adds_nothing():
    half = (0.5, [0.5, 0.5])
    run = role_run([[half], [half], [half]], [(0, [half])])  # steps 2, 3: tool calls, no user turn
    np.testing.assert_allclose(run.streams["user_traj_prob"], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(run.streams["combined_traj_prob"], [0.25, 0.125, 0.0625])


AGENTUQ = json.loads((Path(__file__).parent / "data" / "agentuq_parity.json").read_text())
#: the hand-made trajectories with both roles (agentuq summarised a user role for them)
WITH_USER = [t for t in AGENTUQ["hand"]["trajectories"]
             if t.get("assistant") and t.get("user") and "user" in AGENTUQ["hand"]["summaries"][t["id"]]]


def test_the_agentuq_data_has_trajectories_with_both_roles():
    assert len(WITH_USER) >= 3


@pytest.mark.parametrize("traj", WITH_USER, ids=lambda t: t["id"])
def test_last_step_values_are_agentuqs_per_role_summaries(traj):
    """agentuq's ``get_trajectory_uq_summary`` outputs (committed numbers, tests/test_agentuq_parity.py) for the
    assistant, user and combined roles equal the per-role predictors' values at the last step, mapped."""
    theirs = AGENTUQ["hand"]["summaries"][traj["id"]]
    calls, user = traj["assistant"], traj["user"]
    ep = make_episode("a#0", "clean", [0.5] * len(calls), outcome=1)
    from uqh.rundir.schema import LogprobRow

    rows = [LogprobRow(episode_id="a#0", t=t, attempt=0, accepted=True, tokens=c) for t, c in enumerate(calls, 1)]
    urows = [LogprobRow(episode_id="a#0", t=0, attempt=i, accepted=True, tokens=c) for i, c in enumerate(user)]
    run = run_data_from_records(Path("."), None, [ep], rows, user_rows=urows)
    for role in role_signals.ROLES:
        ref = theirs[role]
        last = {s: float(run.streams[f"{role}_{s}"][-1]) for s in role_signals.SUMMARIES}
        assert last["gmean_prob"] == pytest.approx(math.exp(-ref["avg_token_nll"]), abs=1e-9)
        assert last["traj_prob"] == pytest.approx(math.exp(-ref["trajectory_nll"]), abs=1e-9)
        assert last["min_prob"] == pytest.approx(ref["min_chosen_prob"], rel=1e-9)
        assert last["tokens"] == pytest.approx(1 / (1 + ref["total_tokens"] / 1000), abs=1e-12)


def test_uqh_score_says_once_why_user_predictors_are_missing(tmp_path, capsys):
    from scoring_fixtures import write_run_dir

    from uqh.cli import main

    eps = [make_episode("a#0", "clean", [0.9], outcome=1), make_episode("b#0", "clean", [0.2], outcome=0)]
    rows = [make_row("a#0", 1, make_tokens([(0.9, [0.9, 0.1])])), make_row("b#0", 1, make_tokens([(0.4, [0.4, 0.6])]))]
    path = write_run_dir(tmp_path / "r", eps, rows)
    assert main(["score", str(path), "--predictor", "user_gmean_prob,combined_traj_prob,assistant_min_prob"]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert text.count("the user and combined per-role predictors are missing: the run has no "
                      "user_logprobs.jsonl") == 1, text
    assert main(["score", str(path), "--predictor", "assistant_min_prob"]) == 0
    captured = capsys.readouterr()
    assert "per-role predictors are missing" not in captured.out + captured.err


def test_resuming_with_a_different_user_logprobs_setting_is_refused(tmp_path):
    from scoring_fixtures import write_run_dir

    from uqh.harness.store.writer import check_resumable
    from uqh.rundir.errors import UserError

    path = write_run_dir(tmp_path / "r", [make_episode("a#0", "clean", [0.5], outcome=1)])
    config = RunDir.open(path).manifest.config
    assert config.user_logprobs is None
    check_resumable(path, config)  # a run written before the field existed opens and resumes as it is
    with pytest.raises(UserError, match="differs in: user_logprobs"):
        check_resumable(path, config.model_copy(update={"user_logprobs": 5}))


def test_running_max_within_restarts_per_trajectory_and_keeps_missing():
    terms = np.array([[0.5, 1], [-np.inf, 0], [2.0, 1], [1.0, 1], [0.1, 1], [np.nan, np.nan], [5.0, 1]])
    offsets = np.array([0, 3, 3, 7])  # an empty trajectory in the middle
    out = role_signals.running_max_within(terms, offsets)
    np.testing.assert_allclose(out[:5], [[0.5, 1], [0.5, 1], [2.0, 2], [1.0, 1], [1.0, 2]])
    assert np.isnan(out[5:]).all()  # missing from the call without logprobs on


def test_uqh_repair_quarantines_bad_and_stray_user_sidecar_lines(tmp_path):
    from scoring_fixtures import write_run_dir

    from uqh.harness.store.repair import repair_run_dir

    path = write_run_dir(tmp_path / "r", [make_episode("a#0", "clean", [0.5], outcome=1)])
    kept = make_row("a#0", 0, make_tokens([(0.9, [0.9, 0.1])])).model_dump_json() + "\n"
    stray = make_row("zz#0", 0, make_tokens([(0.9, [0.9, 0.1])])).model_dump_json() + "\n"
    (path / USER_SIDECAR_FILE).write_text(stray + "not json\n" + kept)
    report = repair_run_dir(path)
    assert [b.lineno for b in report.moved[USER_SIDECAR_FILE]] == [1, 2]
    assert (path / USER_SIDECAR_FILE).read_text() == kept
    assert (path / (USER_SIDECAR_FILE + ".quarantine")).read_text() == stray + "not json\n"
