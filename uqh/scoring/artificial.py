"""Artificial-censoring validation (§6.2, Appendix I.1, Table 10): hide the outcomes of complete trajectories at
length-stratified rates and measure how far TPS^cen,simple moves from the complete-data TPS.

:func:`length_stratified_censoring` draws the design; :func:`artificial_censoring_analysis` scores it with
:func:`uqh.scoring.tps.artificial_censoring` (whose prefix-swap and tail-omission terms sum exactly to the shift).
"""
from __future__ import annotations

import numpy as np

from uqh.scoring.calibration import cross_fit_platt
from uqh.scoring.results import ArtificialCensoringRow
from uqh.scoring.rules import DEFAULT_SCORES, parse_score
from uqh.scoring.streams import RunData, build_sample
from uqh.scoring.tps import artificial_censoring
from uqh.scoring.weights import WEIGHT_SCHEMES, trajectory_weights

ARTIFICIAL_RATES = (0.25, 0.5, 0.75)


def length_stratified_censoring(lengths: np.ndarray, rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Which complete trajectories to censor artificially, and where (Appendix I.1's length-stratified rates).

    Within every length stratum T >= 2, ``round(rate * n_T)`` trajectories drawn with a seeded generator are
    censored at Z uniform on {1, ..., T-1}; one-step trajectories have no proper prefix and are never censored.
    Returns (z, censored); z = T for the uncensored ones.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    censored = np.zeros(lengths.size, dtype=bool)
    z = lengths.copy()
    for T in np.unique(lengths):
        if T < 2:
            continue
        idx = np.flatnonzero(lengths == T)
        k = int(round(rate * idx.size))
        chosen = rng.permutation(idx)[:k]
        censored[chosen] = True
        z[chosen] = rng.integers(1, T, size=k)
    return z, censored


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def artificial_censoring_analysis(
    run: RunData,
    predictor: str,
    seed: int,
    *,
    rates: tuple[float, ...] = ARTIFICIAL_RATES,
    scores: tuple[str, ...] = DEFAULT_SCORES,
    schemes: tuple[str, ...] = WEIGHT_SCHEMES,
) -> list[ArtificialCensoringRow]:
    """Table 10 rows on the complete trajectories of ``run`` (none when fewer than two): per weight schedule the
    cross-fitted Platt stream of ``predictor`` (the raw stream, with a note, when no map can be fitted), per
    rate r (design seed ``seed + index of r``) and score family: the complete-data TPS, the mean shift
    Δ = TPS^cen,simple − TPS^complete over all trajectories and per label, its prefix-swap and tail-omission
    means, and the largest residual of the exact decomposition."""
    s = build_sample(run, predictor, censoring="exclude")
    if s.n < 2:
        return []
    lengths = np.diff(s.offsets)
    y = s.y
    rows = []
    for scheme in schemes:
        w = trajectory_weights(s.offsets, scheme, s.horizon)
        try:
            values = cross_fit_platt(s.values, s.offsets, s.y, s.delta, s.episode_ids, w).values
            calibration, note = "platt", None
        except ValueError as exc:
            values, calibration, note = s.values, "raw", f"Platt unavailable: {exc}"
        for k, rate in enumerate(rates):
            z, cens = length_stratified_censoring(lengths, rate, seed + k)
            for spec in scores:
                rule = parse_score(spec)
                out = artificial_censoring(values, s.offsets, y, z, cens, rule, scheme)
                d = out["censored"] - out["complete"]
                err = np.abs(d - (out["prefix_swap"] + out["tail_omission"]))
                rows.append(ArtificialCensoringRow(
                    predictor=predictor, calibration=calibration, note=note, rate=rate, score=rule.name,
                    weights=scheme, n=s.n, n_censored=int(cens.sum()), tps_complete=float(out["complete"].mean()),
                    delta_mean=float(d.mean()), delta_y0=_mean(d[y == 0]), delta_y1=_mean(d[y == 1]),
                    prefix_swap_mean=float(out["prefix_swap"].mean()),
                    tail_omission_mean=float(out["tail_omission"].mean()),
                    max_abs_decomposition_error=float(err.max()),
                ))
    return rows
