"""The simulated user's direct path (``uqh/domains/tau2/user_client.py``) against tau2's own ``generate`` (litellm).

Each case drives one conversation twice against the same fake server -- once through tau2's
``UserSimulator.generate_next_message`` (litellm's synchronous ``completion``), once through
:class:`DirectUserGenerator` -- and requires the same request bodies on the wire, the same messages back (content,
tool calls flipped to the user, cost, usage) and the same simulator state after every turn.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from tau2_fixtures import (
    RETAIL_TASK,
    TELECOM_TASK,
    USER_OPEN,
    Script,
    ToolCallingServer,
    make_domain,
    play,
    respond,
)

from uqh.domains.base import EnvironmentUnavailable
from uqh.domains.tau2.access import Tau2
from uqh.domains.tau2.user_client import DirectUserGenerator, UserCallFailed, direct_path_applies
from uqh.rundir.schema import DecodingConfig


def _dump(m) -> dict:
    """A tau2 message without its creation time (tau2 stamps each message when it is built)."""
    return m.model_dump(mode="json", exclude={"timestamp"})


class Turns:
    """A responder that answers the user's requests in order (the agent never calls here)."""

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.calls = 0

    def __call__(self, body: dict) -> str:
        text = self.replies[self.calls % len(self.replies)]
        self.calls += 1
        return text


def _incoming_sequence(t2, with_tools: bool) -> list:
    """What the agent side sends the user over a conversation: text, and (telecom) results of the user's calls."""
    msg = t2.msg
    seq = [msg.AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
           msg.AssistantMessage(role="assistant", content="Could you restart your phone, please?")]
    if with_tools:
        seq.append(msg.ToolMessage(id="user_call_1", role="tool", content='{"status": "ok"}', requestor="user"))
        seq.append(msg.MultiToolMessage(role="tool", tool_messages=[
            msg.ToolMessage(id="user_call_2", role="tool", content="airplane mode off", requestor="user"),
            msg.ToolMessage(id="user_call_3", role="tool", content="Error: no such setting", requestor="user",
                            error=True)]))
    seq.append(msg.AssistantMessage(role="assistant", content="Thanks. Anything else?"))
    return seq


def _both_paths(srv, responder, domain_name: str, task_id: str, *, with_tools: bool, user_decoding, model=None,
                user_logprobs=None):
    """(requests, messages, states) from tau2's path, then the same from the direct path."""
    domain = make_domain(domain_name, srv, user_decoding=user_decoding)
    if model:
        domain.prepare_runtime({**domain.runtime, "user_model": model})
    if user_logprobs is not None:  # uqh run --user-logprobs
        domain.prepare_runtime({**domain.runtime, "user_logprobs": user_logprobs})
    direct = domain.direct_user()
    assert isinstance(direct, DirectUserGenerator)
    t2 = Tau2.load()
    out = []
    for use_direct in (False, True):
        responder.calls = 0
        start = len(srv.requests)
        env = domain.make_env(task_id, episode_seed=11)
        user = env._make_user()
        state = user.get_init_state()
        messages, states = [], []

        async def turns():
            nonlocal state
            for incoming in _incoming_sequence(t2, with_tools):
                if use_direct:
                    reply, state = await direct.next_message(user, incoming.model_copy(deep=True), state)
                else:
                    reply, state = user.generate_next_message(incoming.model_copy(deep=True), state)
                messages.append(_dump(reply))
                states.append([_dump(m) for m in state.messages])
            await domain.aclose()

        asyncio.run(turns())
        out.append((srv.requests[start:], messages, states))
    return out


