"""Diagnostics on a trajectory scalar C_i, and the AUQ scalar aggregators (§5.1, Appendix B, Appendix F).

Orientation (Appendix F "Metrics"): AUROC and AUPRC are failure-oriented -- the positive class is Y = 0 and
the risk score is low C; AURC is the area under the risk–coverage curve (accept the most confident first,
risk = failure rate of the accepted; lower is better); T-ECE is tie-aware quantile-binned calibration error
with 10 bins (Eq. 10 with empirical bins); T-Brier is the scalarized trajectory Brier mean (C - Y)^2 (Eq. 12).

Tie handling: tied scalars are never split. AUROC counts ties as 1/2 (Mann–Whitney); AUPRC is average
precision with one threshold per distinct value; AURC is the expected area under uniformly random
tie-breaking (closed form through the digamma function); T-ECE assigns a whole block of tied values to the
quantile bin of its first member. Scalars equal to 12 decimals count as tied (float-rounding tolerance).

Every metric accepts resampling ``weights`` -- ``None``, shape (n,), or (B, n) bootstrap counts -- and is then
evaluated for all B rows at once from a single sort of C (the paired bootstrap of :mod:`scoring.bootstrap`).
"""
from __future__ import annotations

import numpy as np
from scipy.special import digamma

from scoring.weights import step_index

N_BINS = 10
TIE_DECIMALS = 12
DIAGNOSTICS = ("auroc", "auprc", "aurc", "t_ece", "t_brier")
DIAGNOSTIC_LABELS = {"auroc": "AUROC↑", "auprc": "AUPRC↑", "aurc": "AURC↓", "t_ece": "T-ECE↓", "t_brier": "T-Brier↓"}


# ------------------------------------------------------------------------------------------ scalar summaries


