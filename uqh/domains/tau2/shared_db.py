"""tau2 environments built from one parse of the domain DB per process.

tau2 builds every environment by parsing its domain DB (retail: 1.3 MB of JSON, airline: 2.6 MB, validated into
pydantic models, 50-250 ms) and computes the DB hash (a sorted JSON dump of the whole DB, 40-120 ms) whenever it
is asked. An episode needs three environments -- its own, and the evaluator's "predicted" and "gold" ones -- and
our step record carries the DB hash after every step. Here, with tau2's own code doing every tool call, state
change and hash:

- **One parse per process.** tau2's registered constructor builds one *catalog* environment per domain; its DB is
  the *pristine* DB, never written (the catalog environment is never stepped: it serves the policy and tool
  schemas). Every other environment is tau2's constructor fed a copy of it.
- **Copy-on-write tables (retail, airline).** Their DBs are a few top-level tables (``orders``, ``users``, ...)
  and their tool kits reach rows only through those tables. A copy is a new DB model whose tables are
  :class:`CopyOnWriteTable` views: a row is deep-copied the first time it is touched by anything but a tool tau2
  marks ``ToolType.READ``, so an episode copies the handful of rows it writes, not 20,000 objects. Telecom's DBs
  are tiny (10 KB) and its environment writes the user's device state outside tool calls (``sync_tools``), so it
  gets a plain deep copy.
- **DB hashes memoised by write history (retail, airline).** Their tools are deterministic functions of the DB
  and the arguments (tau2 fixes the clock and the new ids), so from the same pristine DB the same sequence of
  non-READ tool calls gives the same DB. The hash is tau2's ``get_db_hash``, computed when a (domain, calls) key
  is first seen and reused afterwards: after a read or a message the hash is the previous one, and the
  evaluator's gold environment (the task's gold actions) and predicted environment (the episode's calls) mostly
  hit keys already computed.

Only tasks without an ``initial_state`` and without env assertions take the copy-on-write path (all retail and
airline tasks): those would change state through ``update_db`` / ``run_env_function_call``, which the write
history does not see, so a copy-on-write environment refuses them loudly. tau2's evaluator
(``evaluate_simulation``) is called unchanged; it looks environments up by domain name in tau2's registry, so the
copy-on-write constructor is registered there under its own name (:attr:`SharedDomainDB.evaluator_domain`).
"""
from __future__ import annotations

import copy
import inspect
import json
import threading
from collections import OrderedDict
from typing import Any

from uqh.domains.tau2.access import Tau2

#: Memoised DB hashes: (tau2 domain, non-READ calls so far) -> tau2's get_db_hash. Bounded (oldest dropped).
_HASH_MEMO: OrderedDict[tuple, str] = OrderedDict()
HASH_MEMO_SIZE = 20_000
_memo_lock = threading.Lock()

_shared: dict[str, SharedDomainDB] = {}
_shared_lock = threading.Lock()


def shared_db(tau2_domain: str) -> SharedDomainDB:
    """The process's :class:`SharedDomainDB` for a tau2 domain (built on first use: one DB parse)."""
    with _shared_lock:
        found = _shared.get(tau2_domain)
        if found is None:
            found = _shared[tau2_domain] = SharedDomainDB(tau2_domain)
        return found


class _Guard:
    """Whether touching a row may write it: False only while a READ tool runs."""

    __slots__ = ("writing",)

    def __init__(self) -> None:
        self.writing = True


