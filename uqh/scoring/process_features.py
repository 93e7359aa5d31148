"""Process-level features of every prefix H_t of a trajectory: the inputs of the HTC calibrator and of SAUP.

Holistic Trajectory Calibration (Zhang, Xiong & Wu 2026, arXiv:2601.15778) describes a trajectory by about 48
interpretable features in four groups -- cross-step dynamics, intra-step stability, position, and structure -- and
fits a regularised linear-logistic model on them. uqh computes such features from what a run directory records, at
every step t and from the prefix H_t only (the task prompt, steps 1..t with their calls, the observations of steps
1..t-1), so a predictor built on them is measurable (``tests/test_measurability.py``).

Two stages, both vectorised across trajectories:

1. :func:`step_signals`: per step, :data:`STEP_SIGNALS` (one row per parsed step) from the step, its accepted
   sidecar row, and the earlier text of its episode (:func:`episode_text_signals`).
2. :func:`prefix_features`: per step t, :data:`FEATURES` -- each dynamic signal summarised over steps 1..t
   (last, first, mean, min, max, std, trend, largest drop), plus running counts and position.

A missing signal (no sidecar row, no top-k, no verbal confidence) is NaN and stays NaN in every summary that reads it
(never imputed); the learned model (:mod:`uqh.scoring.learned`) drops a feature only when it is missing on every step
of the run.
"""
from __future__ import annotations

import math
import re

import numpy as np

from uqh.rundir.schema import Episode, LogprobRow, Step
from uqh.scoring.step_values import action_tokens
from uqh.scoring.token_signals import chosen_logprobs, topk_entropies

NAN = float("nan")
#: the error text of a repair caused by an action the environment rejected (uqh.harness.episode.parsing)
REJECTED_ACTION_MARK = "was rejected:"

#: per-step signals: name -> what it is (the dynamic ones are summarised over the prefix, :data:`DYNAMIC`)
STEP_SIGNALS = {
    "verbal": "the step's verbal confidence on the logit scale (clipped to [1e-6, 1 - 1e-6], Platt's feature)",
    "token_mean_lp": "mean chosen-token logprob of the accepted completion",
    "token_min_lp": "minimum chosen-token logprob of the accepted completion",
    "token_entropy": "mean top-k entropy / ln K of the accepted completion",
    "action_mean_lp": "mean chosen-token logprob of the <action> span",
    "token_lp_std": "sd of the chosen-token logprobs within the step (intra-step stability)",
    "repairs": "repairs the step needed (rejected attempts)",
    "tool_errors": "attempts whose action the environment rejected",
    "action_chars": "log(1 + characters of the action)",
    "repeated_action": "1 if the action equals an earlier action of the trajectory",
    "drift": "SAUP inquiry drift: 1 - word Jaccard(think + action, task prompt)",
    "discrepancy": "SAUP observation discrepancy: 1 - word Jaccard(action, the observation it answers)",
}
SIGNAL_INDEX = {name: i for i, name in enumerate(STEP_SIGNALS)}
DYNAMIC = ("verbal", "token_mean_lp", "token_min_lp", "token_entropy", "action_mean_lp")
SUMMARIES = ("last", "first", "mean", "min", "max", "std", "trend", "max_drop")
#: the prefix features, in column order (48)
FEATURES = (
    [f"{s}_{k}" for s in DYNAMIC for k in SUMMARIES]
    + ["repairs_total", "tool_errors_total", "parse_errors_total", "action_chars_mean", "repeated_action_rate",
       "token_lp_std_last", "step_index", "budget_fraction"]
)
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def jaccard_distance(a: str, b: str) -> float:
    """1 - |A ∩ B| / |A ∪ B| over lower-cased word sets (0 for two empty texts)."""
    wa, wb = _words(a), _words(b)
    union = wa | wb
    return 1.0 - len(wa & wb) / len(union) if union else 0.0


def step_signals(step: Step, row: LogprobRow | None) -> np.ndarray:
    """The signals of one step that need only the step and its accepted sidecar row (the text ones are NaN here:
    :func:`episode_text_signals` fills them)."""
    out = np.full(len(STEP_SIGNALS), NAN)
    if step.verbal_confidence is not None:
        p = min(max(float(step.verbal_confidence), 1e-6), 1.0 - 1e-6)
        out[SIGNAL_INDEX["verbal"]] = math.log(p) - math.log1p(-p)
    lp = chosen_logprobs(row.tokens if row is not None else None)
    if lp.size:
        out[SIGNAL_INDEX["token_mean_lp"]] = lp.mean()
        out[SIGNAL_INDEX["token_min_lp"]] = lp.min()
        out[SIGNAL_INDEX["token_lp_std"]] = lp.std()
        ent = topk_entropies(row.tokens)
        if ent is not None and ent[1] >= 2:
            out[SIGNAL_INDEX["token_entropy"]] = float(ent[0].mean() / math.log(ent[1]))
    act = chosen_logprobs(action_tokens(row)) if row is not None else np.zeros(0)
    if act.size:
        out[SIGNAL_INDEX["action_mean_lp"]] = act.mean()
    out[SIGNAL_INDEX["repairs"]] = step.repair_attempts
    out[SIGNAL_INDEX["tool_errors"]] = sum(1 for a in step.attempts if a.error and REJECTED_ACTION_MARK in a.error)
    out[SIGNAL_INDEX["action_chars"]] = math.log1p(len(step.action))
    return out