def trajectory_scalar(values: np.ndarray, offsets: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The default scalar summary: the weighted normalised trajectory mean Σ_t w_t F_t / Σ_t w_t (Appendix F:
    "front-weighted normalized trajectory summary" with the linear-front weights)."""
    traj, _ = step_index(offsets)
    n = len(offsets) - 1
    w = np.asarray(weights, dtype=float)
    return np.bincount(traj, weights=w * values, minlength=n) / np.bincount(traj, weights=w, minlength=n)


def phi_last(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """AUQ Φ_last(F_{1:T}) = F_T (Appendix B.2, Corollary B1)."""
    return np.asarray(values, dtype=float)[np.asarray(offsets)[1:] - 1]


def phi_avg(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """AUQ Φ_avg(F_{1:T}) = (1/T) Σ_t F_t (Appendix B.2, Corollary B2)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    traj, _ = step_index(offsets)
    return np.bincount(traj, weights=values, minlength=offsets.size - 1) / np.diff(offsets)


def phi_min(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """AUQ Φ_min(F_{1:T}) = min_t F_t (Appendix B.2, Corollary B3)."""
    return np.minimum.reduceat(np.asarray(values, dtype=float), np.asarray(offsets, dtype=np.int64)[:-1])


AGGREGATORS = {"last": phi_last, "avg": phi_avg, "min": phi_min}


# ------------------------------------------------------------------------------------------ metrics


class ScalarDiagnostics:
    """The five diagnostics of a scalar ``c`` against outcomes ``y`` (one sort, reused for every weighting)."""

    def __init__(self, c: np.ndarray, y: np.ndarray, n_bins: int = N_BINS):
        c = np.asarray(c, dtype=float)
        y = np.asarray(y, dtype=float)
        if c.shape != y.shape or c.ndim != 1:
            raise ValueError("c and y must be 1-d arrays of the same length")
        if not np.all(np.isfinite(c)) or not np.all(np.isin(y, (0.0, 1.0))):
            raise ValueError("diagnostics need finite scalars and outcomes Y in {0, 1}")
        # Tie tolerance: scalars equal to 12 decimals are one tie block, so that weighted means of a constant
        # stream over different horizons (equal up to float rounding) tie as they should.
        c = np.round(c, TIE_DECIMALS)
        self.n = c.size
        self.n_bins = n_bins
        self.order = np.argsort(c, kind="stable")  # ascending C
        cs = c[self.order]
        self.ys = y[self.order]
        self.cs = cs
        new = np.ones(cs.size, dtype=bool)
        new[1:] = cs[1:] != cs[:-1]
        self.starts = np.flatnonzero(new)  # group boundaries (distinct values, ascending)
        self.group_c = cs[self.starts] if cs.size else cs

    def _groups(self, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (row, group): total weight, failure weight, weighted sum of c."""
        if weights is None:
            w = np.ones((1, self.n))
        else:
            w = np.asarray(weights, dtype=float)
            w = w[None, :] if w.ndim == 1 else w
        ws = w[:, self.order]
        if self.n == 0:
            z = np.zeros((ws.shape[0], 0))
            return z, z, z
        tot = np.add.reduceat(ws, self.starts, axis=1)
        fail = np.add.reduceat(ws * (1.0 - self.ys), self.starts, axis=1)
        return tot, fail, tot * self.group_c[None, :]

    def compute(self, weights: np.ndarray | None = None, which: tuple[str, ...] = DIAGNOSTICS) -> dict[str, np.ndarray]:
        """Metric name -> array of shape (B,) (B = 1 when ``weights`` is None or 1-d)."""
        tot, fail, csum = self._groups(weights)
        succ = tot - fail
        N = tot.sum(axis=1)
        F = fail.sum(axis=1)
        S = N - F
        out: dict[str, np.ndarray] = {}
        with np.errstate(invalid="ignore", divide="ignore"):
            if "auroc" in which:
                # P(C_fail < C_succ) + 1/2 P(C_fail = C_succ); groups ascending in C
                s_above = S[:, None] - np.cumsum(succ, axis=1)
                out["auroc"] = np.where((F > 0) & (S > 0), (fail * (s_above + 0.5 * succ)).sum(axis=1) / (F * S), np.nan)
            if "auprc" in which:
                # average precision, thresholds at distinct values from the riskiest (lowest C) down
                tp = np.cumsum(fail, axis=1)
                pp = np.cumsum(tot, axis=1)
                prec = np.where(pp > 0, tp / np.where(pp > 0, pp, 1.0), 0.0)
                out["auprc"] = np.where(F > 0, (fail * prec).sum(axis=1) / F, np.nan)
            if "aurc" in which:
                # accept most confident first (groups descending in C); expected risk under random tie-breaking:
                # sum_{j=1}^{n_g} (F_b + j f_g/n_g)/(N_b + j) = F_b D + (f_g/n_g)(n_g - N_b D),
                # D = psi(N_b + n_g + 1) - psi(N_b + 1)
                tot_d, fail_d = tot[:, ::-1], fail[:, ::-1]
                nb = np.cumsum(tot_d, axis=1) - tot_d
                fb = np.cumsum(fail_d, axis=1) - fail_d
                d = digamma(nb + tot_d + 1.0) - digamma(nb + 1.0)
                rate = np.where(tot_d > 0, fail_d / np.where(tot_d > 0, tot_d, 1.0), 0.0)
                contrib = fb * d + rate * (tot_d - nb * d)
                out["aurc"] = np.where(N > 0, contrib.sum(axis=1) / N, np.nan)
            if "t_ece" in which:
                # tie-aware quantile bins: a block of ties goes to the bin of its first member's position
                K = self.n_bins
                start = np.cumsum(tot, axis=1) - tot
                b = np.minimum(np.floor(start * K / np.where(N > 0, N, 1.0)[:, None]), K - 1).astype(np.int64)
                rows = np.arange(tot.shape[0])[:, None] * K
                idx = (rows + b).ravel()
                sy = np.bincount(idx, weights=succ.ravel(), minlength=tot.shape[0] * K).reshape(-1, K)
                sc = np.bincount(idx, weights=csum.ravel(), minlength=tot.shape[0] * K).reshape(-1, K)
                out["t_ece"] = np.where(N > 0, np.abs(sy - sc).sum(axis=1) / N, np.nan)
            if "t_brier" in which:
                # sum_i w_i (c_i - y_i)^2 = sum_g [sum w c^2] - 2 [sum w c y] + [sum w y]
                c2 = tot * self.group_c[None, :] ** 2
                cy = succ * self.group_c[None, :]
                out["t_brier"] = np.where(N > 0, (c2 - 2.0 * cy + succ).sum(axis=1) / N, np.nan)
        return out


def _one(name: str, c: np.ndarray, y: np.ndarray, weights: np.ndarray | None, n_bins: int = N_BINS):
    r = ScalarDiagnostics(c, y, n_bins).compute(weights, (name,))[name]
    return float(r[0]) if (weights is None or np.ndim(weights) == 1) else r


def auroc(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None):
    """Failure-oriented AUROC (positive class Y=0, risk = low C), ties counted 1/2 (§5.1, Hanley & McNeil)."""
    return _one("auroc", c, y, weights)


def auprc(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None):
    """Failure-oriented average precision (positive class Y=0), one threshold per distinct value."""
    return _one("auprc", c, y, weights)


def aurc(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None):
    """Area under the risk–coverage curve, expected over random tie-breaking (lower is better)."""
    return _one("aurc", c, y, weights)


def t_ece(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None, n_bins: int = N_BINS):
    """Trajectory ECE (Eq. 10) with tie-aware quantile bins (10 by default)."""
    return _one("t_ece", c, y, weights, n_bins)


def t_brier(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None):
    """Scalarized trajectory Brier mean (C - Y)^2 (Eq. 12 with L = Brier; lower is better)."""
    return _one("t_brier", c, y, weights)


def scalarized_loss(c: np.ndarray, y: np.ndarray, loss: str = "brier") -> float:
    """Mean scalarized loss L(Φ(F), Y) of Eq. (12): ``brier`` (p-Y)^2 or ``log`` -[Y log p + (1-Y) log(1-p)]."""
    c = np.asarray(c, dtype=float)
    y = np.asarray(y, dtype=float)
    if loss == "brier":
        return float(np.mean((c - y) ** 2))
    p = np.clip(c, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))
