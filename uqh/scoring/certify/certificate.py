"""The reliability certificate of one run (Mouzouni, "Black-box reliability certification for AI agents", §6, §7, §9, §11): calibration split, reliability level, M*,
test coverage, α sweep, split stability and the sequential-stopping replay, as one typed
:class:`~uqh.scoring.certify.certificate_results.CertifyResult`.

Input is data, not a run directory: one :class:`CertifyItem` per task -- the canonical class of every recorded
sample (from ``Domain.canonical_answer``, which scoring cannot import: the ``uqh certify`` command computes or
reads them) and the benchmark's verdict on every sample. A class is acceptable when the benchmark accepted one of
its samples (Canon(x, A*(x)), §6.2); with ``verified`` marks, a calibration item's score comes from the human mark
on its top answer instead (accepted: s = 1; rejected: the acceptable rank is unknown, s = +∞, which can only make
M* larger -- conservative). Test-split quantities always use the benchmark's verdicts.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from uqh.scoring.bootstrap import interval, paired_bootstrap, standard_error
from uqh.scoring.certify.certificate_results import (
    AlphaRow,
    CertifyResult,
    CertifySettings,
    ItemCounts,
    Proportion,
    RunStopping,
    SequentialResult,
    StabilityResult,
    threshold_value,
)
from uqh.scoring.certify.conformal import (
    ConsensusTable,
    conformal_k,
    conformal_threshold,
    conformal_thresholds,
    cp_covered,
    cp_scores,
    cp_set_sizes,
    rank_covered,
    rank_items,
    rank_scores,
    rank_set_sizes,
    reliability_level,
    wilson_interval,
)
from uqh.scoring.results import Estimate, finite_or_none

#: The paper's α grid (§11.1 protocol, Appendix C.2).
ALPHA_GRID = (0.01, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
SCORES = ("rank", "cp")


@dataclass(frozen=True)
class CertifyItem:
    """One task: the canonical class (None = no answer) and the benchmark's verdict of every recorded sample, in
    sample order."""

    task_id: str
    classes: tuple[str | None, ...]
    accepted: tuple[bool, ...]

    def acceptable_classes(self) -> set[str]:
        return {c for c, a in zip(self.classes, self.accepted) if a and c is not None}

    def truncated(self, k: int) -> "CertifyItem":
        return CertifyItem(self.task_id, self.classes[:k], self.accepted[:k])


@dataclass
class CertifyOptions:
    alpha: float = 0.1
    score: str = "rank"
    cal_frac: float | None = 0.5
    cal_ids: Sequence[str] | None = None  # explicit calibration items (cal_frac is then None)
    cal_ids_label: str | None = None  # where they came from (the --cal-ids file), for the settings
    seed: int = 0
    resplits: int = 100
    n_bootstrap: int = 1000
    level: float = 0.95
    alphas: tuple[float, ...] = ALPHA_GRID
    verified: dict[str, bool] | None = None  # human marks of the calibration items' top answers
    stop_delta: float = 0.05
    notes: list[str] = field(default_factory=list)


def split_calibration(n: int, cal_frac: float, seed: int) -> np.ndarray:
    """A random calibration mask of round(cal_frac · n) items (seeded); every item when cal_frac = 1."""
    n_cal = n if cal_frac >= 1 else int(round(cal_frac * n))
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng(seed).permutation(n)[:n_cal]] = True
    return mask


def calibration_mask(items: Sequence[CertifyItem], opts: CertifyOptions) -> np.ndarray:
    if opts.cal_ids is not None:
        wanted = set(opts.cal_ids)
        return np.array([it.task_id in wanted for it in items], dtype=bool)
    return split_calibration(len(items), float(opts.cal_frac), opts.seed)


# ------------------------------------------------------------------------------------------ building blocks


def _proportion(hits: np.ndarray, level: float) -> Proportion:
    hits = np.asarray(hits, dtype=bool)
    n, k = int(hits.size), int(hits.sum())
    if n == 0:
        return Proportion(successes=0, n=0)
    lo, hi = wilson_interval(k, n, level)
    return Proportion(successes=k, n=n, value=k / n, ci_low=lo, ci_high=hi)


def _mean_estimate(values: np.ndarray, opts: CertifyOptions) -> Estimate | None:
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return None
    point = float(values.mean())
    if opts.n_bootstrap <= 0:
        return Estimate(value=point)
    boot = paired_bootstrap(lambda c: {"m": c @ values / c.sum(axis=1)}, values.size, opts.n_bootstrap, opts.seed)
    lo, hi = interval(boot["m"], opts.level)
    return Estimate(value=point, ci_low=lo, ci_high=hi, se=finite_or_none(standard_error(boot["m"])))




@dataclass
class _Scored:
    """A consensus table with its gold scores and per-item facts."""

    table: ConsensusTable
    rank: np.ndarray
    cp: np.ndarray
    solvable: np.ndarray
    first_accepted: np.ndarray
    sample_rate: np.ndarray

    @classmethod
    def of(cls, items: Sequence[CertifyItem], seed: int) -> "_Scored":
        table = rank_items([it.task_id for it in items], [it.classes for it in items],
                           [it.acceptable_classes() for it in items], seed)
        return cls(
            table=table,
            rank=rank_scores(table),
            cp=cp_scores(table),
            solvable=np.array([any(it.accepted) for it in items], dtype=bool),
            first_accepted=np.array([bool(it.accepted[0]) if it.accepted else False for it in items], dtype=bool),
            sample_rate=np.array([np.mean(it.accepted) if it.accepted else 0.0 for it in items]),
        )

    def scores(self, score: str) -> np.ndarray:
        return self.rank if score == "rank" else self.cp


def _calibration_scores(sc: _Scored, cal: np.ndarray, items: Sequence[CertifyItem], opts: CertifyOptions):
    """(rank scores, chosen scores) of the calibration items: gold, or from the human marks of their top answers."""
    rank, chosen = sc.rank[cal], sc.scores(opts.score)[cal]
    if opts.verified is None:
        return rank, chosen
    ids = [it.task_id for it, c in zip(items, cal) if c]
    marks = np.array([opts.verified[i] for i in ids], dtype=bool)
    rank = np.where(marks, 1.0, np.inf)
    top_freq = sc.table.cumfreq[np.flatnonzero(cal), 0]
    chosen = rank if opts.score == "rank" else np.where(marks, top_freq, np.inf)
    return rank, chosen


def _evaluate(sc: _Scored, test: np.ndarray, score: str, threshold: float, opts: CertifyOptions):
    """(coverage, mean set size, conditional coverage on solvable items) of a threshold on the test items."""
    if not test.any():
        return None, None, None
    sub = sc.table.subset(test)
    if score == "rank":
        covered = rank_covered(sc.rank[test], threshold)
        sizes = rank_set_sizes(threshold, sub.n_classes)
    else:
        covered = cp_covered(sub, threshold)
        sizes = cp_set_sizes(sub, threshold)
    solv = sc.solvable[test]
    return _proportion(covered, opts.level), _mean_estimate(sizes, opts), _proportion(covered[solv], opts.level)


def _alpha_row(alpha: float, sc: _Scored, cal_rank, cal_scores, test, opts: CertifyOptions) -> AlphaRow:
    threshold = conformal_threshold(cal_scores, alpha)
    coverage, size, cond = _evaluate(sc, test, opts.score, threshold, opts)
    return AlphaRow(alpha=alpha, k=conformal_k(cal_scores.size, alpha), threshold=threshold_value(threshold),
                    mode_suffices=bool(conformal_threshold(cal_rank, alpha) <= 1), coverage=coverage, set_size=size,
                    conditional_coverage=cond)


def _label(threshold: float, score: str) -> str:
    if math.isinf(threshold):
        return "inf"
    return str(int(threshold)) if score == "rank" else f"{threshold:.4f}"


def split_stability(sc: _Scored, n_cal: int, opts: CertifyOptions) -> StabilityResult | None:
    """M*, coverage, set size and reliability level over ``opts.resplits`` random re-splits (Table 4)."""
    n = sc.table.n
    if opts.resplits <= 0 or not 0 < n_cal < n:
        return None
    rng = np.random.default_rng([opts.seed, 1])
    perms = rng.permuted(np.tile(np.arange(n), (opts.resplits, 1)), axis=1)
    cal_idx, test_idx = perms[:, :n_cal], perms[:, n_cal:]
    scores = sc.scores(opts.score)
    thresholds = conformal_thresholds(scores[cal_idx], opts.alpha)
    coverage, sizes = np.empty(opts.resplits), np.empty(opts.resplits)
    for r in range(opts.resplits):
        mask = np.zeros(n, dtype=bool)
        mask[test_idx[r]] = True
        cov, size, _ = _evaluate(sc, mask, opts.score, thresholds[r], CertifyOptions(n_bootstrap=0))
        coverage[r], sizes[r] = cov.value, size.value
    reliability = (sc.rank[cal_idx] <= 1).sum(axis=1) / (n_cal + 1)
    counts: dict[str, int] = defaultdict(int)
    for t in thresholds:
        counts[_label(t, opts.score)] += 1
    finite = thresholds[np.isfinite(thresholds)]
    return StabilityResult(
        resplits=opts.resplits, n_cal=n_cal, n_test=n - n_cal, alpha=opts.alpha,
        threshold_counts=dict(sorted(counts.items(), key=lambda kv: (kv[0] == "inf", float(kv[0].replace("inf", "0"))))),
        threshold_mean=float(finite.mean()) if finite.size else None,
        threshold_sd=float(finite.std(ddof=1)) if finite.size > 1 else None,
        infinite_splits=int(np.isinf(thresholds).sum()),
        coverage_mean=float(coverage.mean()), coverage_sd=float(coverage.std(ddof=1)) if opts.resplits > 1 else None,
        set_size_mean=float(sizes.mean()), set_size_sd=float(sizes.std(ddof=1)) if opts.resplits > 1 else None,
        reliability_mean=float(reliability.mean()),
        reliability_sd=float(reliability.std(ddof=1)) if opts.resplits > 1 else None,
    )


def sequential_replay(items: Sequence[CertifyItem], used: Sequence[int], rule: str, cal: np.ndarray,
                      opts: CertifyOptions) -> SequentialResult:
    """The certificate from the first ``used[i]`` samples of every item (a stopping rule's choice; Table 6)."""
    recorded = np.array([len(it.classes) for it in items])
    used_arr = np.array(used)
    sc = _Scored.of([it.truncated(int(k)) for it, k in zip(items, used_arr)], opts.seed)
    test = ~cal
    cal_scores = sc.scores(opts.score)[cal]
    threshold = conformal_threshold(cal_scores, opts.alpha)
    coverage, size, _ = _evaluate(sc, test, opts.score, threshold, opts)
    return SequentialResult(
        rule=rule, delta=opts.stop_delta, samples_recorded=int(recorded.sum()), samples_used=int(used_arr.sum()),
        savings=float(1 - used_arr.sum() / recorded.sum()) if recorded.sum() else 0.0,
        items_stopped=int((used_arr < recorded).sum()), avg_samples=_mean_estimate(used_arr, opts),
        threshold=threshold_value(threshold), reliability_level=reliability_level(sc.rank[cal]),
        coverage=coverage, set_size=size,
    )


# ------------------------------------------------------------------------------------------ the certificate


def certify_items(
    items: Sequence[CertifyItem],
    opts: CertifyOptions,
    *,
    run_dir: str = "",
    domain: str = "",
    model: str = "",
    canonicalised_now: int = 0,
    stopping: dict[str, Sequence[int]] | None = None,
    run_stopping: RunStopping | None = None,
) -> CertifyResult:
    """The certificate of ``items`` (one per task). ``stopping`` maps a rule name to the samples it would use per
    item (its stopping time, or every recorded sample), replayed by :func:`sequential_replay`."""
    if opts.score not in SCORES:
        raise ValueError(f"unknown score {opts.score!r}; use one of {', '.join(SCORES)}")
    items = list(items)
    sc = _Scored.of(items, opts.seed)
    cal = calibration_mask(items, opts)
    test = ~cal
    n_cal, n_test = int(cal.sum()), int(test.sum())
    cal_rank, cal_scores = _calibration_scores(sc, cal, items, opts)
    main = _alpha_row(opts.alpha, sc, cal_rank, cal_scores, test, opts)
    sweep = [_alpha_row(a, sc, cal_rank, cal_scores, test, opts) for a in opts.alphas]
    evaluated = test if n_test else np.ones(len(items), dtype=bool)
    n_samples = np.array([len(it.classes) for it in items]) if items else np.zeros(0, dtype=int)
    per_class: dict[tuple[str, str], set[bool]] = defaultdict(set)
    for it in items:
        for c, a in zip(it.classes, it.accepted):
            if c is not None:
                per_class[(it.task_id, c)].add(bool(a))
    counts = ItemCounts(
        items=len(items), samples=int(n_samples.sum()), samples_min=int(n_samples.min()) if items else 0,
        samples_max=int(n_samples.max()) if items else 0,
        no_answer_samples=sum(c is None for it in items for c in it.classes), classes=len(per_class),
        mixed_classes=sum(len(v) > 1 for v in per_class.values()), unsolvable_items=int((~sc.solvable).sum()),
        canonicalised_now=canonicalised_now,
    )
    sequential = [sequential_replay(items, used, rule, cal, opts) for rule, used in (stopping or {}).items()]
    result = CertifyResult(
        run_dir=run_dir, domain=domain, model=model,
        settings=CertifySettings(
            alpha=opts.alpha, score=opts.score, cal_frac=None if opts.cal_ids is not None else opts.cal_frac,
            cal_ids=opts.cal_ids_label, seed=opts.seed, resplits=opts.resplits, bootstrap=opts.n_bootstrap,
            ci_level=opts.level, acceptability="verified" if opts.verified is not None else "gold",
            stop_delta=opts.stop_delta),
        counts=counts, n_cal=n_cal, n_test=n_test, evaluated_on="test" if n_test else "all",
        reliability_level=reliability_level(cal_rank) if n_cal else None,
        reliability_count=int((cal_rank <= 1).sum()),
        main=main,
        mode_accuracy=_proportion(sc.rank[evaluated] <= 1, opts.level),
        single_sample_accuracy=_proportion(sc.first_accepted[evaluated], opts.level),
        sample_accuracy=_mean_estimate(sc.sample_rate[evaluated], opts),
        solvable_fraction=float(sc.solvable.mean()) if items else None,
        alpha_sweep=sweep,
        stability=split_stability(sc, n_cal, opts),
        sequential=sequential,
        run_stopping=run_stopping,
    )
    result.notes = list(opts.notes) + _notes(result)
    return result


def _notes(r: CertifyResult) -> list[str]:
    out = []
    s = r.settings
    if r.n_test == 0:
        out.append("no test split: the reliability level is the certificate; coverage is not evaluated")
    if r.main.threshold == "inf":
        out.append(f"at α={s.alpha} no finite prediction set reaches {1 - s.alpha:.0%} on the calibration split "
                   f"(k = {r.main.k} exceeds the finite scores available): sets hold every sampled class")
    c = r.counts
    if c.unsolvable_items:
        out.append(f"{c.unsolvable_items} of {c.items} items have no acceptable sample (capability gap "
                   f"{c.unsolvable_items / c.items:.1%}): no set over sampled classes covers them, so marginal coverage "
                   "can fall short by up to that fraction (Remark 7.6); conditional coverage excludes them")
    if c.mixed_classes:
        out.append(f"{c.mixed_classes} canonical classes hold samples the benchmark judged differently "
                   "(canonicalisation coarser than the benchmark; counted acceptable, as Canon(x, A*(x)))")
    if c.samples_max <= 1:
        out.append("one sample per task: the consensus ranking has a single class; run `uqh run --samples K`")
    if s.acceptability == "verified" and r.sequential:
        out.append("the sequential replay calibrates with the benchmark's verdicts (the human marks cover the "
                   "full-sample top answers only)")
    return out