CASES = {
    # name: (domain, task, with user tools, user decoding, replies to the user's requests)
    "retail_text": ("tau2-retail", RETAIL_TASK, False, None, [USER_OPEN, "Yes, order #W5272531.", "###STOP###"]),
    "retail_decoding": ("tau2-retail", RETAIL_TASK, False,
                        DecodingConfig(temperature=0.7, top_p=0.9, seed=3, max_tokens=48),
                        ["Hello.", "Fine.", "###STOP###"]),
    "telecom_tool_calls": ("tau2-telecom", TELECOM_TASK, True, None,
                           ["My data is broken.", "CALL toggle_airplane_mode {}", "CALL check_status_bar {}",
                            "Done, it still fails.", "###TRANSFER###"]),
    # An empty reply is asked again (tau2's num_retries = 3) before the next scripted line is the answer.
    "empty_then_text": ("tau2-retail", RETAIL_TASK, False, None, ["", "", "Hello again.", "Bye ###STOP###"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_direct_path_sends_and_builds_what_tau2_generate_does(fake_server, name):
    domain_name, task_id, with_tools, decoding, replies = CASES[name]
    responder = Turns(replies)
    with ToolCallingServer.make(fake_server, responder) as srv:
        (theirs_req, theirs_msgs, theirs_states), (ours_req, ours_msgs, ours_states) = _both_paths(
            srv, responder, domain_name, task_id, with_tools=with_tools, user_decoding=decoding)
    assert theirs_req and ours_req == theirs_req  # the same JSON bodies, in the same order
    assert ours_msgs == theirs_msgs
    assert ours_states == theirs_states
    if with_tools:
        assert ours_req[0]["tools"] and ours_req[0]["tool_choice"] == "auto"
        assert any(m.get("tool_calls") and m["tool_calls"][0]["requestor"] == "user" for m in ours_msgs)
    if decoding is not None:
        assert {k: ours_req[0][k] for k in ("temperature", "top_p", "max_tokens")} == {
            "temperature": 0.7, "top_p": 0.9, "max_tokens": 48}
    if name == "empty_then_text":  # 3 turns: "", "", "Hello again."; "Bye ###STOP###"; "", "", "Hello again."
        assert len(ours_req) == 7 and ours_msgs[0]["content"] == "Hello again."


def test_user_logprobs_are_asked_and_returned_the_same_on_both_paths(fake_server):
    """With --user-logprobs both paths send logprobs/top_logprobs and keep the reply's logprobs in raw_data (what
    the episode takes the user sidecar's tokens from)."""
    responder = Turns([USER_OPEN, "Yes, order #W5272531.", "###STOP###"])
    with ToolCallingServer.make(fake_server, responder) as srv:
        (theirs_req, theirs_msgs, _), (ours_req, ours_msgs, _) = _both_paths(
            srv, responder, "tau2-retail", RETAIL_TASK, with_tools=False, user_decoding=None, user_logprobs=3)
    assert theirs_req and ours_req == theirs_req
    assert all(r["logprobs"] is True and r["top_logprobs"] == 3 for r in ours_req)
    assert ours_msgs == theirs_msgs
    content = ours_msgs[0]["raw_data"]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == USER_OPEN and len(content[0]["top_logprobs"]) == 3


def test_priced_model_costs_the_same_on_both_paths(fake_server):
    """A model in litellm's price map (the server reports usage): tau2's cost, computed from litellm's response."""
    responder = Turns(["Hello.", "Sure.", "###STOP###"])
    with ToolCallingServer.make(fake_server, responder) as srv:
        (_, theirs, _), (_, ours, _) = _both_paths(
            srv, responder, "tau2-retail", RETAIL_TASK, with_tools=False, user_decoding=None,
            model="openai/gpt-4o-mini")
    assert ours == theirs and all(m["cost"] > 0 for m in ours)


@pytest.mark.parametrize("model, args, expected", [
    ("openai/fake-user", {"api_base": "http://127.0.0.1:1/v1", "temperature": 0.0, "seed": 1}, True),
    ("openai/gpt-4o-mini", {"api_base": "http://127.0.0.1:1/v1", "num_retries": 3, "timeout": 5.0}, True),
    ("openai/o3-mini", {"api_base": "http://127.0.0.1:1/v1"}, False),  # litellm rewrites reasoning models' fields
    ("openai/gpt-5", {"api_base": "http://127.0.0.1:1/v1"}, False),
    ("openai/fake-user", {"temperature": 0.0}, False),  # no URL: litellm's provider settings decide
    ("anthropic/claude-3-5-haiku", {"api_base": "http://127.0.0.1:1/v1"}, False),
    ("openai/fake-user", {"api_base": "http://127.0.0.1:1/v1", "frequency_penalty": 0.5}, False),
])
def test_direct_path_only_where_litellm_sends_the_plain_request(model, args, expected):
    assert direct_path_applies(model, args) is expected


def test_user_client_litellm_option_keeps_tau2s_generate(fake_server):
    script = Script([respond("How can I help?")], [USER_OPEN, "###STOP###"])
    with fake_server(script) as srv:
        assert make_domain("tau2-retail", srv).direct_user() is not None
        domain = make_domain("tau2-retail", srv, user_client="litellm")
        assert domain.direct_user() is None
        _, result = play(domain, srv, RETAIL_TASK)
    assert result.episode.stop_reason.value == "clean"
    assert domain.manifest_info()["user_client"] == "litellm"


def test_whole_episode_identical_on_both_paths(fake_server):
    """The telecom episode where the user acts on its phone: the same record, request for request."""
    agent = [respond("Please turn off airplane mode and turn data roaming on."), respond("Is it working now?")]
    user = ["My mobile data does not work abroad.", "CALL toggle_airplane_mode {}", "CALL toggle_roaming {}",
            "I did both.", "###STOP###"]
    records = []
    for option in ("litellm", "auto"):
        script = Script(agent, user)
        with ToolCallingServer.make(fake_server, script) as srv:
            _, result = play(make_domain("tau2-telecom", srv, user_client=option), srv, TELECOM_TASK)
        ep = result.episode
        msgs = [{k: v for k, v in m.items() if k != "timestamp"} for s in ep.steps for m in s.info["tau2_messages"]]
        records.append((script.user_requests, msgs, ep.reward_info["tau2"], ep.stop_reason, ep.reward))
    assert records[0] == records[1]
    assert records[1][4] == 1.0


def test_transient_failures_are_retried_then_answered(fake_server):
    responder = Turns(["Hello there."])
    with ToolCallingServer.make(fake_server, responder) as srv:
        srv.faults = ["500", "reset"]
        domain = make_domain("tau2-retail", srv, user_decoding=None)
        env = domain.make_env(RETAIL_TASK, episode_seed=1)

        async def go():
            try:
                return await env.reset()
            finally:
                await domain.aclose()

        first = asyncio.run(go())
    assert srv.faults_served == ["500", "reset"] and "Hello there." in first


def test_a_refused_request_fails_the_episode_as_infrastructure(fake_server):
    """A 400 is not retried; the episode raises EnvironmentUnavailable (re-queued by the runner, never recorded)."""
    with ToolCallingServer.make(fake_server, Turns(["x"])) as srv:
        srv.faults = ["400"]
        domain = make_domain("tau2-retail", srv, user_decoding=None)
        env = domain.make_env(RETAIL_TASK, episode_seed=1)

        async def go():
            try:
                await env.reset()
            finally:
                await domain.aclose()

        with pytest.raises(EnvironmentUnavailable, match="HTTP 400"):
            asyncio.run(go())
    assert srv.n_requests == 1


def test_an_unreachable_endpoint_fails_after_the_retries(monkeypatch):
    monkeypatch.setattr("uqh.domains.tau2.user_client.asyncio.sleep", _no_sleep)
    gen = DirectUserGenerator("openai/fake-user", {"api_base": "http://127.0.0.1:9/v1", "num_retries": 2}, None)

    async def go():
        try:
            await gen._post(json.dumps({"model": "fake-user", "messages": []}))
        finally:
            await gen.aclose()

    with pytest.raises(UserCallFailed, match="3 attempts failed; last: Client"):
        asyncio.run(go())


async def _no_sleep(_s):
    return None
