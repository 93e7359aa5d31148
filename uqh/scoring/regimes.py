"""The sign regime of Δ_practice and the margin over the base rate (Appendix I.2, Tables 13–14).

- :func:`delta_sign` -- one sign for a set of Δ_practice cells (Table 13's entries);
- :func:`mean_forecast` -- F̄, the mean per-step forecast of a stream (Table 13's F̄ column);
- :func:`margin_change` -- shrinkage in % and rank flip of a margin over the base rate (Table 14's last columns);
- :func:`sign_regime` -- Table 13 rows from the per-weight-schedule results of one run;
- :func:`margin_over_base_rate` -- Table 14 rows from the same results;
- :func:`mean_forecasts` -- F̄ of every per-step predictor row of a run under the simple censored extension.

Pure functions on numbers and on :class:`RunScores`; results are typed rows of :mod:`uqh.scoring.results`.
"""
from __future__ import annotations

import numpy as np

from uqh.scoring.pipeline import ScoreOptions, platt_stream
from uqh.scoring.registry import BASE_RATE, DELTA_PRACTICE, TPS, TPS_COMPLETE_ONLY, get_predictor
from uqh.scoring.results import MarginRow, RunScores, SignRegimeRow
from uqh.scoring.streams import RunData, build_sample

#: Table 13's entries: every cell positive, every cell negative, or not one sign
POSITIVE, NEGATIVE, MIXED = "+", "-", "mixed"


def delta_sign(deltas: list[float | None]) -> str | None:
    """The sign summarising Δ_practice cells (Table 13: "each sign summarizes the corresponding score-family
    rows"): ``+`` when every cell is > 0, ``-`` when every cell is < 0, ``mixed`` otherwise (a zero cell is neither
    sign). None when no cell has a value; missing cells are ignored only when others exist."""
    values = np.array([d for d in deltas if d is not None], dtype=float)
    if values.size == 0:
        return None
    if np.all(values > 0):
        return POSITIVE
    if np.all(values < 0):
        return NEGATIVE
    return MIXED


def mean_forecast(values: np.ndarray) -> float | None:
    """F̄ of Table 13: the mean of a stream's per-step forecasts F_t, pooled over every observed step of the
    sample (complete trajectories and censored prefixes). The paper does not spell the pooling out; pooling
    steps is what the prefix-swap sign log(1 − F_t) − log F_t of Appendix I.1 depends on. None when empty or NaN."""
    values = np.asarray(values, dtype=float)
    if values.size == 0 or not np.all(np.isfinite(values)):
        return None
    return float(values.mean())


def margin_change(margin_complete: float | None, margin_censored: float | None) -> tuple[float | None, bool | None]:
    """Table 14's "Shrinkage" and "Rank change?" of a predictor's margin over the base rate,
    m = TPS_predictor − TPS_base, from complete-only (m_comp) to the censored extension (m_cen).

    Shrinkage is the change of the margin's size, 100 · (|m_cen| − |m_comp|) / |m_comp|: negative when the margin
    shrinks toward 0, positive when it grows, whichever side of the base rate the predictor is on (the paper's
    +0.0123 → +0.0086 is −30%; −0.02 → −0.01 is −50%). A rank flip is a change of sign of the margin (the predictor
    and the base rate swap places); the paper prints "rank flip" instead of a percentage there, so the shrinkage is
    None when the rank flips or m_comp is 0. (None, None) when a margin is missing."""
    if margin_complete is None or margin_censored is None:
        return None, None
    flip = bool(np.sign(margin_complete) != np.sign(margin_censored))
    if flip or margin_complete == 0:
        return None, flip
    return 100.0 * (abs(margin_censored) - abs(margin_complete)) / abs(margin_complete), flip


#: A margin smaller than this fraction of the scores it is the difference of is rounding noise (a predictor whose
#: Platt map fell back to the base rate scores the same up to ~1e-16): it is 0.
MARGIN_NOISE = 1e-12


