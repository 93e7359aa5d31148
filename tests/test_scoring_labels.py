"""Label conventions of the base rate and Platt under censoring (issue 15; paper §4.4, §6.3, Prop. C.2-C.3, App. D,
Appendix I.2 Tables 11, 13, 14).

The WebShop working sample is rebuilt from its printed counts (163 complete with 118 successes, 145 max_steps
prefixes at budget 30, n = 308): the base-rate Δ_practice of Table 11 and the complete-only base value of Table 14
are reproduced to the printed digits under every weight schedule, and only with the working-sample ΔY labels.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize

from uqh.rundir.errors import UserError
from uqh.rundir.schema import Manifest, RunConfig
from uqh.scoring.calibration import cross_fit_platt, fit_platt, logit, sigmoid, stratified_split
from uqh.scoring.diagnostics import trajectory_scalar
from uqh.scoring.labels import LABEL_CONVENTIONS, label_convention, training_labels
from uqh.scoring.pipeline import ScoreOptions, score_run
from uqh.scoring.registry import PREDICTORS, step_predictors
from uqh.scoring.long_records import CSV_FIELDS, csv_records
from uqh.scoring.rules import parse_score
from uqh.scoring.streams import RunData, build_sample, load_run
from uqh.scoring.weights import WEIGHT_SCHEMES, trajectory_weights
from scoring_fixtures import synthetic_run

N_COMPLETE, N_SUCCESS, N_CENSORED, BUDGET = 163, 118, 145, 30
N = N_COMPLETE + N_CENSORED
SCORES = ("log", "brier", "beta(2,4)")
#: Table 11, base-rate reference (every weight schedule): Δ_practice per score family, printed digits
TABLE11_BASE = {"log": (0.1623, 4), "brier": (0.0797, 4), "beta(2,4)": (0.00057, 5)}


def webshop_working_sample(forecast=None, seed: int = 0) -> RunData:
    """The WebShop working sample of §6.3 as RunData: ids ws000..ws307, the first 163 complete (118 successes,
    lengths 1..19), the other 145 max_steps with 30 steps. ``forecast(dy, rng, length) -> per-step values`` fills
    every per-step predictor (default: uniform noise, which the base rate ignores)."""
    rng = np.random.default_rng(seed)
    outcome = np.full(N, np.nan)
    outcome[:N_COMPLETE] = 0.0
    outcome[rng.permutation(N_COMPLETE)[:N_SUCCESS]] = 1.0
    lengths = np.concatenate([rng.integers(1, 20, N_COMPLETE), np.full(N_CENSORED, BUDGET)])
    dy = np.nan_to_num(outcome)
    forecast = forecast or (lambda d, r, T: r.uniform(0.05, 0.95, T))
    values = np.concatenate([forecast(dy[i], rng, lengths[i]) for i in range(N)])
    cfg = RunConfig(domain="webshop", task_ids=[f"ws{i:03d}" for i in range(N)], model="openai/fake",
                    step_budget=BUDGET, prompt_sha256="0" * 64, package_version="0.1.0")
    manifest = Manifest(config=cfg, config_hash=cfg.config_hash(), created_at="2026-01-01T00:00:00Z",
                        system_prompt="You are an agent.")
    return RunData(
        run_dir=Path("webshop-working-sample"), manifest=manifest,
        episode_ids=np.array([f"ws{i:03d}#0" for i in range(N)], dtype=object),
        stop_reason=np.array(["clean"] * N_COMPLETE + ["max_steps"] * N_CENSORED, dtype=object),
        outcome=outcome, n_steps=lengths, step_budget=np.full(N, BUDGET),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        streams={p: values.copy() for p in step_predictors()},
    )


@pytest.fixture(scope="module")
def webshop():
    return webshop_working_sample()


def _opts(**kw):
    return ScoreOptions(n_bootstrap=0, auq=False, **kw)


# ------------------------------------------------------------------------------------------ §6.3 / Tables 11, 14


@pytest.mark.parametrize("scheme", WEIGHT_SCHEMES)
def test_webshop_base_rate_reproduces_table_11_and_14(webshop, scheme):
    res = score_run(webshop, _opts(predictors=("base_rate",), censoring="simple", weights=scheme))
    base = res.row("base_rate", "raw")
    assert (base.n_complete, base.n_censored) == (N_COMPLETE, N_CENSORED)
    p = N_SUCCESS / N  # mean ΔY over the working sample
    assert base.label_mean == pytest.approx(p, abs=1e-15) and res.settings.label_convention == "delta_y"
    for score in SCORES:
        printed, digits = TABLE11_BASE[score]
        assert round(base.value("delta_practice", score), digits) == printed, score
        # closed form: every trajectory's weights sum to one, so each scores S(p, ΔY)
        s1, s0 = (float(v[0]) for v in parse_score(score.replace("(", ":").rstrip(")")).pair(np.array([p])))
        comp = (N_SUCCESS * s1 + (N_COMPLETE - N_SUCCESS) * s0) / N_COMPLETE
        ext = (N_SUCCESS * s1 + (N - N_SUCCESS) * s0) / N
        assert base.value("tps_complete_only", score) == pytest.approx(comp, abs=1e-12)
        assert base.value("tps", score) == pytest.approx(ext, abs=1e-12)
    # Table 14 / §6.3: base TPS_comp = -0.8156 - 0.0123, base TPS_cen-ext = -0.6570 - 0.0086 (log)
    assert round(base.value("tps_complete_only", "log"), 4) == -0.8279
    assert round(base.value("tps", "log"), 4) == round(-0.6570 - 0.0086, 4)


def test_complete_only_labels_cannot_give_the_printed_numbers(webshop):
    """With ȳ from the complete trajectories the base-rate Δ_practice is negative: Δ_log(c) is the closed form
    -(118·145 / (308·163)) logit(c), evaluated at c = 118/163."""
    res = score_run(webshop, _opts(predictors=("base_rate",), censoring="simple", labels="complete"))
    base = res.row("base_rate", "raw")
    c = N_SUCCESS / N_COMPLETE
    assert base.label_mean == pytest.approx(c) and res.settings.label_convention == "complete"
    k = N_SUCCESS * N_CENSORED / (N * N_COMPLETE)
    assert base.value("delta_practice", "log") == pytest.approx(-k * math.log(c / (1 - c)), abs=1e-12)
    assert round(base.value("delta_practice", "log"), 4) == -0.3285
    assert base.value("delta_practice", "brier") < 0 and base.value("delta_practice", "beta(2,4)") < 0


def _falling_back(dy, rng, T):
    """A predictor that is confidently wrong: high on failures / censored, low on successes -> negative slope."""
    centre = 0.25 if dy else 0.75
    return np.clip(centre + rng.normal(0, 0.05, T), 0.01, 0.99)


@pytest.mark.parametrize("scheme", WEIGHT_SCHEMES)
def test_platt_rows_that_fall_back_equal_the_base_rate_row(scheme):
    """Table 11: the action-span Platt rows that fell back to a constant equal the base-rate row, so the fallback
    constant -- the training labels' weighted mean -- is the working-sample mean of ΔY in each half."""
    run = webshop_working_sample(_falling_back, seed=1)
    res = score_run(run, _opts(predictors=("action_prob", "base_rate"), censoring="simple", weights=scheme))
    d = next(d for d in res.calibration if d.predictor == "action_prob")
    for half in (d.split_a, d.split_b):  # ΔY strata 190 / 118 alternate into 95 + 59 per half
        assert half.fallback and half.b_fitted < 0
        assert half.ybar_train == pytest.approx(59 / 154, abs=1e-15)
    platt, base = res.row("action_prob", "platt"), res.row("base_rate", "raw")
    for score in SCORES:
        for metric in ("tps", "tps_complete_only", "delta_practice"):
            assert platt.value(metric, score) == pytest.approx(base.value(metric, score), abs=1e-12)
        printed, digits = TABLE11_BASE[score]
        assert round(platt.value("delta_practice", score), digits) == printed
    # trained on complete trajectories the fallback constants are the halves' complete success rates instead
    old = score_run(run, _opts(predictors=("action_prob",), censoring="simple", weights=scheme, labels="complete"))
    d_old = old.calibration[0]
    assert {round(d_old.split_a.ybar_train, 6), round(d_old.split_b.ybar_train, 6)} == {round(59 / 82, 6),
                                                                                      round(59 / 81, 6)}
    assert old.row("action_prob", "platt").value("delta_practice", "log") < 0


