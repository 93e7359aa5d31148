"""One Tau2 episode: tau2's environment and user simulator, orchestrated as tau2's ``Orchestrator`` does, stepped
by our ReAct loop, with tau2's endings mapped to our stop reasons (table in ``uqh/domains/tau2/domain.py``)."""
from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, Protocol

from uqh.rundir.schema import StopReason

from uqh.domains.base import (
    Environment,
    EnvironmentUnavailable,
    EnvResponse,
    RecordedStep,
    ReplayMismatch,
)
from uqh.domains.tau2.access import GREETING, OUT_OF_SCOPE, STOP, TRANSFER, Tau2, message_to_dict
from uqh.domains.tau2.actions import parse_action
from uqh.domains.tau2.replay import check_recorded_prefix, count_hops_and_errors, rebuild_environment



def task_prompt_for(opening_user_text: str) -> str:
    """The agent's first user message: tau2's greeting and the user's opening turn (the text it ends with)."""
    return f"Assistant: {GREETING}\nUser: {opening_user_text}"


def recorded_opening_text(messages: list[Any]) -> str:
    """The text of a recorded conversation's opening user turn: its first user message that is not a tool call
    (the user's own tool calls and results, telecom, come before it), as :meth:`Tau2Environment.reset` returns it."""
    t2 = Tau2.load()
    for m in messages:
        if isinstance(m, t2.msg.UserMessage) and not m.is_tool_call():
            return m.content or ""
    raise ReplayMismatch("the recorded conversation has no opening user turn")


class Tau2EpisodeHost(Protocol):
    """What an episode asks of its Tau2 domain (:class:`uqh.domains.tau2.domain.Tau2Domain`): limits, the shared
    environment, and the simulated user's model and executor."""

    max_hops: int
    max_errors: int
    user_model: str | None
    transfer_as_env_terminated: bool
    user_logprobs: int | None

    def shared_db(self) -> Any: ...

    def user_llm_args(self, episode_seed: int) -> dict[str, Any]: ...

    def direct_user(self) -> Any: ...

    def user_executor(self) -> Any: ...

    def tool_names(self) -> Any: ...


