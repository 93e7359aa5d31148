"""A resumed or continued Tau2 episode is restored from its record, not reset (``Tau2Environment.restore``): no
user-model call for the opening turn or any other replayed turn, no user tokens recorded for them, and the
simulated user's state is the one tau2's own ``Orchestrator`` builds from the same conversation (its requests
after the restore are the ones tau2's user simulator sends)."""
from __future__ import annotations

import asyncio

import pytest
from tau2_fixtures import (
    ORDER,
    RETAIL_TASK,
    RETURN_ARGS,
    TELECOM_TASK,
    USER_OPEN,
    Script,
    ToolCallingServer,
    make_domain,
    play,
    respond,
    tool,
)
from test_tau2_run import client_factory
from test_tau2_user_logprobs import served, tokens_of, user_config

from uqh.cli import main as uqh
from uqh.domains.base import ReplayMismatch
from uqh.domains.tau2.domain import GREETING, message_from_dict
from uqh.harness.episode.loop import recorded_steps
from uqh.harness.runner import run_batch
from uqh.harness.store.writer import checkpoint_path
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import USER_SIDECAR_FILE, PartialEpisode, StopReason
from uqh.harness.config.settings import BatchSettings

# Retail 73 with a user turn inside the prefix: step 1 asks, the user answers (a replayed turn after the opening).
ASK = "Which order is it, and which items?"
DONE = "Your return is processed; the refund goes to your credit card."
USER_ANSWER = f"Order {ORDER}, all four items."
ASKING_AGENT = [respond(ASK), tool("get_order_details", {"order_id": ORDER}),
                tool("return_delivered_order_items", RETURN_ARGS), respond(DONE)]
ASKED_USER = [USER_OPEN, USER_ANSWER, "###STOP###"]

# Telecom: the user's opening turn itself runs a tool on its phone before it speaks.
PHONE_AGENT = [respond("Please turn data roaming on."), respond("Is mobile data working now?")]
PHONE_USER = ["CALL toggle_airplane_mode {}", "My mobile data is broken.", "CALL toggle_roaming {}", "I did it.",
              "###STOP###"]


def answered(req: dict) -> str:
    """The message a user-model request answers: the last one it sends (the agent's text, or tau2's greeting)."""
    return req["messages"][-1]["content"]


def user_view(state) -> list[dict]:
    """What the user's model is sent from a tau2 user state: system messages, then the conversation role-flipped."""
    return [m.model_dump(mode="json", include={"role", "content", "tool_calls", "id"})
            for m in state.system_messages + state.flip_roles()]


def tau2_orchestrator(domain, task_id: str, messages: list, srv):
    """tau2's own ``Orchestrator`` initialised from ``messages`` as its message history (what ``tau2 run`` builds,
    none of our code): its user simulator and user state."""
    from tau2.agent.llm_agent import LLMAgent
    from tau2.data_model.tasks import InitialState
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.registry import registry
    from tau2.user.user_simulator import UserSimulator

    task = domain.tasks()[task_id]
    init = task.initial_state
    task = task.model_copy(update={"initial_state": InitialState(
        initialization_data=init.initialization_data if init else None,
        initialization_actions=init.initialization_actions if init else None,
        message_history=[m.model_copy(deep=True) for m in messages])})
    env = registry.get_env_constructor(domain.tau2_domain)()
    try:
        user_tools = env.get_user_tools()  # as tau2's run_task picks them
    except Exception:  # noqa: BLE001 - tau2's own rule: a domain without user tools
        user_tools = None
    user = UserSimulator(tools=user_tools, instructions=str(task.user_scenario), llm="openai/fake-user",
                         llm_args={"api_base": srv.base_url, "api_key": "x", "temperature": 0.0})
    agent = LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy(), llm="openai/fake-agent", llm_args={})
    orch = Orchestrator(domain=domain.tau2_domain, agent=agent, user=user, environment=env, task=task)
    orch.initialize()
    return orch


