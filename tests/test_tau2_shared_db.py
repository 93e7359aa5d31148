"""The shared tau2 DB (uqh/domains/tau2/shared_db.py), proven by difference against tau2's own environments.

Copy-on-write environments must give the same tool results and DB hashes as tau2's constructor (a fresh parse of
the DB) for every write tool the gold actions of the retail and airline base tasks use, must never write the
pristine DB, and the hash memo must compute tau2's hash only for a write history it has not seen.
"""
from __future__ import annotations

import copy
import pickle

import pytest

from uqh.domains.domain_registry import get_domain_class
from uqh.domains.tau2 import shared_db as sdb
from uqh.domains.tau2.shared_db import CopyOnWriteTable, shared_db


def _tasks(domain: str) -> list:
    return list(get_domain_class(f"tau2-{domain}")({}).tasks().values())


def _covering_tasks(domain: str) -> list:
    """Gold-action tasks that together use every write tool any gold action of the base split uses."""
    shared = shared_db(domain)
    writes = {n for n, k in shared._kinds.items() if k.value != "read"}
    chosen, covered = [], set()
    for task in _tasks(domain):
        used = {a.name for a in task.evaluation_criteria.actions or []} & writes
        if used - covered:
            chosen.append(task)
            covered |= used
    return chosen


def _tool_call(action, i: int):
    from tau2.data_model.message import ToolCall

    return ToolCall(id=f"g{i}", name=action.name, arguments=action.arguments, requestor=action.requestor)


def _real_hash(env) -> str:
    """tau2's hash of the environment's current DB, computed now (no memo)."""
    kit = env.tools
    base = type(kit).__mro__[1] if type(kit).__name__.startswith("Tracked") else type(kit)
    return base.get_db_hash(kit)


@pytest.fixture
def empty_memo(monkeypatch):
    monkeypatch.setattr(sdb, "_HASH_MEMO", type(sdb._HASH_MEMO)())


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_copy_on_write_env_matches_tau2_on_every_gold_write_tool(domain, empty_memo):
    from tau2.registry import registry

    shared = shared_db(domain)
    pristine_before = shared.pristine_hash()
    tasks = _covering_tasks(domain)
    writes = {n for n, k in shared._kinds.items() if k.value == "write"}
    assert {a.name for t in tasks for a in t.evaluation_criteria.actions} >= writes  # every write tool is exercised
    for task in tasks:
        ours = shared.new_environment(task)
        theirs = registry.get_env_constructor(domain)()  # tau2's own: a fresh parse of the DB
        for i, action in enumerate(task.evaluation_criteria.actions):
            a, b = ours.get_response(_tool_call(action, i)), theirs.get_response(_tool_call(action, i))
            assert (a.content, a.error) == (b.content, b.error), (task.id, action.name)
        assert ours.get_db_hash() == _real_hash(ours) == theirs.get_db_hash(), task.id
        # The same calls from a second fresh environment: the memo answers, and it is still tau2's hash.
        again = shared.new_environment(task)
        for i, action in enumerate(task.evaluation_criteria.actions):
            again.get_response(_tool_call(action, i))
        assert again.get_db_hash() == theirs.get_db_hash()
    assert shared.pristine_hash() == pristine_before  # no environment wrote to the shared rows


