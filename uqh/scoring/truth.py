"""The truthful process q_t as a reference, where a domain knows it (the oracle domain ``urn``).

Theorem 4.1 (Appendix A): TPS is uniquely maximised in expectation by the truthful trace
q_t = P(Y = 1 | H_t) (Eq. 1). Where each recorded step carries q_t (``Step.info["q_t"]``), scoring shows it as
the ``truth`` predictor and measures every other stream against it on the same trajectories:

- :func:`tps_gap`: TPS(q_{1:T}, Y) − TPS(F_{1:T}, Y) per trajectory (Eq. 2 for both traces, same weights and
  labels). Its expectation is the weighted sum of the per-step regrets R_t ≥ 0 of Eq. (8)-(9), zero iff F = q;
  a sample mean may be negative by chance.
- :func:`mean_abs_error`: the mean over a trajectory's steps of |F_t − q_t| (then averaged over trajectories).
"""
from __future__ import annotations

import math

import numpy as np

from uqh.rundir.schema import LogprobRow, Step
from uqh.scoring.rules import ScoreRule
from uqh.scoring.tps import per_trajectory_sum, tps

TRUTH = "truth"
#: The key of ``Step.info`` holding q_t (written by the oracle domain's environment).
Q_T_KEY = "q_t"


def truth_value(step: Step, row: LogprobRow | None) -> float:
    """q_t recorded by the environment for the history the step's confidence was stated on; NaN when absent."""
    value = step.info.get(Q_T_KEY)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return float("nan")


def tps_gap(values: np.ndarray, truth: np.ndarray, offsets: np.ndarray, y: np.ndarray, rule: ScoreRule,
            weights: np.ndarray) -> np.ndarray:
    """Per trajectory TPS(q, Y) − TPS(F, Y) (Eq. 2 twice; Theorem 4.1: its expectation is ≥ 0, 0 iff F = q).
    ``y`` may be soft (the posterior weight of the censored extension)."""
    return tps(truth, offsets, y, rule, weights) - tps(values, offsets, y, rule, weights)


def mean_abs_error(values: np.ndarray, truth: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per trajectory (1/T) Σ_t |F_t − q_t| (empty trajectories give NaN)."""
    lengths = np.diff(np.asarray(offsets, dtype=np.int64))
    total = per_trajectory_sum(np.abs(np.asarray(values, float) - np.asarray(truth, float)), offsets)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / lengths
