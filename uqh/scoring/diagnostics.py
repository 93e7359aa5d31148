"""Diagnostics on a trajectory scalar C_i, and the AUQ scalar aggregators (§5.1, Appendix B, Appendix F).

Orientation (Appendix F "Metrics"): AUROC and AUPRC are failure-oriented -- the positive class is Y = 0 and
the risk score is low C; AURC is the area under the risk–coverage curve (accept the most confident first,
risk = failure rate of the accepted; lower is better); T-ECE is tie-aware quantile-binned calibration error
with 10 bins (Eq. 10 with empirical bins); T-Brier is the scalarized trajectory Brier mean (C - Y)^2 (Eq. 12).

Tie handling: tied scalars are never split. AUROC counts ties as 1/2 (Mann–Whitney); AUPRC is average
precision with one threshold per distinct value; AURC is the expected area under uniformly random
tie-breaking (closed form through the digamma function); T-ECE assigns a whole block of tied values to the
quantile bin of its first member. Scalars equal to 12 significant digits count as tied (a relative float-rounding
tolerance, :func:`tie_rounded`): trajectory probabilities of 1e-200 keep their order, where rounding to 12 decimals
would flatten every value below 5e-13 to one tie at 0.

Every metric accepts resampling ``weights`` -- ``None``, shape (n,), or (B, n) bootstrap counts -- and is then
evaluated for all B rows at once from a single sort of C (the paired bootstrap of :mod:`uqh.scoring.bootstrap`).
"""
from __future__ import annotations

import numpy as np
from scipy.special import digamma

from uqh.scoring import failure_association as fa


N_BINS = 10
#: AUARC on tied scalars: the mean over tie-breaking orders (uqh), or the input order (agentuq's stable sort)
AUARC_TIES = ("mean", "input")
TIE_DIGITS = 12  # significant digits that decide a tie
DIAGNOSTICS = ("auroc", "auprc", "aurc", "t_ece", "t_brier")
#: every quantity :meth:`ScalarDiagnostics.compute` knows: the paper's five and agentuq's four (failure_association)
ALL_DIAGNOSTICS = DIAGNOSTICS + fa.AGENTUQ_METRICS


# ------------------------------------------------------------------------------------------ scalar summaries


