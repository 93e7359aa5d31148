"""Platt calibration exactly as Appendix D: split, standardisation, penalised weighted fit, fallback, cross-fit."""
import numpy as np
import pytest
from scipy.optimize import minimize

from uqh.scoring.calibration import cross_fit_platt, fit_platt, logit, sigmoid, stratified_split
from uqh.scoring.weights import trajectory_weights


def synthetic(n=400, slope=1.0, seed=0):
    """Trajectories whose per-step forecasts carry a signal z with P(Y=1) = sigmoid(slope * z)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 8, n)
    off = np.concatenate([[0], np.cumsum(lengths)])
    z = rng.normal(0, 1.5, n)
    y = (rng.random(n) < sigmoid(slope * z)).astype(float)
    values = sigmoid(np.repeat(z, lengths) + rng.normal(0, 0.3, off[-1]) + 2.0)  # over-confident raw stream
    ids = np.array([f"t{i:04d}#0" for i in range(n)], dtype=object)
    return values, off, y, ids


def test_split_alternates_by_id_within_label():
    ids = np.array(["b", "a", "d", "c", "f", "e", "g"], dtype=object)
    y = np.array([0, 0, 1, 1, 0, 1, np.nan])
    delta = np.array([True] * 6 + [False])
    half = stratified_split(ids, y, delta)
    # label 0 sorted: a, b, f -> A, B, A ; label 1 sorted: c, d, e -> B, A, B (parity continues); censored g -> A
    expected = {"a": 0, "b": 1, "f": 0, "c": 1, "d": 0, "e": 1, "g": 0}
    assert {i: int(h) for i, h in zip(ids, half)} == expected
    # balanced halves
    _, _, yy, ids2 = synthetic(101)
    h2 = stratified_split(ids2, yy)
    assert abs((h2 == 0).sum() - (h2 == 1).sum()) <= 1
    for lab in (0, 1):
        assert abs((h2[yy == lab] == 0).sum() - (h2[yy == lab] == 1).sum()) <= 1


def test_fit_matches_direct_minimisation_and_weighted_standardisation():
    rng = np.random.default_rng(1)
    f = rng.uniform(0.05, 0.99, 300)
    y = (rng.random(300) < f).astype(float)
    w = rng.uniform(0.1, 1.0, 300)
    m = fit_platt(f, y, w)
    x_raw = logit(f)
    mu = np.sum(w * x_raw) / w.sum()
    sd = np.sqrt(np.sum(w * (x_raw - mu) ** 2) / w.sum())
    assert m.mu == pytest.approx(mu) and m.sigma == pytest.approx(sd)
    x = (x_raw - mu) / sd

    def obj(th):
        u = th[0] + th[1] * x
        return np.sum(w * (np.logaddexp(0, u) - y * u)) + 0.5 * th[1] ** 2

    ref = minimize(obj, [0.0, 0.0], method="BFGS", options={"gtol": 1e-10}).x
    assert m.a == pytest.approx(ref[0], abs=1e-5) and m.b == pytest.approx(ref[1], abs=1e-5)
    assert not m.fallback and m.b > 0
    # the map itself
    np.testing.assert_allclose(m(f), np.clip(sigmoid(m.a + m.b * x), 1e-6, 1 - 1e-6))


def test_penalty_is_on_the_slope_only():
    # all x identical -> slope has no signal, only the penalty: b = 0 and a = logit(ybar) exactly (unpenalised intercept)
    f = np.full(50, 0.9)
    y = np.array([1.0] * 30 + [0.0] * 20)
    m = fit_platt(f, y, np.ones(50))
    assert m.b == pytest.approx(0.0, abs=1e-12)
    assert sigmoid(m.a) == pytest.approx(0.6, abs=1e-9)
    assert m.sigma_floor_active


def test_cross_fit_recovers_positive_slope():
    values, off, y, ids = synthetic(slope=1.0)
    w = trajectory_weights(off, "linear-front")
    res = cross_fit_platt(values, off, y, np.ones(y.size, bool), ids, w)
    for m in res.maps:
        assert m.b > 0.3 and not m.fallback
    d = res.diagnostics()
    assert d.fallback_triggered is False
    assert 0 < d.calibrated_min < d.calibrated_max < 1
    assert d.split_a.b == res.maps[0].b and d.n_a + d.n_b == y.size
    # each half is calibrated by the map fitted on the OTHER half
    traj_half = np.repeat(res.half, np.diff(off))
    np.testing.assert_allclose(res.values[traj_half == 0], res.maps[1](values[traj_half == 0]))
    np.testing.assert_allclose(res.values[traj_half == 1], res.maps[0](values[traj_half == 1]))
    # calibration improves the log score of this over-confident stream
    from uqh.scoring.rules import parse_score
    from uqh.scoring.tps import tps

    r = parse_score("log")
    assert tps(res.values, off, y, r, w).mean() > tps(values, off, y, r, w).mean()


def test_negative_slope_falls_back_to_base_rate():
    values, off, y, ids = synthetic(slope=-1.0, seed=2)
    w = trajectory_weights(off, "linear-front")
    res = cross_fit_platt(values, off, y, np.ones(y.size, bool), ids, w)
    for h, m in enumerate(res.maps):
        assert m.b_fitted < 0 and m.fallback and m.b == 0.0
        # a = logit(weighted in-train success rate); weights sum to 1 per trajectory -> trajectory mean of Y
        ytrain = y[res.half == h].mean()
        assert m.ybar_train == pytest.approx(ytrain)
        assert sigmoid(m.a) == pytest.approx(ytrain)
    traj_half = np.repeat(res.half, np.diff(off))
    np.testing.assert_allclose(res.values[traj_half == 0], res.maps[1].ybar_train)
    assert res.diagnostics().fallback_triggered is True


def test_complete_labels_calibrate_censored_trajectories_but_never_fit_on_them():
    values, off, y, ids = synthetic(n=200, seed=3)
    w = trajectory_weights(off, "linear-front")
    base = cross_fit_platt(values, off, y, np.ones(200, bool), ids, w)
    extra_vals = np.full(6, 0.999)
    off2 = np.concatenate([off, off[-1] + np.array([3, 6])])
    vals2 = np.concatenate([values, extra_vals])
    y2 = np.concatenate([y, [np.nan, np.nan]])
    delta2 = np.concatenate([np.ones(200, bool), [False, False]])
    ids2 = np.concatenate([ids, np.array(["zz1", "zz2"], dtype=object)])
    res = cross_fit_platt(vals2, off2, y2, delta2, ids2, trajectory_weights(off2, "linear-front"), labels="complete")
    for m0, m1 in zip(base.maps, res.maps):
        assert (m0.a, m0.b, m0.mu, m0.sigma) == (m1.a, m1.b, m1.mu, m1.sigma)
    assert set(res.half[-2:]) == {0, 1}
    assert np.all(np.isfinite(res.values[-6:]))


def test_degenerate_half_and_empty_half():
    f = np.array([0.6, 0.7, 0.8, 0.9])
    m = fit_platt(f, np.ones(4), np.ones(4))
    assert m.degenerate and m.fallback
    np.testing.assert_allclose(m(f), 1 - 1e-6)
    off = np.array([0, 1])
    with pytest.raises(ValueError, match="no trajectory"):
        cross_fit_platt(np.array([0.5]), off, np.array([1.0]), np.array([True]), np.array(["a"]), np.array([1.0]))
    # complete labels: two censored trajectories give no half anything to fit on
    with pytest.raises(ValueError, match="no complete trajectory"):
        cross_fit_platt(np.array([0.5, 0.6]), np.array([0, 1, 2]), np.array([1.0, np.nan]), np.array([True, False]),
                        np.array(["a", "b"]), np.ones(2), labels="complete")
