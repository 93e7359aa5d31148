"""q_Z estimators: Monte Carlo aggregation, plug-in nuisance model, hybrid, audit tables, identity check."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from uqh.scoring.qz import estimate as qz
from uqh.scoring.qz.estimate import OTHER, PARSE_ERROR, RESOLVED, UNRESOLVED


def _branches():
    # prefix 0: 3 successes, 1 failure, 1 unresolved, 1 parse error  -> q = 3/4
    # prefix 1: 0 successes, 2 failures, 2 unresolved, 1 tool error    -> q = 0
    # prefix 2: only unresolved and parse errors                     -> q undefined (NaN)
    rows = [
        (0, RESOLVED, 1), (0, RESOLVED, 1), (0, RESOLVED, 0), (0, RESOLVED, 1), (0, UNRESOLVED, np.nan),
        (0, PARSE_ERROR, np.nan),
        (1, RESOLVED, 0), (1, UNRESOLVED, np.nan), (1, RESOLVED, 0), (1, UNRESOLVED, np.nan), (1, OTHER, np.nan),
        (2, UNRESOLVED, np.nan), (2, PARSE_ERROR, np.nan),
    ]
    p, s, y = zip(*rows)
    return np.array(p), np.array(s), np.array(y, dtype=float)


def test_mc_aggregation_counts_unresolved_and_parse_errors_separately():
    p, s, y = _branches()
    est = qz.aggregate_mc(p, s, y, 4, min_valid=2)
    np.testing.assert_allclose(est.q_hat[:2], [0.75, 0.0])
    assert np.isnan(est.q_hat[2]) and np.isnan(est.q_hat[3])
    assert est.n_resolved.tolist() == [4, 2, 0, 0]
    assert est.n_valid.tolist() == [4, 2, 0, 0]
    assert est.n_success.tolist() == [3, 0, 0, 0]
    assert est.n_unresolved.tolist() == [1, 2, 1, 0]
    assert est.n_parse_error.tolist() == [1, 0, 1, 0]
    assert est.n_other.tolist() == [0, 1, 0, 0]
    assert est.retained.tolist() == [True, True, False, False]
    assert qz.aggregate_mc(p, s, y, 4, min_valid=3).retained.tolist() == [True, False, False, False]


def test_mc_sensitivity_variants():
    p, s, y = _branches()
    fail = qz.aggregate_mc(p, s, y, 3, min_valid=2, unresolved="failure")
    succ = qz.aggregate_mc(p, s, y, 3, min_valid=2, unresolved="success")
    np.testing.assert_allclose(fail.q_hat, [3 / 5, 0 / 4, 0 / 1])
    np.testing.assert_allclose(succ.q_hat, [4 / 5, 2 / 4, 1 / 1])
    assert fail.n_valid.tolist() == [5, 4, 1]
    # retention is defined by resolved branches under every policy
    assert fail.retained.tolist() == succ.retained.tolist() == [True, True, False]


def test_mc_rejects_bad_input():
    with pytest.raises(ValueError, match="unresolved"):
        qz.aggregate_mc(np.array([0]), np.array([0]), np.array([1.0]), 1, unresolved="drop")
    with pytest.raises(ValueError, match="outcome"):
        qz.aggregate_mc(np.array([0]), np.array([RESOLVED]), np.array([np.nan]), 1)
    with pytest.raises(ValueError, match="range"):
        qz.aggregate_mc(np.array([1]), np.array([RESOLVED]), np.array([1.0]), 1)


def test_prefix_features_hand_computed():
    actions = ["search[a]", "search[b]", "search[a]", "lookup[x]"]
    obs = ["Could not find a.", "B is a city", "Could not find a.", "No more results."]
    f = dict(zip(qz.FEATURE_NAMES, qz.prefix_feature_vector(actions, obs, [0, 2, 0, 1], step_budget=8)))
    assert f["z_over_budget"] == 0.5
    assert f["log1p_z"] == pytest.approx(np.log(5))
    assert f["repair_rate"] == 0.75
    assert f["distinct_action_rate"] == 0.75
    assert f["repeated_action_rate"] == 0.25
    assert f["last_action_repeated"] == 0.0
    assert f["no_result_rate"] == 0.5  # "could not find" twice; "No more results" does not match
    assert f["distinct_verb_rate"] == 0.5
    assert f["log_mean_observation_chars"] == pytest.approx(np.log1p(np.mean([len(o) for o in obs])))
    assert qz.prefix_feature_vector([], [], [], 5).tolist() == [0.0] * len(qz.FEATURE_NAMES)


def _objective(beta, xs, y, w, pen):
    u = xs @ beta
    ll = w * (y * u - np.logaddexp(0, u))
    return -(ll.sum() - 0.5 * np.sum(pen * beta**2))


def test_logistic_matches_scipy_on_weighted_soft_labels():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 3))
    y = rng.uniform(size=40)
    w = rng.integers(1, 10, size=40).astype(float)
    m = qz.fit_logistic(x, y, w, l2=0.7, l2_intercept=0.01)
    xs = np.hstack([np.ones((40, 1)), (x - m.mean) / m.scale])
    pen = np.r_[0.01, np.full(3, 0.7)]
    ref = minimize(_objective, np.zeros(4), args=(xs, y, w, pen), method="BFGS", options={"gtol": 1e-10})
    np.testing.assert_allclose(np.r_[m.intercept, m.coef], ref.x, atol=1e-5)


def test_logistic_intercept_only_is_weighted_mean_and_soft_equals_expanded():
    y = np.array([0.25, 1.0, 0.0])
    w = np.array([4.0, 2.0, 2.0])
    m = qz.fit_logistic(np.zeros((3, 0)), y, w, l2_intercept=0.0)
    assert m.predict(np.zeros((1, 0)))[0] == pytest.approx((0.25 * 4 + 2) / 8, abs=1e-12)
    # soft label k/n with weight n == n Bernoulli rows
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 2))
    n = np.array([4, 5, 3, 6, 2, 5])
    k = np.array([1, 5, 0, 3, 1, 2])
    soft = qz.fit_logistic(x, k / n, n.astype(float), l2=0.0, l2_intercept=0.0)
    xe = np.repeat(x, n, axis=0)
    ye = np.concatenate([[1.0] * kk + [0.0] * (nn - kk) for kk, nn in zip(k, n)])
    hard = qz.fit_logistic(xe, ye, l2=0.0, l2_intercept=0.0)  # unpenalised MLE: invariant to standardisation
    np.testing.assert_allclose(soft.predict(x), hard.predict(x), atol=1e-8)
    # all-zero labels stay finite thanks to the intercept penalty
    z = qz.fit_logistic(x, np.zeros(6), n.astype(float))
    assert np.all(z.predict(x) < 0.05)


def test_plugin_is_cross_fitted():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 2))
    label = (x[:, 0] > 0).astype(float)
    label[25:] = np.nan  # unlabelled prefixes
    w = np.full(30, 5.0)
    fit = qz.fit_plugin(x, label, w, folds=5, seed=7)
    assert fit.labelled.sum() == 25 and (fit.fold[25:] == -1).all()
    assert np.all((fit.q_hat > 0) & (fit.q_hat < 1))
    # a labelled row's prediction does not depend on its own label (cross-fitting) ...
    flipped = label.copy()
    flipped[0] = 1.0 - flipped[0]
    fit2 = qz.fit_plugin(x, flipped, w, folds=5, seed=7)
    assert fit2.q_hat[0] == fit.q_hat[0]
    # ... but rows in other folds do see it
    other = fit.fold[:25] != fit.fold[0]
    assert not np.allclose(fit2.q_hat[:25][other], fit.q_hat[:25][other])
    # unlabelled rows are predicted by the model fitted on all labelled rows
    np.testing.assert_allclose(fit.q_hat[25:], fit.full_model.predict(x[25:]))
    # the learned direction is right
    assert fit.full_model.coef[0] > 0
    with pytest.raises(ValueError, match="at least 2"):
        qz.fit_plugin(x[:3], np.array([1.0, np.nan, np.nan]), np.ones(3))


def test_hybrid_prefers_retained_mc():
    q, method = qz.hybrid(
        np.array([0.5, 0.2, np.nan, np.nan]), np.array([True, False, False, False]), np.array([0.9, 0.3, 0.4, np.nan])
    )
    np.testing.assert_allclose(q[:3], [0.5, 0.3, 0.4])
    assert np.isnan(q[3])
    assert method.tolist() == ["mc", "plugin", "plugin", "none"]


def test_qz_distribution_table7():
    q = np.array([0.0, 0.0, 0.0, 0.6, 1.0, 0.2, np.nan])
    d = qz.qz_distribution(q, n_boot=500, seed=1)
    assert d.n == 6
    assert d.mean == pytest.approx(1.8 / 6)
    assert d.median == pytest.approx(0.1)
    assert d.frac_zero == 0.5
    assert d.frac_above_half == pytest.approx(2 / 6)
    assert d.ci[0] <= d.mean <= d.ci[1] and d.ci[0] >= 0 and d.ci[1] <= 1
    const = qz.qz_distribution(np.full(5, 0.3), n_boot=50)
    assert const.ci == pytest.approx((0.3, 0.3))
    assert qz.qz_distribution(np.array([np.nan])).n == 0


def test_paired_comparison_table8():
    rng = np.random.default_rng(0)
    simple = rng.normal(-0.5, 0.1, size=50)
    shift = rng.normal(-0.1, 0.05, size=50)
    c = qz.paired_comparison(simple, simple + shift, n_boot=400, seed=2)
    assert c.difference.mean == pytest.approx(shift.mean())
    assert c.exact.mean - c.simple.mean == pytest.approx(c.difference.mean)
    lo, hi = c.difference.ci
    assert lo < shift.mean() < hi and hi < 0
    # the paired CI of a constant shift is degenerate even though the scores vary
    c2 = qz.paired_comparison(simple, simple - 0.2, n_boot=100)
    assert c2.difference.ci == pytest.approx((-0.2, -0.2))
    from uqh.reports.continuation_audit import audit_output
    from uqh.reports.render import markdown_text
    from uqh.scoring.qz.run_estimate import AuditCounts, AuditSettings, ContinuationAudit

    audit = ContinuationAudit(counts=AuditCounts(min_valid=1, retained=2),
                              distribution=qz.qz_distribution(np.array([0.0, 1.0])), comparison=c2,
                              identity_max_error=1e-17,
                              settings=AuditSettings(source_run_dir="s", min_valid=1, method="mc", rule="log",
                                                     weights="linear-front", n_boot=100, seed=0, plugin_features=[]))
    out = audit_output(audit)
    row = next(r for t in out.tables for r in t.rows if r.get("Quantity") == "Delta exact-simple")
    assert (row["Value"], row["CI low"], row["CI high"]) == pytest.approx((-0.2, -0.2, -0.2))  # numbers, not text
    assert "1e-17" in markdown_text(out)


def test_projection_identity_on_generated_data():
    """exact-MC log score with q_hat^MC == branch-average of complete-prefix log scores (H.2), to 1e-12."""
    rng = np.random.default_rng(42)
    n = 200
    z = rng.integers(1, 15, size=n)
    worst = 0.0
    exact, branch_scores, branch_idx = np.zeros(n), [], []
    for i in range(n):
        T = z[i] + rng.integers(0, 5)  # full horizon; weights truncated at Z, not renormalised
        w = 2 * (T - np.arange(1, T + 1) + 1) / (T * (T + 1))
        w = w[: z[i]]
        f = rng.uniform(0.01, 0.99, size=z[i])
        y = rng.integers(0, 2, size=rng.integers(5, 11))
        q = y.mean()
        exact[i] = np.sum(w * (q * np.log(f) + (1 - q) * np.log1p(-f)))
        for ym in y:
            branch_scores.append(np.sum(w * (ym * np.log(f) + (1 - ym) * np.log1p(-f))))
            branch_idx.append(i)
    err, diff = qz.projection_identity_error(exact, np.array(branch_scores), np.array(branch_idx))
    assert err < 1e-12
    # and the check does detect a wrong q
    err_bad, _ = qz.projection_identity_error(exact + 1e-6, np.array(branch_scores), np.array(branch_idx))
    assert err_bad > 5e-7
