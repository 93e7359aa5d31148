"""Tables 13 and 14 (Appendix I.2): the sign regime of Δ_practice next to F̄, and the margin over the base rate.

The paper prints the inputs both tables are made of: Table 11/12 give Δ_practice per predictor, score family and
weight schedule; Table 13 gives F̄; Table 14 gives the complete-only margin, and the censored margin is the
complete-only margin plus the predictor's Δ_practice minus the base rate's (both Table 11). The tests feed those
printed numbers through the scoring functions and compare with the printed rows; closed-form cases check
:func:`mean_forecast` on a real sample.
"""
from __future__ import annotations

import numpy as np
import pytest

from uqh.scoring.pipeline import ScoreOptions, platt_stream, score_run
from uqh.scoring.regimes import (
    delta_sign,
    margin_change,
    margin_over_base_rate,
    mean_forecast,
    mean_forecasts,
    sign_regime,
)
from uqh.scoring.registry import DELTA_PRACTICE, TPS, TPS_COMPLETE_ONLY
from uqh.scoring.results import Estimate, MetricEstimate, PredictorResult, RunScores, SampleCounts
from uqh.scoring.streams import build_sample
from uqh.scoring.weights import WEIGHT_SCHEMES
from test_scoring_labels import webshop_working_sample

SCORES = ("log", "brier", "beta(2,4)")
#: Table 11 (and Table 12 for token_prob): Δ_practice per weight schedule, (log, Brier, Beta(2,4)), Platt rows
TABLE11 = {
    "verbal": {"linear-front": (0.1586, 0.0766, 0.00060), "uniform": (0.1559, 0.0736, 0.00072),
               "exponential-front": (0.1520, 0.0735, 0.00047), "linear-back": (0.1463, 0.0707, 0.00036)},
    "token_entropy": {"linear-front": (0.1585, 0.0776, 0.00054), "uniform": (0.1573, 0.0769, 0.00054),
                      "exponential-front": (0.1567, 0.0769, 0.00047), "linear-back": (0.1601, 0.0783, 0.00058)},
    "action_entropy": {s: (0.1623, 0.0797, 0.00057) for s in WEIGHT_SCHEMES},
    "action_prob": {"linear-front": (0.1623, 0.0797, 0.00057), "uniform": (0.1618, 0.0793, 0.00056),
                    "exponential-front": (0.1623, 0.0797, 0.00057), "linear-back": (0.1623, 0.0797, 0.00057)},
    "token_prob": {"linear-front": (-2.0686, -0.1175, -0.00241), "uniform": (-2.0700, -0.1182, -0.00243),
                   "exponential-front": (-2.0686, -0.1175, -0.00241), "linear-back": (-2.0686, -0.1175, -0.00241)},
}
TABLE11_BASE = (0.1623, 0.0797, 0.00057)  # base-rate reference, every schedule
#: Table 13: F̄ and the printed sign under every schedule
TABLE13 = {"verbal": (0.38, "+"), "token_entropy": (0.38, "+"), "action_entropy": (0.38, "+"),
           "action_prob": (0.38, "+"), "token_prob": (0.70, "-")}
#: Table 14: complete-only margin, censored margin, printed shrinkage % (None: "rank flip"), rank change
TABLE14 = {"linear-front": (0.0123, 0.0086, -30, False), "uniform": (0.0301, 0.0237, -21, False),
           "exponential-front": (0.0079, -0.0025, None, True), "linear-back": (0.0476, 0.0316, -34, False)}
#: WebShop's complete-only base-rate log TPS is not printed per schedule; any value works (margins are differences)
BASE_COMPLETE_LOG = -0.83


def _metric(name, score, value):
    return MetricEstimate(metric=name, score=score, estimate=Estimate(value=value))


def _row(predictor, cal, metrics):
    return PredictorResult(predictor=predictor, label=predictor, calibration=cal, n_used=308, n_complete=163,
                           n_censored=145, n_skipped_missing=0, metrics=metrics)


