"""Tau2 domains: full episodes against the real tau2 environments, user simulator and evaluator.

The scripted fake server, :func:`play` and the check every episode passes (tau2's own environment and
``evaluate_simulation`` on the recorded conversation give the recorded DB hash and ``RewardInfo``) are in
``tests/tau2_fixtures.py``. Tool errors: ``test_tau2_tool_errors.py``; replay: ``test_tau2_replay.py``; the shared
DB: ``test_tau2_shared_db.py``; parity with tau2's orchestrator: ``test_tau2_parity.py``.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tau2_fixtures import (  # noqa: F401 - re-exported for other test modules
    ORDER,
    RETAIL_TASK,
    RETURN_ARGS,
    SOLVED_AGENT,
    TELECOM_TASK,
    USER_LINES,
    USER_OPEN,
    Script,
    ToolCallingServer,
    make_domain,
    play,
    react,
    respond,
    tool,
)

from uqh.domains.domain_registry import domain_names, get_domain_class
from uqh.domains.base import InvalidAction
from uqh.domains.tau2.domain import GREETING, parse_action
from uqh.harness.episode.loop import recorded_steps
from uqh.rundir.errors import UserError
from uqh.rundir.schema import StopReason

# ------------------------------------------------------------------------------------------ domain basics


def test_domains_registered_with_base_split_sizes():
    assert {"tau2-airline", "tau2-retail", "tau2-telecom"} <= set(domain_names())
    sizes = {n: len(get_domain_class(n)({}).all_task_ids()) for n in ("tau2-airline", "tau2-retail", "tau2-telecom")}
    assert sizes == {"tau2-airline": 50, "tau2-retail": 114, "tau2-telecom": 114}
    d = get_domain_class("tau2-retail")({})
    assert d.default_step_budget == 50 and d.split == "base"
    assert d.select_task_ids(3, seed=0) == d.all_task_ids()[:3] == ["0", "1", "2"]
    assert len(get_domain_class("tau2-retail")({"split": "test"}).all_task_ids()) == 40


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="unknown split 'nope'.*base"):
        get_domain_class("tau2-retail")({"split": "nope"}).all_task_ids()
    with pytest.raises(UserError, match="unknown option"):
        get_domain_class("tau2-retail")({"max_hop": 3})
    with pytest.raises(UserError, match="max_errors must be a positive integer"):
        get_domain_class("tau2-retail")({"max_errors": 0})
    with pytest.raises(UserError, match="transfer_as_env_terminated must be true or false"):
        get_domain_class("tau2-retail")({"transfer_as_env_terminated": "maybe"})
    with pytest.raises(UserError, match="contradict"):
        get_domain_class("tau2-retail")({"transfer_as_env_terminated": False, "native_user_stops": False})
    with pytest.raises(UserError, match="user_client must be .*'auto'.*'litellm'.*got 'direct'"):
        get_domain_class("tau2-retail")({"user_client": "direct"})
    d = get_domain_class("tau2-retail")({})
    with pytest.raises(UserError, match="--user-model"):
        d.make_env("0", episode_seed=1)
    d.prepare_runtime({"user_model": "openai/x"})
    with pytest.raises(UserError, match="unknown task id '9999'"):
        d.make_env("9999", episode_seed=1)


def test_system_prompt_is_appendix_k_filled_from_tau2():
    from tau2.registry import registry

    d = get_domain_class("tau2-retail")({})
    prompt = d.system_prompt()
    template = (Path(__file__).resolve().parent.parent / "uqh" / "prompts" / "tau2.txt").read_text()
    env = registry.get_env_constructor("retail")()
    assert "{TAU2." not in prompt and "- 19" not in template and "\\_" not in template
    assert prompt.startswith("You are a customer-support agent operating in the tau2-bench domain: retail.\n")
    policy = env.get_policy().strip()
    assert f"<domain_policy>\n{policy}\n</domain_policy>" in prompt
    catalog = prompt.split("<tool_catalog>\n")[1].split("\n</tool_catalog>")[0].splitlines()
    assert [json.loads(line)["function"]["name"] for line in catalog] == [t.name for t in env.get_tools()]
    assert prompt.endswith("- Keep think concise and task-focused.")
    assert '<action>Tool[tool_name, {...valid JSON object...}] or Respond["..."]</action>' in prompt


def test_parse_action_grammar_and_messages():
    names = ["get_order_details", "calculate"]
    assert parse_action('Tool[get_order_details, {"order_id": "#W1"}]', names) == (
        "tool", ("get_order_details", {"order_id": "#W1"}))
    assert parse_action("  Tool[calculate,{}]\n", names) == ("tool", ("calculate", {}))
    assert parse_action('Respond["Say \\"hi\\"\\nthen go"]', names) == ("respond", 'Say "hi"\nthen go')
    assert parse_action('Respond["It is 5" tall"]', names) == ("respond", 'It is 5" tall')  # lenient on raw quotes
    # A well-formed call to a tool the domain lacks parses: tau2 answers it with an error tool result.
    assert parse_action('Tool[get_order, {"a": 1}]', names) == ("tool", ("get_order", {"a": 1}))
    cases = {
        "Tool[calculate {}]": "a tool call must look like Tool[tool_name, {...valid JSON object...}]; the tools are: "
                              "get_order_details, calculate",
        "Tool[calculate, {expression: 1}]": "are not valid JSON",
        'Tool[calculate, ["2+2"]]': "must be a JSON object {...}, got list",
        "Tool[calculate]": "has no arguments",
        "Respond[hello]": 'Respond needs a double-quoted message',
        'Respond["  "]': "is empty",
        "Finish[yes]": 'exactly one of Tool[tool_name, {...valid JSON object...}] or Respond["..."]',
    }
    for action, msg in cases.items():
        with pytest.raises(InvalidAction) as exc:
            parse_action(action, names)
        assert msg in str(exc.value), (action, str(exc.value))


# ------------------------------------------------------------------------------------------ full episodes


def test_retail_task_solved_clean_outcome_1(fake_server):
    script = Script(SOLVED_AGENT, USER_LINES)
    with fake_server(script) as srv:
        domain = make_domain("tau2-retail", srv)
        _env, result = play(domain, srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.clean, 1, 1.0, 3)
    assert ep.task_prompt == f"Assistant: {GREETING}\nUser: {USER_OPEN}"
    tau2 = ep.reward_info["tau2"]
    assert tau2["db_check"] == {"db_match": True, "db_reward": 1.0}
    assert tau2["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    assert ep.reward_info["tau2_termination_reason"] == "user_stop"
    assert ep.reward_info["user_stop_marker"] == "###STOP###"
    # Tool results are the observations, verbatim; the user's reply is the last one.
    assert json.loads(ep.steps[0].observation)["order_id"] == ORDER
    assert json.loads(ep.steps[1].observation)["status"] == "return requested"
    assert ep.steps[2].observation == "User: ###STOP###"
    assert ep.steps[1].info["kind"] == "tool" and ep.steps[1].info["tool_arguments"] == RETURN_ARGS
    # Hops as tau2 counts them: user(1) + 2 x (agent call + tool result) + agent text + user = 7.
    assert ep.steps[2].info["hops"] == 7 and ep.reward_info["hops"] == 7
    # User side: its own decoding and per-episode seed, no logprobs; the agent sidecar holds agent calls only.
    assert len(script.user_requests) == 2
    for req in script.user_requests:
        assert req["temperature"] == 0.0 and req["max_tokens"] == 64 and req["seed"] == 7 + 1000
        assert not req.get("logprobs") and "tools" not in req
    assert [(r.t, r.attempt, r.accepted) for r in result.sidecar] == [(1, 0, True), (2, 0, True), (3, 0, True)]
    assert len(script.agent_requests) == 3
    assert all(r["logprobs"] is True and r["seed"] == 5 for r in script.agent_requests)
    # The agent saw the user's opening inside its first user message.
    assert script.agent_requests[0]["messages"][1]["content"] == ep.task_prompt


def test_wrong_db_write_is_clean_outcome_0(fake_server):
    wrong = dict(RETURN_ARGS, item_ids=RETURN_ARGS["item_ids"][:1])  # returns one item of four
    agent = [tool("return_delivered_order_items", wrong), respond("Done.")]
    with fake_server(Script(agent, USER_LINES)) as srv:
        _env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward) == (StopReason.clean, 0, 0.0)
    assert ep.reward_info["tau2"]["db_check"] == {"db_match": False, "db_reward": 0.0}
    assert ep.steps[0].info["tool_error"] is False  # the write itself succeeded; it was the wrong write


def test_step_budget_hit_is_max_steps(fake_server):
    agent = [tool("get_order_details", {"order_id": ORDER})]
    with fake_server(Script(agent, USER_LINES)) as srv:
        env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK, step_budget=2)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.max_steps, None, None, 2)
    assert ep.reward_info == {} and not env.done


def test_user_decodes_as_tau2_by_default_no_max_tokens(fake_server):
    """Without a user_decoding the user runs at tau2's temperature 0.0 with no max_tokens cap (a cut user turn
    could lose its stop marker), seeded per episode."""
    script = Script(SOLVED_AGENT, USER_LINES)
    with fake_server(script) as srv:
        domain = make_domain("tau2-retail", srv, user_decoding=None)
        play(domain, srv, RETAIL_TASK, episode_seed=77)
    assert len(script.user_requests) == 2
    for req in script.user_requests:
        assert req["temperature"] == 0.0 and req["seed"] == 77
        assert "max_tokens" not in req and "max_completion_tokens" not in req


def test_telecom_task_initialised_with_set_state(fake_server):
    from tau2.registry import registry

    agent = [respond("Please turn airplane mode off and roaming on, then tell me if data works.")]
    user = ["My mobile data is not working.", "###STOP###"]
    with fake_server(Script(agent, user)) as srv:
        domain = make_domain("tau2-telecom", srv)

        async def opening():
            env = domain.make_env(TELECOM_TASK, episode_seed=3)
            await env.reset()
            return env

        env = asyncio.run(opening())
        # initialization_actions of the task were applied: the phone is in airplane mode.
        assert env._env.user_tools.db.device.airplane_mode is True
        assert registry.get_env_constructor("telecom")().user_tools.db.device.airplane_mode is False
        _, result = play(domain, srv, TELECOM_TASK)
    ep = result.episode
    # The simulated user sent the telecom user tools with its requests (it may act on its phone).
    assert ep.stop_reason == StopReason.clean and ep.outcome == 0 and ep.reward == 0.0
    checks = ep.reward_info["tau2"]["env_assertions"]
    assert checks and not all(c["met"] for c in checks)  # nothing was fixed on the device
    assert ep.reward_info["tau2"]["reward_basis"] == ["ENV_ASSERTION"]


def test_telecom_user_requests_carry_user_tools(fake_server):
    script = Script([respond("Hello")], ["My data is broken.", "###STOP###"])
    with fake_server(script) as srv:
        play(make_domain("tau2-telecom", srv), srv, TELECOM_TASK)
    names = {t["function"]["name"] for t in script.user_requests[0]["tools"]}
    assert {"toggle_airplane_mode", "check_status_bar"} <= names


def test_telecom_solved_by_the_users_own_tool_calls(fake_server):
    """The agent instructs; the simulated user acts on its phone (tau2 user tools); env assertions pass."""
    agent = [
        respond("Please turn off airplane mode and turn data roaming on."),
        respond("Is mobile data working now?"),
    ]
    user = [
        "My mobile data does not work abroad.",
        "CALL toggle_airplane_mode {}",
        "CALL toggle_roaming {}",
        "I did both.",
        "###STOP###",
    ]
    script = Script(agent, user)
    with ToolCallingServer.make(fake_server, script) as srv:
        _, result = play(make_domain("tau2-telecom", srv), srv, TELECOM_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.clean, 1, 1.0, 2)
    assert all(c["met"] for c in ep.reward_info["tau2"]["env_assertions"])
    # The agent saw only the user's text; the user's tool calls and results are in the step's tau2 messages.
    assert ep.steps[0].observation == "User: I did both."
    roles = [(m["role"], m.get("requestor")) for m in ep.steps[0].info["tau2_messages"]]
    assert roles == [
        ("assistant", None), ("user", None),  # greeting, opening (step 1 carries them)
        ("assistant", None),  # the agent's instruction
        ("user", None), ("tool", "user"), ("user", None), ("tool", "user"),  # two user tool calls + results
        ("user", None),
    ]
    # Hops: opening 1; agent 2; user call 3, results 4, user call 5, results 6, user text 7; agent 8, user 9.
    assert ep.reward_info["hops"] == 9
    # The simulated user saw its own tool results, as in tau2's orchestrator.
    last = script.user_requests[-1]["messages"]
    assert any(m["role"] == "tool" for m in last)


def test_telecom_prefix_with_user_tool_calls_replays(fake_server):
    agent = [respond("Please turn off airplane mode and turn data roaming on."), respond("Is it working?")]
    user = ["My data is broken.", "CALL toggle_airplane_mode {}", "CALL toggle_roaming {}", "I did both.", "###STOP###"]
    with ToolCallingServer.make(fake_server, Script(agent, user)) as srv:
        domain = make_domain("tau2-telecom", srv)
        _, result = play(domain, srv, TELECOM_TASK)
        prefix = result.episode.steps[:1]

        async def go():
            env = domain.make_env(TELECOM_TASK, episode_seed=1000)
            await env.reset()
            await env.replay(recorded_steps(prefix))
            return env

        env = asyncio.run(go())
    assert env._env.user_tools.db.device.airplane_mode is False  # the user's toggle was re-executed by set_state
    assert env._env.get_user_db_hash() == prefix[0].info["user_db_hash"]
    assert (env.hops, env.errors) == (7, 0)


# ------------------------------------------------------------------------------------------ endings


def test_hop_cap_is_env_terminated(fake_server):
    # max_hops=6: user(1); tool step 1 -> 3; tool step 2 -> 5; tool step 3 -> 7 >= 6 -> tau2 MAX_STEPS.
    agent = [tool("get_order_details", {"order_id": ORDER})] * 3
    with fake_server(Script(agent, USER_LINES)) as srv:
        _env, result = play(make_domain("tau2-retail", srv, max_hops=6), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.env_terminated, None, None, 3)
    assert ep.reward_info["tau2_termination_reason"] == "max_steps" and ep.reward_info["hops"] == 7
    assert ep.reward_info["tau2_reward"] == 0.0  # tau2's own verdict for a premature end, kept for audit


def test_hop_cap_reached_by_agent_message_ends_before_user_replies(fake_server):
    # max_hops=2: user(1), agent text (2) -> capped before the user is asked.
    script = Script([respond("Hello there")], USER_LINES)
    with fake_server(script) as srv:
        _env, result = play(make_domain("tau2-retail", srv, max_hops=2), srv, RETAIL_TASK)
    ep = result.episode
    assert ep.stop_reason == StopReason.env_terminated and ep.steps[0].observation == ""
    assert len(script.user_requests) == 1 and ep.steps[0].info["user_reply"] is None


@pytest.mark.parametrize("marker", ["###TRANSFER###", "###OUT-OF-SCOPE###"])
def test_transfer_and_out_of_scope_are_evaluated_clean_as_in_tau2(fake_server, marker):
    """tau2 treats both markers as user stops and evaluates them: clean, Y = (reward == 1). The domain option
    transfer_as_env_terminated (or the older native_user_stops: false) keeps the earlier mapping: env_terminated."""
    agent = [tool("transfer_to_human_agents", {"summary": "needs a human"}), respond("Transferring you now.")]
    with fake_server(Script(agent, [USER_OPEN, marker])) as srv:
        _, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
        _, censored = play(make_domain("tau2-retail", srv, transfer_as_env_terminated=True), srv, RETAIL_TASK)
        _, legacy = play(make_domain("tau2-retail", srv, native_user_stops=False), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward) == (StopReason.clean, 0, 0.0)  # the return was never made
    assert ep.reward_info["user_stop_marker"] == marker and ep.reward_info["tau2_termination_reason"] == "user_stop"
    for other in (censored.episode, legacy.episode):
        assert (other.stop_reason, other.outcome, other.reward) == (StopReason.env_terminated, None, None)
        assert other.reward_info["tau2_reward"] == 0.0 and other.reward_info["user_stop_marker"] == marker


def test_gold_transfer_task_is_clean_with_tau2s_reward(fake_server):
    """Retail base task 12 expects a return and then a transfer: the gold actions, then ###TRANSFER###, is a
    clean success scored by tau2 (the check in play() compares with tau2's own evaluate_simulation)."""
    domain_task = get_domain_class("tau2-retail")({}).tasks()["12"]
    gold = [tool(a.name, a.arguments) for a in domain_task.evaluation_criteria.actions]
    agent = [*gold, respond("A human agent will take it from here.")]
    with fake_server(Script(agent, ["I want to return some items.", "###TRANSFER###"])) as srv:
        domain = make_domain("tau2-retail", srv)
        _, result = play(domain, srv, "12")
        _, censored = play(make_domain("tau2-retail", srv, transfer_as_env_terminated=True), srv, "12")
    ep = result.episode
    assert [s.info["tool_name"] for s in ep.steps[:-1]] == [a.name for a in domain_task.evaluation_criteria.actions]
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.clean, 1, 1.0, len(gold) + 1)
    assert ep.reward_info["user_stop_marker"] == "###TRANSFER###"
    assert ep.reward_info["tau2"]["db_check"] == {"db_match": True, "db_reward": 1.0}
    assert censored.episode.stop_reason == StopReason.env_terminated and censored.episode.reward_info["tau2_reward"] == 1.0


