"""HTC (a learned logistic calibrator on prefix features) and SAUP: fitted as Platt is, transferred across runs,
registered, scored and refused as documented (docs/scoring.md, "Learned calibrators")."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from scoring_fixtures import make_episode, make_row, make_tokens, synthetic_run
from uqh.cli import main
from uqh.scoring.calibration import cross_fit_platt, fit_platt, logit
from uqh.scoring.learned import cross_fit, fit_logistic
from uqh.scoring.pipeline import ScoreOptions, score_run
from uqh.scoring.process_features import FEATURES, jaccard_distance
from uqh.scoring.registry import PREDICTORS
from uqh.scoring.streams import load_run, run_data_from_records


def test_one_feature_logit_f_is_platt_exactly():
    """With the single feature logit(F), the learned calibrator's objective is Platt's (weighted records, L2 λ = 1
    on the standardised slope, free intercept): same map, and the cross-fit gives Platt's cross-fitted stream."""
    rng = np.random.default_rng(0)
    f = rng.uniform(0.05, 0.95, 300)
    y = (rng.random(300) < f).astype(float)
    w = rng.uniform(0.2, 1.0, 300)
    platt = fit_platt(f, y, w)
    ours = fit_logistic(logit(f)[:, None], y, w, ["logit_f"])
    assert ours.intercept == pytest.approx(platt.a, abs=1e-7) and ours.coef[0] == pytest.approx(platt.b, abs=1e-7)
    offsets = np.arange(0, 301, 3)
    traj_y = y[::3]
    ids = np.array([f"e{i:03d}" for i in range(100)], dtype=object)
    ref = cross_fit_platt(f, offsets, traj_y, np.ones(100, bool), ids, w, labels="complete")
    got, _ = cross_fit(logit(f)[:, None], ["logit_f"], offsets, traj_y, np.ones(100, bool), ids, w, labels="complete")
    np.testing.assert_allclose(got, ref.values, atol=1e-7)


def test_lasso_zeroes_uninformative_features_and_ridge_keeps_them():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 6))
    y = (rng.random(400) < 1 / (1 + np.exp(-2 * x[:, 0]))).astype(float)
    w = np.ones(400)
    lasso = fit_logistic(x, y, w, list("abcdef"), penalty="lasso", lam=20.0)
    ridge = fit_logistic(x, y, w, list("abcdef"), penalty="ridge", lam=20.0)
    assert lasso.coef[0] > 0.5 and np.count_nonzero(lasso.coef[1:]) <= 2
    assert np.count_nonzero(ridge.coef) == 6
    with pytest.raises(ValueError, match="penalty"):
        fit_logistic(x, y, w, list("abcdef"), penalty="elastic")


