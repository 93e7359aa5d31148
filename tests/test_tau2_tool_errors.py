"""Tool errors as tau2's orchestrator has them: a well-formed call naming an unknown tool or carrying arguments the
tool rejects reaches tau2's environment, whose error tool result the agent sees and ``max_errors`` counts (too many
-> ``tool_error``). Only a malformed action is a repair (-> ``parse_error`` when repairs run out).

Every episode is checked by ``play`` against tau2's own ``evaluate_simulation`` (tests/tau2_fixtures.py).
"""
from __future__ import annotations

import json

from tau2_fixtures import (
    ORDER,
    RETAIL_TASK,
    RETURN_ARGS,
    USER_LINES,
    Script,
    make_domain,
    play,
    react,
    respond,
    tool,
)

from uqh.rundir.schema import StopReason


def test_unknown_tool_once_then_gold_actions_is_one_counted_error_and_a_success(fake_server):
    agent = [
        tool("get_order_detail", {"order_id": ORDER}),  # no such tool: tau2's error result, not a repair
        tool("get_order_details", {"order_id": ORDER}),
        tool("return_delivered_order_items", RETURN_ARGS),
        respond("Your return is processed."),
    ]
    script = Script(agent, USER_LINES)
    with fake_server(script) as srv:
        env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.clean, 1, 1.0, 4)
    first = ep.steps[0]
    assert first.repair_attempts == 0 and first.info["tool_error"] is True
    assert first.observation == "Error: Tool 'get_order_detail' not found."  # tau2's own message, verbatim
    assert [s.info["tool_errors"] for s in ep.steps] == [1, 1, 1, 1] and ep.reward_info["tool_errors"] == 1
    # The agent's next request carried the error as the observation of its call.
    assert script.agent_requests[1]["messages"][-1]["content"].endswith(first.observation)
    # tau2's trajectory holds the failed call and its error result, as tau2's orchestrator would.
    tool_msgs = [m for m in env.trajectory if m.role == "tool"]
    assert [m.error for m in tool_msgs] == [True, False, False]


def test_wrong_tool_arguments_are_tau2_tool_errors_not_parse_errors(fake_server):
    agent = [tool("get_order_details", {"order": ORDER}), respond("Sorry.")]
    with fake_server(Script(agent, USER_LINES)) as srv:
        _, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    step = result.episode.steps[0]
    assert step.repair_attempts == 0 and step.info["tool_error"] is True and step.observation.startswith("Error:")
    assert "unexpected keyword argument 'order'" in step.observation
    assert result.episode.reward_info["tool_errors"] == 1


def test_eleven_invalid_tool_calls_end_tool_error_at_taus_limit(fake_server):
    """tau2's max_errors is 10: the tenth error ends the episode (TOO_MANY_ERRORS); the eleventh call never runs."""
    bad = [
        tool("get_order_detail", {"order_id": ORDER}),  # unknown tool
        tool("get_order_details", {"order": ORDER}),  # unknown argument
        tool("get_order_details", {"order_id": "#W0000000"}),  # no such order
    ]
    agent = [bad[i % 3] for i in range(11)]
    script = Script(agent, USER_LINES)
    with fake_server(script) as srv:
        _env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.tool_error, None, None, 10)
    assert ep.reward_info["tau2_termination_reason"] == "too_many_errors"
    assert [s.info["tool_errors"] for s in ep.steps] == list(range(1, 11))
    assert all(s.info["tool_error"] and s.repair_attempts == 0 for s in ep.steps)
    assert len(script.agent_requests) == 10 and ep.reward_info["hops"] == 1 + 2 * 10


def test_too_many_tool_errors_with_a_lower_limit(fake_server):
    agent = [tool("get_order_details", {"order_id": "#W0000000"})] * 3
    with fake_server(Script(agent, USER_LINES)) as srv:
        _, result = play(make_domain("tau2-retail", srv, max_errors=2), srv, RETAIL_TASK)
    ep = result.episode
    assert (ep.stop_reason, ep.outcome, ep.reward, ep.n_steps) == (StopReason.tool_error, None, None, 2)
    assert ep.steps[0].observation.startswith("Error:") and ep.steps[0].info["tool_error"] is True
    assert ep.reward_info["tau2_termination_reason"] == "too_many_errors" and ep.reward_info["tool_errors"] == 2


def test_malformed_actions_are_repairs_then_parse_error(fake_server):
    agent = [
        react('Tool[get_order_details, {"order_id": #W5272531}]'),  # step 1, attempt 0: unparseable JSON -> repair
        tool("get_order_details", {"order_id": ORDER}),  # step 1, attempt 1: fine
        react('Tool[get_order_details, ["#W5272531"]]'),  # step 2: arguments not an object
        react("Respond[hello]"),  # unquoted
        react("Finish[done]"),  # neither Tool[...] nor Respond[...] -> parse_error
    ]
    script = Script(agent, USER_LINES)
    with fake_server(script) as srv:
        env, result = play(make_domain("tau2-retail", srv), srv, RETAIL_TASK)
    ep = result.episode
    assert ep.stop_reason == StopReason.parse_error and ep.outcome is None and ep.n_steps == 1
    assert ep.steps[0].repair_attempts == 1 and json.loads(ep.steps[0].observation)["order_id"] == ORDER
    assert "are not valid JSON" in ep.steps[0].attempts[0].error
    errors = [a.error for a in ep.failed_step]
    assert "must be a JSON object" in errors[0] and "double-quoted" in errors[1] and "exactly one of Tool[" in errors[2]
    # The repair message the model saw carries our precise InvalidAction message.
    assert "are not valid JSON" in script.agent_requests[1]["messages"][-1]["content"]
    # Rejected actions changed nothing and counted no tau2 error.
    assert env.hops == 3 and env.errors == 0
    assert [m.role for m in env.trajectory] == ["assistant", "user", "assistant", "tool"]
