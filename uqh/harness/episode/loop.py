"""Run one episode: the agent's loop. Knows nothing about files, processes or concurrency.

An :class:`EpisodeSpec` says what to run and how it starts (:class:`Fresh`, :class:`Resume` from its own
checkpoint, :class:`Branch` of a recorded episode); :func:`open_episode` makes, resets or restores its
environment (the one place that does), and :func:`run_episode` runs the steps.

Each step asks the agent (:mod:`uqh.harness.episode.agent_protocol`; the react agent, the paper's four-tag loop,
unless another is given) for the model's answer and its decision, and applies the action to the environment. An
answer the agent rejects or an action the environment rejects (``InvalidAction``) triggers a repair attempt (the model is told what was wrong and asked again), at most ``MAX_REPAIRS`` per step; then the
episode ends ``parse_error``. Every model call becomes one sidecar :class:`LogprobRow`; a simulated user's calls
(Tau2 with ``--user-logprobs``) become rows of the user sidecar, numbered by the step whose observation holds them
(:func:`user_rows`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, ClassVar

from uqh.domains.base import Domain, Environment, InvalidAction, RecordedStep, ReplayMismatch
from uqh.harness.episode.agent_protocol import Agent, Decision, Rejection
from uqh.harness.episode.react_agent import OBSERVATION_PREFIX, ReactAgent, observation_message  # noqa: F401 - API
from uqh.harness.model.client import convert_logprobs
from uqh.harness.model.types import ModelClient
from uqh.rundir.schema import Attempt, Episode, LogprobRow, PartialEpisode, Step, StopReason

log = logging.getLogger(__name__)

MAX_REPAIRS = 2  # Appendix K: up to two repair attempts per step
#: Alternatives kept per user token: every one the server returned (it was asked for RunConfig.user_logprobs;
#: providers return at most 20).
USER_TOP_K_KEPT = 20


def derive_seed(run_seed: int, episode_id: str) -> int:
    """Per-episode decoding seed: stable across processes and Python versions (sha256, 31 bits)."""
    digest = hashlib.sha256(f"{run_seed}:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def attempt_seed(step_seed: int | None, attempt: int) -> int | None:
    """The decoding seed of a step's ``attempt``: the step's own seed for the first call, a fresh one derived from
    (step seed, attempt number) for each repair -- reusing the step's seed would make a deterministic model repeat
    the text it was just told is wrong. The seed sent is recorded in each attempt's ``call.seed``. None (the
    client's default seed) stays None."""
    if step_seed is None or attempt == 0:
        return step_seed
    return derive_seed(step_seed, f"repair-{attempt}")


def episode_id_for(task_id: str, sample_index: int) -> str:
    return f"{task_id}#{sample_index}"


def branch_episode_id(source_episode_id: str, branch_index: int) -> str:
    return f"{source_episode_id}@b{branch_index}"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def build_messages(system_prompt: str, task_prompt: str, steps: list[Step]) -> list[dict]:
    """The react agent's conversation before the next step (:meth:`ReactAgent.conversation`).

    system, user task prompt, then for each step: every rejected attempt (assistant raw text + user repair
    message) followed by the accepted assistant raw text and the user ``Observation: ...`` message. A run of
    another agent is replayed in the same text form, its native calls written ``name(arguments)``: a chat API
    takes no question after a tool call that has no result, and text is what every probe method can send.
    """
    return ReactAgent(system_prompt).conversation(task_prompt, steps)


def recorded_steps(steps: list[Step]) -> list[RecordedStep]:
    return [RecordedStep(action=s.action, observation=s.observation, info=dict(s.info)) for s in steps]


# --------------------------------------------------------------------------------------- what to run


@dataclass(frozen=True)
class Fresh:
    """A new episode: the environment is reset and nothing is replayed."""

    steps: ClassVar[tuple[Step, ...]] = ()
    task_prompt: ClassVar[str | None] = None
    copied_steps: ClassVar[int] = 0
    sidecar: ClassVar[tuple[LogprobRow, ...]] = ()
    user_sidecar: ClassVar[tuple[LogprobRow, ...]] = ()
    started_at: ClassVar[str | None] = None
    source_episode_id: ClassVar[str | None] = None
    branch_index: ClassVar[int | None] = None


