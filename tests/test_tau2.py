"""Tau2 domains: full episodes against the real tau2 environments, user simulator and evaluator.

One fake OpenAI-compatible server plays both sides: requests whose system prompt is ours are the agent,
requests whose system prompt is tau2's user-simulation guidelines are the simulated user. Each side's reply
is chosen by how many turns that side has already taken in the request (so the script is deterministic).
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from domains import domain_names, get_domain_class
from domains.base import InvalidAction, ReplayMismatch
from domains.tau2_bench import (
    GREETING,
    count_hops_and_errors,
    message_from_dict,
    parse_action,
)
from rundir.errors import UserError
from harness.loop import EpisodeSpec, recorded_steps, run_episode
from harness.model_client import make_model_client
from rundir.schema import DecodingConfig, StopReason

AGENT_MARK = "You are a customer-support agent operating in the tau2-bench domain"
USER_MARK = "# User Simulation Guidelines"

# Retail base task 73: one gold write (a return), no communicate_info -> reward 1 iff the DB matches.
RETAIL_TASK = "73"
ORDER = "#W5272531"
RETURN_ARGS = {
    "order_id": ORDER,
    "item_ids": ["7228247242", "2698416822", "8098621301", "3320557165"],
    "payment_method_id": "credit_card_6824399",
}
TELECOM_TASK = "[mobile_data_issue]airplane_mode_on|user_abroad_roaming_enabled_off[PERSONA:None]"
USER_DECODING = DecodingConfig(temperature=0.0, top_p=1.0, seed=7, max_tokens=64, logprobs=True)
AGENT_DECODING = DecodingConfig(temperature=0.2, seed=42, max_tokens=256)


def react(action: str, confidence: str = "0.8") -> str:
    return (
        f"<think>next step</think>\n<action>{action}</action>\n"
        f"<confidence>{confidence}</confidence>\n<explanation>I think so.</explanation>"
    )


def tool(name: str, args: dict) -> str:
    return react(f"Tool[{name}, {json.dumps(args)}]")


def respond(text: str) -> str:
    return react(f'Respond["{text}"]')


class Script:
    """Responder for the fake server: agent outputs and user replies, indexed by turns already taken."""

    def __init__(self, agent: list[str], user: list[str]):
        self.agent, self.user = agent, user
        self.agent_requests: list[dict] = []
        self.user_requests: list[dict] = []

    def __call__(self, req: dict) -> str:
        system = req["messages"][0]["content"]
        n = sum(1 for m in req["messages"] if m["role"] == "assistant")
        if system.startswith(AGENT_MARK):
            self.agent_requests.append(req)
            return self.agent[min(n, len(self.agent) - 1)]
        assert system.startswith(USER_MARK), system[:80]
        self.user_requests.append(req)
        return self.user[min(n, len(self.user) - 1)]


def make_domain(name: str, srv, **options):
    domain = get_domain_class(name)(options)
    domain.prepare_runtime(
        {"user_model": "openai/fake-user", "user_api_base": srv.base_url, "user_decoding": USER_DECODING}
    )
    return domain


def play(domain, srv, task_id: str, *, step_budget: int = 50, episode_seed: int = 1000):
    async def go():
        env = domain.make_env(task_id, episode_seed=episode_seed)
        client = make_model_client("openai/fake-agent", api_base=srv.base_url, decoding=AGENT_DECODING, api_key="x")
        try:
            result = await run_episode(
                env,
                client,
                spec=EpisodeSpec(episode_id=f"{task_id}#0", task_id=task_id, seed=5),
                system_prompt=domain.system_prompt(),
                step_budget=step_budget,
            )
        finally:
            await client.aclose()
        return env, result

    return asyncio.run(go())


SOLVED_AGENT = [
    tool("get_order_details", {"order_id": ORDER}),
    tool("return_delivered_order_items", RETURN_ARGS),
    respond("Your return is processed; the refund goes to your credit card."),
]
USER_OPEN = "Hi, I want to return everything from order #W5272531."
USER_LINES = [USER_OPEN, "###STOP###"]


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
    template = (Path(__file__).resolve().parent.parent / "prompts" / "tau2.txt").read_text()
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
    cases = {
        'Tool[get_order, {"a": 1}]': "unknown tool 'get_order'; the tools are: get_order_details, calculate",
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
        env, result = play(domain, srv, RETAIL_TASK)
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
        env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
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


def test_malformed_action_repaired_then_exhausted_is_parse_error(fake_server):
    agent = [
        tool("get_order_detail", {"order_id": ORDER}),  # step 1, attempt 0: unknown tool -> repair
        tool("get_order_details", {"order_id": ORDER}),  # step 1, attempt 1: fine
        react("Tool[get_order_details, {order_id: W1}]"),  # step 2: invalid JSON
        react("Respond[hello]"),  # unquoted
        react("Finish[done]"),  # not in the grammar -> parse_error
    ]
    script = Script(agent, USER_LINES)
    with fake_server(script) as srv:
        env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    ep = result.episode
    assert ep.stop_reason == StopReason.parse_error and ep.outcome is None and ep.n_steps == 1
    assert ep.steps[0].repair_attempts == 1
    assert "unknown tool 'get_order_detail'; the tools are: calculate, cancel_pending_order" in ep.steps[0].attempts[0].error
    errors = [a.error for a in ep.failed_step]
    assert "not valid JSON" in errors[0] and "double-quoted" in errors[1] and "exactly one of Tool[" in errors[2]
    # The repair message the model saw carries our precise InvalidAction message.
    repair = script.agent_requests[1]["messages"][-1]["content"]
    assert "unknown tool 'get_order_detail'" in repair
    # Rejected actions changed nothing: two tool messages would mean a rejected call was executed.
    assert env.hops == 3 and [m.role for m in env.trajectory] == ["assistant", "user", "assistant", "tool"]


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


# ------------------------------------------------------------------------------------------ endings


def test_hop_cap_is_env_terminated(fake_server):
    # max_hops=6: user(1); tool step 1 -> 3; tool step 2 -> 5; tool step 3 -> 7 >= 6 -> tau2 MAX_STEPS.
    agent = [tool("get_order_details", {"order_id": ORDER})] * 3
    with fake_server(Script(agent, USER_LINES)) as srv:
        env, result = play(make_domain("tau2-retail", srv, max_hops=6), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.env_terminated, None, None, 3)
    assert ep.reward_info["tau2_termination_reason"] == "max_steps" and ep.reward_info["hops"] == 7
    assert ep.reward_info["tau2_reward"] == 0.0  # tau2's own verdict for a premature end, kept for audit


def test_hop_cap_reached_by_agent_message_ends_before_user_replies(fake_server):
    # max_hops=2: user(1), agent text (2) -> capped before the user is asked.
    script = Script([respond("Hello there")], USER_LINES)
    with fake_server(script) as srv:
        env, result = play(make_domain("tau2-retail", srv, max_hops=2), srv, RETAIL_TASK)
    ep = result.episode
    assert ep.stop_reason == StopReason.env_terminated and ep.steps[0].observation == ""
    assert len(script.user_requests) == 1 and ep.steps[0].info["user_reply"] is None


def test_too_many_tool_errors_is_tool_error(fake_server):
    agent = [tool("get_order_details", {"order_id": "#W0000000"})] * 3
    with fake_server(Script(agent, USER_LINES)) as srv:
        env, result = play(make_domain("tau2-retail", srv, max_errors=2), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.tool_error, None, None, 2)
    assert ep.steps[0].observation.startswith("Error:") and ep.steps[0].info["tool_error"] is True
    assert ep.reward_info["tau2_termination_reason"] == "too_many_errors" and ep.reward_info["tool_errors"] == 2


@pytest.mark.parametrize("marker", ["###TRANSFER###", "###OUT-OF-SCOPE###"])
def test_transfer_and_out_of_scope_are_env_terminated_unless_native(fake_server, marker):
    agent = [tool("transfer_to_human_agents", {"summary": "needs a human"}), respond("Transferring you now.")]
    with fake_server(Script(agent, [USER_OPEN, marker])) as srv:
        _, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
        _, native = play(make_domain("tau2-retail", srv, native_user_stops=True), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward) == (StopReason.env_terminated, None, None)
    assert ep.reward_info["user_stop_marker"] == marker and ep.reward_info["tau2_reward"] == 0.0
    assert (native.episode.stop_reason, native.episode.outcome, native.episode.reward) == (StopReason.clean, 0, 0.0)


# ------------------------------------------------------------------------------------------ replay


def test_prefix_replay_reproduces_db_hash_and_continues(fake_server):
    from tau2.registry import registry

    script = Script(SOLVED_AGENT, USER_LINES)
    with fake_server(script) as srv:
        domain = make_domain("tau2-retail", srv)
        _, result = play(domain, srv, RETAIL_TASK)
        prefix = result.episode.steps[:2]  # read + write; the conversation is still open
        recorded_hash = prefix[-1].info["db_hash"]
        assert recorded_hash != registry.get_env_constructor("retail")().get_db_hash()

        async def replay_and_continue():
            env = domain.make_env(RETAIL_TASK, episode_seed=1000)
            await env.reset()
            n_before = len(srv.requests)
            await env.replay(recorded_steps(prefix))
            assert len(srv.requests) == n_before  # no model calls during replay
            assert env._env.get_db_hash() == recorded_hash
            assert (env.hops, env.errors) == (5, 0) == (prefix[-1].info["hops"], prefix[-1].info["tool_errors"])
            resp = await env.step('Respond["Your return is processed."]')
            return env, resp

        env, resp = asyncio.run(replay_and_continue())
    assert (resp.done, resp.stop_reason, resp.outcome, resp.reward) == (True, StopReason.clean, 1, 1.0)
    # The user simulator resumed from the recorded conversation: greeting, its opening, then the new message.
    last_user_req = script.user_requests[-1]["messages"]
    assert [m["content"] for m in last_user_req[1:]] == [GREETING, USER_OPEN, "Your return is processed."]


def test_tampered_prefix_is_replay_mismatch(fake_server):
    script = Script(SOLVED_AGENT, USER_LINES)
    with fake_server(script) as srv:
        domain = make_domain("tau2-retail", srv)
        _, result = play(domain, srv, RETAIL_TASK)
        steps = recorded_steps(result.episode.steps[:2])

        def replay(recs):
            async def go():
                env = domain.make_env(RETAIL_TASK, episode_seed=1000)
                await env.reset()
                await env.replay(recs)

            asyncio.run(go())

        # 1. A tool result that the real environment does not reproduce: tau2's set_state raises.
        forged = json.loads(steps[0].observation)
        forged["status"] = "cancelled"
        forged_text = json.dumps(forged)
        t1 = steps[0].info["tau2_messages"]
        tampered = [dict(m, content=forged_text) if m["role"] == "tool" else m for m in t1]
        bad = [type(steps[0])(steps[0].action, forged_text, dict(steps[0].info, tau2_messages=tampered)), steps[1]]
        with pytest.raises(ReplayMismatch, match="set_state rejected"):
            replay(bad)
        # 2. An action that is not the recorded tool call.
        bad = [type(steps[0])('Tool[get_order_details, {"order_id": "#W1"}]', steps[0].observation, steps[0].info)]
        with pytest.raises(ReplayMismatch, match="differs from the recorded tool call"):
            replay(bad)
        # 3. A DB hash that the replay does not reach.
        bad = [steps[0], type(steps[1])(steps[1].action, steps[1].observation, dict(steps[1].info, db_hash="0" * 64))]
        with pytest.raises(ReplayMismatch, match="DB hash"):
            replay(bad)
        # 4. A finished episode is not a censored prefix.
        full = recorded_steps(result.episode.steps)
        with pytest.raises(ReplayMismatch):
            replay(full)


def test_hop_count_matches_tau2_conventions():
    msgs = [
        message_from_dict({"role": "assistant", "content": GREETING}),
        message_from_dict({"role": "user", "content": "hi"}),
        message_from_dict({"role": "assistant", "tool_calls": [{"id": "c1", "name": "x", "arguments": {}}]}),
        message_from_dict({"role": "tool", "id": "c1", "content": "Error: no", "error": True}),
        message_from_dict({"role": "assistant", "content": "ok"}),
        message_from_dict({"role": "user", "tool_calls": [
            {"id": "u1", "name": "a", "arguments": {}, "requestor": "user"},
            {"id": "u2", "name": "b", "arguments": {}, "requestor": "user"}]}),
        message_from_dict({"role": "tool", "id": "u1", "content": "1", "requestor": "user"}),
        message_from_dict({"role": "tool", "id": "u2", "content": "Error", "requestor": "user", "error": True}),
        message_from_dict({"role": "user", "content": "done"}),
    ]
    # user, agent call, results, agent text, user call, (two results = one hop), user text
    assert count_hops_and_errors(msgs) == (7, 2)


# ------------------------------------------------------------------------------------------ telecom user tools


class ToolCallingServer:
    """The fake server, plus: a responder text ``CALL name {json}`` is answered as an OpenAI tool call."""

    @staticmethod
    def make(fake_server, responder):
        import time

        from aiohttp import web

        srv = fake_server(responder)
        plain_chat = srv._chat
        counter = iter(range(1, 1000))

        async def chat(request):
            body = json.loads(await request.read())
            text = responder(body)
            if not text.startswith("CALL "):
                return await plain_chat(request)
            srv.requests.append(body)
            _, name, args = text.split(" ", 2)
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"user_call_{next(counter)}", "type": "function", "function": {"name": name, "arguments": args}}]}
            payload = {"id": "chatcmpl-tool", "object": "chat.completion", "created": int(time.time()),
                       "model": body["model"], "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            return web.json_response(payload)

        def make_app():
            app = web.Application(client_max_size=64 * 1024**2)
            app.router.add_post("/v1/chat/completions", chat)
            return app

        srv.make_app = make_app
        return srv


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


def test_wrong_tool_arguments_are_tau2_tool_errors_not_parse_errors(fake_server):
    agent = [tool("get_order_details", {"order": ORDER}), respond("Sorry.")]
    with fake_server(Script(agent, USER_LINES)) as srv:
        _, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    step = result.episode.steps[0]
    assert step.repair_attempts == 0 and step.info["tool_error"] is True and step.observation.startswith("Error:")
    assert result.episode.reward_info["tool_errors"] == 1
