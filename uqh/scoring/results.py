"""Typed scoring results (pydantic): what :func:`uqh.scoring.pipeline.score_run` and the analyses of
:mod:`uqh.scoring.analyses` / :mod:`uqh.scoring.artificial` return, and what ``uqh score --format json`` and the report's
``report.json`` dump. Missing values are None (null in JSON), never NaN.

A metric of a row is a :class:`MetricEstimate` named by its registry name (:data:`uqh.scoring.registry.METRICS`) and,
for per-score-family metrics, the score family (``log``, ``brier``, ``beta(2,4)``): ``row.get("tps", "log")``.
"""
from __future__ import annotations

import math

from typing import Literal

from pydantic import BaseModel

from uqh.scoring.labels import LABEL_CONVENTIONS, ConventionName, LabelsOption
from uqh.scoring.registry import DELTA_PRACTICE, TPS, TPS_COMPLETE_ONLY, MetricKey, diagnostic_metrics, row_label

Calibration = Literal["raw", "platt"]


def finite_or_none(x) -> float | None:
    """A number for a typed result: the float, or None (JSON null) when it is missing, NaN or infinite."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class Estimate(BaseModel):
    """A point estimate with its paired-bootstrap percentile interval and SE (None when not bootstrapped)."""

    value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    se: float | None = None


class Comparison(BaseModel):
    """A paired comparison b − a: Δ, its bootstrap SE, Δ/SE and the percentile CI of the paired differences."""

    delta: float | None = None
    se: float | None = None
    delta_over_se: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


class MetricEstimate(BaseModel):
    metric: str  # registry name
    score: str | None = None  # score family of a per-score metric
    estimate: Estimate
    vs_raw: Comparison | None = None  # Platt rows: this metric's change from the raw row (§6.1)

    @property
    def key(self) -> MetricKey:
        return MetricKey(self.metric, self.score)


class HasMetrics(BaseModel):
    metrics: list[MetricEstimate] = []

    def get(self, metric: str, score: str | None = None) -> MetricEstimate | None:
        return next((m for m in self.metrics if m.metric == metric and m.score == score), None)

    def estimate(self, metric: str, score: str | None = None) -> Estimate:
        m = self.get(metric, score)
        return m.estimate if m is not None else Estimate()

    def value(self, metric: str, score: str | None = None) -> float | None:
        return self.estimate(metric, score).value


class PredictorResult(HasMetrics):
    """One Table-2 row: a predictor's raw or Platt stream on one sample."""

    predictor: str
    label: str
    calibration: Calibration
    n_used: int
    n_complete: int
    n_censored: int
    n_skipped_missing: int
    ybar: float | None = None  # mean Y of the complete trajectories of the working sample
    label_mean: float | None = None  # mean training label of the row's sample (settings.label_convention)
    note: str | None = None

    @property
    def display_label(self) -> str:
        return row_label(self.predictor, self.calibration)


class AuqResult(HasMetrics):
    """One Table-5 row: an AUQ scalar aggregator Φ of a stream, diagnostics only."""

    predictor: str
    label: str
    aggregator: str
    calibration: Calibration
    n: int


class PlattMapSummary(BaseModel):
    a: float
    b: float
    b_fitted: float
    fallback: bool
    degenerate: bool
    mu: float
    sigma: float
    sigma_floor_active: bool
    ybar_train: float
    n_train_trajectories: int
    n_train_steps: int
    reference_map: dict[str, float]


class PlattDiagnostics(BaseModel):
    """Appendix D diagnostics of one predictor's cross-fitted Platt calibration."""

    predictor: str
    split_a: PlattMapSummary
    split_b: PlattMapSummary
    fallback_triggered: bool
    calibrated_min: float | None = None
    calibrated_max: float | None = None
    n_a: int
    n_b: int


class LearnedModel(BaseModel):
    """One fitted linear-logistic model: σ(intercept + Σ weight_j · standardised feature_j)."""

    intercept: float
    weights: list[float]  # one per feature of the calibration, in its order (standardised features: comparable)
    n_train_trajectories: int
    n_train_steps: int


