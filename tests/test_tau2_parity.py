"""Parity with tau2's own Orchestrator: the same agent actions and the same simulated user give the same
conversation, the same termination reason and the same reward through our loop as through tau2.run's machinery --
including a gold transfer (clean, tau2's reward), an unknown tool (an error result, counted) and 11 invalid calls
(tau2's TOO_MANY_ERRORS at the tenth). Our simulated user takes the direct path
(``uqh/domains/tau2/user_client.py``), tau2's takes litellm: the user's requests must be the same JSON too."""
from __future__ import annotations

import json
import re

import pytest
from tau2_fixtures import (
    ORDER,
    RETAIL_TASK,
    RETURN_ARGS,
    USER_LINES,
    USER_OPEN,
    Script,
    make_domain,
    play,
    respond,
    tool,
)

_GOLD_12 = [("find_user_id_by_email", {"email": "mia.garcia2723@example.com"}),
            ("get_user_details", {"user_id": "mia_garcia_4516"}),
            ("get_order_details", {"order_id": "#W5490111"}),
            ("get_order_details", {"order_id": "#W7387996"}),
            ("return_delivered_order_items", {"order_id": "#W5490111", "item_ids": ["4579334072", "6117189161",
                                              "4947717507"], "payment_method_id": "paypal_9497703"}),
            ("transfer_to_human_agents", {"summary": "The user prefers PayPal for refund, but the agent cannot help."})]
_BAD_CALLS = [tool("get_order_detail", {"order_id": ORDER}), tool("get_order_details", {"order": ORDER}),
              tool("get_order_details", {"order_id": "#W0000000"})]

SCENARIOS = {
    # name: (agent outputs, user lines, domain options, task id)
    "solved": ([tool("get_order_details", {"order_id": ORDER}), tool("return_delivered_order_items", RETURN_ARGS),
                respond("Your return is processed.")], USER_LINES, {}, RETAIL_TASK),
    "hop_cap_after_agent_text": ([respond("Hello there")], USER_LINES, {"max_hops": 4}, RETAIL_TASK),
    "hop_cap_on_user_stop": ([respond("Anything else?")], [USER_OPEN, "###STOP###"], {"max_hops": 3}, RETAIL_TASK),
    "too_many_errors_and_hop_cap": ([tool("get_order_details", {"order_id": "#W0"})] * 3, USER_LINES,
                                    {"max_errors": 2, "max_hops": 5}, RETAIL_TASK),  # both caps on hop 5: errors win
    "transfer": ([tool("transfer_to_human_agents", {"summary": "s"}), respond("Transferring.")],
                 [USER_OPEN, "###TRANSFER###"], {}, RETAIL_TASK),
    "gold_transfer": ([*(tool(n, a) for n, a in _GOLD_12), respond("A human agent will take it from here.")],
                      ["I want to return some items.", "###TRANSFER###"], {}, "12"),
    "unknown_tool_then_solved": ([_BAD_CALLS[0], tool("return_delivered_order_items", RETURN_ARGS),
                                  respond("Done.")], USER_LINES, {}, RETAIL_TASK),
    "eleven_invalid_calls": ([_BAD_CALLS[i % 3] for i in range(11)], USER_LINES, {}, RETAIL_TASK),
}


def _agent_messages(outputs: list[str]):
    from tau2.data_model.message import AssistantMessage, ToolCall

    msgs, n = [], 0
    for out in outputs:
        action = re.search(r"<action>(.*)</action>", out, re.DOTALL).group(1)
        m = re.match(r"Tool\[(\w+), (.*)\]\Z", action, re.DOTALL)
        if m:
            n += 1
            call = ToolCall(id=f"call_{n}", name=m.group(1), arguments=json.loads(m.group(2)))
            msgs.append(AssistantMessage(role="assistant", tool_calls=[call]))
        else:
            msgs.append(AssistantMessage(role="assistant", content=json.loads(action[len("Respond["):-1])))
    return msgs


def _run_tau2_orchestrator(domain, task_id, outputs, episode_seed):
    """tau2's Orchestrator with a scripted agent (tau2 BaseAgent) and tau2's UserSimulator on the same server."""
    from tau2.agent.base import BaseAgent
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.registry import registry
    from tau2.user.user_simulator import UserSimulator

    class ScriptedAgent(BaseAgent):
        def __init__(self, messages):
            self.messages = list(messages)

        def get_init_state(self, message_history=None):
            return None

        def generate_next_message(self, message, state):
            from tau2.utils.utils import get_now

            # Stamp now: tau2 orders the trajectory by timestamp (scripted messages were built in advance).
            return self.messages.pop(0).model_copy(update={"timestamp": get_now()}), state

        def stop(self, message=None, state=None):
            return None

        def set_seed(self, seed):
            return None

    task = domain.tasks()[task_id]
    env = registry.get_env_constructor("retail")()
    user = UserSimulator(tools=None, instructions=str(task.user_scenario), llm=domain.user_model,
                         llm_args=domain.user_llm_args(episode_seed))
    orch = Orchestrator(domain="retail", agent=ScriptedAgent(_agent_messages(outputs)), user=user, environment=env,
                        task=task, max_steps=domain.max_hops, max_errors=domain.max_errors)
    sim = orch.run()
    reward = evaluate_simulation(simulation=sim, task=task, evaluation_type=EvaluationType.ALL, solo_mode=False,
                                 domain="retail")
    return sim, reward


def _shape(m: dict) -> tuple:
    calls = tuple((c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in (m.get("tool_calls") or []))
    return m["role"], m.get("content"), calls, m.get("error", False)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_conversation_termination_and_reward_as_tau2_orchestrator(fake_server, name):
    outputs, user_lines, options, task_id = SCENARIOS[name]
    script = Script(outputs, user_lines)
    with fake_server(script) as srv:
        domain = make_domain("tau2-retail", srv, **options)
        assert domain.direct_user() is not None  # ours: the direct user path; theirs: tau2's generate (litellm)
        _, ours = play(domain, srv, task_id, episode_seed=1000)
        n_ours = len(script.user_requests)
        sim, reward = _run_tau2_orchestrator(domain, task_id, outputs, episode_seed=1000)
    assert script.user_requests[:n_ours] == script.user_requests[n_ours:]  # the user's requests: the same JSON
    ep = ours.episode
    our_msgs = [m for s in ep.steps for m in s.info["tau2_messages"]]
    their_msgs = [m.model_dump(mode="json") for m in sim.messages]
    assert [_shape(m) for m in our_msgs] == [_shape(m) for m in their_msgs]
    assert ep.reward_info["tau2_termination_reason"] == sim.termination_reason.value
    assert ep.reward_info["tau2_reward"] == reward.reward
    assert ep.reward_info["tau2"] == reward.model_dump(mode="json", exclude_none=True)
    if ep.reward is not None:
        assert ep.reward == reward.reward
    if name == "eleven_invalid_calls":
        assert sim.termination_reason.value == "too_many_errors" and ep.stop_reason.value == "tool_error"
    if name == "gold_transfer":
        assert reward.reward == 1.0 and ep.stop_reason.value == "clean" and ep.outcome == 1
