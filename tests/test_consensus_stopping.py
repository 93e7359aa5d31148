"""Sequential stopping rules (Mouzouni, "Black-box reliability certification", §9; uqh/harness/sampling/consensus.py): the printed Hoeffding rule (9.1) on hand-computed
sequences, the anytime-valid alternative's closed form and error level, and the scheduler's lower bound."""
from __future__ import annotations

import math

import numpy as np
import pytest

from uqh.harness.sampling.consensus import (
    certify,
    check_rule,
    earliest_stop,
    hoeffding_threshold,
    majority_e_value,
    stopping_time,
)


# ------------------------------------------------------------------------------------------ the printed rule


def test_hoeffding_threshold_is_the_printed_formula():
    # sqrt(2 ln(2 |C| k^2 / delta) / k), by hand: k = 20, |C| = 1, delta = 0.05 -> sqrt(2 ln(16000) / 20)
    assert hoeffding_threshold(20, 1, 0.05) == pytest.approx(math.sqrt(2 * 9.680344001221918 / 20))
    assert hoeffding_threshold(20, 1, 0.05) == pytest.approx(0.98389, abs=1e-5)
    assert hoeffding_threshold(19, 1, 0.05) == pytest.approx(1.00408, abs=1e-5)  # above 1: cannot stop at 19


def test_printed_rule_cannot_stop_before_20_unanimous_samples():
    """As the issue notes: at delta = 0.05 even a unanimous sequence stops only at k = 20 (the threshold first drops
    below the largest possible margin 1 there), against the ~10 samples on average of the paper's Table 6."""
    assert stopping_time(["a"] * 50, "hoeffding", 0.05) == 20
    assert stopping_time(["a"] * 19, "hoeffding", 0.05) is None
    for k in range(1, 20):
        assert not certify("hoeffding", [k], 0.05).certified
    assert earliest_stop([], "hoeffding", 0.05, 100) == 20


def test_printed_rule_with_one_dissent():
    """b then a, a, ...: |C| = 2 and Δ_k = (k - 2)/k. By hand: k = 25: Δ = 0.92 < sqrt(2 ln(4·625/0.05)/25) =
    0.93037; k = 26: Δ = 0.92308 > sqrt(2 ln(4·676/0.05)/26) = 0.91560 -> τ = 26."""
    assert hoeffding_threshold(25, 2, 0.05) == pytest.approx(0.93037, abs=1e-5)
    assert hoeffding_threshold(26, 2, 0.05) == pytest.approx(0.91560, abs=1e-5)
    assert stopping_time(["b"] + ["a"] * 40, "hoeffding", 0.05) == 26
    # the margin is strict: a margin equal to the threshold does not stop
    c = certify("hoeffding", [24, 1, 1], 0.05)
    assert c.statistic == pytest.approx(23 / 26) and c.threshold == pytest.approx(hoeffding_threshold(26, 3, 0.05))


def test_printed_rule_never_stops_on_a_split_vote():
    seq = ["a", "b"] * 200
    assert stopping_time(seq, "hoeffding", 0.05) is None
    assert stopping_time(seq, "anytime", 0.05) is None


# ------------------------------------------------------------------------------------------ the alternative


@pytest.mark.parametrize("a,k", [(0, 0), (0, 1), (1, 1), (3, 3), (5, 7), (2, 5), (10, 12), (30, 40)])
def test_e_value_closed_form_equals_the_mixture_integral(a, k):
    from scipy.integrate import quad

    integral, _ = quad(lambda q: 2 * (2 * q) ** a * (2 * (1 - q)) ** (k - a), 0.5, 1.0, epsabs=1e-13, epsrel=1e-12)
    assert majority_e_value(a, k) == pytest.approx(integral, rel=1e-9)


