"""Run one episode: the ReAct loop. Knows nothing about files, processes or concurrency.

Each step sends the conversation to the model, parses the four tags and applies the action to the
environment. A malformed output or an action the environment rejects (``InvalidAction``) triggers a
repair attempt (the model is told what was wrong and asked again), at most ``MAX_REPAIRS`` per step; then the
episode ends ``parse_error``. Every model call becomes one sidecar :class:`LogprobRow`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from domains.base import Environment, InvalidAction, RecordedStep
from harness.model_types import ModelClient
from harness.parsing import (
    ParseError,
    char_span_to_token_range,
    invalid_action_problem,
    parse_react,
    repair_message,
)
from rundir.schema import Attempt, Episode, LogprobRow, PartialEpisode, Step, StopReason

MAX_REPAIRS = 2
OBSERVATION_PREFIX = "Observation: "


def derive_seed(run_seed: int, episode_id: str) -> int:
    """Per-episode decoding seed: stable across processes and Python versions (sha256, 31 bits)."""
    digest = hashlib.sha256(f"{run_seed}:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def episode_id_for(task_id: str, sample_index: int) -> str:
    return f"{task_id}#{sample_index}"


def branch_episode_id(source_episode_id: str, branch_index: int) -> str:
    return f"{source_episode_id}@b{branch_index}"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def observation_message(observation: str) -> dict:
    return {"role": "user", "content": OBSERVATION_PREFIX + observation}


def build_messages(system_prompt: str, task_prompt: str, steps: list[Step]) -> list[dict]:
    """The conversation sent to the model before the next step.

    system, user task prompt, then for each step: every rejected attempt (assistant raw text + user repair
    message) followed by the accepted assistant raw text and the user ``Observation: ...`` message.
    """
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": task_prompt}]
    for step in steps:
        _extend_with_step(messages, step, system_prompt)
    return messages


def _extend_with_step(messages: list[dict], step: Step, system_prompt: str) -> None:
    for att in step.attempts:
        messages.append({"role": "assistant", "content": att.raw_text})
        if att.error is not None:
            messages.append({"role": "user", "content": repair_message(att.error, system_prompt)})
    messages.append(observation_message(step.observation))


def recorded_steps(steps: list[Step]) -> list[RecordedStep]:
    return [RecordedStep(action=s.action, observation=s.observation, info=dict(s.info)) for s in steps]


@dataclass
class EpisodeSpec:
    """What to run: identity, seed and (optionally) a prefix already replayed into the environment."""

    episode_id: str
    task_id: str
    sample_index: int = 0
    seed: int | None = None
    # Steps to continue from. The environment must already be reset and replayed to them (see start_env).
    prefix: Episode | PartialEpisode | None = None
    # How many of the prefix steps are copied from a source episode (default: all of them, i.e. a continuation).
    # A checkpoint resume passes the checkpoint's own prefix_steps.
    prefix_steps: int | None = None
    # Sidecar rows already produced by this episode's own prefix calls (checkpoint resume); emitted with the result.
    prefix_sidecar: list[LogprobRow] = field(default_factory=list)
    source_episode_id: str | None = None
    branch_index: int | None = None
    # When set, the environment was already reset and this is its first message (otherwise run_episode resets it).
    task_prompt: str | None = None
    started_at: str | None = None
    # Overrides the batch's step budget for this episode (continuation branches).
    step_budget: int | None = None


@dataclass
class EpisodeResult:
    episode: Episode
    sidecar: list[LogprobRow]
    # JSON of the first len(...) sidecar rows when a writer already serialized them (checkpoints); saves a re-dump.
    sidecar_json_prefix: list[str] = field(default_factory=list)


async def start_env(env: Environment, prefix: Episode | PartialEpisode | None) -> str:
    """Reset the environment and replay ``prefix`` into it; return the task prompt (first user message)."""
    task_prompt = await env.reset()
    if prefix is not None and prefix.steps:
        await env.replay(recorded_steps(prefix.steps))
    return task_prompt


OnStep = Callable[[PartialEpisode], Any | Awaitable[Any]]


async def run_episode(
    env: Environment,
    client: ModelClient,
    *,
    spec: EpisodeSpec,
    system_prompt: str,
    step_budget: int,
    on_step: OnStep | None = None,
) -> EpisodeResult:
    """Run (or continue) one episode to its end. ``ModelCallFailed`` propagates: the episode is then not finished.

    ``step_budget`` is the largest step index ``t`` allowed, prefix steps included.
    """
    started_at = spec.started_at or now_iso()
    prefix_steps_list: list[Step] = list(spec.prefix.steps) if spec.prefix is not None else []
    if spec.task_prompt is not None:
        task_prompt = spec.task_prompt
    elif spec.prefix is not None:
        task_prompt = spec.prefix.task_prompt
    else:
        task_prompt = await env.reset()
    prefix_steps = spec.prefix_steps if spec.prefix_steps is not None else len(prefix_steps_list)

    steps: list[Step] = prefix_steps_list
    sidecar: list[LogprobRow] = list(spec.prefix_sidecar)
    messages = build_messages(system_prompt, task_prompt, steps)

    stop_reason = StopReason.max_steps
    outcome: int | None = None
    reward: float | None = None
    reward_info: dict[str, Any] = {}
    failed_step: list[Attempt] | None = None
    info: dict[str, Any] = {}

    t = len(steps)
    while t < step_budget:
        t += 1
        attempts: list[Attempt] = []
        pending: list[dict] = []  # rejected attempts + repair messages of this step
        accepted = None
        for attempt_no in range(MAX_REPAIRS + 1):
            completion = await client.complete(messages + pending if pending else messages, seed=spec.seed)
            raw = completion.text
            parsed = parse_react(raw)
            problem: str | None = None
            response = None
            action_range = None
            if isinstance(parsed, ParseError):
                problem = parsed.message
            else:
                token_texts = [tok.token for tok in completion.tokens] if completion.tokens is not None else None
                action_range = char_span_to_token_range(parsed.action_span, token_texts, raw)
                try:
                    response = await env.step(parsed.action)
                except InvalidAction as exc:
                    problem = invalid_action_problem(parsed.action, str(exc))
            attempts.append(Attempt(attempt=attempt_no, raw_text=raw, error=problem, call=completion.call))
            sidecar.append(
                LogprobRow(
                    episode_id=spec.episode_id,
                    t=t,
                    attempt=attempt_no,
                    accepted=problem is None,
                    tokens=completion.tokens,
                    action_token_range=action_range,
                )
            )
            if problem is None:
                accepted = (parsed, response)
                break
            pending.append({"role": "assistant", "content": raw})
            pending.append({"role": "user", "content": repair_message(problem, system_prompt)})

        if accepted is None:
            stop_reason = StopReason.parse_error
            failed_step = attempts
            break

        parsed, response = accepted
        step = Step(
            t=t,
            think=parsed.think,
            action=parsed.action,
            verbal_confidence=parsed.verbal_confidence,
            confidence_raw=parsed.confidence_raw,
            explanation=parsed.explanation,
            observation=response.observation,
            repair_attempts=len(attempts) - 1,
            attempts=attempts,
            info=dict(response.info),
        )
        steps.append(step)
        # Keep the conversation incrementally (no rebuild per step): same shape as build_messages.
        messages.extend(pending)
        messages.append({"role": "assistant", "content": attempts[-1].raw_text})
        messages.append(observation_message(response.observation))

        if response.done:
            stop_reason = response.stop_reason or StopReason.clean
            if stop_reason == StopReason.clean:
                outcome = response.outcome
            reward = response.reward
            reward_info = dict(response.reward_info)
            break
        if on_step is not None:
            maybe = on_step(
                PartialEpisode.model_construct(
                    episode_id=spec.episode_id,
                    task_id=spec.task_id,
                    sample_index=spec.sample_index,
                    seed=spec.seed,
                    step_budget=step_budget,
                    task_prompt=task_prompt,
                    steps=steps,
                    sidecar=sidecar,
                    prefix_steps=prefix_steps,
                    source_episode_id=spec.source_episode_id,
                    branch_index=spec.branch_index,
                    started_at=started_at,
                )
            )
            if hasattr(maybe, "__await__"):
                await maybe

    episode = Episode(
        episode_id=spec.episode_id,
        task_id=spec.task_id,
        sample_index=spec.sample_index,
        stop_reason=stop_reason,
        outcome=outcome,
        reward=reward,
        reward_info=reward_info,
        n_steps=len(steps),
        step_budget=step_budget,
        seed=spec.seed,
        task_prompt=task_prompt,
        steps=steps,
        failed_step=failed_step,
        source_episode_id=spec.source_episode_id,
        branch_index=spec.branch_index,
        prefix_steps=prefix_steps,
        started_at=started_at,
        finished_at=now_iso(),
        info=info,
    )
    return EpisodeResult(episode=episode, sidecar=sidecar)
