"""Conformal calibration over self-consistency (Mouzouni, "Black-box reliability certification", §6-7; uqh/scoring/certify/conformal.py, uqh/scoring/certify/certificate.py).

Closed forms and hand-computed cases for every formula; simulations with synthetic agents of known per-query answer
distributions for the guarantees: coverage >= 1 - α (Theorem 6.7, with the rank score's ties), the
[1 - α, 1 - α + 1/(n+1)] window for tie-free scores, the exact coverage of a two-class agent, set size growing
as the agent weakens (Theorem 7.5) and the unsolvable-items shortfall (Remark 7.6)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from uqh.scoring.certify.certificate import CertifyItem, CertifyOptions, certify_items, split_calibration
from uqh.scoring.certify.conformal import (
    conformal_k,
    conformal_threshold,
    conformal_thresholds,
    cp_covered,
    cp_scores,
    cp_set_sizes,
    rank_classes,
    rank_covered,
    rank_items,
    rank_scores,
    rank_set_sizes,
    reliability_level,
    wilson_interval,
)


def items_of(design: list[tuple[str, ...]], acceptable: list[set]) -> list[CertifyItem]:
    return [CertifyItem(f"t{i}", cls, tuple(c in acc for c in cls)) for i, (cls, acc) in enumerate(zip(design, acceptable))]


def agent(rng, p_star, k, distractors=(0.6, 0.3, 0.1), prefix="x") -> list[CertifyItem]:
    """Synthetic agent: item i answers its acceptable class "ok" with probability p_star[i], else one of the
    distractors with the given shares."""
    p_star = np.asarray(p_star, dtype=float)
    probs = np.column_stack([p_star] + [(1 - p_star) * w for w in distractors])
    cum = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
    draws = (rng.random((p_star.size, k))[:, :, None] > cum[:, None, :-1]).sum(axis=2)
    names = ["ok"] + [f"d{j}" for j in range(1, len(distractors) + 1)]
    return [CertifyItem(f"{prefix}{i}", tuple(names[d] for d in row), tuple(bool(d == 0) for d in row))
            for i, row in enumerate(draws)]


def table_of(items, seed=0):
    return rank_items([it.task_id for it in items], [it.classes for it in items],
                      [it.acceptable_classes() for it in items], seed)


# ------------------------------------------------------------------------------------------ formulas


def test_reliability_level_by_hand():
    # Definition 2.4: #{s_i <= 1} / (n + 1)
    assert reliability_level(np.array([1, 1, 2, np.inf, 1])) == 3 / 6
    assert reliability_level(np.array([1.0] * 9)) == 9 / 10
    assert reliability_level(np.array([2.0, np.inf])) == 0


@pytest.mark.parametrize("n,alpha,k", [(8, 0.3, 7), (8, 0.1, 9), (8, 0.45, 5), (99, 0.1, 90), (499, 0.1, 450),
                                       (9, 0.7, 3), (24, 0.44, 14), (19, 0.95, 1)])
def test_conformal_k_exact(n, alpha, k):
    # k = ceil((n + 1)(1 - alpha)) in decimal arithmetic: for the last three, binary floating point gives k + 1
    # (e.g. 25 * (1 - 0.44) = 14.000000000000002)
    assert conformal_k(n, alpha) == k


def test_m_star_by_hand_and_infinite_when_k_exceeds_n():
    s = np.array([1, 2, 1, 1, np.inf, 1, 2, 1], dtype=float)  # sorted: 1 1 1 1 1 2 2 inf
    assert conformal_threshold(s, 0.3) == 2  # k = 7
    assert conformal_threshold(s, 0.45) == 1  # k = 5
    assert conformal_threshold(s, 0.2) == math.inf  # k = 8: the 8th smallest is +inf
    assert conformal_threshold(s, 0.1) == math.inf  # k = 9 > n = 8
    rows = np.vstack([s, np.roll(s, 3)])
    assert list(conformal_thresholds(rows, 0.3)) == [2, 2]


def test_mode_suffices_exactly_up_to_the_reliability_level():
    """Definition 2.4, 'equivalently': M*(α) = 1 iff 1 - α <= 1 - α*."""
    s = np.array([1, 2, 1, 1, np.inf, 1, 2, 1], dtype=float)
    level = reliability_level(s)  # 5/9
    for alpha in np.round(np.arange(0.01, 1.0, 0.01), 2):
        assert (conformal_threshold(s, alpha) == 1) == (1 - alpha <= level + 1e-12), alpha


def test_ranking_and_scores_by_hand():
    items = items_of([("a", "a", "a", "b", "b", "c"), ("b", "b", None, None, None, "a"), ("c", "c")],
                     [{"b"}, {"a"}, {"a"}])
    t = table_of(items)
    assert t.classes[0] == ("a", "b", "c") and list(t.counts[0]) == [3, 2, 1]
    assert t.classes[1] == (None, "b", "a")  # the no-answer class is ranked like any class, never acceptable
    assert list(rank_scores(t)) == [2, 3, np.inf]
    assert list(t.n_classes) == [3, 3, 1]
    assert cp_scores(t)[0] == pytest.approx(5 / 6) and cp_scores(t)[1] == pytest.approx(1.0)
    assert cp_scores(t)[2] == np.inf
    # top-M* sets
    assert list(rank_set_sizes(2, t.n_classes)) == [2, 2, 1]
    assert list(rank_covered(rank_scores(t), 2)) == [True, False, False]
    # M* = inf: every sampled class, which still cannot cover an item whose acceptable class was never sampled
    assert list(rank_covered(rank_scores(t), math.inf)) == [True, True, False]
    # S^CP (Eq. 6.7): R(x) = min{r : cumfreq_r >= q}: item 0 cumfreq (1/2, 5/6, 1)
    assert list(cp_set_sizes(t, 0.6)) == [2, 2, 1] and list(cp_covered(t, 0.6)) == [True, False, False]
    assert list(cp_set_sizes(t, 0.5)) == [1, 1, 1]
    assert list(cp_set_sizes(t, math.inf)) == [3, 3, 1]


def test_several_acceptable_classes_take_the_best_rank():
    # Eq. 10.1: s = min over acceptable classes of their rank
    t = table_of(items_of([("a", "a", "b", "c")], [{"b", "a"}]))
    assert rank_scores(t)[0] == 1


def test_ties_broken_uniformly_at_random_and_stably():
    """§4.6: equally frequent classes are ordered uniformly at random (seeded); a class's place among its ties
    does not depend on which other classes exist, so a subset of the samples ranks them the same way."""
    first = [rank_classes("q", ["a", "b", "a", "b"], seed)[0][0] for seed in range(2000)]
    share = first.count("a") / 2000
    assert abs(share - 0.5) < 4 * math.sqrt(0.25 / 2000)
    three = [rank_classes("q", ["a", "b", "c"], seed)[0][0] for seed in range(3000)]
    assert all(abs(three.count(c) / 3000 - 1 / 3) < 0.04 for c in "abc")
    for seed in range(50):  # a more frequent class always ranks first
        assert rank_classes("q", ["b", "a", "a"], seed)[0] == ("a", 2)
        full = [c for c, _ in rank_classes("q", ["a", "b", "c", "a", "b", "c"], seed)]
        sub = [c for c, _ in rank_classes("q", ["a", "c"], seed)]
        assert [c for c in full if c in sub] == sub
    # a tied acceptable class scores 1 or 2 with equal chance
    s = [rank_scores(table_of(items_of([("a", "b")], [{"a"}]), seed))[0] for seed in range(1000)]
    assert abs(s.count(1.0) / 1000 - 0.5) < 0.07


@pytest.mark.parametrize("k,n,printed", [
    (58, 82, (0.60, 0.79)), (53, 82, (0.54, 0.74)),  # Table 2 HumanEval: coverage 0.707, mode acc 0.646
    (399, 409, (0.96, 0.99)), (395, 409, (0.94, 0.98)),  # TruthfulQA: coverage 0.976, judge 0.966
    (99, 125, (0.71, 0.85)), (96, 125, (0.69, 0.83)), (92, 125, (0.65, 0.81)),  # BigBench 0.792 / 0.768 / 0.736
    (478, 500, (0.93, 0.97)), (493, 500, (0.97, 0.99)),  # GSM8K coverage 0.956, judge 0.986
    (419, 500, (0.80, 0.87)), (399, 500, (0.76, 0.83)), (481, 500, (0.94, 0.98)),  # MMLU 0.838 / 0.798 / 0.962
    (29, 82, (0.26, 0.46)), (106, 500, (0.18, 0.25)),  # Table 5: HumanEval .354 (K=1), MMLU .212 (K=1)
])
def test_wilson_interval_reproduces_the_papers_printed_cis(k, n, printed):
    lo, hi = wilson_interval(k, n)
    assert (round(lo, 2), round(hi, 2)) == printed


def test_wilson_interval_closed_form():
    lo, hi = wilson_interval(8, 10)
    z = 1.959963984540054
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
    assert (lo, hi) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(0, 5)[0] == pytest.approx(0, abs=1e-15) and wilson_interval(5, 5)[1] == pytest.approx(1)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


# ------------------------------------------------------------------------------------------ guarantees


def test_window_for_tie_free_scores():
    """Theorem 6.7, Eq. 6.6: without ties P(s_{n+1} <= M*) = k/(n+1), in [1 - α, 1 - α + 1/(n+1)]."""
    rng = np.random.default_rng(0)
    for n, alpha in ((24, 0.1), (49, 0.2), (19, 0.05)):
        reps = 40_000
        scores = rng.random((reps, n + 1))
        thr = conformal_thresholds(scores[:, :n], alpha)
        mc = float((scores[:, n] <= thr).mean())
        exact = conformal_k(n, alpha) / (n + 1)
        se = math.sqrt(exact * (1 - exact) / reps)
        assert abs(mc - exact) < 4 * se
        assert 1 - alpha - 4 * se <= mc <= 1 - alpha + 1 / (n + 1) + 4 * se


def test_two_class_agent_coverage_equals_its_closed_form():
    """Rank scores with ties, through the whole pipeline. K = 5 samples of a two-class agent (acceptable with
    probability p): s = 1 with probability q = P(Bin(5, p) >= 3), else 2 (or +inf, never sampled). With n
    calibration items and k = ceil((n+1)(1-α)): M* = 1 iff at least k scores are 1, and every M* >= 2 gives the
    set of all sampled classes, so coverage = P(M* = 1) q + (1 - P(M* = 1)) (1 - (1-p)^5)."""
    p, K, n, alpha, reps = 0.75, 5, 49, 0.1, 1500
    q = binom.sf(2, K, p)
    k = conformal_k(n, alpha)
    p_mode = binom.sf(k - 1, n, q)
    exact = p_mode * q + (1 - p_mode) * (1 - (1 - p) ** K)
    rng = np.random.default_rng(5)
    hits = 0
    for r in range(reps):
        items = agent(rng, [p] * (n + 1), K, distractors=(1.0,), prefix=f"r{r}-")
        s = rank_scores(table_of(items, seed=r))
        hits += bool(rank_covered(s[n:], conformal_threshold(s[:n], alpha))[0])
    se = math.sqrt(exact * (1 - exact) / reps)
    assert abs(hits / reps - exact) < 4 * se
    assert exact >= 1 - alpha  # and the guarantee


@pytest.mark.parametrize("name", ["strong", "mixed", "hallucinating"])
@pytest.mark.parametrize("score", ["rank", "cp"])
def test_coverage_at_least_one_minus_alpha_over_random_splits(name, score):
    """Theorem 6.7 / 7.3 for any agent: over random calibration/test splits of exchangeable items,
    P(s_test <= M*) >= 1 - α (the conformal event; +inf <= +inf counts), whatever the agent's bias."""
    rng = np.random.default_rng({"strong": 1, "mixed": 2, "hallucinating": 3}[name])
    n_items, n_cal, splits = 300, 100, 300
    if name == "strong":
        p = rng.uniform(0.6, 1.0, n_items)
    elif name == "mixed":
        p = rng.uniform(0.2, 0.9, n_items)
    else:  # half the items: a stable wrong answer dominates (0.3 vs 0.42)
        p = np.where(rng.random(n_items) < 0.5, 0.3, 0.85)
    items = agent(rng, p, 10)
    t = table_of(items)
    s = rank_scores(t) if score == "rank" else cp_scores(t)
    perms = rng.permuted(np.tile(np.arange(n_items), (splits, 1)), axis=1)
    for alpha in (0.05, 0.1, 0.2):
        thr = conformal_thresholds(s[perms[:, :n_cal]], alpha)
        cov = (s[perms[:, n_cal:]] <= thr[:, None]).mean(axis=1)
        assert cov.mean() >= 1 - alpha - 3 * cov.std(ddof=1) / math.sqrt(splits), (alpha, cov.mean())
        if name == "strong":  # no unsolvable items: the sets themselves cover as often
            sets = np.array([rank_covered(rank_scores(t)[perms[r, n_cal:]], thr[r]).mean() if score == "rank"
                             else cp_covered(t.subset(np.isin(np.arange(n_items), perms[r, n_cal:])), thr[r]).mean()
                             for r in range(0, splits, 10)])
            assert sets.mean() >= 1 - alpha - 0.01


