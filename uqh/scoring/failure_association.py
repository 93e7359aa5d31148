"""agentuq's evaluation of a trajectory scalar: AUARC and the Pearson, Spearman and Kendall τ-b correlations of
uncertainty with 1 − reward (``deeplearning-wisc/agentuq``, ``src/tau2/scripts/evaluate_uq_estimates.py``).

uqh scores a confidence C; agentuq's uncertainty is U = 1 − C and its failure label is "reward < threshold". uqh's
outcome Y ∈ {0, 1} is already the benchmark's success (tau2: reward = 1), so agentuq's rule with threshold 1.0
(:data:`FAILURE_THRESHOLD`) makes the failure label exactly 1 − Y. agentuq's command-line default threshold 0.0
labels no 0/1 reward a failure (every AUROC undefined); the differential test (tests/test_agentuq_parity.py) runs
agentuq's functions with 1.0. The correlations are of U with 1 − Y, so a predictor whose uncertainty rises with
failure gets a positive value (higher is better). Flipping both U = 1 − C and 1 − Y leaves every correlation
unchanged, so each is computed from (C, Y) directly.

Ties: agentuq sorts by uncertainty with Python's stable sort, so its AUARC on tied values depends on the input order.
uqh takes the expectation over random tie-breaking (from the tie-aware AURC); on untied values the two agree
exactly. Ranks are average ranks, as agentuq's.

The functions here are formulas on the per-resample sums that :class:`uqh.scoring.diagnostics.ScalarDiagnostics`
already forms for AUROC and AURC (one sort of C shared with them; weights are bootstrap counts, a trajectory drawn k
times being k tied copies). Each returns shape (B,), NaN where the quantity is undefined (no failure or no success,
zero variance). The (C, Y) entry points are :func:`uqh.scoring.diagnostics.auarc` etc.
"""
from __future__ import annotations

import numpy as np
from scipy.special import digamma

FAILURE_THRESHOLD = 1.0  # agentuq: failure iff reward < threshold; on uqh's Y ∈ {0, 1}: failure iff Y = 0
AGENTUQ_METRICS = ("auarc", "pearson_failure", "spearman_failure", "kendall_failure")


def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b)


def auarc_from_aurc(aurc: np.ndarray, n: np.ndarray, failures: np.ndarray) -> np.ndarray:
    """Area under agentuq's accuracy–rejection curve (reject the most uncertain first; trapezoids over rejection
    rates k/N; accuracy 1 once everything is rejected).

    Summing the trapezoids: AUARC = (1/N)[Σ_{k=0}^{N-1} a_k + (1 − a_0)/2] with a_k the accuracy of the N − k most
    confident, and Σ_k a_k = N − N·AURC, so AUARC = 1 − AURC + F / (2 N²) (F failures among N trajectories)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, 1.0 - aurc + failures / (2.0 * n ** 2), np.nan)


def pearson_from_sums(n, sx, sy, sxx, syy, sxy) -> np.ndarray:
    """Pearson correlation from weighted sums (each of shape (B,)); NaN where a variance is zero."""
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = sxy - sx * sy / n
        var = (sxx - sx * sx / n) * (syy - sy * sy / n)
        ok = var > 1e-300
        return np.where(ok, cov / np.sqrt(np.where(ok, var, 1.0)), np.nan)


def pearson(ws: np.ndarray, c_sorted: np.ndarray, succ_sorted: np.ndarray) -> np.ndarray:
    """Pearson correlation of 1 − C with 1 − Y (agentuq ``compute_pearson`` of U and −reward) = Pearson(C, Y),
    from the (B, n) weights in sorted order. C is centred at its mean first, which keeps the one-pass formula
    accurate."""
    x = c_sorted - c_sorted.mean() if c_sorted.size else c_sorted
    n = ws.sum(axis=1)
    sy = ws @ succ_sorted  # Y ∈ {0, 1}: Σ w y² = Σ w y
    return pearson_from_sums(n, ws @ x, sy, ws @ (x * x), sy, ws @ (x * succ_sorted))


def spearman(tot: np.ndarray, fail: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """Spearman correlation (Pearson of average ranks) of 1 − C with 1 − Y (agentuq ``compute_spearman``).

    ``tot``, ``fail``: (B, G) weighted counts per tie group of C (ascending); ``pp`` their cumulative sum. Y takes two
    values, so its average ranks are affine in Y and Pearson(rank C, Y) is the answer; a group's members share the
    average rank pp − (t − 1)/2."""
    succ = tot - fail
    midrank = pp - (tot - 1.0) / 2.0
    n = pp[:, -1] if pp.shape[1] else np.zeros(pp.shape[0])
    sy = succ.sum(axis=1)
    return pearson_from_sums(n, rowdot(midrank, tot), sy, rowdot(midrank * midrank, tot), sy, rowdot(midrank, succ))


def kendall_tau_b(auroc_numerator: np.ndarray, tot: np.ndarray, n: np.ndarray, failures: np.ndarray) -> np.ndarray:
    """Kendall τ-b of 1 − C with 1 − Y (agentuq ``compute_kendall_tau``): (concordant − discordant) over
    sqrt((pairs − pairs tied in C)(pairs − pairs tied in Y)).

    Only (failure, success) pairs are untied in Y; one is concordant when the failure has the lower C. With the
    AUROC numerator P(C_fail < C_succ) + ½ P(tie), times F·S: concordant − discordant = 2·numerator − F·S."""
    successes = n - failures
    signed = 2.0 * auroc_numerator - failures * successes
    pairs = n * (n - 1) / 2
    tied_c = (rowdot(tot, tot) - n) / 2
    tied_y = failures * (failures - 1) / 2 + successes * (successes - 1) / 2
    denom = (pairs - tied_c) * (pairs - tied_y)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, signed / np.sqrt(np.where(denom > 0, denom, 1.0)), np.nan)


def auarc_in_order(ws: np.ndarray, succ_sorted: np.ndarray) -> np.ndarray:
    """agentuq's AUARC with its own tie rule (``uqh score --agentuq-conventions``): trajectories rejected one at a
    time in the given order -- ascending C, tied ones in input order, as agentuq's stable sort by descending
    uncertainty leaves them. ``ws``: (B, n) weights in that order (a trajectory drawn k times: k adjacent copies).

    With a_k the accuracy after rejecting k, AUARC = (1/N)[Σ_{k<N} a_k + (1 − a_0)/2]; a block of c copies with
    success y, M trajectories left and A successes left before it adds Σ_{j<c} (A − j y)/(M − j)
    = c y + (A − y M)(ψ(M + 1) − ψ(M − c + 1))."""
    n = ws.sum(axis=1)
    succ_w = ws * succ_sorted
    s_total = succ_w.sum(axis=1)
    m = n[:, None] - (np.cumsum(ws, axis=1) - ws)
    a = s_total[:, None] - (np.cumsum(succ_w, axis=1) - succ_w)
    with np.errstate(invalid="ignore", divide="ignore"):
        harmonic = np.where(ws > 0, digamma(m + 1.0) - digamma(np.maximum(m - ws, 0.0) + 1.0), 0.0)
        total = (succ_w + (a - succ_sorted * m) * harmonic).sum(axis=1)
        return np.where(n > 0, (total + (1.0 - s_total / n) / 2.0) / n, np.nan)
