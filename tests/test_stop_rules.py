"""The sequential stop rule (uqh.harness.sampling.branch_rules): the confidence sequence against closed forms, its time-uniform
coverage, and the rule's decisions on hand-computed outcome sequences."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from uqh.harness.sampling.branch_rules import (
    FIXED,
    StopRule,
    confidence_sequence,
    decide,
    log_mixture_ratio,
    parse_stop_rule,
)
from uqh.rundir.errors import UserError


def upper_after_zeros(n: int, alpha: float = 0.05) -> float:
    """Closed form of the Jeffreys-mixture sequence's upper end after n failures: M_n(p) = C(2n, n) 4^-n / (1-p)^n
    (B(1/2, n+1/2) / B(1/2, 1/2) = C(2n, n) / 4^n), so M_n(p) >= 1/alpha iff p >= 1 - (alpha C(2n,n) 4^-n)^(1/n)."""
    return 1.0 - (alpha * math.comb(2 * n, n) / 4**n) ** (1.0 / n)


@pytest.mark.parametrize("n", [1, 2, 4, 5, 9, 10, 40])
def test_interval_after_all_failures_or_all_successes_matches_closed_form(n):
    lo, hi = confidence_sequence(0, n)
    assert lo == 0.0 and hi == pytest.approx(upper_after_zeros(n), abs=1e-12)
    lo, hi = confidence_sequence(n, n)  # symmetric prior: mirror image
    assert hi == 1.0 and lo == pytest.approx(1.0 - upper_after_zeros(n), abs=1e-12)


def test_interval_one_of_two_matches_closed_form():
    # M_2(p) = B(3/2, 3/2) / B(1/2, 1/2) / (p (1-p)) = 1 / (8 p (1-p)) >= 20  iff  p (1-p) <= 1/160
    lo, hi = confidence_sequence(1, 2)
    r = math.sqrt(1 - 4 / 160)
    assert lo == pytest.approx((1 - r) / 2, abs=1e-12) and hi == pytest.approx((1 + r) / 2, abs=1e-12)


def test_interval_ends_are_where_the_mixture_ratio_reaches_one_over_alpha():
    for s, n in [(3, 10), (7, 12), (1, 30), (25, 50)]:
        lo, hi = confidence_sequence(s, n)
        assert lo < s / n < hi
        for end in (lo, hi):
            assert log_mixture_ratio(end, s, n) == pytest.approx(math.log(20), abs=1e-9)
        for p in np.linspace(lo, hi, 7)[1:-1]:
            assert log_mixture_ratio(p, s, n) < math.log(20)
    assert confidence_sequence(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        confidence_sequence(3, 2)


def test_coverage_holds_uniformly_over_time():
    """Anytime validity: the chance that the sequence *ever* (n = 1..60) excludes the true q is <= 5%. A fixed-n
    95% interval checked at every n crosses far more often (that is what optional stopping exploits)."""
    rng = np.random.default_rng(3)
    for q in (0.05, 0.3, 0.5):
        y = rng.uniform(size=(1500, 60)) < q
        s = np.cumsum(y, axis=1)
        ever_out = 0
        for row in s:
            for n, k in enumerate(row, start=1):
                lo, hi = confidence_sequence(int(k), n)
                if not lo <= q <= hi:
                    ever_out += 1
                    break
        assert ever_out / len(s) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(s))
    # the test has power: exact fixed-n (Clopper-Pearson) intervals looked at every n leave q far more often
    from scipy.stats import beta

    q = 0.3
    s = np.cumsum(rng.uniform(size=(1500, 60)) < q, axis=1)
    n = np.arange(1, 61)
    lo = np.where(s > 0, beta.ppf(0.025, np.maximum(s, 1), n - s + 1), 0.0)
    hi = np.where(s < n, beta.ppf(0.975, s + 1, np.maximum(n - s, 1)), 1.0)
    assert np.mean(np.any((lo > q) | (hi < q), axis=1)) > 0.12


# ------------------------------------------------------------------------------------------ decisions


def run_rule(rule: StopRule, outcomes, max_branches: int):
    """The decision after each round on a fixed outcome sequence, until the rule stops."""
    for target in rule.rounds(max_branches):
        d = decide(rule, "p", outcomes[:target], planned=target, max_branches=max_branches)
        if d.stopped_by:
            return d
    raise AssertionError("a rule must stop at the maximum")


def test_rounds():
    assert StopRule(0.2).rounds(10) == [1, 5, 6, 7, 8, 9, 10]
    assert StopRule(0.2).rounds(5) == [1, 5] and StopRule(0.2).rounds(3) == [1, 3]
    assert StopRule(0.2).rounds(1) == [1] and FIXED.rounds(10) == [10]


def test_rounds_below_a_maximum_are_the_same_at_every_larger_one():
    """What resuming with a larger --branches relies on: up to the old maximum the same decisions are taken."""
    rule = StopRule(0.2)
    for m in range(1, 30):
        for larger in range(m + 1, 31):
            assert [r for r in rule.rounds(larger) if r < m] == [r for r in rule.rounds(m) if r < m]


def test_all_failures_stop_where_the_half_width_first_reaches_h():
    # half-widths after n zeros (upper / 2): n=4 0.329, n=5 0.2925, n=9 0.2027, n=10 0.1885
    assert upper_after_zeros(4) / 2 > 0.3 > upper_after_zeros(5) / 2
    assert upper_after_zeros(9) / 2 > 0.2 > upper_after_zeros(10) / 2
    d = run_rule(StopRule(0.3), [0] * 10, 10)
    assert (d.branches, d.resolved, d.successes, d.stopped_by) == (5, 5, 0, "half_width")
    assert d.interval == (0.0, pytest.approx(upper_after_zeros(5), abs=1e-12))
    d = run_rule(StopRule(0.2), [0] * 10, 10)
    assert (d.branches, d.stopped_by) == (10, "half_width")
    d = run_rule(StopRule(0.1), [1] * 10, 10)  # 0.1 is out of reach within 10 draws
    assert (d.branches, d.stopped_by) == (10, "max_branches")
    assert d.interval == (pytest.approx(1 - upper_after_zeros(10), abs=1e-12), 1.0)


def test_unresolved_branches_run_but_carry_no_outcome():
    # 7 branches, 2 unresolved: 5 failures -> half-width 0.2925 <= 0.3 after the round that reached 7 branches
    seq = [0, None, 0, 0, None, 0, 0, 1, 1, 1]
    d = run_rule(StopRule(0.3), seq, 10)
    assert (d.branches, d.resolved, d.successes, d.stopped_by) == (7, 5, 0, "half_width")


def test_mixed_outcomes_run_to_the_maximum():
    d = run_rule(StopRule(0.3), [1, 0] * 5, 10)
    assert (d.branches, d.resolved, d.successes, d.stopped_by) == (10, 10, 5, "max_branches")


def test_missing_branch_keeps_the_prefix_open():
    d = decide(StopRule(0.3), "p", [0, 0, 0, 0], planned=5, max_branches=10)  # branch 4 did not finish
    assert d.stopped_by is None and d.branches == 4
    d = decide(StopRule(0.45), "p", [0, 0, 0, 0], planned=5, max_branches=5)  # narrow enough, still open
    assert d.stopped_by is None


def test_fixed_rule_stops_only_at_the_maximum():
    assert decide(FIXED, "p", [0] * 9, planned=9, max_branches=10).stopped_by is None
    assert decide(FIXED, "p", [0] * 10, planned=10, max_branches=10).stopped_by == "max_branches"


def test_parse_stop_rule():
    assert parse_stop_rule("fixed") is FIXED
    assert parse_stop_rule(" CI:0.25 ") == StopRule(0.25) and StopRule(0.25).text == "ci:0.25"
    for bad, msg in [("ci:0", "in (0, 0.5)"), ("ci:0.5", "in (0, 0.5)"), ("ci:x", "in (0, 0.5)"),
                     ("ci:nan", "in (0, 0.5)"), ("sprt", "unknown --stop-rule"), ("", "unknown --stop-rule")]:
        with pytest.raises(UserError, match=re.escape(msg)):
            parse_stop_rule(bad)
