"""Typed results of the GPA-judge analysis (:func:`uqh.scoring.judges.analysis.analyse_judgments`); what
``uqh judge --report --format json`` dumps. Missing values are None (null in JSON), never NaN."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from uqh.scoring.results import Comparison, Estimate

#: Episode groups of the score distributions, in display order (clean episodes split by their outcome Y).
GROUPS = ("clean, Y=1", "clean, Y=0", "clean, no Y", "max_steps", "parse_error", "tool_error", "env_terminated")
#: The row of the GPA mean (failure prediction) and of all metrics pooled (localisation, human agreement).
GPA_MEAN = "gpa_mean"
ALL_METRICS = "all"


class JudgeCounts(BaseModel):
    judgments: int
    scored: int
    missing: int  # the reply never parsed, even after the repair: score null
    repaired: int  # scored after the one repair request
    episodes: int  # judged episodes (with at least one judgment)
    duplicate_lines: int  # judgment lines dropped by the first-kept rule
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None = None  # None when every call was unpriced
    unpriced_calls: int = 0


class ScoreDistributionRow(BaseModel):
    """How one judge scored the episodes of one group (every judgment, repeats included)."""

    metric: str
    group: str
    n_judgments: int
    n_missing: int
    counts: list[int]  # judgments with score 0, 1, 2, 3
    mean: float | None = None


class StabilityRow(BaseModel):
    """Agreement of one judge with itself across repeats (each repeat a rater; Agent GPA §4.1.4, Fig. 5–6)."""

    metric: str
    n_episodes: int  # episodes with at least two valid ratings (the pairable units)
    n_ratings: int  # valid ratings on those episodes
    max_repeats: int
    alpha_ordinal: Estimate  # Krippendorff's α, ordinal, bootstrap CI over episodes
    alpha_interval: float | None = None  # the paper's level of measurement
    mean_sd: float | None = None  # mean over episodes of the SD (ddof=1) of their scores, on the 0-3 scale
    share_identical: float | None = None  # episodes whose repeats all gave the same score


class FailurePredictionRow(BaseModel):
    """One predictor of failure (Y = 0) on the judged complete episodes: a GPA judge (its mean score over
    repeats / 3), the GPA mean, or an agent confidence stream (its linear-front weighted trajectory mean)."""

    predictor: str  # GF..TC, gpa_mean, or a uqh.scoring.registry predictor name
    label: str
    kind: Literal["judge", "confidence"]
    n: int
    n_failures: int
    n_skipped_missing: int  # judged complete episodes without a value for this predictor
    auroc: Estimate
    auprc: Estimate
    vs_verbal_n: int | None = None  # episodes with both this judge row and verbal confidence
    vs_verbal_auroc: Comparison | None = None  # AUROC(this) − AUROC(verbal), paired bootstrap
    vs_verbal_auprc: Comparison | None = None


class LocalisationRow(BaseModel):
    """Do a judge's cited steps point at the first step where the agent's verbal confidence dropped, in failed
    episodes (clean, Y = 0)?"""

    metric: str  # GF..TC, or "all" (the union of every judge's cited steps of one repeat)
    n_failed: int  # failed episodes with a valid judgment of this metric
    n_with_drop: int  # ... whose verbal confidence drops somewhere (the denominator)
    share: float | None = None  # mean over those episodes of the share of their judgments citing the drop step
    chance: float | None = None  # the share expected if each judgment cited as many steps at random
    mean_cited: float | None = None  # cited steps per judgment


class HumanAgreementRow(BaseModel):
    """Judge vs human labels (every valid repeat paired with the episode's label)."""

    metric: str  # GF..TC or "all"
    n_labels: int
    n_unjudged: int  # labels whose episode and metric have no valid judgment
    n_pairs: int
    exact: float | None = None
    within_one: float | None = None
    kappa: float | None = None  # Cohen's κ, unweighted
    kappa_quadratic: float | None = None  # quadratic-weighted κ (ordinal scores)


class JudgeAnalysis(BaseModel):
    judge_dir: str
    judge_model: str
    runs: list[str]
    metrics: list[str]
    bootstrap: int
    seed: int
    counts: JudgeCounts
    distributions: list[ScoreDistributionRow] = []
    stability: list[StabilityRow] = []
    failure_prediction: list[FailurePredictionRow] = []
    localisation: list[LocalisationRow] = []
    human: list[HumanAgreementRow] | None = None  # None without --labels
    notes: list[str] = []