def test_set_size_grows_as_the_agent_weakens():
    """Theorem 7.5 (1): a weaker agent (its acceptable rank stochastically larger) has a larger M* and larger sets;
    (2): a perfect agent has M* = 1 and singleton sets."""
    rng = np.random.default_rng(11)
    m_star, size = [], []
    for p in (1.0, 0.95, 0.8, 0.6, 0.45, 0.3):
        ms, ss = [], []
        for rep in range(12):
            items = agent(rng, np.full(200, p), 10, distractors=(0.7, 0.2, 0.1), prefix=f"{p}-{rep}-")
            t = table_of(items, seed=rep)
            cal = split_calibration(200, 0.5, rep)
            thr = conformal_threshold(rank_scores(t)[cal], 0.1)
            ms.append(thr)
            ss.append(rank_set_sizes(thr, t.n_classes[~cal]).mean())
        m_star.append(np.mean(ms))
        size.append(np.mean(ss))
    assert m_star[0] == 1 and size[0] == 1
    assert all(a <= b for a, b in zip(m_star, m_star[1:])), m_star
    assert all(a <= b for a, b in zip(size, size[1:])), size
    assert size[2] < size[3] < size[4] < size[5] and m_star[-1] >= 2  # strictly, once the mode is often wrong


def test_unsolvable_items_beyond_alpha_make_m_star_infinite_and_coverage_falls_short_by_their_share():
    """Theorem 7.5 (3) and Remark 7.6: 25% of the items are never answered acceptably (β = 0.25 > α = 0.1):
    M* = +inf, the sets hold every sampled class, marginal coverage is the solvable share, conditional coverage on
    solvable items is 1."""
    rng = np.random.default_rng(4)
    p = np.where(np.arange(400) % 4 == 0, 0.0, 0.9)
    items = agent(rng, p, 10)
    res = certify_items(items, CertifyOptions(alpha=0.1, cal_frac=0.5, seed=1, resplits=20, n_bootstrap=50))
    assert res.main.threshold == "inf"
    solvable = [any(it.accepted) for it, c in zip(items, split_calibration(400, 0.5, 1)) if not c]
    assert res.main.coverage.successes == sum(solvable)
    assert res.main.conditional_coverage.value == 1.0
    assert res.counts.unsolvable_items == 100 and res.solvable_fraction == 0.75
    assert any("capability gap 25.0%" in n for n in res.notes)
    assert res.stability.infinite_splits == 20