class Tau2Environment(Environment):
    """One Tau2 episode: tau2's environment + user simulator, stepped by our loop."""

    def __init__(self, domain: Tau2EpisodeHost, task: Any, *, episode_seed: int):
        t2 = Tau2.load()
        self.domain = domain
        self.task = task
        self.episode_seed = episode_seed
        self.max_hops = domain.max_hops
        self.max_errors = domain.max_errors
        self._t2 = t2
        self._shared = domain.shared_db()
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
        self._user_logprobs: list[Any] = []  # raw logprobs of the user's calls not yet taken (--user-logprobs)

    # ------------------------------------------------------------------ construction

    def _make_user(self):
        return self._t2.UserSimulator(
            tools=self._shared.user_tools,  # schemas only: the user's calls run in this episode's environment
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

    def _run_tool_calls(self, calls: list[Any]) -> list[Any]:
        """Execute one message's tool calls in the environment (tau2: ``get_response``, errors counted)."""
        results = []
        for call in calls:
            tm = self._env.get_response(call)
            if tm.error:
                self.errors += 1
            results.append(tm)
        for tm in results:
            self._append(tm)
        self.hops += 1  # one hop for the batch of results
        self._env.sync_tools()
        return results

    async def _user_turn(self, incoming: Any) -> tuple[Any, str | None]:
        """Send ``incoming`` to the user simulator; run the user's own tool calls (telecom) until it
        speaks to the agent. Returns (last user message, termination reason or None)."""
        t2 = self._t2
        loop = asyncio.get_running_loop()
        while True:
            try:
                direct = self.domain.direct_user()
                if direct is not None:  # an OpenAI-compatible URL: the same request, awaited on this loop
                    user_msg, self._user_state = await direct.next_message(self._user, incoming, self._user_state)
                else:
                    # tau2's simulator calls litellm synchronously: a thread of the domain's own pool, so that
                    # every episode's user can wait at once (asyncio's default pool has min(32, CPUs + 4) threads).
                    user_msg, self._user_state = await loop.run_in_executor(
                        self.domain.user_executor(), self._user.generate_next_message, incoming, self._user_state
                    )
            except Exception as e:  # the user model's endpoint failed: infrastructure, not an outcome
                raise EnvironmentUnavailable(f"tau2 user simulator call failed: {type(e).__name__}: {e}") from e
            self.hops += 1
            self._append(user_msg)
            if self.domain.user_logprobs is not None:
                self._user_logprobs.append((user_msg.raw_data or {}).get("logprobs"))
            if not (user_msg.has_text_content() or user_msg.is_tool_call()):
                # An empty user message after tau2's own retries (its ``generate`` retries an empty reply
                # num_retries=3 times). tau2 26.3's orchestrator raises here (``user_msg.validate()``) and
                # ``tau2 run`` aborts, or with --skip-failed-samples keeps a reward-0 placeholder without the
                # conversation. We keep the conversation and end the episode censored, under the name tau2 gives
                # a user's protocol violation (TerminationReason.USER_ERROR): not an infrastructure failure to
                # re-queue (the endpoint answered, and a temperature-0 user would answer the same again).
                return user_msg, "user_error"
            if user_msg.is_tool_call():
                results = self._run_tool_calls(user_msg.tool_calls)
                reason = self._check_caps()
                if reason:
                    return user_msg, reason
                incoming = (
                    t2.msg.MultiToolMessage(role="tool", tool_messages=results) if len(results) > 1 else results[0]
                )
                continue
            reason = "user_stop" if t2.UserSimulator.is_stop(user_msg) else None
            self._env.sync_tools()
            reason = self._check_caps() or reason
            return user_msg, reason

    def _evaluate(self, termination_reason: str) -> Any:
        """tau2's evaluator on the conversation so far (our in-order trajectory, turn indices as tau2 numbers them)."""
        t2 = self._t2
        # Shallow copies: tau2's evaluators only read the messages (set_state deep-copies what it replays).
        messages = [m.model_copy(update={"turn_idx": i}) for i, m in enumerate(self.trajectory)]
        sim = t2.SimulationRun(
            id=f"{self.task.id}@{self.episode_seed}",
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
            domain=self._shared.evaluator_domain_for(self.task),
        )

    def _finish(self, termination_reason: str, last_user_msg: Any | None, observation: str) -> EnvResponse:
        """Map a tau2 ending to our stop reason (the table in ``uqh/domains/tau2/domain.py``)."""
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
        clean = termination_reason == "user_stop" and (marker == STOP or not self.domain.transfer_as_env_terminated)
        if clean:
            reward = float(reward_info.reward)
            return EnvResponse(observation, done=True, outcome=1 if reward == 1.0 else 0, reward=reward,
                               reward_info=info, stop_reason=StopReason.clean)
        stop = StopReason.tool_error if termination_reason == "too_many_errors" else StopReason.env_terminated
        return EnvResponse(observation, done=True, outcome=None, reward=None, reward_info=info, stop_reason=stop)

    # ------------------------------------------------------------------ Environment interface

    def take_user_logprobs(self) -> list[Any]:
        """The raw ``logprobs`` of the user's kept replies since the last take (tau2 keeps ``choices[0]`` of the
        HTTP reply, converted by litellm, as the message's ``raw_data``, on both call paths). An empty reply tau2's
        ``generate`` asks again is discarded inside it, before we see it: only kept replies have rows."""
        out, self._user_logprobs = self._user_logprobs, []
        return out

    def tool_names(self) -> list[str]:
        return self._shared.tool_names

    async def reset(self) -> str:
        t2 = self._t2
        self._started_at = self._now()
        self._env = self._shared.new_environment(self.task)
        self._user = self._make_user()
        self._user_state = self._user.get_init_state()
        greeting = t2.msg.AssistantMessage(role="assistant", content=GREETING, cost=0.0)
        self._append(greeting)
        user_msg, reason = await self._user_turn(greeting)
        if reason is not None:
            self._ended = self._finish(reason, user_msg, observation="")
        return task_prompt_for(user_msg.content or "")

    async def restore(self, task_prompt: str, steps: list[RecordedStep]) -> None:
        """The state after ``steps`` from the record alone, without :meth:`reset`: a reset would ask the user's model
        for an opening turn the record already holds (step 1's ``tau2_messages``: the greeting, the user's opening
        turn, then the agent's first message), so a resumed or continued episode makes no user call for it and
        records none of its tokens. :meth:`replay` gives the user simulator the state tau2 keeps; the recorded task
        prompt must be the one the recorded opening turn gives (the agent and the user then see the same opening).
        """
        if not steps:
            raise ValueError("restore() needs recorded steps; a new episode is reset()")
        await self.replay(steps)
        recorded = task_prompt_for(recorded_opening_text(self.trajectory))
        if task_prompt != recorded:
            raise ReplayMismatch(
                f"the recorded task prompt {task_prompt[-80:]!r} is not the recorded opening turn's {recorded[-80:]!r}")

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
            # Any well-formed call goes to tau2, a name it does not know included: tau2 answers with an error
            # tool result ("Error: Tool '...' not found.") that the agent sees and max_errors counts.
            name, args = payload
            self._n_tool_calls += 1
            call = t2.msg.ToolCall(id=f"call_{self._n_tool_calls}", name=name, arguments=args, requestor="assistant")
            self._append(t2.msg.AssistantMessage(role="assistant", content=None, tool_calls=[call], cost=0.0))
            self.hops += 1  # agent -> env: no cap check (tau2 skips checks while a message is addressed to env)
            (tm,) = self._run_tool_calls([call])
            observation = tm.content or ""
            reason = self._check_caps()
            resp = self._finish(reason, None, observation) if reason else EnvResponse(observation)
            resp.info = self._step_info("tool", tool_name=name, tool_arguments=args, tool_error=tm.error)
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

        The environment is rebuilt from scratch (whatever ``reset`` produced is replaced): the record is checked
        (:func:`.replay.check_recorded_prefix`), a fresh tau2 environment gets ``set_state(task initialisation,
        recorded messages)``, which re-executes every recorded tool call, and the replayed tool results, DB
        hashes, hop and error counts must be the recorded ones (:func:`.replay.rebuild_environment`); the user
        simulator state is the recorded conversation filtered as tau2's orchestrator does.
        """
        t2 = self._t2
        if not steps:
            return
        messages = check_recorded_prefix(steps, self.domain.tool_names())
        self._env = rebuild_environment(self._shared, self.task, steps, messages)
        if self._user is None:
            self._user = self._make_user()
        self._user_state = self._user.get_init_state(
            message_history=[m for m in messages if t2.is_valid_user_history_message(m)]
        )
        self.trajectory = messages
        self._pending = []
        self._user_logprobs = []  # a reset's opening turn, if one was made, is replaced by the recorded one
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
