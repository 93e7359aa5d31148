"""Tau2 replay (checkpoint resume, continuation branches): tau2's ``set_state`` rebuilds the state from the record
with no model calls, and a record that does not support itself or does not replay -- a forged tool result, action,
DB hash, error flag, hop or error count, or a finished conversation -- is a ReplayMismatch."""
from __future__ import annotations

import asyncio
import json

import pytest
from tau2_fixtures import (
    ORDER,
    RETAIL_TASK,
    SOLVED_AGENT,
    USER_LINES,
    USER_OPEN,
    Script,
    make_domain,
    play,
    tool,
)

from uqh.domains.base import RecordedStep, ReplayMismatch
from uqh.domains.tau2.domain import GREETING, count_hops_and_errors, message_from_dict
from uqh.harness.episode.loop import recorded_steps
from uqh.rundir.schema import StopReason


def replayer(domain):
    """replay(steps): a fresh environment of the task, reset, then replayed to ``steps``; returns it."""

    def replay(steps):
        async def go():
            env = domain.make_env(RETAIL_TASK, episode_seed=1000)
            await env.reset()
            await env.replay(steps)
            return env

        return asyncio.run(go())

    return replay


def retagged(rec: RecordedStep, **info) -> RecordedStep:
    return RecordedStep(rec.action, rec.observation, dict(rec.info, **info))


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

        _env, resp = asyncio.run(replay_and_continue())
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


ERROR_FIRST_AGENT = [tool("get_order_detail", {"order_id": ORDER}), *SOLVED_AGENT]  # an unknown tool, then solved


def test_prefix_with_a_tool_error_replays_with_its_error_count(fake_server):
    with fake_server(Script(ERROR_FIRST_AGENT, USER_LINES)) as srv:
        domain = make_domain("tau2-retail", srv)
        _, result = play(domain, srv, RETAIL_TASK)
        prefix = recorded_steps(result.episode.steps[:3])  # error, read, write
        env = replayer(domain)(prefix)
    assert (env.hops, env.errors) == (7, 1) == (prefix[-1].info["hops"], prefix[-1].info["tool_errors"])
    assert [m.error for m in env.trajectory if m.role == "tool"] == [True, False, False]


def _flip_error_flag(rec: RecordedStep, flag: bool) -> RecordedStep:
    msgs = [dict(m, error=flag) if m["role"] == "tool" else m for m in rec.info["tau2_messages"]]
    return retagged(rec, tau2_messages=msgs, tool_error=flag)


def test_replay_refuses_a_tampered_error_flag(fake_server):
    """A consistent record (flag, tool_error, running counts all edited together) whose error flag the real
    environment does not reproduce: the replayed call decides, so a continuation cannot inherit a forged error
    budget."""
    with fake_server(Script(ERROR_FIRST_AGENT, USER_LINES)) as srv:
        domain = make_domain("tau2-retail", srv)
        _, result = play(domain, srv, RETAIL_TASK)
        steps = recorded_steps(result.episode.steps[:3])
        replay = replayer(domain)
        # 1. The unknown-tool call's error hidden: the replayed call errs again.
        hidden = [retagged(_flip_error_flag(steps[0], False), tool_errors=0)] + [retagged(s, tool_errors=0) for s in steps[1:]]
        with pytest.raises(ReplayMismatch, match="recorded error flag False but the replayed call gives True"):
            replay(hidden)
        # 2. A successful read marked as an error: the replayed call succeeds.
        forged = [steps[0], retagged(_flip_error_flag(steps[1], True), tool_errors=2), retagged(steps[2], tool_errors=2)]
        with pytest.raises(ReplayMismatch, match="recorded error flag True but the replayed call gives False"):
            replay(forged)
        # 3. Only the step's tool_error changed: the record contradicts itself.
        with pytest.raises(ReplayMismatch, match="recorded tool_error False differs from the recorded tool result"):
            replay([retagged(steps[0], tool_error=False), *steps[1:]])


@pytest.mark.parametrize("field, value", [("hops", 6), ("tool_errors", 0), ("tool_errors", 2), ("hops", None)])
def test_replay_refuses_tampered_hop_or_error_counts(fake_server, field, value):
    with fake_server(Script(ERROR_FIRST_AGENT, USER_LINES)) as srv:
        domain = make_domain("tau2-retail", srv)
        _, result = play(domain, srv, RETAIL_TASK)
        steps = recorded_steps(result.episode.steps[:3])
        with pytest.raises(ReplayMismatch, match="recorded hops / tool errors"):
            replayer(domain)([*steps[:2], retagged(steps[2], **{field: value})])


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