def test_empty_user_message_ends_env_terminated_as_user_error(fake_server):
    """tau2's generate retries an empty reply num_retries (3) times; still empty, tau2 26.3's orchestrator would
    raise. We keep the conversation and end the episode censored, tau2_termination_reason user_error."""
    script = Script([respond("How can I help?")], [USER_OPEN, ""])
    with fake_server(script) as srv:
        env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.env_terminated, None, None, 1)
    assert ep.reward_info["tau2_termination_reason"] == "user_error" and ep.reward_info["user_stop_marker"] is None
    assert len(script.user_requests) == 1 + 4  # the opening, then the empty reply and its 3 retries
    assert ep.steps[0].observation == "User: " and ep.steps[0].info["tau2_messages"][-1]["role"] == "user"
    assert not env.trajectory[-1].has_text_content()


def test_user_ending_before_the_agent_acts(fake_server):
    """The user's very first message is a stop: the first step reports the ending without executing the action."""
    script = Script([tool("return_delivered_order_items", RETURN_ARGS)], ["Never mind. ###STOP###"])
    with fake_server(script) as srv:
        env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.clean, 0, 0.0, 1)
    assert ep.steps[0].info["kind"] == "ended_before_agent" and ep.steps[0].observation == ""
    assert [m.role for m in env.trajectory] == ["assistant", "user"]  # the return was never executed
    assert ep.reward_info["tau2"]["db_check"]["db_match"] is False
