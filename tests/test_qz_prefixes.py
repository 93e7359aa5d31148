"""Exact vs simple censored score over retained prefixes (Appendix H.2, Tables 7–9; Remarks C.4/C.5), on
hand-made prefixes with known q_Z: closed forms, exact == simple at q̂_Z = 0, the conditional-projection identity
to 1e-12, Eq. (17), the unresolved-branch sensitivity and the plug-in bias."""
from __future__ import annotations

import math

import numpy as np
import pytest

from uqh.scoring.qz.prefixes import (
    RetainedPrefixes,
    branch_average_scores,
    mean_se,
    plugin_bias,
    prefix_scores,
    score_prefix_stream,
)
from uqh.scoring.rules import parse_score
from uqh.scoring.weights import trajectory_weights

LOG = parse_score("log")


def _prefixes(n_success, n_resolved, n_unresolved, q_plugin=None):
    s, r, u = (np.asarray(a, dtype=np.int64) for a in (n_success, n_resolved, n_unresolved))
    q = {"exclude": s / r, "failure": s / (r + u), "success": (s + u) / (r + u)}
    return RetainedPrefixes(np.array([f"p{i}" for i in range(s.size)], dtype=object), q, s, r,
                            None if q_plugin is None else np.asarray(q_plugin, dtype=float))


def _stream(rng, n, max_len=6):
    lengths = rng.integers(1, max_len + 1, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.uniform(0.02, 0.98, offsets[-1])
    return values, offsets, trajectory_weights(offsets, "linear-front", lengths)


def test_closed_form_on_two_hand_made_prefixes():
    # prefix 0: F = (0.8,), w = 1, q = 1/4; prefix 1: F = (0.5, 0.5), uniform w = 1/2, q = 1/2
    values, offsets = np.array([0.8, 0.5, 0.5]), np.array([0, 1, 3])
    w = np.array([1.0, 0.5, 0.5])
    simple, exact = prefix_scores(values, offsets, w, np.array([0.25, 0.5]), LOG)
    assert simple == pytest.approx([math.log(0.2), math.log(0.5)], abs=1e-15)
    assert exact == pytest.approx([0.25 * math.log(0.8) + 0.75 * math.log(0.2), math.log(0.5)], abs=1e-15)


def test_exact_equals_simple_when_every_q_hat_is_zero():
    values, offsets, w = _stream(np.random.default_rng(0), 30)
    p = _prefixes(np.zeros(30), np.full(30, 5), np.zeros(30))
    out = score_prefix_stream(values, offsets, w, p, LOG, n_boot=50, seed=1)
    assert out["exact"] == out["simple"]  # the same numbers, resample by resample
    assert out["difference"].mean == 0.0 and out["difference"].ci_low == 0.0 and out["difference"].ci_high == 0.0
    assert out["identity_max_error"] <= 1e-12 and out["eq17_max_error"] == 0.0


def test_identity_eq17_and_sensitivity_hold_on_random_prefixes():
    rng = np.random.default_rng(7)
    n = 40
    values, offsets, w = _stream(rng, n)
    r = rng.integers(5, 11, n)
    s = rng.binomial(r, rng.uniform(0, 1, n))
    u = rng.integers(0, 4, n)
    p = _prefixes(s, r, u)
    out = score_prefix_stream(values, offsets, w, p, LOG, n_boot=200, seed=3)
    assert out["n"] == n
    assert out["identity_max_error"] <= 1e-12
    assert out["eq17_max_error"] <= 1e-12
    simple, exact = prefix_scores(values, offsets, w, s / r, LOG)
    assert out["difference"].mean == pytest.approx(float(np.mean(exact - simple)), abs=1e-14)
    assert out["difference"].ci_low <= out["difference"].mean <= out["difference"].ci_high
    assert out["delta_over_se"] == pytest.approx(out["difference"].mean / out["difference"].se)
    # unresolved as failures: q = s / (r + u); as successes: (s + u) / (r + u)
    _, ex_f = prefix_scores(values, offsets, w, s / (r + u), LOG)
    _, ex_s = prefix_scores(values, offsets, w, (s + u) / (r + u), LOG)
    assert out["unresolved_as_failure"].mean == pytest.approx(float(np.mean(ex_f - simple)), abs=1e-14)
    assert out["unresolved_as_success"].mean == pytest.approx(float(np.mean(ex_s - simple)), abs=1e-14)
    # the correction's sign follows Eq. (17): prefixes all below 0.5 -> negative, all above -> positive
    low = score_prefix_stream(np.full(offsets[-1], 0.2), offsets, w, p, LOG, n_boot=20, seed=0)
    high = score_prefix_stream(np.full(offsets[-1], 0.8), offsets, w, p, LOG, n_boot=20, seed=0)
    assert low["difference"].mean < 0 < high["difference"].mean


def test_identity_check_detects_a_wrong_q_hat():
    values, offsets, w = _stream(np.random.default_rng(2), 10)
    p = _prefixes(np.full(10, 2), np.full(10, 5), np.zeros(10))
    _, exact = prefix_scores(values, offsets, w, np.full(10, 0.5), LOG)  # not the branch mean 0.4
    assert branch_average_scores(values, offsets, w, p.n_success, p.n_resolved, LOG, exact) > 1e-3
    _, exact = prefix_scores(values, offsets, w, np.full(10, 0.4), LOG)
    assert branch_average_scores(values, offsets, w, p.n_success, p.n_resolved, LOG, exact) <= 1e-12


def test_plugin_bias_closed_form():
    values, offsets = np.array([0.8, 0.5, 0.5, 0.3]), np.array([0, 1, 3, 4])
    w = np.array([1.0, 0.5, 0.5, 1.0])
    p = _prefixes([1, 2, 0], [4, 4, 5], [0, 0, 0], q_plugin=[0.35, 0.5, np.nan])  # MC q = 0.25, 0.5, 0
    b = plugin_bias(p, values, offsets, w, LOG, n_boot=100, seed=0)
    assert b.n == 2  # the prefix without a plug-in estimate is not averaged
    assert b.mean_bias.mean == pytest.approx((0.10 + 0.0) / 2)
    assert b.mean_abs_bias == pytest.approx(0.05)
    # Eq. 4 is linear in q: shift = r Σ w (log F − log(1 − F)); prefix 1 has F = 0.5 -> 0
    assert b.primary_score_shift.mean == pytest.approx(0.10 * math.log(0.8 / 0.2) / 2)
    assert plugin_bias(_prefixes([1], [4], [0]), values[:1], offsets[:2], w[:1], LOG, 10, 0) is None


def test_mean_se_edges():
    assert mean_se(np.array([]), np.zeros((5, 0), dtype=int)).mean is None
    m = mean_se(np.array([1.0, 3.0]), np.zeros((0, 2), dtype=int))
    assert m.mean == 2.0 and m.ci_low is None and m.se is None


def test_table_7_reproduced_from_its_printed_counts():
    """Table 7 prints n = 87, 67.8% at q̂ = 0, 23.0% above 0.5, median 0 and mean 0.240: 59 zeros, 20 prefixes
    above 0.5 and 8 in between with the printed mean give exactly those rows."""
    from uqh.scoring.qz.estimate import qz_distribution

    q = np.r_[np.zeros(59), np.full(20, 0.9), np.full(8, 0.36)]
    d = qz_distribution(q, n_boot=1000, seed=0)
    assert d.n == 87 and d.median == 0.0
    assert (round(100 * d.frac_zero, 1), round(100 * d.frac_above_half, 1), round(d.mean, 3)) == (67.8, 23.0, 0.240)
    assert d.ci[0] < d.mean < d.ci[1]
