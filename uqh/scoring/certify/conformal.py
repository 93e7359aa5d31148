"""Split conformal calibration over self-consistency consensus (Mouzouni, "Black-box reliability certification", §4.6, §6, Definition 2.4).

Each item (a task) has K sampled answers mapped to canonical classes. :func:`rank_items` ranks an item's classes by
frequency -- ties broken uniformly at random, §4.6 -- into a :class:`ConsensusTable`: per item the ranked counts
and which ranked classes are acceptable, as padded arrays. Everything else is a vectorised function of that table:

- :func:`rank_scores` -- s(x, y) = the rank of the first acceptable class, +∞ when none was sampled (Def. 6.2;
  with several acceptable classes the smallest rank, Eq. 10.1);
- :func:`cp_scores` -- s^cp(x, y) = the cumulative frequency up to that rank (Def. 6.3), +∞ when none;
- :func:`conformal_k`, :func:`conformal_threshold` -- k = ⌈(n+1)(1−α)⌉ and M* = s_(k), the k-th smallest
  calibration score (Eq. 6.3; +∞ when k > n);
- :func:`rank_set_sizes` / :func:`cp_set_sizes` and :func:`rank_covered` / :func:`cp_covered` -- the top-M* set
  (Eq. 6.4) and the adaptive set S^CP = top-R(x), R(x) = min{r : Σ_{j≤r} P̂(c_(j)) ≥ q̂} (Eq. 6.7), and whether an
  acceptable class is in them;
- :func:`reliability_level` -- 1 − α* = #{s_i ≤ 1} / (n + 1) (Eq. 2.4);
- :func:`wilson_interval` -- the Wilson score interval for a proportion (the paper's 95% CIs, [14]).

The "no answer" class (None) is ranked like any class and is never acceptable.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Sequence

import numpy as np

#: Tolerance of the S^CP cumulative-frequency comparison (frequencies are ratios of small integers).
_CP_EPS = 1e-12


@dataclass(frozen=True)
class ConsensusTable:
    """Ranked consensus of n items, padded to L = the largest number of classes of an item.

    ``counts[i, r]`` is the number of samples of item i in its (r+1)-th ranked class (0 past its classes);
    ``acceptable[i, r]`` whether that class is acceptable; ``classes[i]`` the ranked class labels.
    """

    counts: np.ndarray  # (n, L) int
    acceptable: np.ndarray  # (n, L) bool
    classes: tuple[tuple[str | None, ...], ...]

    @property
    def n(self) -> int:
        return int(self.counts.shape[0])

    @property
    def samples(self) -> np.ndarray:
        """K_i: samples per item."""
        return self.counts.sum(axis=1)

    @property
    def n_classes(self) -> np.ndarray:
        """|C(x_i)|: distinct classes observed per item."""
        return (self.counts > 0).sum(axis=1)

    @property
    def cumfreq(self) -> np.ndarray:
        """(n, L) cumulative empirical frequency Σ_{j≤r} P̂(c_(j)) (1 past an item's classes)."""
        k = np.maximum(self.samples, 1)[:, None]
        return np.cumsum(self.counts, axis=1) / k

    def subset(self, mask: np.ndarray) -> "ConsensusTable":
        idx = np.flatnonzero(mask)
        return ConsensusTable(self.counts[idx], self.acceptable[idx], tuple(self.classes[i] for i in idx))


def tie_key(seed: int, item_id: str, cls: str | None) -> int:
    """A uniform random key per (seed, item, class), used to break ties between equally frequent classes. It does
    not depend on the other classes, so an item ranks its classes the same way whichever subset of samples is used
    (sequential stopping) and in every call (the verification file's top answer)."""
    label = "\x00none" if cls is None else "c:" + cls
    return int.from_bytes(hashlib.sha256(f"{seed}|{item_id}|{label}".encode()).digest()[:8], "big")


def rank_classes(item_id: str, classes: Sequence[str | None], seed: int) -> list[tuple[str | None, int]]:
    """(class, count) of one item's samples by decreasing count, ties in random order (§4.6, Eq. 4.8)."""
    counts = Counter(classes)
    return sorted(counts.items(), key=lambda kv: (-kv[1], tie_key(seed, item_id, kv[0])))


def rank_items(item_ids: Sequence[str], classes: Sequence[Sequence[str | None]],
               acceptable: Sequence[set], seed: int) -> ConsensusTable:
    """The :class:`ConsensusTable` of items given each item's sampled classes and its set of acceptable classes
    (the "no answer" class None is never acceptable)."""
    ranked = [rank_classes(i, c, seed) for i, c in zip(item_ids, classes)]
    width = max([len(r) for r in ranked] + [1])
    counts = np.zeros((len(ranked), width), dtype=np.int64)
    ok = np.zeros((len(ranked), width), dtype=bool)
    for i, (row, acc) in enumerate(zip(ranked, acceptable)):
        for r, (cls, c) in enumerate(row):
            counts[i, r] = c
            ok[i, r] = cls is not None and cls in acc
    return ConsensusTable(counts, ok, tuple(tuple(cls for cls, _ in row) for row in ranked))


# ------------------------------------------------------------------------------------------ scores


def rank_scores(table: ConsensusTable) -> np.ndarray:
    """Definition 6.2 / Eq. 10.1: the 1-based rank of the first acceptable class; +∞ when none was sampled."""
    found = table.acceptable.any(axis=1)
    first = np.argmax(table.acceptable, axis=1) + 1
    return np.where(found, first.astype(float), np.inf)


def cp_scores(table: ConsensusTable) -> np.ndarray:
    """Definition 6.3: Σ_{r ≤ rank} P̂(c_(r)) at the rank of the first acceptable class; +∞ when none."""
    s = rank_scores(table)
    out = np.full(table.n, np.inf)
    ok = np.isfinite(s)
    out[ok] = table.cumfreq[np.flatnonzero(ok), s[ok].astype(int) - 1]
    return out


def conformal_k(n: int, alpha: float) -> int:
    """k = ⌈(n + 1)(1 − α)⌉, in exact decimal arithmetic (α = 0.1 is one tenth, not its binary neighbour)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return math.ceil((n + 1) * (1 - Fraction(repr(float(alpha)))))


def conformal_threshold(scores: np.ndarray, alpha: float) -> float:
    """Eq. 6.3: the k-th smallest calibration score, k = ⌈(n + 1)(1 − α)⌉; +∞ when k > n (too few scores)."""
    scores = np.asarray(scores, dtype=float)
    k = conformal_k(scores.size, alpha)
    if k > scores.size:
        return math.inf
    return float(np.partition(scores, k - 1)[k - 1])


def conformal_thresholds(scores: np.ndarray, alpha: float) -> np.ndarray:
    """:func:`conformal_threshold` of every row of a (R, n) matrix of calibration scores (re-splits)."""
    scores = np.asarray(scores, dtype=float)
    k = conformal_k(scores.shape[1], alpha)
    if k > scores.shape[1]:
        return np.full(scores.shape[0], np.inf)
    return np.partition(scores, k - 1, axis=1)[:, k - 1]


def reliability_level(rank: np.ndarray) -> float:
    """Definition 2.4: 1 − α* = #{i : s_i ≤ 1} / (n + 1) over the calibration rank scores."""
    rank = np.asarray(rank, dtype=float)
    return float((rank <= 1).sum() / (rank.size + 1))


# ------------------------------------------------------------------------------------------ prediction sets


def rank_set_sizes(m_star: float, n_classes: np.ndarray) -> np.ndarray:
    """|S_{M*}(x)| = min(M*, |C(x)|): the top-M* classes (Eq. 6.4); M* = +∞ gives every observed class."""
    n_classes = np.asarray(n_classes)
    return np.minimum(n_classes, m_star).astype(float)


def rank_covered(rank: np.ndarray, m_star: float) -> np.ndarray:
    """Whether the top-M* set holds an acceptable class: s ≤ M* with s finite. The set holds sampled classes
    only, so an item none of whose acceptable answers was sampled (s = +∞) is never covered, even when M* = +∞
    (where the conformal event s ≤ M* holds): the shortfall is the unsolvable fraction (Remark 7.6)."""
    rank = np.asarray(rank, dtype=float)
    return np.isfinite(rank) & (rank <= m_star)


def cp_set_ranks(table: ConsensusTable, q_hat: float) -> np.ndarray:
    """R(x) of Eq. 6.7: the fewest top classes whose cumulative frequency reaches q̂ (every observed class when
    q̂ exceeds 1, i.e. +∞)."""
    cum = table.cumfreq
    reach = cum >= q_hat - _CP_EPS
    reach &= np.arange(cum.shape[1])[None, :] < table.n_classes[:, None]
    found = reach.any(axis=1)
    return np.where(found, np.argmax(reach, axis=1) + 1, table.n_classes).astype(float)


def cp_set_sizes(table: ConsensusTable, q_hat: float) -> np.ndarray:
    return cp_set_ranks(table, q_hat)


def cp_covered(table: ConsensusTable, q_hat: float) -> np.ndarray:
    """Whether S^CP(x) (the top-R(x) classes) holds an acceptable class."""
    return rank_scores(table) <= cp_set_ranks(table, q_hat)


# ------------------------------------------------------------------------------------------ proportions


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (Wilson 1927); (nan, nan) for n = 0."""
    if n <= 0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
