"""The Trajectory Proper Score and its censored extensions, on flat (values, offsets) arrays.

Layout: ``values`` holds every scored per-step forecast F_{i,t} of every trajectory back to back;
``offsets`` (length n+1) delimits trajectory i as ``values[offsets[i]:offsets[i+1]]``; ``weights`` is the
matching flat array of w_{i,t} (:func:`uqh.scoring.weights.trajectory_weights`). Everything is vectorised across
trajectories (a single ``bincount`` per reduction).

Paper: Eq. (2) TPS; Eq. (4) exact reduced censored score; Eq. (5)/(6) simple censored score (q_Z ≈ 0);
Proposition C.2 (posterior weight Δ Y + (1-Δ) q_Z); Eq. (17) exact-minus-simple identity; Appendix I.1
prefix-swap / tail-omission decomposition of artificial censoring.
"""
from __future__ import annotations

import numpy as np

from uqh.scoring.rules import EPS, ScoreRule
from uqh.scoring.weights import step_index, trajectory_weights


def per_trajectory_sum(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``sum_{t} x_{i,t}`` for each trajectory i (empty trajectories give 0)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    x = np.asarray(x, dtype=float)
    n = offsets.size - 1
    if n == 0:
        return np.zeros(0)
    nonempty = offsets[1:] > offsets[:-1]
    if x.size == 0:
        return np.zeros(n)
    if nonempty.all():
        return np.add.reduceat(x, offsets[:-1])
    out = np.zeros(n)
    out[nonempty] = np.add.reduceat(x, offsets[:-1][nonempty])
    return out


def branch_scores(values: np.ndarray, offsets: np.ndarray, weights: np.ndarray, rule: ScoreRule) -> tuple[np.ndarray, np.ndarray]:
    """Per trajectory ``(Σ_t w_t S(F_t, 1), Σ_t w_t S(F_t, 0))``: the success and failure branches of Eq. (13)."""
    s1, s0 = rule.pair(values)
    w = np.asarray(weights, dtype=float)
    return per_trajectory_sum(w * s1, offsets), per_trajectory_sum(w * s0, offsets)


def posterior_weight(y: np.ndarray, delta: np.ndarray, q_z: np.ndarray | float | None = None) -> np.ndarray:
    """η*_Z = Δ Y + (1 - Δ) q_Z (Proposition C.2); q_Z = 0 where not given (the simple score, §4.4)."""
    delta = np.asarray(delta, dtype=bool)
    y = np.asarray(y, dtype=float)
    q = np.zeros(delta.shape) if q_z is None else np.broadcast_to(np.asarray(q_z, dtype=float), delta.shape)
    eta = np.where(delta, y, q)
    if np.any(~np.isfinite(eta)):
        raise ValueError("every complete trajectory needs Y in {0,1} and every censored one a finite q_Z")
    return eta


def tps(values: np.ndarray, offsets: np.ndarray, y: np.ndarray, rule: ScoreRule, weights: np.ndarray) -> np.ndarray:
    """TPS(F_{1:T}, Y) = Σ_{t=1}^T w_t S(F_t, Y) per trajectory (Eq. 2). ``y`` may be soft (in [0, 1])."""
    y = np.asarray(y, dtype=float)
    offsets = np.asarray(offsets, dtype=np.int64)
    if np.all((y == 0.0) | (y == 1.0)):  # hard labels: evaluate only the observed branch
        y_step = np.repeat(y, np.diff(offsets))
        return per_trajectory_sum(np.asarray(weights, dtype=float) * rule.observed(values, y_step), offsets)
    a, b = branch_scores(values, offsets, weights, rule)
    return y * a + (1.0 - y) * b


def tps_censored_exact(
    values: np.ndarray,
    offsets: np.ndarray,
    y: np.ndarray,
    delta: np.ndarray,
    q_z: np.ndarray,
    rule: ScoreRule,
    weights: np.ndarray,
) -> np.ndarray:
    """TPS^{cen,exact} (Eq. 4): Σ_{t≤Z} w_t [Δ S(F_t,Y) + (1-Δ)(q_Z S(F_t,1) + (1-q_Z) S(F_t,0))].

    ``q_z`` is read only where ``delta`` is False (may be NaN elsewhere); ``y`` only where ``delta`` is True.
    """
    return tps(values, offsets, posterior_weight(y, delta, q_z), rule, weights)


def tps_censored_simple(
    values: np.ndarray, offsets: np.ndarray, y: np.ndarray, delta: np.ndarray, rule: ScoreRule, weights: np.ndarray
) -> np.ndarray:
    """TPS^{cen,simple} (Eq. 5; Eq. 6 for log): the exact score with the pessimistic q_Z ≈ 0 (§4.4)."""
    return tps(values, offsets, posterior_weight(y, delta, None), rule, weights)


def exact_minus_simple_log(values: np.ndarray, offsets: np.ndarray, weights: np.ndarray, q_z: np.ndarray) -> np.ndarray:
    """Eq. (17): TPS^{cen,exact} - TPS^{cen,simple} = q̂_Z Σ_{t≤Z} w_t log(F_t / (1 - F_t)) for the log score
    (F clipped to [1e-6, 1-1e-6] as in the score itself)."""
    f = np.clip(np.asarray(values, dtype=float), EPS, 1.0 - EPS)
    return np.asarray(q_z, dtype=float) * per_trajectory_sum(np.asarray(weights) * (np.log(f) - np.log1p(-f)), offsets)


def truncate(values: np.ndarray, offsets: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep the first ``z[i]`` steps of every trajectory: returns (values, offsets) of the prefixes."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    z = np.asarray(z, dtype=np.int64)
    if np.any((z < 0) | (z > lengths)):
        raise ValueError("prefix length z must lie in [0, T_i]")
    traj, t = step_index(offsets)
    keep = t <= z[traj]
    new_offsets = np.concatenate([[0], np.cumsum(z)])
    return np.asarray(values)[keep], new_offsets


def artificial_censoring(
    values: np.ndarray,
    offsets: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    censored: np.ndarray,
    rule: ScoreRule,
    scheme: str,
) -> dict[str, np.ndarray]:
    """Artificial-censoring validation (§6.2, Appendix I.1) on complete trajectories.

    Trajectories with ``censored[i]`` have their outcome hidden after step ``z[i]``; weights are the full-length
    T_i-normalised schedule truncated at Z_i, not renormalised (§4.1). Returns per trajectory:

    - ``complete``: TPS on the full trajectory (Eq. 2);
    - ``censored``: TPS^{cen,simple} on the observed data (Eq. 5);
    - ``prefix_swap``: Σ_{t≤Z} w_t [S(F_t,0) - S(F_t,Y)] (zero unless Y=1; sign of log(1-F)-log F per step);
    - ``tail_omission``: -Σ_{t>Z} w_t S(F_t,Y) (always ≥ 0);

    with ``censored - complete == prefix_swap + tail_omission`` exactly (the closed-form decomposition).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    censored = np.asarray(censored, dtype=bool)
    y = np.asarray(y, dtype=float)
    z_eff = np.where(censored, np.asarray(z, dtype=np.int64), lengths)
    w_full = trajectory_weights(offsets, scheme)
    traj, t = step_index(offsets)
    observed = t <= z_eff[traj]
    s1, s0 = rule.pair(values)
    s_y = np.where(y[traj] == 1.0, s1, s0)
    complete = per_trajectory_sum(w_full * s_y, offsets)
    s_cen = np.where(censored[traj], s0, s_y)
    cens = per_trajectory_sum(np.where(observed, w_full * s_cen, 0.0), offsets)
    swap = per_trajectory_sum(np.where(observed & censored[traj], w_full * (s0 - s_y), 0.0), offsets)
    tail = -per_trajectory_sum(np.where(~observed, w_full * s_y, 0.0), offsets)
    return {"complete": complete, "censored": cens, "prefix_swap": swap, "tail_omission": tail}
