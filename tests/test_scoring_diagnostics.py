"""Diagnostics (failure-oriented): hand-computed cases with ties, invariances, weighted == replicated, bootstrap."""
import itertools

import numpy as np
import pytest

from uqh.scoring.bootstrap import compare, interval, paired_bootstrap, resample_counts
from uqh.scoring.diagnostics import (
    ScalarDiagnostics,
    auprc,
    aurc,
    auroc,
    phi_avg,
    phi_last,
    phi_min,
    t_brier,
    t_ece,
    trajectory_scalar,
)
from uqh.scoring.weights import trajectory_weights


def test_hand_computed_no_ties():
    c = np.array([0.1, 0.4, 0.35, 0.8])
    y = np.array([0, 0, 1, 1.0])
    # failures (positive) are 0.1, 0.4; pairs with a success above: (0.1,0.35),(0.1,0.8),(0.4,0.8) -> 3/4
    assert auroc(c, y) == pytest.approx(0.75)
    # risk order (ascending c): F(0.1) S(0.35) F(0.4) S(0.8): precision at the failures 1, 2/3
    assert auprc(c, y) == pytest.approx((1 + 2 / 3) / 2)
    # accept most confident first: S F S F -> risks 0, 1/2, 1/3, 2/4
    assert aurc(c, y) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4)
    assert t_brier(c, y) == pytest.approx((0.01 + 0.16 + 0.4225 + 0.04) / 4)


def test_hand_computed_with_ties():
    c = np.array([0.2, 0.2, 0.5, 0.5, 0.5, 0.9])
    y = np.array([0, 1, 0, 0, 1, 1.0])
    # failures: 0.2, 0.5, 0.5 ; successes: 0.2, 0.5, 0.9
    # pairs (f, s): f=0.2: s=0.2 tie 1/2, s=0.5 win, s=0.9 win -> 2.5; f=0.5 (x2): 0.2 loss, 0.5 tie, 0.9 win -> 1.5 each
    assert auroc(c, y) == pytest.approx((2.5 + 1.5 + 1.5) / 9)
    # AP with thresholds at distinct values, riskiest first: {0.2}: TP 1, PP 2 -> P=1/2 (recall +1/3);
    # {0.5}: TP 3, PP 5 -> P=3/5 (recall +2/3); {0.9}: no failures
    assert auprc(c, y) == pytest.approx((1 / 3) * 0.5 + (2 / 3) * 0.6)


def _aurc_bruteforce(c, y):
    """Mean over all orderings consistent with descending c (ties in every order) of mean_k risk@k."""
    idx = np.argsort(-c, kind="stable")
    vals = []
    blocks = [list(g) for _, g in itertools.groupby(idx, key=lambda i: c[i])]
    for perms in itertools.product(*[list(itertools.permutations(b)) for b in blocks]):
        order = [i for p in perms for i in p]
        fails = np.cumsum(1 - y[order])
        vals.append(np.mean(fails / np.arange(1, len(order) + 1)))
    return np.mean(vals)


def test_aurc_is_expected_over_random_tie_breaking():
    c = np.array([0.2, 0.2, 0.5, 0.5, 0.5, 0.9, 0.9])
    y = np.array([0, 1, 0, 0, 1, 1, 0.0])
    assert aurc(c, y) == pytest.approx(_aurc_bruteforce(c, y), abs=1e-12)


def test_constant_forecast():
    ybar = 0.842
    n = 1000
    y = (np.arange(n) < 842).astype(float)
    c = np.full(n, ybar)
    assert t_ece(c, y) == pytest.approx(0.0, abs=1e-12)
    assert auroc(c, y) == 0.5
    assert auprc(c, y) == pytest.approx(1 - ybar)  # Table 2 base-rate row: 0.158
    assert aurc(c, y) == pytest.approx(1 - ybar)
    assert t_brier(c, y) == pytest.approx(ybar * (1 - ybar))


def test_constant_stream_over_varying_horizons_is_tied():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 17, 300)
    off = np.concatenate([[0], np.cumsum(lengths)])
    y = (rng.random(300) < 0.6).astype(float)
    c = trajectory_scalar(np.full(off[-1], 0.6), off, trajectory_weights(off, "linear-front"))
    assert auroc(c, y) == 0.5  # float-rounding differences between horizons do not break ties