def _flat_verbal(dy, rng, T):
    """Verbal confidence of the §6.3 kind: high, nearly flat, barely separating outcomes (and not separating
    complete from censored trajectories)."""
    return rng.choice([0.85, 0.9, 0.95, 1.0], size=T, p=[0.1, 0.3, 0.4, 0.2] if dy else [0.15, 0.3, 0.4, 0.15])


def test_platt_on_working_labels_targets_the_pseudo_label_mean():
    """The issue's synthetic check: Platt trained on complete trajectories calibrates everything towards the
    complete success rate (≈ 0.72) and the censored extension punishes it; trained on ΔY it targets ≈ 0.38 and
    Δ_practice is positive, as §6.3 reports for verbal confidence (+0.1586)."""
    run = webshop_working_sample(_flat_verbal, seed=2)
    means, deltas = {}, {}
    for labels in ("working", "complete"):
        res = score_run(run, _opts(predictors=("verbal",), censoring="simple", labels=labels))
        s = build_sample(run, "verbal", censoring="simple", labels=labels)
        w = trajectory_weights(s.offsets, "linear-front", s.horizon)
        fit = cross_fit_platt(s.values, s.offsets, s.y, s.delta, s.episode_ids, w, labels=s.label_convention)
        means[labels] = trajectory_scalar(fit.values, s.offsets, w).mean()
        deltas[labels] = res.row("verbal", "platt").value("delta_practice", "log")
    assert means["working"] == pytest.approx(N_SUCCESS / N, abs=0.03)
    assert means["complete"] == pytest.approx(N_SUCCESS / N_COMPLETE, abs=0.03)
    assert deltas["working"] > 0.1 and deltas["complete"] < -0.2


