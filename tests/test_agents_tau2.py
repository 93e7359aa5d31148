"""Equality with tau2's own LLM agent (``tau2.agent.llm_agent.LLMAgent``, run in tau2's ``Orchestrator`` with
tau2's ``UserSimulator``): on the same scripted fake endpoint, ``--agent tools`` on Tau2 offers the same tools under
the same system prompt (each tool plus our required ``confidence`` argument, the prompt plus our confidence
paragraph), makes the same tool calls, sends the user the same messages (the ``Confidence:`` line of a reply taken
off) and reaches the same reward, termination and tau2 reward breakdown.

One server plays three parts: tau2's agent (requests whose tools have no ``confidence``), ours (tools with it) and
the simulated user (tau2's user-simulation guidelines); each side's reply is chosen by the turns it has taken, so
both agents make the same decisions and the test compares what the two harnesses do with them."""
from __future__ import annotations

import asyncio
import copy
import json

import pytest
from tau2_fixtures import ORDER, RETAIL_TASK, RETURN_ARGS, USER_MARK, USER_OPEN, assert_tau2_scores_it_the_same, make_domain

from uqh.harness.episode.agent_registry import make_agent
from uqh.harness.episode.loop import EpisodeSpec, run_episode
from uqh.harness.model.client import make_model_client
from uqh.rundir.schema import DecodingConfig

AGENT_DECODING = DecodingConfig(temperature=0.0, seed=42, max_tokens=256, logprobs=False)
SCENARIOS = {
    # name: (the agent's decisions: ("call", name, args) or ("say", text); the user's lines; task)
    "solved": ([("call", "get_order_details", {"order_id": ORDER}),
                ("call", "return_delivered_order_items", RETURN_ARGS),
                ("say", "Your return is processed; the refund goes to your credit card.")],
               [USER_OPEN, "###STOP###"], RETAIL_TASK),
    "unknown_tool_and_wrong_items": ([("call", "get_order_detail", {"order_id": ORDER}),
                                      ("call", "return_delivered_order_items", {**RETURN_ARGS, "item_ids": RETURN_ARGS["item_ids"][:1]}),
                                      ("say", "Done.")],
                                     [USER_OPEN, "###STOP###"], RETAIL_TASK),
    "transfer": ([("call", "transfer_to_human_agents", {"summary": "The user wants a human."}),
                  ("say", "You are being transferred to a human agent.")],
                 [USER_OPEN, "###TRANSFER###"], RETAIL_TASK),
}


def _has_confidence(body: dict) -> bool:
    return "confidence" in body["tools"][0]["function"]["parameters"]["properties"]


class TwoAgentScript:
    """The fake server's responder: the same decisions for tau2's agent and ours (ours adds a confidence to each),
    the same user lines for both users."""

    def __init__(self, decisions, user_lines):
        self.decisions, self.user_lines = decisions, user_lines
        self.requests = {"tau2": [], "uqh": [], "user": []}

    def __call__(self, body: dict):
        system = body["messages"][0]["content"]
        turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if system.startswith(USER_MARK):
            self.requests["user"].append(body)
            return self.user_lines[min(turns, len(self.user_lines) - 1)]
        ours = _has_confidence(body)
        self.requests["uqh" if ours else "tau2"].append(body)
        kind, *rest = self.decisions[min(turns - 1, len(self.decisions) - 1)]  # turn 0: tau2's greeting
        confidence = round(0.5 + 0.1 * turns, 2)
        if kind == "say":
            return f"{rest[0]}\nConfidence: {confidence}" if ours else rest[0]
        name, args = rest
        return {"tool_calls": [{"name": name, "arguments": {**args, "confidence": confidence} if ours else args}]}


def _run_tau2_llm_agent(domain, task_id: str, url: str, seed: int):
    """tau2's own LLMAgent, Orchestrator and UserSimulator (tau2's code only), against ``url``."""
    from tau2.agent.llm_agent import LLMAgent
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.registry import registry
    from tau2.user.user_simulator import UserSimulator

    task = domain.tasks()[task_id]
    env = registry.get_env_constructor("retail")()
    agent = LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy(), llm="openai/fake-agent",
                     llm_args={"api_base": url, "api_key": "x", "temperature": 0.0})
    user = UserSimulator(tools=None, instructions=str(task.user_scenario), llm=domain.user_model,
                         llm_args=domain.user_llm_args(seed))
    orch = Orchestrator(domain="retail", agent=agent, user=user, environment=env, task=task,
                        max_steps=domain.max_hops, max_errors=domain.max_errors)
    sim = orch.run()
    reward = evaluate_simulation(simulation=sim, task=task, evaluation_type=EvaluationType.ALL, solo_mode=False,
                                 domain="retail")
    return sim, reward


def _run_ours(domain, task_id: str, url: str, seed: int):
    async def go():
        env = domain.make_env(task_id, episode_seed=seed)
        client = make_model_client("openai/fake-agent", api_base=url, decoding=AGENT_DECODING, api_key="x")
        agent = make_agent("tools", domain, "")
        try:
            return await run_episode(env, client, spec=EpisodeSpec(episode_id=f"{task_id}#0", task_id=task_id,
                                                                   seed=5),
                                     system_prompt=agent.system_prompt, step_budget=30, agent=agent)
        finally:
            await client.aclose()
            await domain.aclose()

    return asyncio.run(go())


