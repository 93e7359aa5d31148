"""Agreement between raters of ordinal scores: Krippendorff's α, Cohen's κ, exact and within-one agreement.

Used by :mod:`uqh.scoring.judges.analysis` for the stability of LLM judges across repeats (Agent GPA §4.1.4: each repeat is a
rater) and for judge-vs-human agreement (§4.1.2, Table 4: exact and off-by-one accuracy).

Krippendorff's α follows Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability" (values-by-units
coincidences): for unit u with m_u >= 2 pairable values and n_uc values c,

    o_ck = Σ_u (n_uc n_uk − [c = k] n_uc) / (m_u − 1),   n_c = Σ_k o_ck,   n = Σ_c n_c,
    α = 1 − D_o / D_e = 1 − (n − 1) Σ_ck o_ck δ²_ck / Σ_ck n_c n_k δ²_ck,

with the metric δ² of the level of measurement: nominal [c ≠ k]; interval (c − k)²; ordinal
(Σ_{g=c..k} n_g − (n_c + n_k)/2)², which depends on the marginal frequencies n_g of the ranked values.
Units with fewer than two values contribute nothing. α is undefined (NaN) when fewer than two values are
pairable or all pairable values are equal (D_e = 0).

Every α accepts unit multiplicities ``weights`` -- None, (n_units,) or (B, n_units) bootstrap counts -- and
evaluates all B rows at once (the paired bootstrap of :mod:`uqh.scoring.bootstrap`).
"""
from __future__ import annotations

import numpy as np

LEVELS = ("nominal", "ordinal", "interval")