def test_e_value_unanimous_by_hand():
    # a = k: (2^(k+1) - 1)/(k + 1): 255/8 at k = 7, 511/9 at k = 8
    assert majority_e_value(7, 7) == 255 / 8 and majority_e_value(8, 8) == 511 / 9
    # one dissent (a = k - 1): (2^(k+1) - k - 2)/(k (k + 1))
    assert majority_e_value(11, 12) == pytest.approx(8178 / 156)
    assert majority_e_value(10, 11) == pytest.approx(4083 / 132)
    # never above 1 without a strict majority
    assert all(majority_e_value(a, k) <= 1 for k in range(1, 30) for a in range(0, k // 2 + 1))


def test_anytime_rule_stops_earlier_on_unanimous_samples():
    for delta in (0.01, 0.05, 0.1, 0.2):
        t_any = stopping_time(["a"] * 60, "anytime", delta)
        t_hoe = stopping_time(["a"] * 60, "hoeffding", delta)
        assert t_any < t_hoe
    # by hand at delta = 0.05 (threshold 2/delta = 40): E_7 = 31.875 < 40 <= E_8 = 56.8
    assert stopping_time(["a"] * 60, "anytime", 0.05) == 8
    assert stopping_time(["b"] + ["a"] * 60, "anytime", 0.05) == 12  # E at (10, 11) = 30.9 < 40 <= 52.4 at (11, 12)
    assert earliest_stop([], "anytime", 0.05, 100) == 8


def _simulate_wrong_stops(probs, rule, delta, n_seq, k_max, seed):
    """Fraction of sequences on which ``rule`` certifies a class other than the (unique) most likely one."""
    rng = np.random.default_rng(seed)
    draws = rng.choice(len(probs), size=(n_seq, k_max), p=probs)
    mode = int(np.argmax(probs))
    wrong = 0
    for row in draws:
        t = stopping_time(list(row), rule, delta)
        if t is not None:
            leader = np.bincount(row[:t], minlength=len(probs)).argmax()
            wrong += leader != mode or probs[mode] <= max(p for i, p in enumerate(probs) if i != mode)
    return wrong / n_seq


@pytest.mark.parametrize("probs", [(0.5, 0.5), (0.4, 0.3, 0.3), (0.45, 0.45, 0.1)])
def test_anytime_rule_error_level_without_a_majority(probs):
    """With no class above 1/2 any certificate is an error; Ville's inequality bounds them by delta."""
    delta, n = 0.2, 600
    rate = _simulate_wrong_stops(probs, "anytime", delta, n, 60, seed=1)
    assert rate <= delta + 3 * math.sqrt(delta * (1 - delta) / n)
    assert rate < delta  # in fact far below: the bound holds for every stopping time at once


def test_anytime_rule_certifies_the_majority_mode_sooner():
    """A clear majority (0.8): the alternative certifies the mode on nearly every sequence, never a wrong class,
    and with fewer samples than the printed rule (which, on these 80 samples, often does not stop at all)."""
    rng = np.random.default_rng(3)
    used = {"anytime": [], "hoeffding": []}
    wrong = 0
    for _ in range(300):
        seq = list(rng.choice(3, size=80, p=(0.8, 0.1, 0.1)))
        for rule in used:
            t = stopping_time(seq, rule, 0.05)
            used[rule].append(t or 80)
            if rule == "anytime" and t is not None:
                wrong += np.bincount(seq[:t], minlength=3).argmax() != 0
    assert wrong == 0 and sum(u < 80 for u in used["anytime"]) >= 290
    assert np.mean(used["anytime"]) < 0.5 * np.mean(used["hoeffding"])


def test_rules_take_no_label():
    """Proposition 9.3: the stopping time is a function of the samples alone; relabelling classes changes nothing."""
    seq = list("aababaaaaabaaaaaaaaaaaaaaaaaa")
    relabelled = ["z" if c == "a" else "q" for c in seq]
    for rule in ("hoeffding", "anytime"):
        assert stopping_time(seq, rule, 0.1) == stopping_time(relabelled, rule, 0.1)


# ------------------------------------------------------------------------------------------ the scheduler's bound


@pytest.mark.parametrize("rule", ["hoeffding", "anytime"])
def test_earliest_stop_is_a_lower_bound_on_the_stopping_time(rule):
    rng = np.random.default_rng(7)
    for _ in range(150):
        probs = rng.dirichlet(np.ones(3) * 0.4)
        seq = list(rng.choice(3, size=40, p=probs))
        tau = stopping_time(seq, rule, 0.1)
        for m in range(0, (tau or 40)):
            if m and certify(rule, np.bincount(seq[:m]).tolist(), 0.1).certified:
                break
            bound = earliest_stop(np.bincount(seq[:m], minlength=1).tolist(), rule, 0.1, 40)
            if tau is None:
                continue
            assert bound is not None and bound <= tau, (m, bound, tau)


def test_bad_rule_or_level():
    with pytest.raises(ValueError, match="unknown stopping rule"):
        check_rule("majority", 0.1)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        check_rule("anytime", 1.0)
    with pytest.raises(ValueError, match="unknown stopping rule"):
        certify("nope", [1], 0.1)