def margin(score: float, base: float) -> float:
    """``score − base``, 0.0 when the difference is rounding noise (:data:`MARGIN_NOISE`)."""
    diff = score - base
    return 0.0 if abs(diff) <= MARGIN_NOISE * max(abs(score), abs(base)) else diff


def sign_regime(by_weights: dict[str, RunScores], forecasts: dict[tuple[str, str], float | None]) -> list[SignRegimeRow]:
    """Table 13: per non-constant predictor row (raw and Platt), F̄ (``forecasts``, by (predictor, calibration))
    and, per weight schedule, the sign of Δ_practice over the score families (:func:`delta_sign`), with the counts
    of positive and negative cells. Results without Δ_practice (no censored trajectories) give no rows."""
    keys: list[tuple[str, str]] = []
    for res in by_weights.values():
        for r in res.rows:
            if not get_predictor(r.predictor).is_constant and (r.predictor, r.calibration) not in keys:
                keys.append((r.predictor, r.calibration))
    out = []
    for predictor, cal in keys:
        signs: dict[str, str | None] = {}
        cells: list[float] = []
        for scheme, res in by_weights.items():
            row = res.row(predictor, cal)
            deltas = [row.value(DELTA_PRACTICE, s) for s in res.settings.scores] if row is not None else []
            signs[scheme] = delta_sign(deltas)
            cells += [d for d in deltas if d is not None]
        if not cells:
            continue
        out.append(SignRegimeRow(
            predictor=predictor, calibration=cal, mean_forecast=forecasts.get((predictor, cal)), signs=signs,
            n_positive=sum(d > 0 for d in cells), n_negative=sum(d < 0 for d in cells), n_cells=len(cells),
        ))
    return out


def margin_over_base_rate(by_weights: dict[str, RunScores], score: str = "log") -> list[MarginRow]:
    """Table 14: per weight schedule and non-constant predictor row, the margin over the base-rate reference
    under complete-only scoring (TPS_comp − TPS_base) and under the censored extension (TPS_cen-ext − TPS_base),
    both on ``score``, with the shrinkage and rank flip of :func:`margin_change`. The base rate is the row of the
    same result (trained on the same labels). Results without a censored extension give no rows."""
    out = []
    for scheme, res in by_weights.items():
        base = res.row(BASE_RATE, "raw")
        if base is None or score not in res.settings.scores:
            continue
        base_comp, base_cen = base.value(TPS_COMPLETE_ONLY, score), base.value(TPS, score)
        for r in res.rows:
            if get_predictor(r.predictor).is_constant:
                continue
            comp, cen = r.value(TPS_COMPLETE_ONLY, score), r.value(TPS, score)
            if comp is None or base_comp is None:
                continue
            m_comp = margin(comp, base_comp)
            m_cen = margin(cen, base_cen) if (cen is not None and base_cen is not None) else None
            shrinkage, flip = margin_change(m_comp, m_cen)
            out.append(MarginRow(predictor=r.predictor, calibration=r.calibration, weights=scheme, score=score,
                                 margin_complete_only=m_comp, margin_censored=m_cen, shrinkage_percent=shrinkage,
                                 rank_flip=flip))
    return out


def mean_forecasts(run: RunData, res: RunScores) -> dict[tuple[str, str], float | None]:
    """F̄ (:func:`mean_forecast`) of every non-constant row of ``res`` on its sample of ``run`` (same censoring,
    labels and weights, so the Platt stream is the one ``res`` was scored with)."""
    opts = ScoreOptions(weights=res.settings.weights, censoring=res.settings.censoring, labels=res.settings.labels)
    out: dict[tuple[str, str], float | None] = {}
    for predictor in dict.fromkeys(r.predictor for r in res.rows):
        if get_predictor(predictor).is_constant:
            continue
        sample = build_sample(run, predictor, censoring=res.settings.censoring, labels=res.settings.labels,
                              include_parse_errors=res.settings.include_parse_errors)
        out[(predictor, "raw")] = mean_forecast(sample.values)
        if res.row(predictor, "platt") is not None:
            values, _ = platt_stream(sample, opts)
            out[(predictor, "platt")] = mean_forecast(values) if values is not None else None
    return out