def unit_value_counts(ratings: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n_units, V) counts n_uv of each value per unit; NaN ratings are missing. A rating outside ``values`` is a
    ValueError."""
    r = np.asarray(ratings, dtype=float)
    if r.ndim != 2:
        raise ValueError("ratings must be a 2-d array (units x raters)")
    values = np.asarray(values, dtype=float)
    present = np.isfinite(r)
    idx = np.searchsorted(values, np.where(present, r, values[0]))
    idx = np.clip(idx, 0, values.size - 1)
    if np.any(present & (values[idx] != r)):
        raise ValueError("a rating is not one of the given values")
    counts = np.zeros((r.shape[0], values.size))
    rows = np.repeat(np.arange(r.shape[0]), r.shape[1]).reshape(r.shape)
    np.add.at(counts, (rows[present], idx[present]), 1.0)
    return counts


def unit_coincidences(counts: np.ndarray) -> np.ndarray:
    """(n_units, V, V): each unit's contribution (n_uc n_uk − [c = k] n_uc) / (m_u − 1) to the coincidence
    matrix; zero for units with fewer than two values."""
    counts = np.asarray(counts, dtype=float)
    m = counts.sum(axis=1)
    pairs = counts[:, :, None] * counts[:, None, :]
    idx = np.arange(counts.shape[1])
    pairs[:, idx, idx] -= counts
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(m >= 2, 1.0 / np.maximum(m - 1.0, 1.0), 0.0)
    return pairs * scale[:, None, None]


def squared_distance(marginals: np.ndarray, values: np.ndarray, level: str) -> np.ndarray:
    """δ²_ck for every row of value marginals n_c (B, V) -> (B, V, V)."""
    marginals = np.atleast_2d(np.asarray(marginals, dtype=float))
    values = np.asarray(values, dtype=float)
    B, V = marginals.shape
    if level == "nominal":
        d = 1.0 - np.eye(V)
        return np.broadcast_to(d, (B, V, V)).copy()
    if level == "interval":
        d = (values[:, None] - values[None, :]) ** 2
        return np.broadcast_to(d, (B, V, V)).copy()
    if level == "ordinal":
        cum = np.cumsum(marginals, axis=1)  # Σ_{g <= k} n_g
        lo = np.minimum(np.arange(V)[:, None], np.arange(V)[None, :])
        hi = np.maximum(np.arange(V)[:, None], np.arange(V)[None, :])
        between = cum[:, hi] - cum[:, lo] + marginals[:, lo]  # Σ_{g=lo..hi} n_g
        ends = (marginals[:, :, None] + marginals[:, None, :]) / 2.0
        return (between - ends) ** 2
    raise ValueError(f"unknown level {level!r}; use one of {', '.join(LEVELS)}")


def krippendorff_alpha(
    ratings: np.ndarray,
    level: str = "ordinal",
    values: np.ndarray | None = None,
    weights: np.ndarray | None = None,
):
    """Krippendorff's α of ``ratings`` (units x raters, NaN = missing) at ``level`` (see the module docstring).

    ``values``: the ordered value domain (default: the distinct observed ratings); ``weights``: unit
    multiplicities. Returns a float, or a (B,) array for (B, n_units) weights; NaN where α is undefined.
    """
    r = np.asarray(ratings, dtype=float)
    if values is None:
        values = np.unique(r[np.isfinite(r)])
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return float("nan") if weights is None or np.ndim(weights) == 1 else np.full(np.shape(weights)[0], np.nan)
    per_unit = unit_coincidences(unit_value_counts(r, values))
    return alpha_from_coincidences(per_unit, values, level, weights)


def alpha_from_coincidences(per_unit: np.ndarray, values: np.ndarray, level: str, weights: np.ndarray | None = None):
    """α from per-unit coincidence matrices (n_units, V, V) -- computed once, reused for every resample."""
    n_units = per_unit.shape[0]
    single = weights is None or np.ndim(weights) == 1
    w = np.ones((1, n_units)) if weights is None else np.atleast_2d(np.asarray(weights, dtype=float))
    o = np.einsum("bu,uck->bck", w, per_unit)  # (B, V, V)
    n_c = o.sum(axis=2)
    n = n_c.sum(axis=1)
    d2 = squared_distance(n_c, values, level)
    observed = np.einsum("bck,bck->b", o, d2)
    expected = np.einsum("bc,bk,bck->b", n_c, n_c, d2)
    with np.errstate(invalid="ignore", divide="ignore"):
        alpha = np.where((expected > 0) & (n > 1), 1.0 - (n - 1.0) * observed / expected, np.nan)
    return float(alpha[0]) if single else alpha


# ------------------------------------------------------------------------------------------ two raters


KAPPA_WEIGHTS = (None, "linear", "quadratic")


def cohen_kappa(a: np.ndarray, b: np.ndarray, categories: np.ndarray, weights: str | None = None) -> float:
    """Cohen's κ of two raters' paired scores over ``categories`` (Cohen 1960; weighted, Cohen 1968):

    κ = 1 − Σ_ij v_ij p_ij / Σ_ij v_ij p_i. p_.j with disagreement weights v_ij = [i ≠ j] (unweighted),
    |i − j| (linear) or (i − j)² (quadratic), category indices i, j. NaN when there is no pair or the expected
    disagreement is 0 (both raters used one and the same category throughout).
    """
    if weights not in KAPPA_WEIGHTS:
        raise ValueError(f"unknown kappa weights {weights!r}; use None, 'linear' or 'quadratic'")
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    cats = np.asarray(categories, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("a and b must be 1-d arrays of the same length")
    if a.size == 0:
        return float("nan")
    ia, ib = np.searchsorted(cats, a), np.searchsorted(cats, b)
    if np.any(ia >= cats.size) or np.any(ib >= cats.size) or np.any(cats[np.minimum(ia, cats.size - 1)] != a) \
            or np.any(cats[np.minimum(ib, cats.size - 1)] != b):
        raise ValueError("a score is not one of the given categories")
    K = cats.size
    p = np.zeros((K, K))
    np.add.at(p, (ia, ib), 1.0)
    p /= a.size
    i, j = np.meshgrid(np.arange(K), np.arange(K), indexing="ij")
    v = {None: (i != j).astype(float), "linear": np.abs(i - j).astype(float), "quadratic": (i - j) ** 2.0}[weights]
    expected = np.outer(p.sum(axis=1), p.sum(axis=0))
    denom = float((v * expected).sum())
    return float("nan") if denom <= 0 else 1.0 - float((v * p).sum()) / denom


def exact_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Share of pairs with equal scores (NaN for no pair)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.mean(a == b)) if a.size else float("nan")


def within_one_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Share of pairs whose scores differ by at most one point (the paper's off-by-one accuracy)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.mean(np.abs(a - b) <= 1)) if a.size else float("nan")