@dataclass(frozen=True)
class Branch:
    """A continuation branch of a recorded (censored) episode: its steps are replayed and copied verbatim (they
    count as ``prefix_steps``, and their model calls are not this episode's)."""

    prefix: Episode
    index: int = 0

    @property
    def steps(self) -> list[Step]:
        return self.prefix.steps

    @property
    def task_prompt(self) -> str:
        return self.prefix.task_prompt

    @property
    def copied_steps(self) -> int:
        return len(self.prefix.steps)

    sidecar: ClassVar[tuple[LogprobRow, ...]] = ()
    user_sidecar: ClassVar[tuple[LogprobRow, ...]] = ()  # the prefix's user turns are replayed, not this episode's
    started_at: ClassVar[str | None] = None

    @property
    def source_episode_id(self) -> str:
        return self.prefix.episode_id

    @property
    def branch_index(self) -> int:
        return self.index


@dataclass(frozen=True)
class Resume:
    """This episode again from its own checkpoint (after a crash): its steps, sidecar rows and start time carry
    on. When the checkpoint cannot be replayed the episode is opened as ``restart`` instead (what it was planned
    as: :class:`Fresh`, or the :class:`Branch` whose checkpoint this is)."""

    partial: PartialEpisode
    restart: "Fresh | Branch" = Fresh()

    @property
    def steps(self) -> list[Step]:
        return self.partial.steps

    @property
    def task_prompt(self) -> str:
        return self.partial.task_prompt

    @property
    def copied_steps(self) -> int:
        return self.partial.prefix_steps

    @property
    def sidecar(self) -> list[LogprobRow]:
        return self.partial.sidecar

    @property
    def user_sidecar(self) -> list[LogprobRow]:
        return self.partial.user_sidecar

    @property
    def started_at(self) -> str | None:
        return self.partial.started_at

    @property
    def source_episode_id(self) -> str | None:
        return self.partial.source_episode_id

    @property
    def branch_index(self) -> int | None:
        return self.partial.branch_index


#: How an episode starts. Each mode answers the same questions: which recorded ``steps`` to replay and continue,
#: their ``task_prompt``, how many of them are ``copied_steps`` of a source episode, the ``sidecar`` rows of this
#: episode's own earlier calls, ``started_at``, and the ``source_episode_id``/``branch_index`` to record.
Start = Fresh | Resume | Branch


@dataclass(frozen=True)
class EpisodeSpec:
    """What to run: identity, decoding seed (also the environment's seed), an optional step-budget override
    (continuation branches: ``Z + K``) and how the episode starts."""

    episode_id: str
    task_id: str
    sample_index: int = 0
    seed: int | None = None
    step_budget: int | None = None
    start: Start = Fresh()


@dataclass
class EpisodeResult:
    episode: Episode
    sidecar: list[LogprobRow]
    # JSON of the first len(...) sidecar rows when a writer already serialized them (checkpoints); saves a re-dump.
    sidecar_json_prefix: list[str] = field(default_factory=list)
    #: the simulated user's rows (Tau2 with --user-logprobs; empty otherwise)
    user_sidecar: list[LogprobRow] = field(default_factory=list)


async def open_episode(domain: Domain, spec: EpisodeSpec) -> tuple[Environment, str, EpisodeSpec]:
    """Make the episode's environment and reset it, or, when ``spec.start`` has recorded steps, restore it to the
    state after them (:meth:`Environment.restore`: Tau2's makes no model call, its opening turn is in the record).

    Returns the environment (the caller closes it), the task prompt to continue with (the recorded one when steps
    were replayed: the restored state holds the recorded conversation) and the spec actually opened. A :class:`Resume` whose
    checkpoint does not replay (``ReplayMismatch``) is opened as its ``restart`` instead; every other failure
    closes the environment and propagates (a :class:`Branch` that does not replay raises ``ReplayMismatch``).
    """
    try:
        return await _open(domain, spec)
    except ReplayMismatch as exc:
        if not isinstance(spec.start, Resume):
            raise
        log.warning("%s: checkpoint replay failed (%s); restarting the episode", spec.episode_id, exc)
        spec = dataclasses.replace(spec, start=spec.start.restart)
        return await _open(domain, spec)