# ------------------------------------------------------------------------------------------ the certificate


DESIGN = [5, 5, 4, 3, 2, 1, 0, 5]  # acceptable samples out of 5 per task; the others give one wrong answer


def design_items() -> list[CertifyItem]:
    out = []
    for i, c in enumerate(DESIGN):
        cls = tuple(["R"] * c + ["W"] * (5 - c))
        out.append(CertifyItem(f"t{i}", cls, tuple(x == "R" for x in cls)))
    return out


def test_certificate_on_a_hand_computed_design():
    # rank scores: c >= 3 -> 1; c in {1, 2} -> 2; c = 0 -> inf:  1 1 1 1 2 2 inf 1
    res = certify_items(design_items(), CertifyOptions(alpha=0.3, cal_frac=1.0, n_bootstrap=0))
    assert res.n_cal == 8 and res.n_test == 0 and res.evaluated_on == "all"
    assert res.reliability_level == pytest.approx(5 / 9) and res.reliability_count == 5
    assert res.main.k == 7 and res.main.threshold == 2 and not res.main.mode_suffices
    assert res.main.coverage is None and res.stability is None
    sweep = {r.alpha: (r.k, r.threshold) for r in res.alpha_sweep}
    assert sweep == {0.01: (9, "inf"), 0.05: (9, "inf"), 0.1: (9, "inf"), 0.15: (8, "inf"), 0.2: (8, "inf"),
                     0.25: (7, 2), 0.3: (7, 2)}
    assert res.mode_accuracy.successes == 5 and res.single_sample_accuracy.successes == 7
    assert res.sample_accuracy.value == pytest.approx(25 / 40)
    assert res.counts.unsolvable_items == 1 and res.counts.classes == 12 and res.counts.mixed_classes == 0


