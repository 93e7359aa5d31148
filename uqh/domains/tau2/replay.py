"""Rebuilding a Tau2 episode's state from its record, refusing any prefix the record does not support.

A recorded step carries the tau2 messages it added, the DB hashes after it, and the running hop and tool-error
counts. Replay must reproduce all of them: a prefix whose tool-result ``error`` flags, hops or error counts were
changed would silently move every continuation's distance to tau2's ``max_steps`` / ``max_errors`` caps.
"""
from __future__ import annotations

from typing import Any

from uqh.domains.base import InvalidAction, RecordedStep, ReplayMismatch
from uqh.domains.tau2.access import GREETING, Tau2, message_from_dict
from uqh.domains.tau2.actions import parse_action


def count_hops_and_errors(messages: list[Any]) -> tuple[int, int]:
    """tau2's step_count and num_errors for a conversation that starts with the greeting.

    One hop per agent or user message after the greeting, one per batch of tool results (one batch follows
    every tool-calling message); one error per ToolMessage with ``error``.
    """
    t2 = Tau2.load()
    hops = errors = 0
    for i, m in enumerate(messages):
        if isinstance(m, (t2.msg.AssistantMessage, t2.msg.UserMessage)):
            if i > 0:
                hops += 1
            if m.is_tool_call():
                hops += 1  # the batch of tool results that answers it
        elif isinstance(m, t2.msg.ToolMessage) and m.error:
            errors += 1
    return hops, errors


def check_recorded_prefix(steps: list[RecordedStep], tool_names: list[str]) -> list[Any]:
    """The conversation a censored prefix records, after checking the record against itself.

    Every recorded action must parse to the recorded agent message and every observation must be what the
    recorded messages say; a tool step's ``tool_error`` must be its tool result's ``error`` flag; each step's
    ``hops`` / ``tool_errors`` must be tau2's counts of the conversation up to it; the conversation must open with
    tau2's greeting and must not have ended (a user stop or an ending before the agent acted).
    """
    t2 = Tau2.load()
    messages: list[Any] = []
    for i, rec in enumerate(steps, start=1):
        raw = rec.info.get("tau2_messages")
        if not isinstance(raw, list):
            raise ReplayMismatch(f"step {i}: the record has no tau2_messages; it cannot be replayed")
        step_msgs = [message_from_dict(d) for d in raw]
        if rec.info.get("kind") == "ended_before_agent":
            raise ReplayMismatch(f"step {i}: the episode ended during replay; the prefix is not censored")
        _check_recorded_step(i, rec, step_msgs, tool_names)
        messages.extend(step_msgs)
        counted = count_hops_and_errors(messages)
        recorded = (rec.info.get("hops"), rec.info.get("tool_errors"))
        if counted != recorded:
            raise ReplayMismatch(
                f"step {i}: recorded hops / tool errors {recorded} differ from tau2's count of the recorded "
                f"conversation {counted}"
            )
    for m in messages:
        if isinstance(m, t2.msg.UserMessage) and not m.is_tool_call() and t2.UserSimulator.is_stop(m):
            raise ReplayMismatch(
                f"the recorded user ended the conversation ({(m.content or '').strip()[:40]!r}); "
                "the prefix is not censored"
            )
    if not messages or messages[0].content != GREETING:
        raise ReplayMismatch("step 1: the recorded conversation does not start with tau2's greeting")
    return messages


def _check_recorded_step(i: int, rec: RecordedStep, step_msgs: list[Any], tool_names: list[str]) -> None:
    """The recorded action and observation must be the ones the recorded messages imply."""
    t2 = Tau2.load()
    agent_msgs = [m for m in step_msgs if isinstance(m, t2.msg.AssistantMessage) and m.content != GREETING]
    if len(agent_msgs) != 1:
        raise ReplayMismatch(f"step {i}: expected one agent message in the record, found {len(agent_msgs)}")
    try:
        kind, payload = parse_action(rec.action, tool_names)
    except InvalidAction as e:
        raise ReplayMismatch(f"step {i}: recorded action does not parse: {e}") from None
    am = agent_msgs[0]
    if kind == "tool":
        tc = (am.tool_calls or [None])[0]
        if tc is None or (tc.name, tc.arguments) != payload:
            raise ReplayMismatch(f"step {i}: recorded action {rec.action[:80]!r} differs from the recorded tool call")
        results = [m for m in step_msgs if isinstance(m, t2.msg.ToolMessage) and m.id == tc.id]
        if not results or (results[0].content or "") != rec.observation:
            raise ReplayMismatch(f"step {i}: recorded observation differs from the recorded tool result")
        if rec.info.get("tool_error") != results[0].error:
            raise ReplayMismatch(
                f"step {i}: recorded tool_error {rec.info.get('tool_error')!r} differs from the recorded tool "
                f"result's error flag {results[0].error!r}"
            )
    else:
        if am.is_tool_call() or am.content != payload:
            raise ReplayMismatch(f"step {i}: recorded action {rec.action[:80]!r} differs from the recorded message")
        users = [m for m in step_msgs if isinstance(m, t2.msg.UserMessage) and not m.is_tool_call()]
        if not users or f"User: {users[-1].content or ''}" != rec.observation:
            raise ReplayMismatch(f"step {i}: recorded observation differs from the recorded user reply")


def rebuild_environment(shared: Any, task: Any, steps: list[RecordedStep], messages: list[Any]) -> Any:
    """A fresh tau2 environment brought to the end of ``messages`` by tau2's own ``set_state``.

    ``set_state`` re-executes every recorded tool call (agent's and user's) and raises when an output differs
    (compared as decoded JSON). It does not compare the ``error`` flags, so the results it produces are captured
    and their flags compared with the recorded ones here; the DB hashes after the last step must be the recorded
    ones.
    """
    t2 = Tau2.load()
    env = shared.new_environment(task, apply_initial_state=False)
    replayed: list[Any] = []
    execute = env.get_response

    def capture(call: Any) -> Any:
        result = execute(call)
        replayed.append(result)
        return result

    env.get_response = capture  # set_state calls self.get_response for every recorded call
    init = task.initial_state
    try:
        env.set_state(
            initialization_data=init.initialization_data if init else None,
            initialization_actions=init.initialization_actions if init else None,
            message_history=messages,
        )
    except (ValueError, AssertionError) as e:
        raise ReplayMismatch(f"tau2 set_state rejected the recorded prefix: {str(e)[:300]}") from None
    finally:
        del env.get_response
    recorded = [m for m in messages if isinstance(m, t2.msg.ToolMessage)]
    if len(replayed) != len(recorded):
        raise ReplayMismatch(f"replay ran {len(replayed)} tool calls; the record has {len(recorded)} tool results")
    for rec_msg, new_msg in zip(recorded, replayed):
        if rec_msg.error != new_msg.error:
            raise ReplayMismatch(
                f"tool result {rec_msg.id}: recorded error flag {rec_msg.error} but the replayed call gives "
                f"{new_msg.error}"
            )
    last = steps[-1].info
    if env.get_db_hash() != last.get("db_hash") or env.get_user_db_hash() != last.get("user_db_hash"):
        raise ReplayMismatch(
            f"step {len(steps)}: replayed DB hash {env.get_db_hash()} differs from the recorded {last.get('db_hash')}"
        )
    return env
