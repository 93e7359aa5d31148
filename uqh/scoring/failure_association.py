"""agentuq's evaluation of a trajectory scalar: AUARC and the Pearson, Spearman and Kendall τ-b correlations of
uncertainty with 1 − reward (``deeplearning-wisc/agentuq``, ``src/tau2/scripts/evaluate_uq_estimates.py``).

uqh scores a confidence C; agentuq's uncertainty is U = 1 − C and its failure label is "reward < threshold". uqh's
outcome Y ∈ {0, 1} is already the benchmark's success (tau2: reward = 1), so agentuq's rule with threshold 1.0
(:data:`FAILURE_THRESHOLD`) makes the failure label exactly 1 − Y. agentuq's command-line default threshold 0.0
labels no 0/1 reward a failure (every AUROC undefined); the differential test (tests/test_agentuq_parity.py) runs
agentuq's functions with 1.0. The correlations are of U with 1 − Y, so a predictor whose uncertainty rises with
failure gets a positive value (higher is better). Flipping both U = 1 − C and 1 − Y leaves every correlation unchanged,
so each is computed from (C, Y) directly.

Ties: agentuq sorts by uncertainty with Python's stable sort, so its AUARC on tied values depends on the input order.
uqh takes the expectation over random tie-breaking (from the tie-aware AURC of :mod:`uqh.scoring.diagnostics`);
on untied values the two agree exactly. Its ranks are average ranks, as agentuq's.

Every function accepts bootstrap ``weights`` of shape (B, n) (counts: a trajectory drawn k times is k tied copies)
and returns shape (B,), NaN where the quantity is undefined (no failure or no success, zero variance).
"""
from __future__ import annotations

import numpy as np

from uqh.scoring.diagnostics import TIE_DECIMALS, ScalarDiagnostics

FAILURE_THRESHOLD = 1.0  # agentuq: failure iff reward < threshold; on uqh's Y ∈ {0, 1}: failure iff Y = 0


def _rows(weights: np.ndarray | None, n: int) -> np.ndarray:
    if weights is None:
        return np.ones((1, n))
    w = np.asarray(weights, dtype=float)
    return w[None, :] if w.ndim == 1 else w


def auarc(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Area under agentuq's accuracy–rejection curve (reject the most uncertain first; trapezoids over rejection
    rates k/N; accuracy 1 once everything is rejected).

    Summing the trapezoids gives AUARC = 1 − AURC + F / (2 N²) with AURC the area under the risk–coverage curve and
    F the failures among N trajectories; with uqh's tie-aware AURC this is the expectation over tie-breaking.
    """
    w = _rows(weights, np.size(c))
    aurc = ScalarDiagnostics(c, y).compute(w, ("aurc",))["aurc"]
    n_total = w.sum(axis=1)
    failures = w @ (1.0 - np.asarray(y, dtype=float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_total > 0, 1.0 - aurc + failures / (2.0 * n_total ** 2), np.nan)


def _weighted_pearson(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Pearson correlation of x (B, n) or (n,) with y (n,) under count weights w (B, n)."""
    tot = w.sum(axis=1, keepdims=True)
    mx = (w * x).sum(axis=1, keepdims=True) / tot
    my = (w * y).sum(axis=1, keepdims=True) / tot
    dx, dy = x - mx, y - my
    cov = (w * dx * dy).sum(axis=1)
    var = (w * dx * dx).sum(axis=1) * (w * dy * dy).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(var > 0, cov / np.sqrt(np.where(var > 0, var, 1.0)), np.nan)


def pearson(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Pearson correlation of uncertainty 1 − C with 1 − Y (agentuq ``compute_pearson`` of U and −reward)."""
    c = np.asarray(c, dtype=float)
    return _weighted_pearson(c, np.asarray(y, dtype=float), _rows(weights, c.size))


class _TieGroups:
    """The distinct values of C (12 decimals, as the diagnostics) and each trajectory's group index."""

    def __init__(self, c: np.ndarray):
        c = np.round(np.asarray(c, dtype=float), TIE_DECIMALS)
        self.values, self.index = np.unique(c, return_inverse=True)
        self.order = np.argsort(self.index, kind="stable")
        self.starts = np.searchsorted(self.index[self.order], np.arange(self.values.size))

    def totals(self, w: np.ndarray) -> np.ndarray:
        """(B, G) weighted counts per group."""
        if self.values.size == 0:
            return np.zeros((w.shape[0], 0))
        return np.add.reduceat(np.take(w, self.order, axis=1), self.starts, axis=1)


def spearman(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Spearman correlation (Pearson of average ranks) of 1 − C with 1 − Y (agentuq ``compute_spearman``).
    Y takes two values, so its average ranks are an affine function of Y and Pearson(rank C, Y) is the answer."""
    c = np.asarray(c, dtype=float)
    w = _rows(weights, c.size)
    groups = _TieGroups(c)
    tot = groups.totals(w)
    midrank = np.cumsum(tot, axis=1) - tot + (tot + 1.0) / 2.0  # average rank of each tie block in the expanded sample
    return _weighted_pearson(midrank[:, groups.index], np.asarray(y, dtype=float), w)


def kendall_tau_b(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Kendall τ-b of 1 − C with 1 − Y (agentuq ``compute_kendall_tau``): (concordant − discordant) over
    sqrt((pairs − pairs tied in C)(pairs − pairs tied in Y)). Only (failure, success) pairs are untied in Y: one
    is concordant when the failure has the lower C."""
    c = np.asarray(c, dtype=float)
    y = np.asarray(y, dtype=float)
    w = _rows(weights, c.size)
    groups = _TieGroups(c)
    tot = groups.totals(w)
    fail = groups.totals(w * (1.0 - y)[None, :])
    succ = tot - fail
    succ_below = np.cumsum(succ, axis=1) - succ
    succ_total = succ.sum(axis=1, keepdims=True)
    signed = (fail * (succ_total - succ_below - succ) - fail * succ_below).sum(axis=1)
    n = tot.sum(axis=1)
    n_fail = fail.sum(axis=1)
    n_succ = n - n_fail
    pairs = n * (n - 1) / 2
    tied_c = (tot * (tot - 1) / 2).sum(axis=1)
    tied_y = n_fail * (n_fail - 1) / 2 + n_succ * (n_succ - 1) / 2
    denom = (pairs - tied_c) * (pairs - tied_y)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, signed / np.sqrt(np.where(denom > 0, denom, 1.0)), np.nan)