def test_certificate_test_split_by_hand():
    items = design_items()
    opts = CertifyOptions(alpha=0.3, cal_ids=["t0", "t1", "t4", "t6", "t7"], n_bootstrap=0, resplits=0)
    res = certify_items(items, opts)
    # calibration scores 1 1 2 inf 1: k = ceil(6 * 0.7) = 5 -> M* = inf; reliability 3/6
    assert res.n_cal == 5 and res.reliability_level == pytest.approx(0.5) and res.main.threshold == "inf"
    # test items t2 (c=4), t3 (c=3), t5 (c=1): all sampled the acceptable class; M* = inf holds both classes
    assert (res.main.coverage.successes, res.main.coverage.n) == (3, 3)
    assert res.main.set_size.value == pytest.approx(2.0)
    row = next(r for r in res.alpha_sweep if r.alpha == 0.3)
    assert row.threshold == "inf"
    opts = CertifyOptions(alpha=0.45, cal_ids=["t0", "t1", "t4", "t6", "t7"], n_bootstrap=0, resplits=0)
    res = certify_items(items, opts)  # k = ceil(6 * 0.55) = 4 -> M* = 2
    assert res.main.threshold == 2 and res.main.coverage.successes == 3
    assert res.mode_accuracy.successes == 2 and res.mode_accuracy.n == 3  # t5's mode is wrong


