"""Comparisons between scored samples, and the calibrated stream of one run: pure functions to typed rows.

- :func:`censored_shift` -- complete-only vs censored extension per row and score family, with the censoring
  rate, Δ_practice/SE and Δ_practice per unit censoring rate (§6.3, Fig. 2A);
- :func:`exact_vs_simple` -- TPS^cen,exact (Eq. 4, q_Z from ``uqh continue``) vs TPS^cen,simple (Eq. 5) (§4.3);
- :func:`parse_error_sensitivity` -- the working sample vs parse errors treated as censored (Appendix G.2);
- :func:`missing_qz` -- censored episodes of a run without a q_hat_Z;
- :func:`calibrated_stream` -- the cross-fitted Platt per-step stream of one predictor (Appendix D).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from uqh.scoring.calibration import cross_fit_platt
from uqh.scoring.registry import DELTA_PRACTICE, TPS, TPS_COMPLETE_ONLY
from uqh.scoring.results import CensoredShiftRow, ExactVsSimpleRow, ParseErrorRow, RunScores
from uqh.scoring.streams import RunData, build_sample
from uqh.scoring.weights import DEFAULT_WEIGHTS, trajectory_weights


def _difference(a: float | None, b: float | None) -> float | None:
    return (b - a) if (a is not None and b is not None) else None


def censored_shift(scores: RunScores) -> list[CensoredShiftRow]:
    """Per row and score family of a censored-extension result (``censoring`` simple or exact): complete-only
    TPS, TPS_cen-ext, Δ_practice with its CI, the censoring rate n_censored / n_used, Δ/SE and Δ/rate."""
    out = []
    for r in scores.rows:
        for s in scores.settings.scores:
            d = r.estimate(DELTA_PRACTICE, s)
            n = r.n_complete + r.n_censored
            rate = r.n_censored / n if n else None
            out.append(CensoredShiftRow(
                predictor=r.predictor, calibration=r.calibration, score=s, n_complete=r.n_complete,
                n_censored=r.n_censored, censoring_rate=rate, tps_complete_only=r.estimate(TPS_COMPLETE_ONLY, s),
                tps_censored=r.estimate(TPS, s), delta_practice=d,
                delta_over_se=(d.value / d.se) if (d.value is not None and d.se) else None,
                delta_per_censoring_rate=(d.value / rate) if (d.value is not None and rate) else None,
            ))
    return out


def exact_vs_simple(exact: RunScores, simple: RunScores) -> list[ExactVsSimpleRow]:
    """Per row and score family of the exact result: its TPS (with CI), the simple result's TPS for the same
    predictor and calibration, their difference, and the complete-only TPS."""
    out = []
    for r in exact.rows:
        r_s = simple.row(r.predictor, r.calibration)
        for s in exact.settings.scores:
            a = r_s.value(TPS, s) if r_s is not None else None
            b = r.estimate(TPS, s)
            out.append(ExactVsSimpleRow(
                predictor=r.predictor, calibration=r.calibration, score=s, n_complete=r.n_complete,
                n_censored=r.n_censored, tps_simple=a, tps_exact=b, exact_minus_simple=_difference(a, b.value),
                tps_complete_only=r.value(TPS_COMPLETE_ONLY, s),
            ))
    return out


def parse_error_sensitivity(working: RunScores, with_parse_errors: RunScores) -> list[ParseErrorRow]:
    """Per row of the working-sample result that also exists with parse errors as censored, and score family:
    both TPS values and their difference (with − working)."""
    out = []
    for r in working.rows:
        r2 = with_parse_errors.row(r.predictor, r.calibration)
        if r2 is None:
            continue
        for s in working.settings.scores:
            a, b = r.value(TPS, s), r2.value(TPS, s)
            out.append(ParseErrorRow(
                predictor=r.predictor, calibration=r.calibration, score=s, n_working=r.n_used,
                n_with_parse_errors=r2.n_used,
                parse_errors_as_censored=with_parse_errors.counts.parse_errors_included_as_censored,
                tps_working=a, tps_with_parse_errors=b, difference=_difference(a, b),
            ))
    return out


def missing_qz(run: RunData, q_z: dict[str, float]) -> int:
    """Administratively censored episodes of ``run`` without a q_hat_Z in ``q_z``."""
    return sum(1 for e, st in zip(run.episode_ids, run.stop_reason) if st == "max_steps" and str(e) not in q_z)


@dataclass
class CalibratedStream:
    """A per-step stream laid out like a sample: trajectory i is ``values[offsets[i]:offsets[i+1]]``."""

    predictor: str
    episode_ids: np.ndarray
    offsets: np.ndarray
    values: np.ndarray

    def by_episode(self) -> dict[str, np.ndarray]:
        return {str(e): self.values[self.offsets[i]:self.offsets[i + 1]] for i, e in enumerate(self.episode_ids)}


def calibrated_stream(run: RunData, predictor: str, weights: str = DEFAULT_WEIGHTS) -> CalibratedStream | None:
    """The cross-fitted Platt stream of ``predictor`` on the complete trajectories of ``run`` (censoring
    excluded), fitted with ``weights``; None when no map can be fitted (Appendix D)."""
    s = build_sample(run, predictor, censoring="exclude")
    if s.n == 0:
        return None
    w = trajectory_weights(s.offsets, weights, s.horizon)
    try:
        fit = cross_fit_platt(s.values, s.offsets, s.y, s.delta, s.episode_ids, w)
    except ValueError:
        return None
    return CalibratedStream(predictor, s.episode_ids, s.offsets, fit.values)
