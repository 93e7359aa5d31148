"""Typed results of ``uqh certify`` (:func:`uqh.scoring.certify.certificate.certify_items`): what ``--format json`` dumps and the
tables of :mod:`uqh.reports.certify_tables` arrange. Missing values are None; an infinite threshold (no finite
prediction set reaches the level) is the string ``"inf"``, never a float infinity.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from uqh.scoring.results import Estimate

#: An M* (an integer rank) or q̂ (a cumulative frequency), or "inf".
Threshold = float | int | Literal["inf"]


def threshold_value(x: float) -> Threshold:
    """The JSON form of a threshold: an int for a finite rank M*, a float q̂, or ``"inf"``."""
    if math.isinf(x):
        return "inf"
    return int(x) if float(x).is_integer() else float(x)


class Proportion(BaseModel):
    """successes / n with its Wilson interval (None when n = 0)."""

    successes: int
    n: int
    value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


class CertifySettings(BaseModel):
    alpha: float
    score: Literal["rank", "cp"]
    cal_frac: float | None  # None when the calibration ids were given (--cal-ids)
    cal_ids: str | None = None
    seed: int
    resplits: int
    bootstrap: int
    ci_level: float
    acceptability: Literal["gold", "verified"]
    stop_delta: float


class ItemCounts(BaseModel):
    """The items (tasks) and samples the certificate is computed from."""

    items: int
    samples: int
    samples_min: int
    samples_max: int
    no_answer_samples: int  # samples in the explicit "no answer" class
    classes: int  # distinct (item, canonical class) pairs
    mixed_classes: int  # classes whose samples the benchmark judged differently (canonicalisation too coarse)
    unsolvable_items: int  # no sample acceptable: no prediction set over sampled classes can cover them
    canonicalised_now: int  # samples without a recorded canonical answer, canonicalised by `uqh certify`


class AlphaRow(BaseModel):
    """One level of the α sweep (and the requested α): the threshold on the calibration split and, with a test
    split, what it achieves there."""

    alpha: float
    k: int
    threshold: Threshold  # M* (rank score) or q̂ (cumulative-probability score)
    mode_suffices: bool  # M* = 1 (rank score): the mode alone gives the coverage (1 − α ≤ reliability level)
    coverage: Proportion | None = None
    set_size: Estimate | None = None
    conditional_coverage: Proportion | None = None  # on solvable test items


class StabilityResult(BaseModel):
    """Split stability (the paper's Table 4): R random calibration/test re-splits of the same sizes."""

    resplits: int
    n_cal: int
    n_test: int
    alpha: float
    threshold_counts: dict[str, int]  # M* (or q̂) value -> number of splits
    threshold_mean: float | None = None  # over splits with a finite threshold
    threshold_sd: float | None = None
    infinite_splits: int = 0
    coverage_mean: float | None = None
    coverage_sd: float | None = None
    set_size_mean: float | None = None
    set_size_sd: float | None = None
    reliability_mean: float | None = None
    reliability_sd: float | None = None


class SequentialResult(BaseModel):
    """A stopping rule replayed on the recorded samples (the paper's Table 6): samples it would have used and the
    certificate computed from those samples only."""

    rule: str
    delta: float
    samples_recorded: int
    samples_used: int
    savings: float  # 1 − used / recorded
    items_stopped: int  # items the rule certified before their last recorded sample
    avg_samples: Estimate  # mean samples used per item, bootstrap CI
    threshold: Threshold
    reliability_level: float | None = None
    coverage: Proportion | None = None
    set_size: Estimate | None = None


class RunStopping(BaseModel):
    """What the run itself did with ``uqh run --stop-on-consensus`` (from ``skipped_samples.jsonl``)."""

    rule: str
    delta: float
    samples_planned: int
    samples_skipped: int
    tasks_stopped: int


class CertifyResult(BaseModel):
    """Everything ``uqh certify`` reports for one run directory."""

    run_dir: str
    domain: str
    model: str
    settings: CertifySettings
    counts: ItemCounts
    n_cal: int
    n_test: int
    evaluated_on: Literal["test", "all"]  # where accuracies are computed (all items without a test split)
    reliability_level: float | None = None  # Eq. 2.4 on the calibration split
    reliability_count: int = 0  # #{s_i ≤ 1}
    main: AlphaRow  # at settings.alpha
    mode_accuracy: Proportion | None = None
    single_sample_accuracy: Proportion | None = None  # the first recorded sample of each item
    sample_accuracy: Estimate | None = None  # mean acceptability over all samples (p̄), bootstrap CI
    solvable_fraction: float | None = None
    alpha_sweep: list[AlphaRow] = []
    stability: StabilityResult | None = None
    sequential: list[SequentialResult] = []
    run_stopping: RunStopping | None = None
    notes: list[str] = []
