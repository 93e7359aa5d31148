"""Sequential stopping rules for self-consistency sampling (Mouzouni, "Black-box reliability certification for AI agents", §9): when may a task's sampling stop?

Pure functions of the canonical classes drawn so far, in sample order -- never of a label, so a stopping time
depends only on the agent's samples and the conformal guarantee survives adaptive sampling (Proposition 9.3).
The runner's scheduler (:mod:`uqh.harness.sampling.scheduler`) asks them after every finished sample; ``uqh certify`` replays
them on recorded samples to report what each rule would have used. They live in the harness (importing nothing of
ours) because the write path may not import :mod:`scoring`.

Two rules, both on the class counts after k samples:

- ``hoeffding`` -- Theorem 9.1 exactly as printed: stop at the first k with
  Δ_k > sqrt(2 ln(2 |C(x)| k² / δ) / k), Δ_k the margin between the two largest empirical frequencies and |C(x)|
  the number of distinct classes seen so far. As printed it cannot stop before k = 20 at δ = 0.05 even when every
  sample agrees (Δ_k ≤ 1, and the threshold first drops below 1 at k = 20), which contradicts the ~10 samples on
  average the paper reports (Table 6). Its union over k spends Σ_k δ/k² = (π²/6) δ, not δ.
- ``anytime`` -- a tighter, anytime-valid alternative: stop at the first k at which some class c has the mixture
  e-value E_k(c) = ∫ Π_i [q / ½]^{1[c_i = c]} [(1 − q) / ½]^{1[c_i ≠ c]} dπ(q) ≥ 2/δ, with π uniform on [½, 1] (a
  test of H0: P(c) ≤ ½ against P(c) > ½; only a class seen in more than half of the samples can reach it). For any
  class with P(c) = p ≤ ½, E_k(c) ≤ 2p · M_k where M_k is a nonnegative martingale with M_0 = 1 under the truth, so by
  Ville's inequality P(∃k: E_k(c) ≥ 2/δ) ≤ p δ; summed over every class but the mode -- any number of them, seen or
  not -- the probability that the rule ever certifies a class that is not the strict-majority mode is ≤ δ. It
  certifies only a majority mode (P(mode) > ½), and stops after 8 unanimous samples at δ = 0.05 (20 for
  ``hoeffding``). E_k has the closed form Σ_{j≤a} C(k+1, j) / ((k + 1) C(k, a)) for a samples of c out of k.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Sequence

RULES = ("hoeffding", "anytime")


@dataclass(frozen=True)
class Certificate:
    """The rule's verdict on one set of counts: whether it certifies the mode, with the numbers behind it."""

    certified: bool
    statistic: float  # hoeffding: the margin Δ_k; anytime: the leading class's e-value E_k
    threshold: float  # what the statistic had to exceed (hoeffding: strictly; anytime: reach)


def check_rule(rule: str, delta: float) -> None:
    """ValueError unless ``rule`` is known and 0 < delta < 1."""
    if rule not in RULES:
        raise ValueError(f"unknown stopping rule {rule!r}; use one of {', '.join(RULES)}")
    if not 0 < delta < 1:
        raise ValueError(f"the stopping level delta must be in (0, 1), got {delta}")


def hoeffding_threshold(k: int, n_classes: int, delta: float) -> float:
    """The right-hand side of (9.1): sqrt(2 ln(2 |C| k² / δ) / k)."""
    return math.sqrt(2.0 * math.log(2.0 * n_classes * k * k / delta) / k)


def majority_e_value(a: int, k: int) -> float:
    """E_k of a class seen ``a`` times in ``k`` samples: the uniform-on-[½, 1] mixture of the likelihood ratios
    (2q)^a (2(1 − q))^(k − a), in closed form Σ_{j≤a} C(k+1, j) / ((k + 1) C(k, a)) (exact integer arithmetic)."""
    if not 0 <= a <= k:
        raise ValueError(f"need 0 <= a <= k, got a={a}, k={k}")
    return sum(math.comb(k + 1, j) for j in range(a + 1)) / ((k + 1) * math.comb(k, a))


def certify(rule: str, counts: Sequence[int], delta: float) -> Certificate:
    """Does ``rule`` certify the mode of a task whose classes were seen ``counts`` times (any order)?"""
    counts = sorted((c for c in counts if c > 0), reverse=True)
    k = sum(counts)
    if k == 0:
        return Certificate(False, 0.0, math.inf)
    top = counts[0]
    if rule == "hoeffding":
        second = counts[1] if len(counts) > 1 else 0
        margin = (top - second) / k
        threshold = hoeffding_threshold(k, len(counts), delta)
        return Certificate(margin > threshold, margin, threshold)
    if rule == "anytime":
        e_value = majority_e_value(top, k)
        threshold = 2.0 / delta
        return Certificate(e_value >= threshold, e_value, threshold)
    raise ValueError(f"unknown stopping rule {rule!r}; use one of {', '.join(RULES)}")


def stopping_time(classes: Sequence[Hashable], rule: str, delta: float) -> int | None:
    """τ: the first k (1-based) at which ``rule`` certifies the mode of ``classes[:k]``; None if it never does
    within the sequence."""
    counts: Counter = Counter()
    for k, c in enumerate(classes, start=1):
        counts[c] += 1
        if certify(rule, list(counts.values()), delta).certified:
            return k
    return None


def earliest_stop(counts: Sequence[int], rule: str, delta: float, k_max: int) -> int | None:
    """The smallest k' in (k, k_max] at which ``rule`` could certify after ``k = sum(counts)`` samples whatever the
    next samples are (a lower bound on τ when the rule has not certified at k); None if it cannot by ``k_max``.

    The best case for both rules is every further sample in the leading class: the margin and the e-value only grow
    with the leader's count, the other counts never shrink and the number of classes never drops.
    """
    counts = sorted((c for c in counts if c > 0), reverse=True)
    k = sum(counts)
    top = counts[0] if counts else 0
    rest = counts[1:]
    for k_next in range(k + 1, k_max + 1):
        best = [top + (k_next - k)] + rest
        if certify(rule, best, delta).certified:
            return k_next
    return None