# ------------------------------------------------------------------------------------------ exact: soft labels


@pytest.fixture(scope="module")
def syn(tmp_path_factory):
    return load_run(synthetic_run(tmp_path_factory.mktemp("labels") / "syn", n=40, censored=11, seed=11))


def _numbers(obj, path=""):
    """Every number of a JSON dump, keyed by its path."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _numbers(val, f"{path}.{key}").items()}
    if isinstance(obj, list):
        return {k: v for i, val in enumerate(obj) for k, v in _numbers(val, f"{path}[{i}]").items()}
    return {path: obj}


def test_exact_with_zero_q_z_equals_simple(syn):
    cens = [str(e) for e, s in zip(syn.episode_ids, syn.stop_reason) if s == "max_steps"]
    common = dict(n_bootstrap=40, seed=5, fixed_rank=True)
    simple = score_run(syn, ScoreOptions(censoring="simple", **common))
    exact = score_run(syn, ScoreOptions(censoring="exact", q_z={e: 0.0 for e in cens}, **common))
    assert (simple.settings.label_convention, exact.settings.label_convention) == ("delta_y", "soft")
    a, b = _numbers(json.loads(simple.model_dump_json())), _numbers(json.loads(exact.model_dump_json()))
    assert a.keys() == b.keys()
    differing = {k for k in a if a[k] != b[k]}
    assert differing == {".settings.censoring", ".settings.label_convention"}
    assert sum(isinstance(v, float) for v in a.values()) > 500 and len(exact.calibration) == len(simple.calibration) >= 5
    # and soft labels are not ΔY once q_hat_z > 0
    half = score_run(syn, ScoreOptions(censoring="exact", q_z={e: 0.5 for e in cens}, **common))
    assert half.row("base_rate", "raw").value("tps", "log") != simple.row("base_rate", "raw").value("tps", "log")


def test_soft_labels_set_the_base_rate_and_platt_targets(syn):
    cens = [str(e) for e, s in zip(syn.episode_ids, syn.stop_reason) if s == "max_steps"]
    q = {e: (k % 5) / 5 + 0.1 for k, e in enumerate(cens)}
    base = build_sample(syn, "base_rate", censoring="exact", q_z=q)
    complete = (syn.stop_reason == "clean")
    expected = (np.nansum(syn.outcome[complete]) + sum(q.values())) / (complete.sum() + len(cens))
    np.testing.assert_allclose(base.values, expected, rtol=0, atol=1e-15)
    assert base.label_convention == "soft" and base.label_mean == pytest.approx(expected)
    # Platt: each half is fitted on η = ΔY + (1-Δ) q̂ ; weights sum to one per trajectory, so a half's weighted
    # mean label is the mean η of its trajectories; the split is the ΔY split
    s = build_sample(syn, "verbal", censoring="exact", q_z=q)
    w = trajectory_weights(s.offsets, "linear-front", s.horizon)
    fit = cross_fit_platt(s.values, s.offsets, s.y, s.delta, s.episode_ids, w, labels="soft", q_z=s.q_z)
    eta = np.where(s.delta, s.y, s.q_z)
    np.testing.assert_array_equal(fit.half, stratified_split(s.episode_ids, np.where(s.delta, s.y, 0.0)))
    assert np.any(fit.half != stratified_split(s.episode_ids, s.y, s.delta))  # (an odd number censored: not Y's)
    for h, m in enumerate(fit.maps):
        assert m.ybar_train == pytest.approx(eta[fit.half == h].mean(), abs=1e-12)
        assert m.n_train_trajectories == int((fit.half == h).sum())
    # complete labels under exact: today's convention, censored trajectories never trained on
    old = build_sample(syn, "base_rate", censoring="exact", q_z=q, labels="complete")
    np.testing.assert_allclose(old.values, np.nanmean(syn.outcome[complete]))


def _soft_sample(n_censored, n_complete, alpha, beta, seed):
    """Trajectories with one forecast per trajectory (repeated over 1..5 steps). Censored ones carry the soft label
    q̂ = g(F) of the generating map g(F) = sigmoid(alpha + beta logit F); complete ones Y ~ Bernoulli(g(F))."""
    rng = np.random.default_rng(seed)
    n = n_censored + n_complete
    f = rng.uniform(0.03, 0.97, n)
    g = sigmoid(alpha + beta * logit(f))
    lengths = rng.integers(1, 6, n)
    delta = np.arange(n) >= n_censored
    y = np.where(delta, (rng.random(n) < g).astype(float), np.nan)
    return np.repeat(f, lengths), np.concatenate([[0], np.cumsum(lengths)]), y, delta, np.where(delta, np.nan, g)


def test_soft_label_platt_recovers_the_generating_map():
    alpha, beta = -0.7, 0.6
    grid = np.linspace(0.05, 0.95, 19)
    truth = sigmoid(alpha + beta * logit(grid))
    # all soft labels, no penalty: the generating map is the exact optimum
    values, off, y, delta, q = _soft_sample(2000, 0, alpha, beta, seed=4)
    w = trajectory_weights(off, "linear-front")
    m = fit_platt(values, q[np.repeat(np.arange(q.size), np.diff(off))], w, lam=0.0)
    assert m.b / m.sigma == pytest.approx(beta, abs=1e-8)
    assert m.a - m.b * m.mu / m.sigma == pytest.approx(alpha, abs=1e-8)
    # cross-fitted with the penalty, soft labels on censored and Bernoulli outcomes on complete trajectories
    values, off, y, delta, q = _soft_sample(3000, 1000, alpha, beta, seed=5)
    w = trajectory_weights(off, "linear-front")
    ids = np.array([f"t{i:05d}" for i in range(y.size)], dtype=object)
    fit = cross_fit_platt(values, off, y, delta, ids, w, labels="soft", q_z=q)
    for mp in fit.maps:
        assert not mp.fallback
        assert np.abs(mp(grid) - truth).max() < 0.03


def test_fractional_targets_minimise_the_weighted_soft_log_loss():
    """Independent optimiser on the Appendix D objective with fractional targets (L2 on the slope only)."""
    rng = np.random.default_rng(8)
    f = rng.uniform(0.05, 0.99, 400)
    y = rng.uniform(0, 1, 400)
    y[:100] = np.round(y[:100])  # hard and soft labels mixed
    w = rng.uniform(0.1, 1.0, 400)
    m = fit_platt(f, y, w)
    x = (logit(f) - m.mu) / m.sigma

    def objective(th):
        u = th[0] + th[1] * x
        return np.sum(w * (np.logaddexp(0, u) - y * u)) + 0.5 * th[1] ** 2

    ref = minimize(objective, [0.0, 0.0], method="BFGS", options={"gtol": 1e-10}).x
    assert (m.a, m.b) == pytest.approx(tuple(ref), abs=1e-5)
    # a soft label y is the same as a success of weight w y plus a failure of weight w (1 - y)
    both = fit_platt(np.concatenate([f, f]), np.concatenate([np.ones(400), np.zeros(400)]),
                     np.concatenate([w * y, w * (1 - y)]))
    assert (both.a, both.b) == pytest.approx((m.a, m.b), abs=1e-9)


# ------------------------------------------------------------------------------------------ conventions


def test_conventions_and_labels():
    assert label_convention("exclude", "working") == label_convention("exclude", "complete") == "complete"
    assert label_convention("simple", "working") == "delta_y" and label_convention("exact", "working") == "soft"
    assert label_convention("simple", "complete") == label_convention("exact", "complete") == "complete"
    y, delta, q = np.array([1.0, 0.0, np.nan, np.nan]), np.array([True, True, False, False]), np.array([np.nan, 0, 0.3, 0])
    np.testing.assert_array_equal(training_labels(y, delta, None, "complete"), [1, 0, np.nan, np.nan])
    np.testing.assert_array_equal(training_labels(y, delta, None, "delta_y"), [1, 0, 0, 0])
    np.testing.assert_array_equal(training_labels(y, delta, q, "soft"), [1, 0, 0.3, 0])
    with pytest.raises(ValueError, match="q_hat_z"):
        training_labels(y, delta, None, "soft")
    with pytest.raises(ValueError, match="finite"):
        training_labels(y, delta, np.array([0, 0, np.nan, 0.2]), "soft")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        training_labels(y, delta, np.array([0, 0, 1.5, 0.2]), "soft")
    with pytest.raises(ValueError, match="unknown label convention"):
        training_labels(y, delta, q, "vibes")
    with pytest.raises(UserError, match="unknown labels"):
        label_convention("simple", "vibes")
    assert set(LABEL_CONVENTIONS) == {"complete", "delta_y", "soft"}
    assert PREDICTORS["base_rate"].constant(np.array([1.0, 0.0, 0.0, 0.5])) == pytest.approx(0.375)


def test_the_convention_is_printed_with_every_table_and_stored(webshop):
    import io

    from uqh.reports.render import emit
    from uqh.reports.score_view import score_output

    res = score_run(webshop, ScoreOptions(predictors=("verbal", "base_rate"), censoring="simple", n_bootstrap=20,
                                          fixed_rank=True))
    buf = io.StringIO()
    emit(score_output([res]), "table", out=buf)
    text = buf.getvalue()
    assert "labels=delta_y" in text.splitlines()[0]
    flat = " ".join(text.split())  # captions wrap at 120 columns
    caption = "Base rate and Platt trained on labels=delta_y: " + LABEL_CONVENTIONS["delta_y"].description
    # Table 2, censored extension, distance from the truth (the fixture fills every per-step stream, truth
    # included), raw -> Platt, AUQ, fixed rank
    assert flat.count(caption) == 6
    assert f"base rate {N_SUCCESS / N:.4f}" in flat and "delta_y" in flat.split("Platt maps")[1]
    dump = json.loads(res.model_dump_json())
    assert dump["settings"]["labels"] == "working" and dump["settings"]["label_convention"] == "delta_y"
    recs = csv_records(res)
    assert "label_convention" in CSV_FIELDS and {r["label_convention"] for r in recs} == {"delta_y"}
    assert {r["censoring"] for r in recs} == {"simple"}