class CopyOnWriteTable(dict):
    """One top-level table of a DB, sharing its rows with the pristine DB until they may be written.

    The dict's own storage always holds the current rows (so pydantic's serialiser and tau2's hash, which read the
    storage directly, see this environment's state); a row still shared with the pristine DB is replaced by a deep
    copy before any access that could write it -- every access outside a READ tool.
    """

    def __init__(self, rows: dict, guard: _Guard):
        super().__init__(rows)
        self._owned: set = set()
        self._guard = guard

    def _own(self, key: Any) -> None:
        if self._guard.writing and key not in self._owned and dict.__contains__(self, key):
            dict.__setitem__(self, key, copy.deepcopy(dict.__getitem__(self, key)))
            self._owned.add(key)

    def _own_all(self) -> None:
        if self._guard.writing:
            for key in list(dict.keys(self)):
                self._own(key)

    def __getitem__(self, key: Any) -> Any:
        self._own(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._own(key)
        return dict.get(self, key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._owned.add(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._own(key)
        if not dict.__contains__(self, key):
            self[key] = default
        return dict.__getitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._own(key)
        self._owned.discard(key)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple:
        self._own_all()
        return dict.popitem(self)

    def values(self):  # type: ignore[override]
        self._own_all()
        return dict.values(self)

    def items(self):  # type: ignore[override]
        self._own_all()
        return dict.items(self)

    def copy(self) -> dict:  # type: ignore[override]
        return {k: copy.deepcopy(v) for k, v in dict.items(self)}

    def __deepcopy__(self, memo: dict) -> dict:
        return {k: copy.deepcopy(v, memo) for k, v in dict.items(self)}

    def __reduce__(self):  # pickles as the plain dict it stands for
        return (dict, (self.copy(),))


def _refuse_untracked(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError(
        "a copy-on-write tau2 environment cannot run environment functions (initialisation actions, env "
        "assertions): their writes bypass the write history; such tasks use plain copies"
    )


def _tracked_toolkit_class(base: type) -> type:
    """tau2's tool kit class, recording the non-READ calls and memoising the DB hash by them."""
    read = Tau2.load().ToolType.READ

    class TrackedToolKit(base):  # type: ignore[misc, valid-type]
        _uqh_domain: str
        _uqh_kinds: dict[str, Any]
        _uqh_guard: _Guard
        _uqh_writes: list[tuple[str, str]]

        def use_tool(self, tool_name: str, **kwargs: Any) -> Any:
            kind = self._uqh_kinds.get(tool_name)
            if kind is None:  # not a tool: tau2 raises before touching the DB
                return super().use_tool(tool_name, **kwargs)
            if kind == read:
                self._uqh_guard.writing = False
                try:
                    return super().use_tool(tool_name, **kwargs)
                finally:
                    self._uqh_guard.writing = True
            # Recorded before the call: a call that raises half-way may still have written.
            self._uqh_writes.append((tool_name, json.dumps(kwargs, sort_keys=True, default=str)))
            return super().use_tool(tool_name, **kwargs)

        def get_db_hash(self) -> str:
            key = (self._uqh_domain, tuple(self._uqh_writes))
            with _memo_lock:
                found = _HASH_MEMO.get(key)
                if found is not None:
                    _HASH_MEMO.move_to_end(key)
                    return found
            value = super().get_db_hash()
            with _memo_lock:
                _HASH_MEMO[key] = value
                while len(_HASH_MEMO) > HASH_MEMO_SIZE:
                    _HASH_MEMO.popitem(last=False)
            return value

        def update_db(self, update_data: Any = None) -> None:
            _refuse_untracked()

    TrackedToolKit.__name__ = TrackedToolKit.__qualname__ = f"Tracked{base.__name__}"
    return TrackedToolKit


class SharedDomainDB:
    """One tau2 domain's pristine DB, and environments built from copies of it."""

    def __init__(self, tau2_domain: str):
        t2 = Tau2.load()
        from tau2.environment.environment import Environment as Tau2Env

        self.tau2_domain = tau2_domain
        self.constructor = t2.registry.get_env_constructor(tau2_domain)
        # Never stepped: it holds the pristine DB and serves the policy and the tool schemas.
        self.catalog_env = self.constructor()
        self.policy: str = self.catalog_env.get_policy()
        self.tools: list[Any] = self.catalog_env.get_tools()
        self.tool_names: list[str] = [t.name for t in self.tools]
        try:
            self.user_tools: list[Any] | None = self.catalog_env.get_user_tools()
        except ValueError:  # no user tools in this domain
            self.user_tools = None
        kit = self.catalog_env.tools
        self._pristine = kit.db
        self._pristine_user = self.catalog_env.user_tools.db if self.catalog_env.user_tools is not None else None
        params = inspect.signature(self.constructor).parameters
        self._takes_db = "db" in params and (self._pristine_user is None or "user_db" in params)
        self.copy_on_write = (
            self._takes_db
            and type(self.catalog_env) is Tau2Env
            and set(vars(self.catalog_env)) == {"domain_name", "policy", "tools", "user_tools", "solo_mode"}
            and self.catalog_env.user_tools is None
            and type(self.catalog_env).sync_tools is Tau2Env.sync_tools
            and all(isinstance(getattr(self._pristine, f), dict) for f in type(self._pristine).model_fields)
        )
        self._kinds = {name: kit.tool_type(name) for name in kit.tools}
        self._tracked_cls = _tracked_toolkit_class(type(kit)) if self.copy_on_write else None
        self.evaluator_domain: str | None = None
        if self.copy_on_write:
            self.evaluator_domain = f"uqh-copy-on-write:{tau2_domain}"
            if self.evaluator_domain not in t2.registry.get_domains():
                t2.registry.register_domain(self._evaluator_constructor, self.evaluator_domain)

    # ------------------------------------------------------------------ environments

    def takes_copy_on_write(self, task: Any) -> bool:
        """Whether ``task`` may use copy-on-write environments (no initial state, no env assertions)."""
        crit = task.evaluation_criteria
        return self.copy_on_write and task.initial_state is None and not (crit is not None and crit.env_assertions)

    def new_environment(self, task: Any, *, apply_initial_state: bool = True) -> Any:
        """A fresh tau2 environment for ``task``, with the task's initial state applied as tau2's orchestrator does
        (``set_state(initialization_data, initialization_actions, [])``) unless the caller applies it itself."""
        if self.takes_copy_on_write(task):
            return self._copy_on_write_env()
        if self._takes_db:
            kwargs = {"db": copy.deepcopy(self._pristine)}
            if self._pristine_user is not None:
                kwargs["user_db"] = copy.deepcopy(self._pristine_user)
            env = self.constructor(**kwargs)
        else:  # pragma: no cover - every tau2 26.3 domain takes its DB
            env = self.constructor()
        init = task.initial_state
        if init is not None and apply_initial_state:
            # Telecom: the device/line state of the scenario (initialization_data + initialization_actions).
            env.set_state(
                initialization_data=init.initialization_data,
                initialization_actions=init.initialization_actions,
                message_history=[],
            )
        return env

    def evaluator_domain_for(self, task: Any) -> str:
        """The registry name to hand tau2's evaluator for ``task``: ours when copy-on-write applies, else tau2's."""
        return self.evaluator_domain if self.takes_copy_on_write(task) else self.tau2_domain  # type: ignore[return-value]

    def _evaluator_constructor(self, db: Any = None, solo_mode: bool = False) -> Any:
        if db is not None or solo_mode:
            raise RuntimeError("the copy-on-write constructor builds non-solo environments from the pristine DB only")
        return self._copy_on_write_env()

    def _copy_on_write_env(self) -> Any:
        guard = _Guard()
        db_cls = type(self._pristine)
        tables = {f: CopyOnWriteTable(getattr(self._pristine, f), guard) for f in db_cls.model_fields}
        db = db_cls.model_construct(**tables)
        # tau2's constructor gives an Environment(domain name, policy, tool kit over ``db``) with no other state: the
        # catalog environment's shallow copy with the kit replaced is that object, without re-reading the policy.
        env = copy.copy(self.catalog_env)
        kit = self._tracked_cls(db)  # type: ignore[misc]
        kit._uqh_domain, kit._uqh_kinds, kit._uqh_guard, kit._uqh_writes = self.tau2_domain, self._kinds, guard, []
        env.tools = kit
        env.run_env_function_call = _refuse_untracked
        return env

    def pristine_hash(self) -> str:
        """tau2's hash of the pristine DB, computed afresh (tests check that no environment wrote to it)."""
        return self.catalog_env.get_db_hash()