CASES = {
    "retail-user-turn-in-prefix": ("tau2-retail", RETAIL_TASK, ASKING_AGENT, ASKED_USER, 3, DONE),
    "telecom-opening-with-user-tool-call": ("tau2-telecom", TELECOM_TASK, PHONE_AGENT, PHONE_USER, 1,
                                            "Is mobile data working now?"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_restore_makes_no_call_and_gives_the_user_tau2s_state(fake_server, case):
    domain_name, task_id, agent, user, n_prefix, next_text = CASES[case]
    script = Script(agent, user)
    with ToolCallingServer.make(fake_server, script) as srv:
        domain = make_domain(domain_name, srv)
        _, live = play(domain, srv, task_id)
        ep = live.episode
        assert ep.stop_reason == StopReason.clean and ep.n_steps == n_prefix + 1
        live_next_request = script.user_requests[-1]  # the user's answer to the last step, in the live episode
        assert answered(live_next_request) == next_text
        prefix = recorded_steps(ep.steps[:n_prefix])

        async def restore_and_step():
            env = domain.make_env(task_id, episode_seed=1000)
            n_before = len(srv.requests)
            await env.restore(ep.task_prompt, prefix)
            assert len(srv.requests) == n_before  # no model call at all: the opening turn is the recorded one
            assert env.take_user_logprobs() == []
            restored = user_view(env._user_state)
            resp = await env.step(f'Respond["{next_text}"]')
            await domain.aclose()
            return env, restored, resp

        env, restored, resp = asyncio.run(restore_and_step())
        ours_next_request = script.user_requests[-1]
        # tau2's own orchestrator from the same recorded conversation, then its user simulator's next request.
        messages = [message_from_dict(d) for s in prefix for d in s.info["tau2_messages"]]
        orch = tau2_orchestrator(domain, task_id, messages, srv)
        assert user_view(orch.user_state) == restored
        from tau2.data_model.message import AssistantMessage

        orch.user.generate_next_message(AssistantMessage(role="assistant", content=next_text), orch.user_state)
        theirs_next_request = script.user_requests[-1]
    assert resp.done and resp.stop_reason == StopReason.clean
    # Ours after the restore, the live episode's and tau2's: the same conversation sent to the user's model.
    for req in (live_next_request, theirs_next_request):
        assert ours_next_request["messages"] == req["messages"]
        assert ours_next_request.get("tools") == req.get("tools")
    assert ours_next_request["messages"][1]["content"] == GREETING


def test_a_task_prompt_the_recorded_opening_does_not_give_is_replay_mismatch(fake_server):
    script = Script(ASKING_AGENT, ASKED_USER)
    with fake_server(script) as srv:
        domain = make_domain("tau2-retail", srv)
        _, live = play(domain, srv, RETAIL_TASK)
        ep = live.episode
        prefix = recorded_steps(ep.steps[:2])

        async def restore(task_prompt):
            env = domain.make_env(RETAIL_TASK, episode_seed=1000)
            await env.restore(task_prompt, prefix)

        n_before = len(srv.requests)
        asyncio.run(restore(ep.task_prompt))
        assert ep.task_prompt == f"Assistant: {GREETING}\nUser: {USER_OPEN}"
        with pytest.raises(ReplayMismatch, match="not the recorded opening turn's"):
            asyncio.run(restore(ep.task_prompt.replace("everything", "one item")))
        with pytest.raises(ValueError, match="needs recorded steps"):
            asyncio.run(domain.make_env(RETAIL_TASK, episode_seed=1000).restore(ep.task_prompt, []))
        assert len(srv.requests) == n_before


def test_resume_and_continue_ask_the_user_only_for_new_turns(fake_server, tmp_path, monkeypatch):
    """End to end against the fake server: a resumed run and `uqh continue` send the user's model exactly one request
    per new user turn (none answering the greeting or a replayed agent message), and the user sidecar has a row
    for each user turn once: the checkpoint's rows for the replayed turns, nothing new for them."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    script = Script(ASKING_AGENT, ASKED_USER)
    run, src, cont = tmp_path / "run", tmp_path / "src", tmp_path / "cont"
    with fake_server(script) as srv:
        config = user_config(srv, direct=True)
        # 1. Resume: the agent's model fails at step 4; steps 1-3 (a user turn, a read, the write) are checkpointed.
        first = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False, checkpoint_interval_s=0.0), client_factory=client_factory(fail_after=3))
        assert first.remaining == 1
        partial = PartialEpisode.model_validate_json(checkpoint_path(run, f"{RETAIL_TASK}#0").read_text())
        assert [s.t for s in partial.steps] == [1, 2, 3]
        assert [(r.t, tokens_of(r)) for r in partial.user_sidecar] == [(0, served(USER_OPEN)), (1, served(USER_ANSWER))]
        assert [answered(r) for r in script.user_requests] == [GREETING, ASK]
        script.user_requests.clear()
        second = run_batch(config, run, settings=BatchSettings(concurrency=1, progress=False, checkpoint_interval_s=0.0), client_factory=client_factory())
        assert second.ok
        assert [answered(r) for r in script.user_requests] == [DONE]  # step 4's reply only
        # 2. `uqh continue` of a censored source (step budget 3): each branch's step 4 reply only.
        script.user_requests.clear()
        assert run_batch(user_config(srv, direct=True, step_budget=3), src, settings=BatchSettings(concurrency=1, progress=False),
                         client_factory=client_factory()).ok
        assert [answered(r) for r in script.user_requests] == [GREETING, ASK]
        script.user_requests.clear()
        rc = uqh(["continue", str(src), "--out", str(cont), "--branches", "3", "--extra-steps", "1",
                  "--min-valid", "1", "--no-progress", "--bootstrap", "10"])
        assert rc == 0
        assert [answered(r) for r in script.user_requests] == [DONE] * 3
    (ep,) = RunDir.open(run).episodes()
    assert (ep.stop_reason, ep.reward, ep.n_steps) == (StopReason.clean, 1.0, 4)
    rows = list(RunDir.open(run).user_sidecar())
    assert [(r.t, r.attempt) for r in rows] == [(0, 0), (1, 0), (4, 0)]
    assert [tokens_of(r) for r in rows] == [served(USER_OPEN), served(USER_ANSWER), served("###STOP###")]
    assert (run / USER_SIDECAR_FILE).read_bytes().count(b"\n") == 3  # the file itself: one line per user turn
    assert [(r.t, r.attempt) for r in RunDir.open(src).user_sidecar()] == [(0, 0), (1, 0)]
    branches = RunDir.open(cont)
    assert sorted(e.episode_id for e in branches.episodes()) == [f"{RETAIL_TASK}#0@b{i}" for i in range(3)]
    assert all(e.stop_reason == StopReason.clean and e.prefix_steps == 3 for e in branches.episodes())
    # The replayed prefix (opening turn, step 1's user reply, two tool steps) adds no rows to the branches.
    assert sorted((r.episode_id, r.t) for r in branches.user_sidecar()) == [
        (f"{RETAIL_TASK}#0@b{i}", 4) for i in range(3)]