def test_htc_and_saup_are_registered_and_scored_with_weights_in_the_json(tmp_path, capsys):
    assert PREDICTORS["htc"].learned is not None and PREDICTORS["saup"].signal_running is not None
    assert len(FEATURES) == 48
    run = synthetic_run(tmp_path / "run", n=60, censored=6)
    assert main(["score", str(run), "--predictor", "verbal,htc,saup", "--censoring", "simple", "--bootstrap", "0",
                 "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = {(r["predictor"], r["calibration"]) for r in res["rows"]}
    assert {("htc", "raw"), ("saup", "raw"), ("saup", "platt"), ("verbal", "raw")} <= rows
    assert ("htc", "platt") not in rows  # already calibrated: one row
    (fit,) = res["learned"]
    assert fit["predictor"] == "htc" and fit["penalty"] == "ridge" and len(fit["models"]) == 2
    assert all(len(m["weights"]) == len(fit["features"]) for m in fit["models"])
    htc = next(r for r in res["rows"] if r["predictor"] == "htc")
    tps = {(m["metric"], m["score"]): m["estimate"]["value"] for m in htc["metrics"]}
    assert math.isfinite(tps[("tps", "log")]) and math.isfinite(tps[("delta_practice", "log")])


def test_calibrator_from_fits_on_one_run_and_applies_to_another(tmp_path, capsys):
    src = synthetic_run(tmp_path / "src", n=80, seed=5)
    dst = synthetic_run(tmp_path / "dst", n=40, seed=6)
    opts = ScoreOptions(predictors=("htc",), n_bootstrap=0, calibrator_from=load_run(src))
    res = score_run(load_run(dst), opts)
    (fit,) = res.learned
    assert fit.transfer_from == str(src) and len(fit.models) == 1
    assert fit.models[0].n_train_trajectories == 80  # every trajectory of the source, none of the scored run
    assert res.settings.calibrator_from == str(src)
    # the same model whatever the scored run's labels: flip them and the forecasts stay
    flipped = load_run(dst)
    flipped.outcome = 1.0 - flipped.outcome
    values = score_run(flipped, opts).learned[0].models[0].weights
    assert values == fit.models[0].weights
    assert main(["score", str(dst), "--predictor", "htc", "--calibrator-from", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_htc_is_unavailable_with_a_note_when_a_half_cannot_be_fitted(tmp_path):
    eps = [make_episode("a#0", "clean", [0.5], outcome=1)]
    rows = [make_row("a#0", 1, make_tokens([(0.5, [0.5, 0.5])]), action_range=(0, 1))]
    data = run_data_from_records(tmp_path, None, eps, rows)
    from uqh.scoring.pipeline import evaluate_predictor
    from uqh.scoring.streams import build_sample

    res = evaluate_predictor(build_sample(data, "htc"), ScoreOptions(n_bootstrap=0))
    assert res.rows[0].note.startswith("HTC learned calibrator (cross-fitted) unavailable") and not res.rows[0].metrics


def test_saup_closed_form_on_a_two_step_trajectory():
    """U_i = mean NLL of the step, W_i = drift + discrepancy (word Jaccard), F_t = exp(−sqrt(mean (W U)²))."""
    ep = make_episode("a#0", "clean", [0.5, 0.5], outcome=1)
    ep.task_prompt = "Question: what is two plus two"
    ep.steps[0].think, ep.steps[0].action, ep.steps[0].observation = "two plus two", "Finish[four]", "ok"
    ep.steps[1].think, ep.steps[1].action = "done", "Finish[4]"
    rows = [make_row("a#0", 1, make_tokens([(0.5, [0.5, 0.5])])),
            make_row("a#0", 2, make_tokens([(0.25, [0.25, 0.75]), (1.0, [1.0])]))]
    data = run_data_from_records(".", None, [ep], rows)
    u = np.array([math.log(2), math.log(4) / 2])
    w = np.array([jaccard_distance("two plus two Finish[four]", ep.task_prompt)
                  + jaccard_distance("Finish[four]", ep.task_prompt),
                  jaccard_distance("done Finish[4]", ep.task_prompt) + jaccard_distance("Finish[4]", "ok")])
    wu2 = (w * u) ** 2
    np.testing.assert_allclose(data.streams["saup"], np.exp(-np.sqrt(np.cumsum(wu2) / [1, 2])), rtol=1e-12)
    assert 0 < w[0] < 2 and jaccard_distance("a b", "b a") == 0.0 and jaccard_distance("", "") == 0.0


def test_every_consumer_of_a_sample_sees_the_fitted_htc_forecasts(tmp_path):
    """build_sample fits the learned calibrator, so analyses that read sample.values (paired comparisons, sign
    regimes, censored prefixes) get HTC's forecasts, the same as `uqh score`'s rows."""
    from uqh.scoring.learned import cross_fit
    from uqh.scoring.streams import build_sample, unfitted_sample
    from uqh.scoring.weights import trajectory_weights

    data = load_run(synthetic_run(tmp_path / "run", n=50, censored=4))
    sample = build_sample(data, "htc", censoring="simple")
    raw = unfitted_sample(data, "htc", censoring="simple")
    assert (raw.values == 0).all() and sample.learned_fit is not None
    w = trajectory_weights(raw.offsets, "linear-front", raw.horizon)
    want, _ = cross_fit(raw.features, raw.feature_names, raw.offsets, raw.y, raw.delta, raw.episode_ids, w,
                        labels=raw.label_convention)
    np.testing.assert_array_equal(sample.values, want)
    assert ((sample.values > 0) & (sample.values < 1)).all()