def test_hash_is_computed_only_for_new_write_histories(empty_memo, monkeypatch):
    shared = shared_db("retail")
    task = get_domain_class("tau2-retail")({}).tasks()["73"]
    computed = []
    base = shared._tracked_cls.__mro__[1]
    real = base.get_db_hash
    monkeypatch.setattr(base, "get_db_hash", lambda self: computed.append(1) or real(self))

    def call(env, name, **args):
        from tau2.data_model.message import ToolCall

        return env.get_response(ToolCall(id="c", name=name, arguments=args))

    env = shared.new_environment(task)
    h0 = env.get_db_hash()
    assert len(computed) == 1
    call(env, "get_order_details", order_id="#W5272531")  # READ: the DB is unchanged
    call(env, "get_order_detail", order_id="#W5272531")  # not a tool: tau2 errs before touching the DB
    assert env.get_db_hash() == h0 and len(computed) == 1
    assert call(env, "return_delivered_order_items", order_id="#W5272531",
                item_ids=["7228247242"], payment_method_id="credit_card_6824399").error is False
    h1 = env.get_db_hash()
    assert h1 != h0 and len(computed) == 2
    other = shared.new_environment(task)  # a second episode making the same write: no hash computed
    call(other, "return_delivered_order_items", order_id="#W5272531",
         item_ids=["7228247242"], payment_method_id="credit_card_6824399")
    assert other.get_db_hash() == h1 and len(computed) == 2
    assert _real_hash(other) == h1  # and the memo's answer is the true one


def test_copy_on_write_rows_are_private_and_the_pristine_db_untouched():
    shared = shared_db("retail")
    task = get_domain_class("tau2-retail")({}).tasks()["73"]
    env = shared.new_environment(task)
    pristine_order = shared._pristine.orders["#W5272531"]
    status = pristine_order.status
    from tau2.data_model.message import ToolCall

    env.get_response(ToolCall(id="c", name="return_delivered_order_items", arguments={
        "order_id": "#W5272531", "item_ids": ["7228247242"], "payment_method_id": "credit_card_6824399"}))
    assert env.tools.db.orders["#W5272531"].status == "return requested"
    assert pristine_order.status == status and shared._pristine.orders["#W5272531"] is pristine_order
    assert shared.new_environment(task).tools.db.orders["#W5272531"].status == status


def test_copy_on_write_table_semantics():
    class Guard:
        writing = True

    guard = Guard()
    rows = {"a": {"x": 1}, "b": {"x": 2}}
    table = CopyOnWriteTable(rows, guard)
    guard.writing = False
    assert table["a"] is rows["a"]  # a READ tool shares the pristine row
    guard.writing = True
    table["a"]["x"] = 10  # any other access copies the row first
    assert rows["a"] == {"x": 1} and table["a"] == {"x": 10}
    for v in table.values():
        v["x"] += 1
    assert rows == {"a": {"x": 1}, "b": {"x": 2}} and dict(table) == {"a": {"x": 11}, "b": {"x": 3}}
    table["c"] = {"x": 5}
    assert table.pop("c") == {"x": 5} and "c" not in table
    snapshot = copy.deepcopy(table)
    assert type(snapshot) is dict and snapshot == {"a": {"x": 11}, "b": {"x": 3}}
    assert pickle.loads(pickle.dumps(table)) == snapshot


def test_copy_on_write_env_refuses_untracked_state_changes():
    env = shared_db("airline").new_environment(get_domain_class("tau2-airline")({}).tasks()["0"])
    with pytest.raises(RuntimeError, match="bypass the write history"):
        env.tools.update_db({"users": {}})
    with pytest.raises(RuntimeError, match="bypass the write history"):
        env.run_env_function_call(None)


def test_telecom_takes_plain_copies_with_tau2s_hashes():
    from tau2.registry import registry

    shared = shared_db("telecom")
    assert not shared.copy_on_write and shared.evaluator_domain is None
    task = next(iter(get_domain_class("tau2-telecom")({}).tasks().values()))
    assert not shared.takes_copy_on_write(task) and shared.evaluator_domain_for(task) == "telecom"
    ours = shared.new_environment(task)
    theirs = registry.get_env_constructor("telecom")()
    init = task.initial_state
    theirs.set_state(initialization_data=init.initialization_data,
                     initialization_actions=init.initialization_actions, message_history=[])
    assert (ours.get_db_hash(), ours.get_user_db_hash()) == (theirs.get_db_hash(), theirs.get_user_db_hash())
    assert ours.tools.db is not shared._pristine and ours.user_tools.db is not shared._pristine_user
