"""The agent interface (docs/agents.md): ``--agent tools`` (native function calling) end to end over real HTTP
against the fake server, next to the react agent it must not change.

- The team's check: ``uqh run --domain arithmetic --agent tools`` with 3 tasks against a tool-calling server:
  every request offers the tools (each with a required ``confidence``), every episode ends clean and every step
  records the confidence the server gave.
- A confidence that is absent or not a number is recorded as missing (never imputed, never repaired).
- Repairs: a call to no offered tool, unreadable arguments, two calls at once, a reply without a call; the
  repair answers every call with a tool message; three bad answers end the step ``parse_error``.
- Token logprobs of a tool-call turn are kept when the provider returns them; without them the call's tier is
  ``none``.
- Resume and continuations: the conversation rebuilt from recorded steps is the one the model saw; a
  checkpoint resumes, and ``uqh continue`` branches a tools run with the tools agent.
- The manifest records the agent (a react config, the default, is written as before agents existed, so its
  config hash is the one it had).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import re

import pytest

from run_files import read_episodes, read_manifest, read_sidecar
from uqh.cli import main
from uqh.domains.arithmetic import ArithmeticDomain
from uqh.harness.episode.agent_registry import make_agent
from uqh.harness.episode.loop import EpisodeSpec, Resume, open_episode, run_episode
from uqh.harness.episode.tool_calling_agent import split_confidence_line
from uqh.harness.model.client import make_model_client
from uqh.rundir.schema import DecodingConfig, PartialEpisode, RunConfig, StopReason

TASKS = ArithmeticDomain().all_task_ids()


def confidence_for(expression: str, step: int) -> float:
    """The confidence the server gives: a different one per task and step, so a test can tell them apart."""
    digest = hashlib.sha256(f"{expression}|{step}".encode()).digest()
    return round(0.05 + (digest[0] % 90) / 100, 2)


def tool_solver(body: dict) -> dict:
    """Solves an arithmetic task with native calls: calc(the expression), then finish(the result)."""
    msgs = body["messages"]
    expression = re.search(r"What is (.*)\?", msgs[1]["content"]).group(1)
    results = [m["content"] for m in msgs if m["role"] == "tool"]
    if not results:
        return call("calc", expression=expression, confidence=confidence_for(expression, 1))
    return call("finish", answer=results[-1].split(": ")[1], confidence=confidence_for(expression, 2))


def call(name: str, **arguments) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def uqh(*argv: str) -> int:
    return main(["run", *argv])


def test_the_teams_check_tools_offered_clean_endings_and_the_servers_confidence(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(tool_solver) as srv:
        code = uqh("--domain", "arithmetic", "--agent", "tools", "--tasks", "3", "--model", "openai/fake",
                   "--api-base", srv.base_url, "--out", str(out), "--no-progress")
        requests = list(srv.requests)
    assert code == 0, capsys.readouterr().err
    assert len(requests) == 6  # 3 tasks x (calc, finish)
    for body in requests:
        assert body["tool_choice"] == "auto"
        assert [t["function"]["name"] for t in body["tools"]] == ["calc", "finish"]
        for tool in body["tools"]:
            assert "confidence" in tool["function"]["parameters"]["required"]
        assert "grammar" not in body  # the four-tag grammar is the react agent's
    episodes = read_episodes(out)
    assert sorted(e.task_id for e in episodes) == TASKS[:3]
    for ep in episodes:
        assert ep.stop_reason == StopReason.clean and ep.outcome == 1
        expression = re.search(r"What is (.*)\?", ep.task_prompt).group(1)
        assert [s.verbal_confidence for s in ep.steps] == [confidence_for(expression, 1), confidence_for(expression, 2)]
        assert ep.steps[0].action == f"Calc[{expression}]" and ep.steps[1].action.startswith("Finish[")
        assert [a.tool_calls[0].name for s in ep.steps for a in s.attempts] == ["calc", "finish"]
    manifest = read_manifest(out)
    assert manifest.config.agent == "tools"
    assert "calc tool" in manifest.system_prompt and '"confidence"' in manifest.system_prompt
    assert requests[0]["messages"][0]["content"] == manifest.system_prompt


def _run_one(srv, responder_steps: int = 6, task: str = "arith-0000", start=None, agent: str = "tools",
             transport: str | None = None):
    """One arithmetic episode through run_episode with the agent, against the fake server."""
    domain = ArithmeticDomain()

    async def go():
        spec = EpisodeSpec(episode_id=f"{task}#0", task_id=task, seed=3, **({"start": start} if start else {}))
        env, task_prompt, spec = await open_episode(domain, spec)
        client = make_model_client("openai/fake", api_base=srv.base_url, decoding=DecodingConfig(), api_key="x",
                                   max_retries=0, transport=transport)
        runner = make_agent(agent, domain, domain.system_prompt())
        try:
            return await run_episode(env, client, spec=spec, task_prompt=task_prompt, step_budget=responder_steps,
                                     system_prompt=runner.system_prompt, agent=runner)
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["aiohttp", "litellm", "openai"])
def test_every_transport_sends_the_tools_and_reads_the_calls(fake_server, transport):
    with fake_server(tool_solver) as srv:
        result = _run_one(srv, transport=transport)
        requests = list(srv.requests)
    assert all(r["tool_choice"] == "auto" and len(r["tools"]) == 2 for r in requests)
    ep = result.episode
    assert ep.stop_reason == StopReason.clean and ep.outcome == 1
    expression = re.search(r"What is (.*)\?", ep.task_prompt).group(1)
    assert [s.verbal_confidence for s in ep.steps] == [confidence_for(expression, 1), confidence_for(expression, 2)]
    assert [s.attempts[0].tool_calls[0].id for s in ep.steps] == ["call_fake_0", "call_fake_0"]


def test_a_missing_or_unreadable_confidence_is_recorded_missing_never_imputed(fake_server):
    script = [call("calc", expression="1+1"),  # no confidence at all
              call("calc", expression="2+2", confidence="high"),  # not a number
              call("calc", expression="3+3", confidence="85%"),  # a percentage, read as the react agent reads it
              call("finish", answer="0", confidence=1.7)]  # clipped to [0, 1], as <confidence>
    with fake_server(script) as srv:
        result = _run_one(srv)
        n_requests = len(srv.requests)
    steps = result.episode.steps
    assert n_requests == 4 and [s.repair_attempts for s in steps] == [0, 0, 0, 0]  # no repair spent on it
    assert [s.verbal_confidence for s in steps] == [None, None, 0.85, 1.0]
    assert [s.confidence_raw for s in steps] == [None, "high", "85%", "1.7"]
    assert result.episode.stop_reason == StopReason.clean


def test_repairs_answer_every_call_and_three_bad_answers_end_parse_error(fake_server):
    bad = [call("sqrt", x="4", confidence=0.5),
           {"tool_calls": [{"name": "calc", "arguments": '{"expression": "1+'}]},
           {"tool_calls": [{"name": "calc", "arguments": {"expression": "1", "confidence": 0.5}},
                           {"name": "calc", "arguments": {"expression": "2", "confidence": 0.5}, "id": "call_b"}]}]
    with fake_server(bad) as srv:
        result = _run_one(srv)
        requests = list(srv.requests)
    ep = result.episode
    assert ep.stop_reason == StopReason.parse_error and ep.n_steps == 0
    errors = [a.error for a in ep.failed_step]
    assert "there is no tool 'sqrt'" in errors[0]
    assert "not valid JSON" in errors[1]
    assert "2 tools at once" in errors[2]
    # the repair of each rejected call: the assistant's call, then a tool message with what was wrong
    second = requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "sqrt"
    assert second[-1] == {"role": "tool", "tool_call_id": "call_fake_0",
                          "content": f"Your previous answer could not be used: {errors[0]}"}
    assert [a.tool_calls[0].name for a in ep.failed_step] == ["sqrt", "calc", "calc"]
    assert all(not row.accepted for row in result.sidecar)


def test_a_reply_without_a_call_is_repaired_where_the_domain_has_no_text_action(fake_server):
    with fake_server(["The answer is 4.", call("finish", answer="0", confidence=0.4)]) as srv:
        result = _run_one(srv)
        requests = list(srv.requests)
    step = result.episode.steps[0]
    assert step.repair_attempts == 1 and "called no tool" in step.attempts[0].error
    assert step.attempts[0].tool_calls is None and step.attempts[0].raw_text == "The answer is 4."
    assert requests[1]["messages"][-1]["role"] == "user"  # no call to answer: the problem is a user message
    assert step.verbal_confidence == 0.4


def test_tool_call_logprobs_are_kept_and_their_absence_is_a_tier(fake_server):
    with fake_server([dict(call("calc", expression="6*7", confidence=0.6), logprobs=True, content="Let me compute."),
                      call("finish", answer="42", confidence=0.9)]) as srv:
        result = _run_one(srv)
    rows = result.sidecar
    assert [r.capability_tier for r in rows] == ["full", "none"]
    joined = "".join(t.token for t in rows[0].tokens)
    assert joined.startswith("Let me compute.") and '"calc"' in joined
    calls = [a.call for s in result.episode.steps for a in s.attempts]
    assert [c.has_logprobs for c in calls] == [True, False]
    assert not any(c.content_null for c in calls)  # a call is an answer, not a null content
    assert result.episode.steps[0].think == "Let me compute."
    start, end = rows[0].action_token_range  # the call's tokens, from its name to its argument's value
    assert "".join(t.token for t in rows[0].tokens[start:end]) == 'calc", "arguments": "{\\"expression\\": \\"6*7'
    assert rows[1].action_token_range is None  # no tokens, no range


def test_the_conversation_rebuilt_from_recorded_steps_is_the_one_sent_and_a_checkpoint_resumes(fake_server):
    with fake_server(tool_solver) as srv:
        whole = _run_one(srv)
        sent = [r["messages"] for r in srv.requests]
    ep = whole.episode
    agent = make_agent("tools", ArithmeticDomain(), "")
    for t in range(len(ep.steps)):
        assert agent.conversation(ep.task_prompt, ep.steps[:t]) == sent[t]
    partial = PartialEpisode(episode_id=ep.episode_id, task_id=ep.task_id, seed=ep.seed, step_budget=6,
                             task_prompt=ep.task_prompt, steps=ep.steps[:1], sidecar=whole.sidecar[:1],
                             started_at=ep.started_at)
    with fake_server(tool_solver) as srv:
        resumed = _run_one(srv, start=Resume(partial))
        resent = [r["messages"] for r in srv.requests]
    assert resent == sent[1:]  # only the second step is asked again, with the same conversation
    def shape(steps):
        return [(s.action, s.verbal_confidence, s.observation, [a.tool_calls for a in s.attempts]) for s in steps]

    assert shape(resumed.episode.steps) == shape(ep.steps) and resumed.episode.reward == ep.reward == 1.0


def test_uqh_continue_branches_a_tools_run_with_the_tools_agent(fake_server, tmp_path, capsys):
    src, cont = tmp_path / "src", tmp_path / "cont"

    def calc_forever(body):
        return call("calc", expression="1+1", confidence=0.3)

    with fake_server(calc_forever) as srv:
        assert uqh("--domain", "arithmetic", "--agent", "tools", "--tasks", "2", "--step-budget", "2",
                   "--model", "openai/fake", "--api-base", srv.base_url, "--out", str(src), "--no-progress") == 0
        srv.responder = lambda body: call("finish", answer="0", confidence=0.2)
        n_before = len(srv.requests)
        code = main(["continue", str(src), "--branches", "2", "--extra-steps", "1", "--out", str(cont),
                     "--api-base", srv.base_url, "--no-progress"])
        branch_requests = srv.requests[n_before:]
    assert code == 0, capsys.readouterr().err
    assert len(branch_requests) == 4 and all(r["tools"] for r in branch_requests)
    # each branch continues the recorded conversation: the prefix's two calls and their results
    assert [m["role"] for m in branch_requests[0]["messages"]] == ["system", "user", "assistant", "tool",
                                                                   "assistant", "tool"]
    branches = read_episodes(cont)
    assert len(branches) == 4 and all(b.steps[-1].verbal_confidence == 0.2 for b in branches)
    assert read_manifest(cont).config.agent == "tools"


def test_the_manifest_records_the_agent_and_old_react_runs_keep_their_hash():
    base = dict(domain="arithmetic", task_ids=["arith-0000"], model="openai/fake", step_budget=3,
                prompt_sha256="x", package_version="0")
    old = RunConfig.model_validate(base)  # a manifest written before there was an agent field
    react = RunConfig(**base, agent="react")
    tools = RunConfig(**base, agent="tools")
    assert old.agent == "react" and old.config_hash() == react.config_hash()
    assert "agent" not in json.loads(react.model_dump_json())  # a react config is written as before agents existed
    assert json.loads(tools.model_dump_json())["agent"] == "tools"
    assert RunConfig.model_validate_json(tools.model_dump_json()).agent == "tools"
    assert tools.config_hash() != react.config_hash()


@pytest.mark.parametrize("argv, fragment", [
    (["--agent", "planner"], "unknown --agent 'planner'; choose one of: react, tools"),
    (["--agent", "tools", "--grammar"], "--grammar forces the react agent's four tags"),
])
def test_bad_agent_flags_are_one_line_exit_2_nothing_written(argv, fragment, tmp_path, capsys):
    out = tmp_path / "run"
    code = uqh("--domain", "arithmetic", "--tasks", "1", "--model", "openai/fake", "--api-base",
               "http://127.0.0.1:9/v1", "--out", str(out), *argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and fragment in err[0]
    assert not out.exists()


def test_a_tools_run_refuses_to_resume_as_react(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(tool_solver) as srv:
        common = ["--domain", "arithmetic", "--tasks", "1", "--model", "openai/fake", "--api-base", srv.base_url,
                  "--out", str(out), "--no-progress"]
        assert uqh(*common, "--agent", "tools") == 0
        capsys.readouterr()
        assert uqh(*common) == 2
    assert "agent" in capsys.readouterr().err


def test_a_reply_ends_with_its_confidence_line_taken_off():
    assert split_confidence_line("Your refund is on its way.\nConfidence: 0.85") == (
        "Your refund is on its way.", 0.85, "0.85")
    assert split_confidence_line("Done.\n  confidence = 70% ") == ("Done.", 0.7, "70%")
    assert split_confidence_line("No line here.") == ("No line here.", None, None)
    assert split_confidence_line("Hi.\nConfidence: unsure") == ("Hi.", None, "unsure")


def test_a_tools_run_resumes_from_its_checkpoints(fake_server, tmp_path, capsys):
    """An episode whose third call fails (HTTP 400) is not written; its checkpoint is. The rerun continues it from
    the checkpoint: the conversation it sends holds the recorded calls and results, and the episode ends clean."""
    out = tmp_path / "run"

    def fails_at_third_call(body):
        results = [m for m in body["messages"] if m["role"] == "tool"]
        if len(results) >= 2:
            raise RuntimeError("the endpoint breaks")
        return call("calc", expression=f"{len(results) + 1}+1", confidence=0.3)

    def finishes(body):
        return call("finish", answer="0", confidence=0.6)

    argv = ["--domain", "arithmetic", "--agent", "tools", "--task-ids", "arith-0000", "--step-budget", "5",
            "--model", "openai/fake", "--out", str(out), "--no-progress", "--max-retries", "0"]
    with fake_server(fails_at_third_call) as srv:
        uqh(*argv, "--api-base", srv.base_url)
    assert read_episodes(out) == [] and list((out / "checkpoints").glob("*.json"))
    with fake_server(finishes) as srv:
        assert uqh(*argv, "--api-base", srv.base_url) == 0, capsys.readouterr().err
        (resumed_request,) = srv.requests
    (ep,) = read_episodes(out)
    done = ep.info["resumed_after_step"]
    assert done >= 1 and ep.n_steps == done + 1 and ep.stop_reason == StopReason.clean
    assert [s.verbal_confidence for s in ep.steps] == [0.3] * done + [0.6]
    messages = resumed_request["messages"]
    assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "tool"] * done
    for assistant, result in zip(messages[2::2], messages[3::2]):
        assert result["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert len(read_sidecar(out)) == done + 1


def test_text_replays_of_a_tools_run_show_its_calls(fake_server, tmp_path, capsys):
    """A tools turn's content is often empty: the probes' conversation, the judges' trace and the viewer show its
    calls as ``name(arguments as sent)`` (they showed empty assistant turns before), a react turn unchanged."""
    from test_probe import SCRIPT  # P(True)'s scripted answer

    from uqh.harness.judge.prompts import render_trace
    from uqh.reports.view.runs import episode_json

    def rejected_then_solved(body):
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return call("sqrt", x="4", confidence=0.5)  # no such tool: rejected, then repaired
        return tool_solver({"messages": [m for m in body["messages"]
                                         if not str(m.get("content")).startswith("Your previous answer")]})

    run, probes = tmp_path / "run", tmp_path / "probes"
    with fake_server(rejected_then_solved) as srv:
        assert uqh("--domain", "arithmetic", "--agent", "tools", "--task-ids", "arith-0000", "--model", "openai/fake",
                   "--api-base", srv.base_url, "--out", str(run), "--no-progress") == 0, capsys.readouterr().err
    (ep,) = read_episodes(run)
    rejected, calc = ep.steps[0].attempts
    assert rejected.raw_text == calc.raw_text == "" and rejected.error is not None
    assert rejected.text_with_calls == 'sqrt({"x": "4", "confidence": 0.5})'
    assert calc.text_with_calls == f"calc({calc.tool_calls[0].arguments})" and '"expression"' in calc.text_with_calls

    with fake_server("Yes", scripted_logprobs=SCRIPT) as srv:
        assert main(["probe", str(run), "--probe", "p_true", "--model", "openai/fake", "--api-base", srv.base_url,
                     "--out", str(probes), "--no-progress"]) == 0, capsys.readouterr().err
        first = next(r for r in srv.requests if len(r["messages"]) == 6)  # step 1: a repair, then the accepted call
    assistant = [m["content"] for m in first["messages"] if m["role"] == "assistant"]
    assert assistant == [rejected.text_with_calls, calc.text_with_calls]

    assert episode_json(ep, {})["steps"][0]["rejected"][0]["raw"] == rejected.text_with_calls
    failed = ep.model_copy(update={"stop_reason": StopReason.parse_error, "failed_step": [rejected]})
    assert f"Its last output was:\n{rejected.text_with_calls}\n" in render_trace(failed, "the prompt")