def _without_confidence(tools: list[dict]) -> list[dict]:
    out = copy.deepcopy(tools)
    for tool in out:
        params = tool["function"]["parameters"]
        params["properties"].pop("confidence")
        params["required"].remove("confidence")
        if not params["required"]:  # a tool without required arguments: tau2's schema has no "required" key
            del params["required"]
    return out


def _calls(messages: list[dict]) -> list[tuple[str, dict]]:
    """The tool calls of a request's assistant messages, arguments parsed, our confidence left out."""
    out = []
    for m in messages:
        for c in m.get("tool_calls") or []:
            args = json.loads(c["function"]["arguments"])
            args.pop("confidence", None)
            out.append((c["function"]["name"], args))
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_tools_agent_equals_tau2s_llm_agent(fake_server, name):
    decisions, user_lines, task_id = SCENARIOS[name]
    script = TwoAgentScript(decisions, user_lines)
    with fake_server(script) as srv:
        domain = make_domain("tau2-retail", srv)
        result = _run_ours(domain, task_id, srv.base_url, seed=1000)
        n_user = len(script.requests["user"])
        sim, reward = _run_tau2_llm_agent(domain, task_id, srv.base_url, seed=1000)
    ours, theirs = script.requests["uqh"], script.requests["tau2"]
    assert len(ours) == len(theirs) == len(decisions)
    # the same tools, exactly as tau2's agent sends them, plus our required confidence; tool_choice as tau2's
    for body in ours:
        assert _without_confidence(body["tools"]) == theirs[0]["tools"]
        assert body["tool_choice"] == theirs[0]["tool_choice"] == "auto"
    # the same system prompt, plus our confidence paragraph; the same opening (tau2's greeting, the user's turn)
    assert ours[0]["messages"][0]["content"].startswith(theirs[0]["messages"][0]["content"] + "\n\n")
    assert ours[0]["messages"][1:] == theirs[0]["messages"][1:]
    # the same tool calls in the conversation, and the same tool results
    assert _calls(ours[-1]["messages"]) == _calls(theirs[-1]["messages"])
    assert _calls(ours[-1]["messages"]) == [(n, a) for kind, *rest in decisions if kind == "call" for n, a in [rest]]
    assert ([m["content"] for m in ours[-1]["messages"] if m["role"] == "tool"]
            == [m["content"] for m in theirs[-1]["messages"] if m["role"] == "tool"])
    # the simulated user was sent the same messages (our Confidence: line never reaches it)
    assert script.requests["user"][:n_user] == script.requests["user"][n_user:]
    # the same ending and reward
    ep = result.episode
    assert ep.reward_info["tau2_termination_reason"] == sim.termination_reason.value
    assert ep.reward_info["tau2_reward"] == reward.reward
    assert ep.reward_info["tau2"] == reward.model_dump(mode="json", exclude_none=True)
    assert_tau2_scores_it_the_same(domain, ep)
    # every step recorded the confidence the server gave ours
    assert [s.verbal_confidence for s in ep.steps] == [round(0.5 + 0.1 * t, 2) for t in range(1, len(ep.steps) + 1)]
    if name == "solved":
        assert reward.reward == 1.0 and ep.reward == 1.0 and ep.outcome == 1
    if name == "unknown_tool_and_wrong_items":
        assert reward.reward == 0.0 and ep.reward == 0.0
        assert ep.steps[0].info["tool_error"] is True


def test_the_tau2_conversation_rebuilt_from_steps_is_the_one_sent(fake_server):
    """Resume and continuations rebuild tau2's agent conversation from the record (greeting, user turns without
    our ``User:``, tool results under their call ids): it is what the model was sent."""
    decisions, user_lines, task_id = SCENARIOS["solved"]
    script = TwoAgentScript(decisions, user_lines)
    with fake_server(script) as srv:
        domain = make_domain("tau2-retail", srv)
        ep = _run_ours(domain, task_id, srv.base_url, seed=1000).episode
    agent = make_agent("tools", domain, "")
    sent = [r["messages"] for r in script.requests["uqh"]]
    assert [agent.conversation(ep.task_prompt, ep.steps[:t]) for t in range(len(ep.steps))] == sent


def test_uqh_run_tau2_with_the_tools_agent(fake_server, tmp_path, capsys):
    """The whole run path (runner, store, manifest) on Tau2 with --agent tools: tau2's reward, the agent recorded."""
    from run_files import read_episodes, read_manifest

    from uqh.cli import main

    decisions, user_lines, task_id = SCENARIOS["solved"]
    out = tmp_path / "run"
    with fake_server(TwoAgentScript(decisions, user_lines)) as srv:
        code = main(["run", "--domain", "tau2-retail", "--agent", "tools", "--task-ids", task_id, "--model",
                     "openai/fake-agent", "--api-base", srv.base_url, "--user-model", "openai/fake-user",
                     "--user-api-base", srv.base_url, "--out", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    (ep,) = read_episodes(out)
    assert ep.stop_reason.value == "clean" and ep.reward == 1.0 and ep.outcome == 1
    manifest = read_manifest(out)
    assert manifest.config.agent == "tools" and manifest.system_prompt.startswith("<instructions>")
