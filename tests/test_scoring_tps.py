"""TPS, weights, censored extensions: closed forms (Eq. 2, 4, 5, 17), base rate, Theorem B counter-examples."""
import math

import numpy as np
import pytest

from uqh.rundir.errors import UserError
from uqh.scoring.diagnostics import phi_avg, phi_last, phi_min, scalarized_loss
from uqh.scoring.rules import parse_score
from uqh.scoring.tps import (
    artificial_censoring,
    exact_minus_simple_log,
    posterior_weight,
    tps,
    tps_censored_exact,
    tps_censored_simple,
    truncate,
)
from uqh.scoring.weights import WEIGHT_SCHEMES, check_scheme, step_weights, trajectory_weights

RULES = [parse_score(s) for s in ("log", "brier", "beta:2,4")]


def random_traces(n=50, seed=0, tmax=12):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, tmax, size=n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.uniform(0.01, 0.99, size=offsets[-1])
    y = (rng.random(n) < 0.5).astype(float)
    return values, offsets, y


def test_weight_schedules_closed_forms():
    off = np.array([0, 3])
    np.testing.assert_allclose(trajectory_weights(off, "linear-front"), [3 / 6, 2 / 6, 1 / 6])
    np.testing.assert_allclose(trajectory_weights(off, "linear-back"), [1 / 6, 2 / 6, 3 / 6])
    np.testing.assert_allclose(trajectory_weights(off, "uniform"), [1 / 3] * 3)
    np.testing.assert_allclose(trajectory_weights(off, "exponential-front"), [4 / 7, 2 / 7, 1 / 7])
    _, offsets, _ = random_traces()
    for s in WEIGHT_SCHEMES:
        w = trajectory_weights(offsets, s)
        assert np.all(w > 0)
        np.testing.assert_allclose(np.add.reduceat(w, offsets[:-1]), 1.0)
    with pytest.raises(UserError, match="unknown weights"):
        check_scheme("quadratic")


def test_truncated_weights_are_not_renormalised():
    # artificial censoring: T=4 schedule truncated at Z=2
    w = trajectory_weights(np.array([0, 2]), "linear-front", horizon=np.array([4]))
    np.testing.assert_allclose(w, [8 / 20, 6 / 20])
    assert w.sum() < 1
    with pytest.raises(ValueError):
        trajectory_weights(np.array([0, 3]), "uniform", horizon=np.array([2]))


def test_tps_hand_computed():
    values = np.array([0.8, 0.6, 0.3, 0.9])
    offsets = np.array([0, 3, 4])
    y = np.array([1.0, 0.0])
    w = trajectory_weights(offsets, "linear-front")
    got = tps(values, offsets, y, parse_score("log"), w)
    assert got[0] == pytest.approx(0.5 * math.log(0.8) + (1 / 3) * math.log(0.6) + (1 / 6) * math.log(0.3), abs=1e-15)
    assert got[1] == pytest.approx(math.log(0.1), abs=1e-15)
    got_b = tps(values, offsets, y, parse_score("brier"), w)
    assert got_b[0] == pytest.approx(-(0.5 * 0.04 + 0.16 / 3 + 0.49 / 6))


