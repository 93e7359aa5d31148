"""What a GPA judge is shown and what it must answer: the judge prompts, uqh's trace rendering, reply parsing.

The prompts live in ``prompts/judges/``: ``common.txt`` (how a uqh trace is built, and the reply format) wraps
one ``<METRIC>.txt`` per judge, adapted from the Agent GPA paper's Appendix B (provenance: docs/judges.md).

The trace a judge sees (:func:`render_trace`) is built from the recorded :class:`uqh.rundir.schema.Episode` and the
run's system prompt (the agent's instructions and tool catalogue, from the manifest). It shows each step's
THINK (the plan), ACTION and OBSERVATION, and withholds what would let a judge read the outcome or the agent's
own uncertainty instead of the trace: the verbal confidence and its explanation, the reward, and the observation
that answered the final action of a clean episode (the benchmark's verdict, e.g. "your answer is wrong").

A reply must be one JSON object ``{"score": 0..3, "rationale": str, "cited_steps": [int]}``
(:class:`JudgeReply`); :func:`parse_reply` raises :class:`ReplyError` with the reason to send back in the
single repair request.
"""
from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from uqh.prompts import PROMPTS_DIR
from uqh.rundir.judgments import JudgeMetric, validation_message
from uqh.rundir.schema import Episode, StopReason

JUDGE_PROMPTS_DIR = PROMPTS_DIR / "judges"
#: Bump when :func:`render_trace` changes what judges see: it is part of the judge config (resume guard).
TRACE_FORMAT = 1
#: Characters of an unparseable final output shown in a parse_error trace.
FAILED_OUTPUT_CHARS = 1000

REPLY_SHAPE = '{"score": <0-3>, "rationale": "...", "cited_steps": [<step numbers>]}'

_ENDINGS = {
    StopReason.max_steps: "The step budget ({budget} steps) ran out before the agent gave a final answer.",
    StopReason.tool_error: "The environment ended the episode after too many tool errors.",
    StopReason.env_terminated: "The environment ended the episode (e.g. a transfer to a human agent or its turn "
                               "limit) without a final answer from the agent.",
}


# --------------------------------------------------------------------------------------- prompts


@lru_cache(maxsize=None)
def judge_system_prompt(metric: JudgeMetric) -> str:
    """The full system prompt of one judge: ``common.txt`` with the metric's instructions inserted."""
    common = (JUDGE_PROMPTS_DIR / "common.txt").read_text()
    instructions = (JUDGE_PROMPTS_DIR / f"{metric.value}.txt").read_text().strip()
    return common.replace("{JUDGE_INSTRUCTIONS}", instructions)


def prompts_sha256() -> dict[str, str]:
    """sha256 of every judge's system prompt (all seven, whichever are run: a changed prompt refuses resume)."""
    return {m.value: hashlib.sha256(judge_system_prompt(m).encode()).hexdigest() for m in JudgeMetric}


# --------------------------------------------------------------------------------------- the trace


def _ending(episode: Episode) -> str:
    sr = episode.stop_reason
    if sr == StopReason.clean:
        return (f"The agent ended the episode with its final action at step {episode.n_steps}. The environment's "
                "verdict on it is withheld from you.")
    if sr == StopReason.parse_error:
        failed = episode.failed_step or []
        text = (f"The episode ended because the agent's output for step {episode.n_steps + 1} could not be used "
                f"after {max(0, len(failed) - 1)} repair request(s).")
        if failed:
            last = failed[-1]
            raw = last.text_with_calls
            if len(raw) > FAILED_OUTPUT_CHARS:
                raw = raw[:FAILED_OUTPUT_CHARS] + " [...]"
            text += f" Its last output was:\n{raw}\nIt was rejected because: {last.error or 'unknown'}"
        return text
    return _ENDINGS[sr].format(budget=episode.step_budget)


def render_trace(episode: Episode, system_prompt: str) -> str:
    """The user message of every judge for one episode (see the module docstring for what is withheld)."""
    parts = [
        "# The agent's system prompt (its instructions and tool catalogue)",
        "<system_prompt>", system_prompt.strip(), "</system_prompt>", "",
        "# The task (the first message the agent received)",
        "<task>", episode.task_prompt.strip(), "</task>", "",
        f"# The trace ({episode.n_steps} step{'s' if episode.n_steps != 1 else ''})",
    ]
    if not episode.steps:
        parts.append("(no completed step)")
    last = len(episode.steps)
    for step in episode.steps:
        parts += ["", f"[step {step.t}]", f"THINK: {step.think.strip()}", f"ACTION: {step.action.strip()}"]
        if step.t == last and episode.stop_reason == StopReason.clean:
            parts.append("OBSERVATION: (withheld: the environment's verdict on the final action)")
        else:
            parts.append(f"OBSERVATION: {step.observation.strip()}")
    parts += ["", "# How the episode ended", _ending(episode), "",
              f"Evaluate this trace as instructed and reply with the JSON object only: {REPLY_SHAPE}"]
    return "\n".join(parts)


def judge_messages(metric: JudgeMetric, episode: Episode, system_prompt: str) -> list[dict]:
    return [
        {"role": "system", "content": judge_system_prompt(metric)},
        {"role": "user", "content": render_trace(episode, system_prompt)},
    ]


def repair_request(error: str) -> str:
    return (f"Your reply could not be used: {error}. Reply again with exactly one JSON object and nothing else: "
            f"{REPLY_SHAPE}")


# --------------------------------------------------------------------------------------- the reply


class JudgeReply(BaseModel):
    """The judge's structured output (extra keys are ignored: a judge may add e.g. its criteria)."""

    model_config = ConfigDict(extra="ignore")

    score: Annotated[int, Field(ge=0, le=3, strict=True)]
    rationale: Annotated[str, Field(min_length=1)]
    cited_steps: list[Annotated[int, Field(strict=True)]] = []


class ReplyError(ValueError):
    """The reply is not a valid judgment; the message is sent back in the repair request."""


_THINK_BLOCK = re.compile(r"^\s*<(think|thinking)>.*?</\1>\s*", re.DOTALL)
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def _json_object(text: str) -> dict:
    text = _THINK_BLOCK.sub("", text, count=1)
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    text = text.strip()
    try:
        obj = json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise ReplyError("the reply contains no JSON object") from None
        try:
            obj = json.loads(text[start : end + 1])
        except ValueError as exc:
            raise ReplyError(f"the reply's JSON object does not parse ({exc.msg} at char {exc.pos})") from None
    if not isinstance(obj, dict):
        raise ReplyError("the reply is JSON but not an object")
    return obj


def parse_reply(text: str, n_steps: int) -> JudgeReply:
    """The validated reply; cited steps sorted and de-duplicated. ReplyError says what is wrong."""
    obj = _json_object(text)
    try:
        reply = JudgeReply.model_validate(obj)
    except ValidationError as exc:
        raise ReplyError(validation_message(exc)) from None
    if not reply.rationale.strip():
        raise ReplyError("rationale: must not be empty")
    outside = [t for t in reply.cited_steps if not 1 <= t <= n_steps]
    if outside:
        allowed = f"1..{n_steps}" if n_steps else "none (the trace has no step)"
        raise ReplyError(f"cited_steps: {outside} are not steps of the trace (allowed: {allowed})")
    return reply.model_copy(update={"cited_steps": sorted(set(reply.cited_steps))})
