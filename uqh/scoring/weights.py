"""Trajectory weight schedules w_t (§4.1, Appendix I "Weight schedules").

All schedules are normalised over the evaluated horizon ``T`` (sum_{t=1}^T w_t = 1) and built separately per
trajectory. For censored prefixes the caller passes the horizon (natural censoring: the observed stop length /
budget; artificial censoring: the full length ``T_i``) and only the steps ``t <= Z_i`` are evaluated — weights
are truncated, never renormalised over the prefix (§4.2, Appendix I).
"""
from __future__ import annotations

import numpy as np

from uqh.rundir.errors import UserError

WEIGHT_SCHEMES = ("linear-front", "uniform", "exponential-front", "linear-back")
DEFAULT_WEIGHTS = "linear-front"


def check_scheme(scheme: str) -> str:
    if scheme not in WEIGHT_SCHEMES:
        raise UserError(f"unknown weights {scheme!r}; use one of {', '.join(WEIGHT_SCHEMES)}")
    return scheme


def step_weights(t: np.ndarray, horizon: np.ndarray, scheme: str = DEFAULT_WEIGHTS) -> np.ndarray:
    """Weight of step ``t`` (1-based) in a trajectory with evaluated horizon ``T`` (elementwise arrays).

    - linear-front (default, §4.1): ``w_t = 2(T - t + 1) / (T (T + 1))``
    - uniform: ``w_t = 1 / T``
    - exponential-front (App. I): ``w_t = 2^{-(t-1)} / sum_{s=1}^T 2^{-(s-1)} = 2^{-(t-1)} / (2 (1 - 2^{-T}))``
    - linear-back (App. I): ``w_t = 2t / (T (T + 1))``
    """
    check_scheme(scheme)
    t = np.asarray(t, dtype=float)
    T = np.asarray(horizon, dtype=float)
    if scheme == "linear-front":
        return 2.0 * (T - t + 1.0) / (T * (T + 1.0))
    if scheme == "uniform":
        return 1.0 / T * np.ones_like(t)
    if scheme == "exponential-front":
        return np.exp2(-(t - 1.0)) / (2.0 * (1.0 - np.exp2(-T)))
    return 2.0 * t / (T * (T + 1.0))


def step_index(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For flat per-step arrays described by ``offsets`` (length n+1): (trajectory index, 1-based step t)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    traj = np.repeat(np.arange(lengths.size), lengths)
    t = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths) + 1
    return traj, t


def trajectory_weights(offsets: np.ndarray, scheme: str = DEFAULT_WEIGHTS, horizon: np.ndarray | None = None) -> np.ndarray:
    """Flat per-step weights for trajectories laid out by ``offsets``.

    ``horizon[i]`` is the evaluated horizon T_i (default: the trajectory's own length). It must be at least the
    number of stored steps; with ``horizon > length`` the schedule is truncated, not renormalised (artificial
    censoring, §4.1).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    traj, t = step_index(offsets)
    if horizon is None:
        horizon = lengths
    horizon = np.asarray(horizon, dtype=np.int64)
    if horizon.shape != lengths.shape:
        raise ValueError("horizon must have one entry per trajectory")
    if np.any(horizon < lengths):
        raise ValueError("horizon must be >= the number of scored steps of every trajectory")
    return step_weights(t, horizon[traj], scheme)