def test_verified_marks_replace_the_calibration_scores():
    items = design_items()
    marks = {"t0": True, "t1": True, "t4": True, "t6": False, "t7": True}  # a lenient human accepts t4's top answer
    res = certify_items(items, CertifyOptions(alpha=0.3, cal_ids=list(marks), verified=marks, n_bootstrap=0))
    assert res.settings.acceptability == "verified"
    assert res.reliability_count == 4 and res.reliability_level == pytest.approx(4 / 6)
    # a rejected top answer is scored +inf (its acceptable rank is unknown): conservative
    harsh = {k: False for k in marks}
    res = certify_items(items, CertifyOptions(alpha=0.3, cal_ids=list(harsh), verified=harsh, n_bootstrap=0))
    assert res.reliability_level == 0 and res.main.threshold == "inf"


def test_split_stability_counts_every_resplit():
    rng = np.random.default_rng(8)
    items = agent(rng, rng.uniform(0.4, 1.0, 120), 10)
    res = certify_items(items, CertifyOptions(alpha=0.1, cal_frac=0.5, resplits=40, n_bootstrap=0))
    st = res.stability
    assert st.resplits == 40 and sum(st.threshold_counts.values()) == 40 and st.n_cal == 60 == res.n_cal
    assert 0 < st.coverage_mean <= 1 and st.coverage_sd >= 0
    perfect = certify_items(agent(rng, np.ones(60), 5), CertifyOptions(alpha=0.1, resplits=30, n_bootstrap=0))
    assert perfect.stability.threshold_counts == {"1": 30} and perfect.stability.coverage_sd == 0


def test_sequential_replay_uses_the_given_samples():
    items = [CertifyItem("u", ("a",) * 10, (True,) * 10), CertifyItem("v", ("a", "b") * 5, (True, False) * 5),
             CertifyItem("w", ("b",) * 10, (False,) * 10)]
    res = certify_items(items, CertifyOptions(alpha=0.3, cal_frac=1.0, n_bootstrap=0),
                        stopping={"anytime": [4, 10, 6]})
    (seq,) = res.sequential
    assert (seq.samples_used, seq.samples_recorded, seq.items_stopped) == (20, 30, 2)
    assert seq.savings == pytest.approx(1 / 3) and seq.avg_samples.value == pytest.approx(20 / 3)
    assert seq.reliability_level == pytest.approx(1 / 4)  # u: mode right; v: tie a/b (random); w: never right