class LearnedCalibration(BaseModel):
    """A learned calibrator of a predictor (HTC): its features, penalty and fitted weights -- two models (split A,
    split B) when cross-fitted, one when transferred from another run (``transfer_from``)."""

    predictor: str
    penalty: str
    lam: float
    features: list[str]
    dropped_features: list[str] = []  # missing on every scored step of the run: not used
    models: list[LearnedModel]
    transfer_from: str | None = None

    def mean_weights(self) -> list[float]:
        """Per feature, the mean weight over the models (the cross-fitted pair, or the one transferred model)."""
        return [sum(m.weights[j] for m in self.models) / len(self.models) for j in range(len(self.features))]


class FixedRankRow(HasMetrics):
    """One Appendix E row (point values only)."""

    predictor: str
    transform: str


class SampleCounts(BaseModel):
    episodes: int = 0
    complete: int = 0
    censored: int = 0
    excluded_max_steps: int = 0
    excluded_parse_error: int = 0
    excluded_tool_error: int = 0
    excluded_env_terminated: int = 0
    excluded_clean_without_outcome: int = 0
    excluded_no_steps: int = 0
    excluded_no_qz: int = 0
    parse_errors_included_as_censored: int = 0
    #: parsed steps of the run per logprob capability tier (uqh.rundir.schema.CAPABILITY_TIERS); a signal that
    #: needs top-k is missing on a step below ``full``
    steps_full_logprobs: int = 0
    steps_selected_logprobs_only: int = 0
    steps_no_logprobs: int = 0

    def exclusions(self) -> dict[str, int]:
        """Excluded episodes by reason (reasons with none left out)."""
        by_reason = {
            "max_steps": self.excluded_max_steps,
            "parse_error": self.excluded_parse_error,
            "tool_error": self.excluded_tool_error,
            "env_terminated": self.excluded_env_terminated,
            "clean_without_outcome": self.excluded_clean_without_outcome,
            "no_steps": self.excluded_no_steps,
            "no_qz": self.excluded_no_qz,
        }
        return {k: v for k, v in by_reason.items() if v}


class ScoreSettings(BaseModel):
    predictors: list[str]
    calibrations: list[str]
    scores: list[str]
    weights: str
    censoring: str
    labels: LabelsOption  # the --labels option
    label_convention: ConventionName  # what the base rate and Platt were trained on (uqh.scoring.labels)
    include_parse_errors: bool
    missing_qz: str
    bootstrap: int
    seed: int
    ci_level: float
    #: the learned calibrators' (HTC) penalty, and the run they were fitted on when transferred (None: cross-fitted)
    learned_penalty: str = "ridge"
    calibrator_from: str | None = None
    #: agentuq's conventions instead of uqh's (docs/scoring.md, "uqh and agentuq")
    agentuq_conventions: bool = False

    @property
    def label_description(self) -> str:
        """One line naming the training labels of the base rate and Platt, with the paper reference."""
        return LABEL_CONVENTIONS[self.label_convention].description


class RunScores(BaseModel):
    """Everything ``uqh score`` reports for one run directory (or a pooled sample)."""

    run_dir: str
    domain: str
    model: str
    settings: ScoreSettings
    counts: SampleCounts
    rows: list[PredictorResult] = []
    auq: list[AuqResult] = []
    calibration: list[PlattDiagnostics] = []
    fixed_rank: list[FixedRankRow] = []
    #: learned calibrators (HTC): feature weights, for interpretability
    learned: list[LearnedCalibration] = []

    def row(self, predictor: str, calibration: str) -> PredictorResult | None:
        return next((r for r in self.rows if r.predictor == predictor and r.calibration == calibration), None)

    def metric_keys(self) -> list[MetricKey]:
        """The Table-2 columns in registry order: diagnostics, TPS per score family, and with censoring the
        complete-only TPS and Δ_practice per score family."""
        keys = [MetricKey(m.name) for m in diagnostic_metrics()]
        keys += [MetricKey(TPS, s) for s in self.settings.scores]
        if self.settings.censoring != "exclude":
            for s in self.settings.scores:
                keys += [MetricKey(TPS_COMPLETE_ONLY, s), MetricKey(DELTA_PRACTICE, s)]
        return keys


# ------------------------------------------------------------------------------------------ paired comparison