def episode_text_signals(episode: Episode) -> np.ndarray:
    """(steps, 3): repeated action, drift and discrepancy of every step of ``episode``; step t reads the task prompt,
    its own think and action, and the observation it answers (step t - 1's; the task prompt for step 1)."""
    out = np.zeros((len(episode.steps), 3))
    seen: set[str] = set()
    previous = episode.task_prompt
    for i, step in enumerate(episode.steps):
        out[i, 0] = float(step.action.strip() in seen)
        out[i, 1] = jaccard_distance(f"{step.think} {step.action}", episode.task_prompt)
        out[i, 2] = jaccard_distance(step.action, previous)
        seen.add(step.action.strip())
        previous = step.observation
    return out


TEXT_SIGNALS = ("repeated_action", "drift", "discrepancy")


def fill_text_signals(signals: np.ndarray, episodes: list[Episode]) -> None:
    """Write :func:`episode_text_signals` of every episode (flat step order) into ``signals``."""
    if not episodes or signals.shape[0] == 0:
        return
    text = np.vstack([episode_text_signals(ep) for ep in episodes if ep.steps] or [np.zeros((0, 3))])
    for j, name in enumerate(TEXT_SIGNALS):
        signals[:, SIGNAL_INDEX[name]] = text[:, j]


def _grid(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(trajectories, longest) NaN-padded grid of a flat per-step column, with each step's (row, col)."""
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(lengths.size), lengths)
    col = np.arange(values.shape[0]) - np.repeat(offsets[:-1], lengths)
    grid = np.full((lengths.size, int(lengths.max()) if lengths.size else 0), np.nan)
    grid[row, col] = values
    return grid, row, col


def prefix_summaries(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(steps, 8): :data:`SUMMARIES` of a per-step signal over steps 1..t of its trajectory, at every step t. trend =
    (x_t − x_1)/(t − 1) and max_drop = max over consecutive steps of x_{i−1} − x_i are 0 at t = 1 (no change yet);
    a NaN makes every summary that reads it NaN (from that step on, for the running ones)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    out = np.full((values.shape[0], len(SUMMARIES)), np.nan)
    if values.shape[0] == 0:
        return out
    g, row, col = _grid(np.asarray(values, dtype=float), offsets)
    n = np.arange(1, g.shape[1] + 1, dtype=float)[None, :]
    mean = np.cumsum(g, axis=1) / n
    var = np.maximum(np.cumsum(g * g, axis=1) / n - mean * mean, 0.0)
    first = g[:, :1]
    with np.errstate(invalid="ignore", divide="ignore"):
        trend = np.where(n > 1, (g - first) / np.maximum(n - 1, 1), 0.0 * g)
    drops = np.concatenate([np.zeros_like(g[:, :1]) * g[:, :1], g[:, :-1] - g[:, 1:]], axis=1)
    max_drop = np.fmax(np.maximum.accumulate(np.where(np.isnan(drops), -np.inf, drops), axis=1), 0.0)
    max_drop[np.logical_or.accumulate(np.isnan(g), axis=1)] = np.nan
    cols = (g, np.broadcast_to(first, g.shape), mean, np.minimum.accumulate(g, axis=1),
            np.maximum.accumulate(g, axis=1), np.sqrt(var), trend, max_drop)
    for j, c in enumerate(cols):
        out[:, j] = c[row, col]
    return out


def prefix_features(signals: np.ndarray, offsets: np.ndarray, step_budget: np.ndarray) -> np.ndarray:
    """(steps, len(FEATURES)): the HTC-style features of every prefix H_t (see :data:`FEATURES`)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n_steps = signals.shape[0]
    lengths = np.diff(offsets)
    cols = [prefix_summaries(signals[:, SIGNAL_INDEX[s]], offsets) for s in DYNAMIC]
    t = (np.arange(n_steps) - np.repeat(offsets[:-1], lengths) + 1).astype(float)

    def running_sum(name: str) -> np.ndarray:
        g, row, col = _grid(signals[:, SIGNAL_INDEX[name]], offsets)
        return np.cumsum(g, axis=1)[row, col]

    repairs, tool_errors = running_sum("repairs"), running_sum("tool_errors")
    structure = np.column_stack([
        repairs, tool_errors, repairs - tool_errors, running_sum("action_chars") / t,
        running_sum("repeated_action") / t, signals[:, SIGNAL_INDEX["token_lp_std"]], t,
        t / np.repeat(np.asarray(step_budget, dtype=float), lengths),
    ]) if n_steps else np.zeros((0, 8))
    return np.column_stack([*cols, structure]) if n_steps else np.zeros((0, len(FEATURES)))