def test_t_ece_hand_computed_quantile_bins():
    # 20 distinct values -> 10 bins of 2
    c = np.linspace(0.05, 0.95, 20)
    y = np.array([0, 1] * 10, dtype=float)
    expected = sum(abs(y[2 * k : 2 * k + 2].sum() - c[2 * k : 2 * k + 2].sum()) for k in range(10)) / 20
    assert t_ece(c, y) == pytest.approx(expected)
    # a tie block is never split: 3 equal values at the start all go to bin 0
    c2 = np.array([0.3, 0.3, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    y2 = np.array([1, 0, 0, 1, 1, 0, 1, 1, 1, 1.0])
    bins = [[0, 1, 2], [3], [4], [5], [6], [7], [8], [9]]
    expected2 = sum(abs(y2[b].sum() - c2[b].sum()) for b in bins) / 10
    assert t_ece(c2, y2) == pytest.approx(expected2)


def test_binwise_average_ties_truthful_under_t_ece():
    # Theorem A flavour: G = constant 0.5 has T-ECE 0 when E[Y] = 0.5
    y = np.array([1, 0] * 50, dtype=float)
    assert t_ece(np.full(100, 0.5), y) == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("f", [np.sqrt, np.square, lambda x: 0.4 + 0.2 * x, lambda x: 1 / (1 + np.exp(-10 * (x - 0.3)))])
def test_rank_metrics_invariant_under_monotone_maps(f):
    rng = np.random.default_rng(2)
    c = np.round(rng.uniform(0, 1, 400), 2)  # many ties
    y = (rng.random(400) < c).astype(float)
    for m in (auroc, auprc, aurc):
        assert m(f(c), y) == pytest.approx(m(c, y), abs=1e-12)


def test_weighted_equals_replicated():
    rng = np.random.default_rng(3)
    c = np.round(rng.uniform(0, 1, 60), 1)
    y = (rng.random(60) < 0.5).astype(float)
    counts = rng.integers(0, 4, size=(5, 60)).astype(float)
    batched = ScalarDiagnostics(c, y).compute(counts)
    for b in range(5):
        rep = np.repeat(np.arange(60), counts[b].astype(int))
        single = ScalarDiagnostics(c[rep], y[rep]).compute()
        for k in single:
            assert batched[k][b] == pytest.approx(single[k][0], abs=1e-12), k


def test_degenerate_labels_give_nan_not_numbers():
    c = np.array([0.2, 0.7])
    assert np.isnan(auroc(c, np.array([1.0, 1.0])))
    assert np.isnan(auprc(c, np.array([1.0, 1.0])))
    with pytest.raises(ValueError):
        auroc(np.array([0.2, np.nan]), np.array([0.0, 1.0]))


def test_aggregators():
    v = np.array([0.5, 0.9, 0.2, 0.7, 0.4])
    off = np.array([0, 3, 5])
    np.testing.assert_allclose(phi_last(v, off), [0.2, 0.4])
    np.testing.assert_allclose(phi_avg(v, off), [1.6 / 3, 0.55])
    np.testing.assert_allclose(phi_min(v, off), [0.2, 0.4])
    w = trajectory_weights(off, "linear-front")
    np.testing.assert_allclose(trajectory_scalar(v, off, w), [(3 * 0.5 + 2 * 0.9 + 0.2) / 6, (2 * 0.7 + 0.4) / 3])


def test_bootstrap_is_seeded_chunk_independent_and_matches_a_loop():
    rng = np.random.default_rng(4)
    c = rng.uniform(0, 1, 50)
    y = (rng.random(50) < c).astype(float)
    diag = ScalarDiagnostics(c, y)
    a = paired_bootstrap(lambda w: diag.compute(w), 50, 40, seed=9, chunk=7)
    b = paired_bootstrap(lambda w: diag.compute(w), 50, 40, seed=9, chunk=64)
    threaded = paired_bootstrap(lambda w: diag.compute(w), 50, 40, seed=9, chunk=3, workers=2)
    for k in a:
        np.testing.assert_allclose(a[k], threaded[k], rtol=0, atol=1e-13)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-13)  # BLAS order may differ by chunk
    # a straightforward loop over index resamples from the same generator gives the same numbers
    gen = np.random.default_rng(9)
    for r in range(40):
        idx = gen.integers(0, 50, 50)
        assert a["auroc"][r] == pytest.approx(auroc(c[idx], y[idx]), abs=1e-12)
        assert a["t_ece"][r] == pytest.approx(t_ece(c[idx], y[idx]), abs=1e-12)
    counts = next(resample_counts(50, 3, seed=1))
    assert counts.shape == (3, 50) and np.all(counts.sum(axis=1) == 50)


def test_compare_and_interval():
    rng = np.random.default_rng(5)
    sa = rng.normal(0, 1, 1000)
    sb = sa + 2.0 + rng.normal(0, 0.1, 1000)
    d = compare(0.0, 2.0, sa, sb)
    assert d["delta"] == 2.0
    assert d["se"] == pytest.approx(0.1, rel=0.1)
    assert d["delta_over_se"] == pytest.approx(20, rel=0.1)
    lo, hi = interval(np.arange(1001.0))
    assert (lo, hi) == pytest.approx((25.0, 975.0))


def test_tiny_trajectory_probabilities_keep_their_order():
    """exp(-cumulative NLL) runs from about 1e-200 to 1e-22: ties are decided to 12 significant digits, not 12
    decimals, so tiny values are not flattened to one tie at 0 (AUROC 0.5, correlations undefined)."""
    from uqh.scoring.diagnostics import auroc, kendall_failure, spearman_failure, tie_rounded

    c = np.array([1e-200, 3e-150, 2e-100, 1e-50, 5e-22, 2e-22])
    y = np.array([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    assert auroc(c, y) == pytest.approx(auroc(np.log(c), y)) == pytest.approx(8 / 9)
    assert spearman_failure(c, y) == pytest.approx(spearman_failure(np.log(c), y))
    assert kendall_failure(c, y) == pytest.approx(kendall_failure(np.arange(6.0), y)) and kendall_failure(c, y) > 0
    # still a tie tolerance: values equal up to float rounding are one tie, at any scale
    for scale in (1.0, 1e-30, 1e-250):
        a = np.array([0.3, 0.1 + 0.2, 0.3 * (1 + 1e-14), 0.31]) * scale
        assert np.unique(tie_rounded(a)).size == 2, scale
    assert tie_rounded(np.array([0.0, 5e-324]))[0] == 0.0 and np.isfinite(tie_rounded(np.array([5e-324]))).all()