def _scores(scheme: str, rows: list[PredictorResult]) -> RunScores:
    settings = ScoreOptions(weights=scheme, censoring="simple").settings()
    return RunScores(run_dir="webshop", domain="webshop", model="m", settings=settings, counts=SampleCounts(),
                     rows=rows)


def _table11_results() -> dict[str, RunScores]:
    """Per weight schedule, a RunScores with the printed Δ_practice of every Platt row and the base rate, and the
    log TPS (complete-only, censored) of verbal Platt and the base rate implied by Table 14's margins."""
    out = {}
    for scheme in WEIGHT_SCHEMES:
        rows = []
        for predictor, by_scheme in TABLE11.items():
            metrics = [_metric(DELTA_PRACTICE, s, d) for s, d in zip(SCORES, by_scheme[scheme])]
            if predictor == "verbal":
                comp = BASE_COMPLETE_LOG + TABLE14[scheme][0]
                metrics += [_metric(TPS_COMPLETE_ONLY, "log", comp), _metric(TPS, "log", comp + by_scheme[scheme][0])]
            rows.append(_row(predictor, "platt", metrics))
        base = [_metric(DELTA_PRACTICE, s, d) for s, d in zip(SCORES, TABLE11_BASE)]
        base += [_metric(TPS_COMPLETE_ONLY, "log", BASE_COMPLETE_LOG),
                 _metric(TPS, "log", BASE_COMPLETE_LOG + TABLE11_BASE[0])]
        rows.append(_row("base_rate", "raw", base))
        out[scheme] = _scores(scheme, rows)
    return out


def test_table_13_reproduced_from_table_11():
    forecasts = {(p, "platt"): f for p, (f, _) in TABLE13.items()}
    rows = sign_regime(_table11_results(), forecasts)
    assert [r.predictor for r in rows] == list(TABLE11)  # the base rate is the reference, not a row
    for r in rows:
        f_bar, sign = TABLE13[r.predictor]
        assert r.mean_forecast == f_bar
        assert r.signs == {s: sign for s in WEIGHT_SCHEMES}
    # "Across the 5 × 3 × 4 = 60 non-reference cells, 48 are positive and 12 are negative", all 12 token_prob
    assert sum(r.n_cells for r in rows) == 60
    assert (sum(r.n_positive for r in rows), sum(r.n_negative for r in rows)) == (48, 12)
    assert next(r for r in rows if r.predictor == "token_prob").n_negative == 12


def test_table_14_reproduced_from_table_11_and_the_complete_only_margin():
    rows = margin_over_base_rate(_table11_results(), "log")
    assert [(r.predictor, r.calibration) for r in rows] == [("verbal", "platt")] * 4
    assert [r.weights for r in rows] == list(WEIGHT_SCHEMES)
    for r in rows:
        comp, cen, shrink, flip = TABLE14[r.weights]
        assert r.margin_complete_only == pytest.approx(comp, abs=1e-12)
        assert r.margin_censored == pytest.approx(cen, abs=1.5e-4)  # printed digits of three tables
        assert r.rank_flip is flip
        assert (round(r.shrinkage_percent) if r.shrinkage_percent is not None else None) == shrink


def test_margin_change_closed_forms_and_edges():
    assert margin_change(0.0123, 0.0086) == (pytest.approx(100 * (0.0086 - 0.0123) / 0.0123), False)
    # one sign convention on both sides of the base rate: negative = the margin shrinks toward 0 (issue 43)
    assert margin_change(-0.02, -0.01) == (pytest.approx(-50.0), False)
    assert margin_change(-0.01, -0.02) == (pytest.approx(100.0), False)
    assert margin_change(0.01, 0.02) == (pytest.approx(100.0), False)
    assert margin_change(0.0079, -0.0025) == (None, True)
    assert margin_change(-0.01, 0.01) == (None, True)
    assert margin_change(0.0, 0.0) == (None, False)
    assert margin_change(None, 0.1) == (None, None)
    assert margin_change(0.1, None) == (None, None)