async def _open(domain: Domain, spec: EpisodeSpec) -> tuple[Environment, str, EpisodeSpec]:
    env = domain.make_env(spec.task_id, episode_seed=spec.seed)
    try:
        start = spec.start
        if start.steps:
            await env.restore(start.task_prompt, recorded_steps(start.steps))
            task_prompt = start.task_prompt
        else:
            task_prompt = await env.reset()
    except BaseException:
        with contextlib.suppress(Exception):
            env.close()
        raise
    return env, task_prompt, spec


OnStep = Callable[[PartialEpisode], Any | Awaitable[Any]]


def user_rows(env: Environment, episode_id: str, t: int) -> list[LogprobRow]:
    """The user sidecar's rows of the simulated-user calls ``env`` made since the last take, as step ``t``'s: ``t``
    is the step whose observation holds the user's turn (0: the opening turn, in the task prompt), ``attempt`` the
    call's index within the turn. Converted from the provider's JSON as the agent's tokens are."""
    return [LogprobRow(episode_id=episode_id, t=t, attempt=i, accepted=True,
                       tokens=None if raw is None else convert_logprobs(raw, USER_TOP_K_KEPT))
            for i, raw in enumerate(env.take_user_logprobs())]


@dataclass
class StepOutcome:
    """One step's calls: every attempt (accepted or not), its sidecar rows, and -- when an attempt was accepted --
    the agent's decision and the environment's response; ``pending`` holds the rejected attempts' messages."""

    attempts: list[Attempt]
    rows: list[LogprobRow]
    pending: list[dict]
    accepted: tuple[Decision, Any] | None = None


async def attempt_step(env: Environment, client: ModelClient, messages: list[dict], *, spec: EpisodeSpec, t: int,
                       system_prompt: str, agent: Agent | None = None) -> StepOutcome:
    """Step ``t``: ask the agent's model, let the agent decide and act, with up to ``MAX_REPAIRS`` repair attempts
    (``agent`` None: the react agent over ``system_prompt``)."""
    agent = agent if agent is not None else ReactAgent(system_prompt)
    out = StepOutcome(attempts=[], rows=[], pending=[])
    for attempt_no in range(MAX_REPAIRS + 1):
        completion = await agent.ask(client, messages + out.pending if out.pending else messages,
                                     attempt_seed(spec.seed, attempt_no))
        decision = agent.decide(completion)
        response = None
        if isinstance(decision, Rejection):
            problem: str | None = decision.problem
        else:
            problem = None
            try:
                response = await env.step(decision.action)
            except InvalidAction as exc:
                problem = agent.invalid_action_problem(decision.action, str(exc))
        attempt = Attempt(attempt=attempt_no, raw_text=completion.text, error=problem, call=completion.call,
                          tool_calls=completion.tool_calls)
        out.attempts.append(attempt)
        out.rows.append(LogprobRow(
            episode_id=spec.episode_id, t=t, attempt=attempt_no, accepted=problem is None, tokens=completion.tokens,
            action_token_range=decision.action_token_range if isinstance(decision, Decision) else None))
        if problem is None:
            out.accepted = (decision, response)
            return out
        out.pending.extend(agent.rejected_messages(attempt))
    return out