def trajectory_scalar(values: np.ndarray, offsets: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The default scalar summary: the weighted normalised trajectory mean Σ_t w_t F_t / Σ_t w_t (Appendix F:
    "front-weighted normalized trajectory summary" with the linear-front weights)."""
    from uqh.scoring.tps import per_trajectory_sum

    w = np.asarray(weights, dtype=float)
    return per_trajectory_sum(w * values, offsets) / per_trajectory_sum(w, offsets)


def phi_last(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """AUQ Φ_last(F_{1:T}) = F_T (Appendix B.2, Corollary B1)."""
    return np.asarray(values, dtype=float)[np.asarray(offsets)[1:] - 1]


def phi_avg(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """AUQ Φ_avg(F_{1:T}) = (1/T) Σ_t F_t (Appendix B.2, Corollary B2)."""
    from uqh.scoring.tps import per_trajectory_sum

    offsets = np.asarray(offsets, dtype=np.int64)
    return per_trajectory_sum(values, offsets) / np.diff(offsets)


def phi_min(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """AUQ Φ_min(F_{1:T}) = min_t F_t (Appendix B.2, Corollary B3)."""
    return np.minimum.reduceat(np.asarray(values, dtype=float), np.asarray(offsets, dtype=np.int64)[:-1])


AGGREGATORS = {"last": phi_last, "avg": phi_avg, "min": phi_min}


# ------------------------------------------------------------------------------------------ metrics


def tie_rounded(c: np.ndarray, digits: int = TIE_DIGITS) -> np.ndarray:
    """``c`` rounded to ``digits`` significant digits (mantissa and decimal exponent apart, so 1e-300 neither
    overflows nor underflows): a monotone map, so the order of distinct values is kept except where they agree to
    ``digits`` digits. Zeros stay zero."""
    c = np.asarray(c, dtype=float)
    out = c.copy()
    nonzero = c != 0
    if nonzero.any():
        # subnormals (< 1e-307) share the smallest normal scale: they round to 0 together
        exponent = np.maximum(np.floor(np.log10(np.abs(c[nonzero]))), -307.0)
        scale = 10.0 ** exponent
        out[nonzero] = np.round(c[nonzero] / scale, digits - 1) * scale
    return out



class ScalarDiagnostics:
    """The five diagnostics of a scalar ``c`` against outcomes ``y`` (one sort, reused for every weighting).

    Internally everything is expressed through two cumulative sums over the distinct values of C in
    ascending order, per resample row: failures ``tp`` and all trajectories ``pp`` at or below each value.
    """

    def __init__(self, c: np.ndarray, y: np.ndarray, n_bins: int = N_BINS, auarc_ties: str = "mean"):
        c = np.asarray(c, dtype=float)
        y = np.asarray(y, dtype=float)
        if c.shape != y.shape or c.ndim != 1:
            raise ValueError("c and y must be 1-d arrays of the same length")
        if not np.all(np.isfinite(c)) or not np.all(np.isin(y, (0.0, 1.0))):
            raise ValueError("diagnostics need finite scalars and outcomes Y in {0, 1}")
        # Tie tolerance: scalars equal to 12 significant digits are one tie block, so that weighted means of a
        # constant stream over different horizons (equal up to float rounding) tie as they should.
        c = tie_rounded(c)
        self.n = c.size
        self.n_bins = n_bins
        if auarc_ties not in AUARC_TIES:
            raise ValueError(f"unknown AUARC tie rule {auarc_ties!r}; use mean or input")
        self.auarc_ties = auarc_ties  # "mean": expected over orders (uqh); "input": input order (agentuq)
        self.order = np.argsort(c, kind="stable")  # ascending C
        cs = c[self.order]
        self.c_sorted = cs
        self.ys = y[self.order]
        self.fail_sorted = 1.0 - self.ys
        new = np.ones(cs.size, dtype=bool)
        new[1:] = cs[1:] != cs[:-1]
        self.starts = np.flatnonzero(new)  # group boundaries (distinct values, ascending)
        self.has_ties = self.starts.size != cs.size
        self.group_c = cs[self.starts] if cs.size else cs
        self.sq_err = (c - y) ** 2  # original order, for T-Brier
        self._psi: np.ndarray | None = None

    def _psi1(self, x: np.ndarray, integer: bool, upper: float) -> np.ndarray:
        """digamma(x + 1) for 0 <= x <= upper; a table lookup when x holds integers (bootstrap counts)."""
        if not integer:
            return digamma(x + 1.0)
        m = int(upper)
        if self._psi is None or self._psi.size <= m:
            self._psi = digamma(np.arange(max(m + 1, 2 * self.n + 2), dtype=float) + 1.0)
        return self._psi[x.astype(np.int64)]

    def compute(
        self, weights: np.ndarray | None = None, which: tuple[str, ...] = DIAGNOSTICS, integer_weights: bool | None = None
    ) -> dict[str, np.ndarray]:
        """Metric name -> array of shape (B,) (B = 1 when ``weights`` is None or 1-d).

        ``integer_weights``: the weights are whole numbers (bootstrap counts; default: True when ``weights`` is
        None, detected otherwise) -- enables the exact table lookup for AURC's digamma terms.
        """
        if weights is None:
            w = np.ones((1, self.n))
            integer_weights = True
        else:
            w = np.asarray(weights, dtype=float)
            w = w[None, :] if w.ndim == 1 else w
            if integer_weights is None:
                integer_weights = bool(np.all(w == np.floor(w)))
        rows = w.shape[0]
        if self.n == 0:
            return {k: np.full(rows, np.nan) for k in which}
        ws = np.take(w, self.order, axis=1)  # C-contiguous rows (w[:, order] is column-major)
        if self.has_ties:
            tot = np.add.reduceat(ws, self.starts, axis=1)
            fail = np.add.reduceat(ws * self.fail_sorted, self.starts, axis=1)
            rate = np.divide(fail, tot, out=np.zeros_like(tot), where=tot > 0)
        else:
            # no ties in the data: copies of one trajectory in a resample share its label
            tot = ws
            fail = ws * self.fail_sorted
            rate = self.fail_sorted
        tp = np.cumsum(fail, axis=1)  # failures with C <= group value
        pp = np.cumsum(tot, axis=1)  # all with C <= group value
        N = pp[:, -1].copy()
        F = tp[:, -1].copy()
        S = N - F
        buf = np.empty_like(pp)
        out: dict[str, np.ndarray] = {}

        def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.einsum("ij,ij->i", a, b)

        with np.errstate(invalid="ignore", divide="ignore"):
            if "auroc" in which or "kendall_failure" in which:
                # P(C_fail < C_succ) + 1/2 P(tie) = sum_g f_g (S - cs_g + s_g/2) / (F S), cs = pp - tp (cum. successes)
                # = [F S - sum f pp + sum f tp + (sum f t - sum f f)/2] / (F S)
                num = F * S - rowdot(fail, pp) + rowdot(fail, tp)
                if self.has_ties:
                    num += 0.5 * (rowdot(fail, tot) - rowdot(fail, fail))
                if "auroc" in which:
                    out["auroc"] = np.where((F > 0) & (S > 0), num / (F * S), np.nan)
                if "kendall_failure" in which:
                    out["kendall_failure"] = fa.kendall_tau_b(num, tot, N, F)
            if "pearson_failure" in which:
                out["pearson_failure"] = fa.pearson(ws, self.c_sorted, self.ys)
            if "spearman_failure" in which:
                out["spearman_failure"] = fa.spearman(tot, fail, pp)
            if "auprc" in which:
                # average precision: thresholds at distinct values from the riskiest (lowest C) down
                # (where pp = 0 also tp = 0 and f = 0, so the floor only avoids 0/0)
                np.maximum(pp, 1e-300, out=buf)
                np.divide(tp, buf, out=buf)
                out["auprc"] = np.where(F > 0, rowdot(fail, buf) / F, np.nan)
            if "aurc" in which or "auarc" in which:
                # accept the most confident first. Group g (descending C) has n_b = N - pp_g accepted before it,
                # f_b = F - tp_g failures before it; under random tie-breaking its positions contribute
                # sum_{j=1}^{t_g} (f_b + j f_g/t_g)/(n_b + j) = f_b D_g + f_g - (f_g/t_g) n_b D_g,
                # D_g = psi(n_b + t_g + 1) - psi(n_b + 1) = psi(N - pp_{g-1} + 1) - psi(N - pp_g + 1).
                np.subtract(N[:, None], pp, out=buf)  # n_b
                psi = self._psi1(buf, integer_weights, N.max())  # psi(n_b + 1)
                e = np.subtract(F[:, None], tp)  # f_b
                buf *= rate
                e -= buf  # e_g = f_b - rate_g n_b
                # sum_g e_g (psi_{g-1} - psi_g), psi_{-1} = psi(N + 1)
                first = e[:, 0] * self._psi1(N, integer_weights, N.max())
                acc = first + rowdot(e[:, 1:], psi[:, :-1]) - rowdot(e, psi)
                aurc = np.where(N > 0, (acc + F) / N, np.nan)
                if "aurc" in which:
                    out["aurc"] = aurc
                if "auarc" in which:
                    out["auarc"] = (fa.auarc_from_aurc(aurc, N, F) if self.auarc_ties == "mean"
                                    else fa.auarc_in_order(ws, self.ys))
                del e, psi
            if "t_ece" in which:
                # tie-aware quantile bins: group g (a block of ties) is in bin floor(K * pp_{g-1} / N); per-bin sums
                # of successes from the cumulative sums at the bin ends, of C by one dot product per bin
                K = self.n_bins
                thr = np.arange(1, K)[None, :] * N[:, None] / K - 1e-9 * np.maximum(N[:, None], 1.0)
                G = pp.shape[1]
                gc = self.group_c
                ece = np.zeros(rows)
                for r in range(rows):
                    # first group whose start position pp_{g-1} >= k N / K  ->  bin boundaries
                    b = np.minimum(np.searchsorted(pp[r], thr[r], side="left") + 1, G)
                    edges = np.concatenate([[0], b, [G]])
                    ends = edges[1:] - 1
                    cs_end = np.concatenate([[0.0], pp[r][ends] - tp[r][ends]])
                    succ_bins = np.diff(cs_end)
                    tr = tot[r]
                    c_bins = np.array([np.einsum('i,i->', tr[a:z], gc[a:z]) for a, z in zip(edges[:-1], edges[1:])])
                    ece[r] = np.abs(succ_bins - c_bins).sum()
                out["t_ece"] = np.where(N > 0, ece / N, np.nan)
            if "t_brier" in which:
                out["t_brier"] = np.where(N > 0, np.einsum("ij,j->i", w, self.sq_err) / N, np.nan)
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


def auarc(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None, ties: str = "mean"):
    """agentuq's area under the accuracy–rejection curve (higher is better): on tied values expected over random
    tie-breaking (``ties="mean"``), or in input order as agentuq's stable sort takes them (``ties="input"``)."""
    r = ScalarDiagnostics(c, y, auarc_ties=ties).compute(weights, ("auarc",))["auarc"]
    return float(r[0]) if (weights is None or np.ndim(weights) == 1) else r


def pearson_failure(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None):
    """Pearson correlation of 1 − C with 1 − Y (agentuq's Pearson of uncertainty with −reward)."""
    return _one("pearson_failure", c, y, weights)


def spearman_failure(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None):
    """Spearman correlation (average ranks) of 1 − C with 1 − Y (agentuq's Spearman)."""
    return _one("spearman_failure", c, y, weights)


def kendall_failure(c: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None):
    """Kendall τ-b of 1 − C with 1 − Y (agentuq's Kendall tau-b)."""
    return _one("kendall_failure", c, y, weights)


def scalarized_loss(c: np.ndarray, y: np.ndarray, loss: str = "brier") -> float:
    """Mean scalarized loss L(Φ(F), Y) of Eq. (12): ``brier`` (p-Y)^2 or ``log`` -[Y log p + (1-Y) log(1-p)]."""
    c = np.asarray(c, dtype=float)
    y = np.asarray(y, dtype=float)
    if loss == "brier":
        return float(np.mean((c - y) ** 2))
    p = np.clip(c, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))
