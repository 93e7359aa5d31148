"""Write small but complete run directories with the uqh.rundir.schema models, for audit/report tests.

Every episode is spelled out by an :class:`EpisodeSpec`-like dict so that counts and means can be computed
by hand in the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from uqh.rundir.schema import (
    EPISODES_FILE,
    MANIFEST_FILE,
    SIDECAR_FILE,
    USER_SIDECAR_FILE,
    Attempt,
    CallRecord,
    DecodingConfig,
    Episode,
    LogprobRow,
    Manifest,
    RunConfig,
    Step,
    StopReason,
    TokenLogprob,
    TopLogprob,
)


@dataclass
class Ep:
    task_id: str
    stop: StopReason
    confidences: list[float | None]
    outcome: int | None = None
    token_p: list[float] | None = None  # chosen-token probability per step (one 5-token completion per step)
    sample_index: int = 0
    actions: list[str] = field(default_factory=list)


def _tokens(p: float, n: int = 5, name: str = "tok") -> list[TokenLogprob]:
    """n tokens each with chosen probability p and four equal alternatives sharing (1 - p) / 2."""
    alt = max((1.0 - p) / 8.0, 1e-9)
    toks = []
    for i in range(n):
        tops = [TopLogprob(token=f"{name}{i}", logprob=math.log(p))] + [
            TopLogprob(token=f"alt{i}{j}", logprob=math.log(alt)) for j in range(4)
        ]
        toks.append(TokenLogprob(token=f"{name}{i}", logprob=math.log(p), top_logprobs=tops))
    return toks


def user_token_p(t: int) -> float:
    """The chosen-token probability of the simulated user's turn after step ``t`` (0: the opening turn)."""
    return 0.6 + 0.05 * t


def write_run(run_dir: Path, domain: str, step_budget: int, episodes: list[Ep], *, model: str = "openai/fake",
              user_tokens: bool = False) -> Path:
    """``user_tokens``: also a simulated user's sidecar (as ``uqh run --user-logprobs`` writes): an opening turn
    (t = 0) and a reply after every step, 3 tokens ``user0..2`` each with probability :func:`user_token_p`."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    task_ids = sorted({e.task_id for e in episodes})
    config = RunConfig(
        domain=domain,
        task_ids=task_ids,
        model=model,
        decoding=DecodingConfig(),
        step_budget=step_budget,
        prompt_sha256="0" * 64,
        package_version="0.1.0",
        user_logprobs=5 if user_tokens else None,
    )
    manifest = Manifest(
        config=config,
        config_hash=config.config_hash(),
        created_at="2026-01-01T00:00:00Z",
        system_prompt=f"You are a {domain} agent.",
    )
    (run_dir / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2))
    ep_lines, side_lines, user_lines = [], [], []
    for e in episodes:
        eid = f"{e.task_id}#{e.sample_index}"
        if user_tokens:
            user_lines += [LogprobRow(episode_id=eid, t=t, attempt=0, accepted=True,
                                      tokens=_tokens(user_token_p(t), 3, "user")).model_dump_json()
                           for t in range(len(e.confidences) + 1)]
        steps = []
        for t, c in enumerate(e.confidences, start=1):
            action = e.actions[t - 1] if t - 1 < len(e.actions) else f"Search[q{t}]"
            raw = f"<think>step {t}</think><action>{action}</action><confidence>{c}</confidence><explanation>x</explanation>"
            call = CallRecord(model=model, has_logprobs=e.token_p is not None)
            steps.append(
                Step(
                    t=t,
                    think=f"step {t}",
                    action=action,
                    verbal_confidence=c,
                    confidence_raw=None if c is None else str(c),
                    explanation="x",
                    observation=f"observation {t} of {eid} <b>&amp;</b>",
                    attempts=[Attempt(attempt=0, raw_text=raw, call=call)],
                )
            )
            toks = _tokens(e.token_p[t - 1]) if e.token_p is not None else None
            side_lines.append(
                LogprobRow(episode_id=eid, t=t, attempt=0, accepted=True, tokens=toks, action_token_range=(1, 3) if toks else None)
                .model_dump_json()
            )
        failed = None
        if e.stop == StopReason.parse_error:
            failed = [Attempt(attempt=i, raw_text="garbage", error="missing <action>", call=CallRecord(model=model)) for i in range(3)]
        ep = Episode(
            episode_id=eid,
            task_id=e.task_id,
            sample_index=e.sample_index,
            stop_reason=e.stop,
            outcome=e.outcome,
            reward=None if e.outcome is None else float(e.outcome),
            n_steps=len(steps),
            step_budget=step_budget,
            task_prompt=f"Task {e.task_id}",
            steps=steps,
            failed_step=failed,
        )
        ep_lines.append(ep.model_dump_json())
    (run_dir / EPISODES_FILE).write_text("".join(line + "\n" for line in ep_lines))
    (run_dir / SIDECAR_FILE).write_text("".join(line + "\n" for line in side_lines))
    if user_tokens:
        (run_dir / USER_SIDECAR_FILE).write_text("".join(line + "\n" for line in user_lines))
    return run_dir


def webshop_like(run_dir: Path) -> Path:
    """8 episodes, budget 4: 3 clean (2 successes), 3 max_steps, 1 parse_error, 1 clean with a missing confidence."""
    S = StopReason
    eps = [
        Ep("a", S.clean, [0.9, 0.8], outcome=1, token_p=[0.9, 0.8]),
        Ep("b", S.clean, [0.6], outcome=0, token_p=[0.5]),
        Ep("c", S.clean, [0.7, 0.9, 1.0], outcome=1, token_p=[0.7, 0.95, 0.99]),
        Ep("d", S.max_steps, [0.5, 0.4, 0.3, 0.2], token_p=[0.6, 0.5, 0.4, 0.3]),
        Ep("e", S.max_steps, [0.8, 0.8, 0.6, 0.6], token_p=[0.8, 0.8, 0.7, 0.6]),
        Ep("f", S.max_steps, [0.1, 0.3, 0.2, 0.2], token_p=[0.3, 0.3, 0.2, 0.2]),
        Ep("g", S.parse_error, [0.5], token_p=[0.5]),
        Ep("h", S.clean, [None, 0.4], outcome=0, token_p=[0.4, 0.45]),
    ]
    return write_run(run_dir, "webshop", 4, eps)


def tau2_like(run_dir: Path, *, user_tokens: bool = False) -> Path:
    """6 episodes, budget 5: 4 clean, 1 tool_error, 1 env_terminated (``user_tokens``: see :func:`write_run`)."""
    S = StopReason
    eps = [
        Ep("1", S.clean, [0.9, 0.95], outcome=1, token_p=[0.9, 0.9]),
        Ep("2", S.clean, [0.95, 1.0, 1.0], outcome=0, token_p=[0.8, 0.7, 0.9]),
        Ep("3", S.clean, [0.9], outcome=1, token_p=[0.99]),
        Ep("4", S.clean, [1.0, 0.9], outcome=0, token_p=[0.6, 0.5]),
        Ep("5", S.tool_error, [0.9, 0.9], token_p=[0.5, 0.5]),
        Ep("6", S.env_terminated, [0.95], token_p=[0.7]),
    ]
    return write_run(run_dir, "tau2-airline", 5, eps, user_tokens=user_tokens)