async def run_episode(
    env: Environment,
    client: ModelClient,
    *,
    spec: EpisodeSpec,
    system_prompt: str,
    step_budget: int,
    task_prompt: str | None = None,
    on_step: OnStep | None = None,
    agent: Agent | None = None,
) -> EpisodeResult:
    """Run (or continue) one episode to its end. ``ModelCallFailed`` propagates: the episode is then not finished.

    ``step_budget`` is the largest step index ``t`` allowed, prefix steps included. ``task_prompt``: the
    environment is already open (:func:`open_episode`) and this is the first user message; without it a
    :class:`Fresh` episode resets ``env`` here, and a started one assumes ``env`` already holds its replayed steps.
    ``agent``: the policy (:mod:`uqh.harness.episode.agent_protocol`); None is the react agent over ``system_prompt``.
    """
    agent = agent if agent is not None else ReactAgent(system_prompt)
    start = spec.start
    started_at = start.started_at or now_iso()
    if task_prompt is None:
        task_prompt = start.task_prompt if start.task_prompt is not None else await env.reset()
    steps: list[Step] = list(start.steps)
    sidecar: list[LogprobRow] = list(start.sidecar)
    user_sidecar: list[LogprobRow] = list(start.user_sidecar)
    opening = user_rows(env, spec.episode_id, 0)
    if not start.steps:  # a started episode's opening turn is the recorded one (its rows, if any, carried on above)
        user_sidecar.extend(opening)
    messages = agent.conversation(task_prompt, steps)
    ending = EpisodeEnding()
    t = len(steps)
    while t < step_budget:
        t += 1
        step_calls = await attempt_step(env, client, messages, spec=spec, t=t, system_prompt=system_prompt,
                                        agent=agent)
        sidecar.extend(step_calls.rows)
        user_sidecar.extend(user_rows(env, spec.episode_id, t))
        if step_calls.accepted is None:
            ending = EpisodeEnding(stop_reason=StopReason.parse_error, failed_step=step_calls.attempts)
            break
        decision, response = step_calls.accepted
        steps.append(Step(
            t=t, think=decision.think, action=decision.action, verbal_confidence=decision.verbal_confidence,
            confidence_raw=decision.confidence_raw, explanation=decision.explanation,
            observation=response.observation, repair_attempts=len(step_calls.attempts) - 1,
            attempts=step_calls.attempts, info=dict(response.info),
        ))
        # Keep the conversation incrementally (no rebuild per step): same shape as agent.conversation.
        messages.extend(step_calls.pending)
        messages.extend(agent.step_messages(step_calls.attempts[-1], response.observation))
        if response.done:
            ending = EpisodeEnding.of(response)
            break
        if on_step is not None:
            maybe = on_step(PartialEpisode.model_construct(
                episode_id=spec.episode_id, task_id=spec.task_id, sample_index=spec.sample_index, seed=spec.seed,
                step_budget=step_budget, task_prompt=task_prompt, steps=steps, sidecar=sidecar,
                user_sidecar=user_sidecar, prefix_steps=start.copied_steps, source_episode_id=start.source_episode_id,
                branch_index=start.branch_index, started_at=started_at,
            ))
            if hasattr(maybe, "__await__"):
                await maybe
    episode = Episode(
        episode_id=spec.episode_id, task_id=spec.task_id, sample_index=spec.sample_index,
        stop_reason=ending.stop_reason, outcome=ending.outcome, reward=ending.reward, reward_info=ending.reward_info,
        n_steps=len(steps), step_budget=step_budget, seed=spec.seed, task_prompt=task_prompt, steps=steps,
        failed_step=ending.failed_step, source_episode_id=start.source_episode_id, branch_index=start.branch_index,
        prefix_steps=start.copied_steps, started_at=started_at, finished_at=now_iso(), info={},
    )
    return EpisodeResult(episode=episode, sidecar=sidecar, user_sidecar=user_sidecar)


@dataclass
class EpisodeEnding:
    """How an episode ended: ``max_steps`` until a step says otherwise."""

    stop_reason: StopReason = StopReason.max_steps
    outcome: int | None = None
    reward: float | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    failed_step: list[Attempt] | None = None

    @classmethod
    def of(cls, response: Any) -> EpisodeEnding:
        """The ending an environment's final response states (outcome only for a clean ending)."""
        stop_reason = response.stop_reason or StopReason.clean
        return cls(stop_reason=stop_reason, outcome=response.outcome if stop_reason == StopReason.clean else None,
                   reward=response.reward, reward_info=dict(response.reward_info))