class PairedMetric(BaseModel):
    """One metric of two runs on their shared tasks: each run's estimate and the paired difference b − a."""

    metric: str  # registry name
    score: str | None = None
    a: Estimate
    b: Estimate
    delta: Comparison  # b − a; CI and SE from the paired bootstrap over shared tasks

    @property
    def key(self) -> MetricKey:
        return MetricKey(self.metric, self.score)


class PairedRow(BaseModel):
    """One predictor stream (raw or Platt) compared between two runs."""

    predictor: str
    label: str
    calibration: Calibration
    n_a: int  # trajectories of run a scored (shared tasks only)
    n_b: int
    metrics: list[PairedMetric] = []
    note: str | None = None

    def get(self, metric: str, score: str | None = None) -> PairedMetric | None:
        return next((m for m in self.metrics if m.metric == metric and m.score == score), None)

    @property
    def display_label(self) -> str:
        return row_label(self.predictor, self.calibration)


class PairedComparison(BaseModel):
    """``uqh score A B --paired``: every metric of B minus A on the tasks both ran, with paired-bootstrap CIs (one
    resample of task ids applied to both runs' trajectories of those tasks)."""

    run_a: str
    run_b: str
    shared_tasks: int
    only_a: int  # tasks of run a that run b did not run (left out)
    only_b: int
    settings: ScoreSettings
    rows: list[PairedRow] = []

    def row(self, predictor: str, calibration: str) -> PairedRow | None:
        return next((r for r in self.rows if r.predictor == predictor and r.calibration == calibration), None)


# ------------------------------------------------------------------------------------------ analyses


class CensoredShiftRow(BaseModel):
    """Complete-only vs censored extension of one row and score family (Fig. 2A, §6.3)."""

    predictor: str
    calibration: Calibration
    score: str
    n_complete: int
    n_censored: int
    censoring_rate: float | None = None
    tps_complete_only: Estimate
    tps_censored: Estimate
    delta_practice: Estimate
    delta_over_se: float | None = None
    delta_per_censoring_rate: float | None = None


class ExactVsSimpleRow(BaseModel):
    """TPS^cen,exact (Eq. 4) next to TPS^cen,simple (Eq. 5) for one row and score family (Tables 8–9 shape)."""

    predictor: str
    calibration: Calibration
    score: str
    n_complete: int
    n_censored: int
    tps_simple: float | None = None
    tps_exact: Estimate
    exact_minus_simple: float | None = None
    tps_complete_only: float | None = None


class ParseErrorRow(BaseModel):
    """Working sample vs parse errors as censored at the failing step (Appendix G.2)."""

    predictor: str
    calibration: Calibration
    score: str
    n_working: int
    n_with_parse_errors: int
    parse_errors_as_censored: int
    tps_working: float | None = None
    tps_with_parse_errors: float | None = None
    difference: float | None = None


class ArtificialCensoringRow(BaseModel):
    """One cell of the artificial-censoring validation (Appendix I.1, Table 10 shape)."""

    predictor: str
    calibration: Calibration
    note: str | None = None  # why the raw stream was used (Platt unavailable)
    rate: float
    score: str
    weights: str
    n: int
    n_censored: int
    tps_complete: float
    delta_mean: float
    delta_y0: float | None = None
    delta_y1: float | None = None
    prefix_swap_mean: float
    tail_omission_mean: float
    max_abs_decomposition_error: float


class SignRegimeRow(BaseModel):
    """The sign of Δ_practice of one predictor row per weight schedule, next to its mean forecast F̄ (Table 13)."""

    predictor: str
    calibration: Calibration
    mean_forecast: float | None = None  # F̄: mean per-step forecast over the censored-extension sample
    signs: dict[str, str | None]  # weight schedule -> "+", "-", "mixed" over the score families (None: no value)
    n_positive: int  # Δ_practice cells > 0 over every score family and weight schedule
    n_negative: int
    n_cells: int


class MarginRow(BaseModel):
    """A predictor row's margin over the base-rate reference, complete-only vs censored extension (Table 14)."""

    predictor: str
    calibration: Calibration
    weights: str
    score: str
    margin_complete_only: float  # TPS_comp − TPS_base
    margin_censored: float | None = None  # TPS_cen-ext − TPS_base
    shrinkage_percent: float | None = None  # None when the rank flips (the paper prints "rank flip")
    rank_flip: bool | None = None