@pytest.mark.parametrize("ybar", [0.842, 0.443, 0.583])
@pytest.mark.parametrize("scheme", WEIGHT_SCHEMES)
def test_base_rate_row_textbook_values(ybar, scheme):
    # 1000 trajectories of varying length, exactly round(1000*ybar) successes, constant forecast ybar
    n = 1000
    lengths = np.random.default_rng(1).integers(1, 17, size=n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    y = (np.arange(n) < round(n * ybar)).astype(float)
    values = np.full(offsets[-1], ybar)
    w = trajectory_weights(offsets, scheme)
    log_mean = tps(values, offsets, y, parse_score("log"), w).mean()
    brier_mean = tps(values, offsets, y, parse_score("brier"), w).mean()
    assert log_mean == pytest.approx(ybar * math.log(ybar) + (1 - ybar) * math.log(1 - ybar), abs=1e-12)
    assert brier_mean == pytest.approx(-ybar * (1 - ybar), abs=1e-12)


def test_base_rate_beta_2_4_matches_table_2():
    # Table 2 (StrategyQA, ybar = 0.842): base-rate TPS_beta(2,4) = -0.00263
    s = parse_score("beta:2,4")(np.array([0.842]), np.array([0.842]))[0]
    assert round(s, 5) == -0.00263


@pytest.mark.parametrize("scheme", WEIGHT_SCHEMES)
def test_eq17_exact_minus_simple(scheme):
    values, offsets, _ = random_traces(n=200, seed=3)
    values[::7] = 1.0  # clipped boundary values included
    values[::11] = 0.0
    n = offsets.size - 1
    q = np.random.default_rng(4).uniform(0, 1, n)
    delta = np.zeros(n, dtype=bool)
    y = np.full(n, np.nan)
    w = trajectory_weights(offsets, scheme)
    rule = parse_score("log")
    exact = tps_censored_exact(values, offsets, y, delta, q, rule, w)
    simple = tps_censored_simple(values, offsets, y, delta, rule, w)
    f = np.clip(values, 1e-6, 1 - 1e-6)
    manual = q * np.array([np.sum(w[a:b] * np.log(f[a:b] / (1 - f[a:b]))) for a, b in zip(offsets[:-1], offsets[1:])])
    np.testing.assert_allclose(exact - simple, manual, rtol=0, atol=1e-12)
    np.testing.assert_allclose(exact_minus_simple_log(values, offsets, w, q), manual, rtol=0, atol=1e-12)


def test_censored_scores_mixed_sample_and_projection_identity():
    values, offsets, y = random_traces(n=30, seed=5)
    n = offsets.size - 1
    delta = np.arange(n) % 3 != 0
    y = np.where(delta, y, np.nan)
    q = np.where(delta, np.nan, np.linspace(0, 1, n))
    w = trajectory_weights(offsets, "linear-front")
    for rule in RULES:
        exact = tps_censored_exact(values, offsets, y, delta, q, rule, w)
        simple = tps_censored_simple(values, offsets, y, delta, rule, w)
        yy = np.nan_to_num(y)
        full1 = tps(values, offsets, np.ones(n), rule, w)
        full0 = tps(values, offsets, np.zeros(n), rule, w)
        # complete trajectories: both equal Eq. 2
        np.testing.assert_allclose(exact[delta], np.where(yy == 1, full1, full0)[delta], atol=1e-15)
        np.testing.assert_allclose(simple[delta], exact[delta], atol=0)
        # censored: simple is the failure branch; exact is the q-mixture = branch average of M outcomes
        np.testing.assert_allclose(simple[~delta], full0[~delta], atol=1e-15)
        mix = q * full1 + (1 - q) * full0
        np.testing.assert_allclose(exact[~delta], mix[~delta], atol=1e-14)
    # q_Z = 0 reduces exact to simple
    z = tps_censored_exact(values, offsets, y, delta, np.where(delta, np.nan, 0.0), RULES[0], w)
    np.testing.assert_allclose(z, tps_censored_simple(values, offsets, y, delta, RULES[0], w), atol=0)
    with pytest.raises(ValueError):
        posterior_weight(np.array([np.nan]), np.array([True]), None)  # complete without Y


def test_conditional_projection_identity_with_branches():
    # q_hat = k/M from M branch outcomes: exact score equals the branch-average complete-prefix score (App. H.2)
    values = np.array([0.3, 0.55, 0.2, 0.9, 0.6])
    offsets = np.array([0, 3, 5])
    w = trajectory_weights(offsets, "linear-front")
    outcomes = [np.array([1, 0, 0, 1, 0, 0, 0, 1, 0, 0.0]), np.array([1, 1, 1, 0, 1.0])]
    q = np.array([o.mean() for o in outcomes])
    rule = parse_score("log")
    exact = tps_censored_exact(values, offsets, np.full(2, np.nan), np.zeros(2, bool), q, rule, w)
    for i, o in enumerate(outcomes):
        branch = [tps(values, offsets, np.full(2, yy), rule, w)[i] for yy in o]
        assert abs(exact[i] - np.mean(branch)) < 1e-15


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
@pytest.mark.parametrize("scheme", WEIGHT_SCHEMES)
def test_artificial_censoring_decomposition(rule, scheme):
    values, offsets, y = random_traces(n=80, seed=7)
    lengths = np.diff(offsets)
    rng = np.random.default_rng(8)
    z = np.array([rng.integers(1, L + 1) for L in lengths])
    cens = rng.random(lengths.size) < 0.5
    d = artificial_censoring(values, offsets, y, z, cens, rule, scheme)
    np.testing.assert_allclose(d["censored"] - d["complete"], d["prefix_swap"] + d["tail_omission"], atol=1e-14)
    assert np.all(d["tail_omission"] >= -1e-15)
    np.testing.assert_allclose(d["prefix_swap"][y == 0], 0.0, atol=0)
    np.testing.assert_allclose(d["censored"][~cens], d["complete"][~cens], atol=0)
    # direct recomputation: truncated prefixes, full-length weights, failure branch
    pv, po = truncate(values, offsets, np.where(cens, z, lengths))
    w_full = trajectory_weights(offsets, scheme)
    w_trunc, _ = truncate(w_full, offsets, np.where(cens, z, lengths))
    direct = tps_censored_simple(pv, po, np.where(cens, np.nan, y), ~cens, rule, w_trunc)
    np.testing.assert_allclose(d["censored"], direct, atol=1e-14)


# ---------------------------------------------------------------- Theorem B (Appendix B.2) counter-examples

def _two_step_world(trace):
    """q1 = 0.5, q2 in {0.7, 0.3} w.p. 1/2, Y ~ Bernoulli(q2). Enumerate the 4 (q2, Y) cells with probabilities.
    ``trace(q2) -> (F1, F2)``. Returns values, offsets, y, prob."""
    values, y, prob = [], [], []
    for q2 in (0.7, 0.3):
        for yy in (1.0, 0.0):
            values += list(trace(q2))
            y.append(yy)
            prob.append(0.5 * (q2 if yy else 1 - q2))
    return np.array(values), np.array([0, 2, 4, 6, 8]), np.array(y), np.array(prob)


def _expected_scalarized_brier(phi, trace):
    v, off, y, p = _two_step_world(trace)
    return float(np.sum(p * (phi(v, off) - y) ** 2))


def _expected_tps(trace, rule):
    v, off, y, p = _two_step_world(trace)
    return float(np.sum(p * tps(v, off, y, rule, trajectory_weights(off, "linear-front"))))


def truthful(q2):
    return (0.5, q2)


def test_theorem_b_phi_avg_makes_truthful_trace_strictly_worse():
    cheat = lambda q2: (0.5, 2 * q2 - 0.5)  # noqa: E731  G2 in {0.9, 0.1}
    t = _expected_scalarized_brier(phi_avg, truthful)
    g = _expected_scalarized_brier(phi_avg, cheat)
    assert t - g == pytest.approx(0.01, abs=1e-12)  # excess conditional loss 0.1^2 on every realisation
    for rule in RULES:  # TPS ranks them correctly (Theorem 4.1)
        assert _expected_tps(truthful, rule) > _expected_tps(cheat, rule)


def test_theorem_b_phi_min_makes_truthful_trace_strictly_worse():
    cheat = lambda q2: (1.0, q2)  # noqa: E731  inflate the non-minimum prefix
    t = _expected_scalarized_brier(phi_min, truthful)
    g = _expected_scalarized_brier(phi_min, cheat)
    # on q2 = 0.7 (prob 1/2) the loss difference is (0.7-0.7)^2 - (0.5-0.7)^2 = -0.04
    assert g - t == pytest.approx(0.5 * -0.04, abs=1e-12)
    for rule in RULES:
        assert _expected_tps(truthful, rule) > _expected_tps(cheat, rule)


def test_theorem_b_phi_last_ties():
    cheat = lambda q2: (0.9, q2)  # noqa: E731
    assert _expected_scalarized_brier(phi_last, cheat) == pytest.approx(_expected_scalarized_brier(phi_last, truthful), abs=1e-15)
    assert _expected_tps(truthful, RULES[0]) > _expected_tps(cheat, RULES[0])


def test_scalarized_loss_forms():
    c = np.array([0.2, 0.9])
    y = np.array([0.0, 1.0])
    assert scalarized_loss(c, y) == pytest.approx((0.04 + 0.01) / 2)
    assert scalarized_loss(c, y, "log") == pytest.approx(-(math.log(0.8) + math.log(0.9)) / 2)


def test_step_weights_elementwise():
    np.testing.assert_allclose(step_weights(np.array([1, 2]), np.array([2, 2]), "linear-front"), [2 / 3, 1 / 3])
