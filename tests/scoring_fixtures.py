"""Build run directories in the exact run-directory schema (uqh.rundir.schema models) for the scoring tests."""
from __future__ import annotations

import math
from pathlib import Path

from uqh.rundir.schema import (
    EPISODES_FILE,
    MANIFEST_FILE,
    SIDECAR_FILE,
    Attempt,
    CallRecord,
    Episode,
    LogprobRow,
    Manifest,
    RunConfig,
    Step,
    StopReason,
    TokenLogprob,
    TopLogprob,
)


def make_step(t: int, confidence: float | None, action: str = "Finish[yes]") -> Step:
    raw = f"<think>x</think><action>{action}</action><confidence>{confidence}</confidence><explanation>e</explanation>"
    return Step(
        t=t,
        think="x",
        action=action,
        verbal_confidence=confidence,
        confidence_raw=None if confidence is None else str(confidence),
        explanation="e",
        observation="obs",
        attempts=[Attempt(attempt=0, raw_text=raw, call=CallRecord(model="openai/fake", has_logprobs=True))],
    )


def make_episode(
    episode_id: str,
    stop_reason: str,
    confidences: list[float | None],
    outcome: int | None = None,
    step_budget: int = 5,
) -> Episode:
    sr = StopReason(stop_reason)
    return Episode(
        episode_id=episode_id,
        task_id=episode_id.split("#")[0],
        stop_reason=sr,
        outcome=outcome if sr is StopReason.clean else None,
        n_steps=len(confidences),
        step_budget=step_budget,
        task_prompt="Question: ?",
        steps=[make_step(t + 1, c) for t, c in enumerate(confidences)],
    )


def make_tokens(spec: list[tuple[float, list[float]]]) -> list[TokenLogprob]:
    """spec: per token (chosen-token probability, list of top-5 alternative probabilities)."""
    return [
        TokenLogprob(
            token=f"tok{i}",
            logprob=math.log(p),
            top_logprobs=[TopLogprob(token=f"alt{j}", logprob=math.log(a)) for j, a in enumerate(tops)],
        )
        for i, (p, tops) in enumerate(spec)
    ]


def make_row(episode_id: str, t: int, tokens, action_range=None, accepted: bool = True, attempt: int = 0) -> LogprobRow:
    return LogprobRow(episode_id=episode_id, t=t, attempt=attempt, accepted=accepted, tokens=tokens,
                      action_token_range=action_range)


def write_run_dir(path: Path, episodes: list[Episode], rows: list[LogprobRow] = (), domain: str = "arithmetic",
                  step_budget: int = 5) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig(domain=domain, task_ids=sorted({e.task_id for e in episodes}), model="openai/fake",
                    step_budget=step_budget, prompt_sha256="0" * 64, package_version="0.1.0")
    manifest = Manifest(config=cfg, config_hash=cfg.config_hash(), created_at="2026-01-01T00:00:00Z",
                        system_prompt="You are an agent.")
    (path / MANIFEST_FILE).write_text(manifest.model_dump_json())
    (path / EPISODES_FILE).write_text("".join(e.model_dump_json() + "\n" for e in episodes))
    (path / SIDECAR_FILE).write_text("".join(r.model_dump_json() + "\n" for r in rows))
    return path


def synthetic_run(path: Path, n: int = 40, seed: int = 0, censored: int = 0, parse_errors: int = 0,
                  step_budget: int = 5) -> Path:
    """A run directory of ``n`` clean episodes (plus censored / parse-error ones) with informative verbal
    confidences and token logprobs on every step."""
    import numpy as np

    rng = np.random.default_rng(seed)
    episodes, rows = [], []
    for i in range(n + censored + parse_errors):
        eid = f"task{i:03d}#0"
        T = int(rng.integers(1, 5))
        if i < n:
            y = int(rng.random() < 0.6)
            conf = [float(np.clip(0.35 + 0.3 * y + rng.normal(0, 0.15), 0.01, 0.99)) for _ in range(T)]
            ep = make_episode(eid, "clean", [round(c, 2) for c in conf], outcome=y)
        elif i < n + censored:
            conf = [round(float(rng.uniform(0.2, 0.9)), 2) for _ in range(5)]
            ep = make_episode(eid, "max_steps", conf)
        else:
            conf = [round(float(rng.uniform(0.2, 0.9)), 2) for _ in range(T)]
            ep = make_episode(eid, "parse_error", conf)
        episodes.append(ep)
        for s in ep.steps:
            spec = []
            for _ in range(4):
                p = float(rng.uniform(0.3, 0.95))
                rest = (1 - p) * np.array([0.5, 0.25, 0.15, 0.1])
                spec.append((p, [p, *rest.tolist()]))
            rows.append(make_row(eid, s.t, make_tokens(spec), action_range=(1, 3)))
    return write_run_dir(path, episodes, rows, step_budget=step_budget)