def test_a_margin_at_rounding_noise_is_zero():
    """Issue 43: a Platt map that fell back to the base rate scores the same up to ~1e-16; its margin is 0, not
    -8.47e-22, and its shrinkage is left empty instead of a percentage of noise."""
    from uqh.scoring.regimes import margin

    base = 0.6931471805599453
    assert margin(base + 1e-17, base) == 0.0 and margin(base, base + 2e-16) == 0.0
    assert margin(base + 1e-6, base) == pytest.approx(1e-6)
    assert margin_change(margin(base + 1e-17, base), 0.01) == (None, True)


def test_delta_sign():
    assert delta_sign([0.1, 0.2, 1e-9]) == "+"
    assert delta_sign([-0.1, -2.0]) == "-"
    assert delta_sign([0.1, -0.1]) == "mixed"
    assert delta_sign([0.1, 0.0]) == "mixed"  # zero is neither sign
    assert delta_sign([None, -0.3]) == "-"
    assert delta_sign([None, None]) is None
    assert delta_sign([]) is None


def test_mean_forecast_edges():
    assert mean_forecast(np.array([0.2, 0.4, 0.9])) == pytest.approx(0.5)
    assert mean_forecast(np.array([])) is None
    assert mean_forecast(np.array([0.2, np.nan])) is None


def test_regimes_on_a_scored_sample_match_the_scoring_api():
    """On a real scored sample: F̄ is the pooled mean of the very streams the rows were scored with, the signs are
    the signs of the rows' Δ_practice, and the margins are the rows' TPS minus the base rate's."""
    run = webshop_working_sample(forecast=lambda dy, rng, T: np.clip(0.3 + 0.4 * dy + rng.normal(0, 0.1, T), 0.01, 0.99))
    by_weights = {s: score_run(run, ScoreOptions(weights=s, censoring="simple", n_bootstrap=0, auq=False,
                                                 predictors=("verbal", "base_rate"))) for s in WEIGHT_SCHEMES}
    primary = by_weights["linear-front"]
    forecasts = mean_forecasts(run, primary)
    sample = build_sample(run, "verbal", censoring="simple")
    platt, _ = platt_stream(sample, ScoreOptions(weights="linear-front", censoring="simple"))
    assert forecasts[("verbal", "raw")] == pytest.approx(float(np.mean(sample.values)), abs=1e-12)
    assert forecasts[("verbal", "platt")] == pytest.approx(float(np.mean(platt)), abs=1e-12)
    assert ("base_rate", "raw") not in forecasts
    rows = sign_regime(by_weights, forecasts)
    assert {(r.predictor, r.calibration) for r in rows} == {("verbal", "raw"), ("verbal", "platt")}
    for r in rows:
        for scheme, res in by_weights.items():
            deltas = [res.row(r.predictor, r.calibration).value(DELTA_PRACTICE, s) for s in res.settings.scores]
            assert r.signs[scheme] == delta_sign(deltas)
    margins = margin_over_base_rate(by_weights, "log")
    assert len(margins) == 2 * len(WEIGHT_SCHEMES)
    for m in margins:
        res = by_weights[m.weights]
        row, base = res.row(m.predictor, m.calibration), res.row("base_rate", "raw")
        assert m.margin_complete_only == pytest.approx(row.value(TPS_COMPLETE_ONLY, "log") - base.value(TPS_COMPLETE_ONLY, "log"), abs=1e-12)
        assert m.margin_censored == pytest.approx(row.value(TPS, "log") - base.value(TPS, "log"), abs=1e-12)


def test_no_censored_extension_gives_no_rows():
    complete_only = {s: _scores(s, [_row("verbal", "platt", [_metric(TPS, "log", -0.5)]),
                                     _row("base_rate", "raw", [_metric(TPS, "log", -0.6)])]) for s in WEIGHT_SCHEMES}
    assert sign_regime(complete_only, {}) == []
    assert margin_over_base_rate(complete_only) == []
