"""The METRICS and PREDICTORS registries: every metric and predictor is one entry, defined once.

The scoring pipeline (:mod:`uqh.scoring.pipeline`), the CLI table and CSV, and the Markdown/HTML reports read names,
labels, headers and directions from here. Adding a predictor or a scalar diagnostic is one
:func:`register_predictor` / :func:`register_metric` call; nothing else needs to change.

- A **predictor** computes its per-step value from a :class:`uqh.rundir.schema.Step` and the step's accepted sidecar
  :class:`uqh.rundir.schema.LogprobRow` (None when the step has none); NaN means missing. A *trajectory* predictor
  computes one value per episode from all the run's episodes (self-consistency across a task's samples), constant
  along the trajectory. A *constant* predictor has no per-step function: its stream is one number per scored
  sample, computed from the sample's training labels (the label convention in force, :mod:`uqh.scoring.labels`: Y of
  the complete trajectories, ΔY or the soft labels over the working sample) -- the base rate. Only calibratable
  predictors get Platt rows.
- A **metric** is either a ``diagnostic`` of the trajectory scalar on complete trajectories (AUROC, ..., or a
  registered one with its own ``compute``), a ``tps`` metric (one value per score family), or a
  ``censored_tps`` metric (per score family, only when the sample has censored trajectories, §6.3), or, only when
  the run records the truthful q_t (the ``truth`` predictor, :mod:`uqh.scoring.truth`), a ``truth_gap`` (per score
  family) or ``truth_distance`` metric of each stream against it.
"""
from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import numpy as np

from uqh.rundir import entry_points
from uqh.rundir.errors import UserError
from uqh.rundir.schema import Episode, LogprobRow, Step
from uqh.scoring import role_signals, saup, self_consistency, step_values, token_signals as ts, truth

MetricKind = Literal["diagnostic", "tps", "censored_tps", "truth_gap", "truth_distance"]
StepValue = Callable[[Step, "LogprobRow | None"], float]
StepTerms = Callable[[Step, "LogprobRow | None"], "tuple[float, float]"]
TrajectoryValue = Callable[[Sequence[Episode]], np.ndarray]


@dataclass(frozen=True)
class Metric:
    """One reported quantity. ``short`` may contain ``{score}`` (per-score-family metrics)."""

    name: str
    label: str  # prose label
    short: str  # column header without the direction arrow
    higher_is_better: bool | None  # None: a difference, no direction
    kind: MetricKind
    #: for registered diagnostics: (c, y, weights (B, n)) -> (B,) on complete trajectories; the built-in ones (the
    #: paper's five, agentuq's four) are computed together by :class:`uqh.scoring.diagnostics.ScalarDiagnostics` (None)
    compute: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None
    #: shown as a column of the Table-2-shaped tables (False: the AUQ table, JSON, CSV and export only, which keeps
    #: the main table within the terminal width)
    main_table: bool = True

    @property
    def per_score(self) -> bool:
        return self.kind not in ("diagnostic", "truth_distance")

    def header(self, score: str | None = None) -> str:
        arrow = "" if self.higher_is_better is None else ("↑" if self.higher_is_better else "↓")
        text = self.short.format(score=score_label(score)) if self.per_score else self.short
        return text + arrow


@dataclass(frozen=True)
class RunningValue:
    """A per-step value that depends on the trajectory so far: two per-step terms (e.g. sum NLL, token count),
    summed along the trajectory up to each step, then mapped to a confidence (a missing term makes that step and
    every later one missing)."""

    terms: StepTerms
    confidence: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (cumulative term 1, cumulative term 2) -> values


@dataclass(frozen=True)
class SignalRunning:
    """A running per-step value from the process signals of :mod:`uqh.scoring.process_features` (which read the
    episode's earlier text, not only the step): per-step terms from the (steps, signals) matrix, summed along the
    trajectory, then mapped to a confidence (a missing term makes that step and every later one missing)."""

    terms: Callable[[np.ndarray], np.ndarray]  # (steps, signals) -> (steps, 2)
    confidence: Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class LearnedCalibrator:
    """A predictor learned from the outcomes: a regularised logistic model on the prefix features
    (:mod:`uqh.scoring.learned`), cross-fitted across trajectories as Platt is (or fitted on another run,
    ``uqh score --calibrator-from``). Its stream exists only once scored: ``RunData`` holds the features."""

    penalty: str = "ridge"


@dataclass(frozen=True)
class Predictor:
    """One predictor: a per-step function, a per-trajectory function of the run's episodes, or a per-sample
    constant (exactly one of the three)."""

    name: str
    label: str
    step_value: StepValue | None = None
    constant: Callable[[np.ndarray], float] | None = None  # the sample's training labels -> the constant
    calibratable: bool = True
    #: the run's episodes -> one value per episode (NaN: missing), repeated along the trajectory's steps
    trajectory_value: TrajectoryValue | None = None
    #: a running per-step value (cumulative along the trajectory), e.g. the trajectory NLL to date
    running: RunningValue | None = None
    #: only meaningful under greedy decoding (G-NLL): refused on a sampled run (temperature > 0)
    greedy_only: bool = False
    #: scored by default; False: only when asked for (``--predictor NAME`` or ``--predictor all``), which keeps the
    #: default tables and their cost as they were (the white-box token signals)
    default: bool = True
    #: the probe (``uqh probe --probe NAME``) whose per-step values, read from a probe directory given to
    #: ``uqh score --probes DIR``, are this predictor's stream (missing without one)
    probe: str | None = None
    #: a running per-role value (agentuq's per-role summaries, :mod:`uqh.scoring.role_signals`): from the accepted
    #: calls' tokens (assistant), the user sidecar's (user) or both (combined)
    role: role_signals.RoleRunning | None = None
    #: a probe whose value is not a probability (observation_surprise's mean NLL): the monotone map to a
    #: confidence in (0, 1) its stream holds instead (None: the value is the confidence)
    probe_confidence: Callable[[float], float] | None = None
    #: the raw stream is a signal, not a probability: its raw row has the rank metrics only (RANK_METRICS); the
    #: cross-fitted Platt row has every metric
    rank_only_raw: bool = False
    #: a running value of the process signals (SAUP)
    signal_running: SignalRunning | None = None
    #: a learned calibrator on the prefix features (HTC); its one row is already calibrated (``calibratable=False``)
    learned: LearnedCalibrator | None = None

    def __post_init__(self) -> None:
        kinds = (self.step_value, self.constant, self.trajectory_value, self.running, self.probe, self.role,
                 self.signal_running, self.learned)
        if sum(f is not None for f in kinds) != 1:
            raise ValueError(f"predictor {self.name!r} needs exactly one of step_value, trajectory_value, running, "
                             "constant, probe, role, signal_running and learned")

    def probe_stream_value(self, value: float) -> float:
        """A probe value as this predictor's stream holds it (a confidence)."""
        return self.probe_confidence(value) if self.probe_confidence is not None else value

    @property
    def is_constant(self) -> bool:
        return self.constant is not None

    @property
    def is_trajectory(self) -> bool:
        return self.trajectory_value is not None


@dataclass(frozen=True)
class MetricKey:
    """A metric of a result row: the registry name, plus the score family for per-score metrics."""

    metric: str
    score: str | None = None

    @property
    def header(self) -> str:
        return get_metric(self.metric).header(self.score)

    @property
    def higher_is_better(self) -> bool | None:
        return get_metric(self.metric).higher_is_better


def _base_rate(labels: np.ndarray) -> float:
    """The mean training label: ȳ of the complete trajectories, or over the working sample (uqh.scoring.labels)."""
    return float(np.mean(labels)) if labels.size else float("nan")


SPAN_LABELS = {"token": "Completion", "action": "Action-span"}


def token_signal_predictors() -> list[Predictor]:
    """The white-box token signals of :mod:`uqh.scoring.token_signals`, each for the completion (``token_*``) and the
    action span (``action_*``)."""
    out = []
    for span in ts.SPANS:
        lab = SPAN_LABELS[span]
        out += [
            Predictor(f"{span}_gmean_prob", f"{lab} geometric-mean token probability",
                      ts.span_value(ts.geometric_mean_probability, span), default=False),
            Predictor(f"{span}_min_prob", f"{lab} minimum token probability",
                      ts.span_value(ts.minimum_probability, span), default=False),
            Predictor(f"{span}_topk_mass", f"{lab} top-k mass", ts.span_value(ts.topk_mass, span), default=False),
            Predictor(f"{span}_entropy_max", f"{lab} max top-k entropy confidence",
                      ts.span_value(ts.max_entropy_confidence, span), default=False),
            Predictor(f"{span}_traj_prob", f"{lab} trajectory probability to date",
                      running=RunningValue(ts.span_nll_terms(span), ts.trajectory_probability), default=False),
            Predictor(f"{span}_traj_gmean_prob", f"{lab} trajectory geometric-mean probability to date",
                      running=RunningValue(ts.span_nll_terms(span), ts.trajectory_geometric_mean), default=False),
            Predictor(f"{span}_traj_entropy", f"{lab} mean top-k entropy confidence to date",
                      running=RunningValue(ts.span_entropy_terms(span), ts.trajectory_entropy_confidence),
                      default=False),
            Predictor(f"{span}_gnll", f"{lab} G-NLL probability (greedy only)",
                      ts.span_value(ts.sequence_probability, span), greedy_only=True, default=False),
        ]
    return out


def role_predictors() -> list[Predictor]:
    """agentuq's five per-role summaries for the assistant, the simulated user and both (``{role}_{summary}``)."""
    return [
        Predictor(f"{role}_{name}", f"{role.capitalize()} {label}",
                  role=role_signals.RoleRunning(role, terms, accumulate, confidence), default=False)
        for role in role_signals.ROLES
        for name, (label, terms, accumulate, confidence) in role_signals.SUMMARIES.items()
    ]


TPS, TPS_COMPLETE_ONLY, DELTA_PRACTICE = "tps", "tps_complete_only", "delta_practice"
#: the metrics that depend only on the order of the confidences (unchanged by any increasing map): all a raw
#: signal that is not a probability is shown with
RANK_METRICS = frozenset({"auroc", "auprc", "aurc", "auarc", "spearman_failure", "kendall_failure"})
BASE_RATE = "base_rate"
TPS_GAP, TRUTH_MAE = "tps_gap", "truth_mae"

def builtin_metrics() -> list[Metric]:
    """uqh's own metrics, in table order (the ``uqh.metrics`` entry point ``builtin``)."""
    return [
        Metric("auroc", "AUROC (failure-oriented)", "AUROC", True, "diagnostic"),
        Metric("auprc", "AUPRC (failure-oriented average precision)", "AUPRC", True, "diagnostic"),
        Metric("aurc", "area under the risk-coverage curve", "AURC", False, "diagnostic"),
        Metric("t_ece", "trajectory ECE (10 tie-aware quantile bins)", "T-ECE", False, "diagnostic"),
        Metric("t_brier", "scalarized trajectory Brier", "T-Brier", False, "diagnostic"),
        Metric("auarc", "area under agentuq's accuracy-rejection curve", "AUARC", True, "diagnostic",
               main_table=False),
        Metric("pearson_failure", "Pearson correlation of 1 - C with 1 - Y (agentuq)", "Pearson", True, "diagnostic",
               main_table=False),
        Metric("spearman_failure", "Spearman correlation of 1 - C with 1 - Y (agentuq)", "Spearman", True,
               "diagnostic", main_table=False),
        Metric("kendall_failure", "Kendall tau-b of 1 - C with 1 - Y (agentuq)", "Kendall τ-b", True, "diagnostic",
               main_table=False),
        Metric(TPS, "Trajectory Proper Score", "TPS_{score}", True, "tps"),
        Metric(TPS_COMPLETE_ONLY, "TPS on the complete trajectories only", "TPS_{score} complete-only", True,
               "censored_tps"),
        Metric(DELTA_PRACTICE, "Δ_practice = TPS_cen-ext − TPS_complete-only", "Δ_practice {score}", None,
               "censored_tps"),
        Metric(TPS_GAP, "TPS gap to the truth: TPS(q) − TPS(F) on the same trajectories", "TPS gap {score}", False,
               "truth_gap"),
        Metric(TRUTH_MAE, "mean |F_t − q_t| over a trajectory's steps", "mean |F−q|", False, "truth_distance"),
    ]

def builtin_predictors() -> list[Predictor]:
    """uqh's own predictors, in table order (the ``uqh.predictors`` entry point ``builtin``)."""
    return [
        Predictor("verbal", "Verbal confidence", step_values.verbal_value),
        Predictor("token_prob", "Completion token probability", step_values.token_prob_value),
        Predictor("token_entropy", "Completion entropy confidence", step_values.token_entropy_value),
        Predictor("action_prob", "Action-span token probability", step_values.action_prob_value),
        Predictor("action_entropy", "Action-span entropy confidence", step_values.action_entropy_value),
        *token_signal_predictors(),
        *role_predictors(),
        Predictor("sc_mode_freq", "Self-consistency mode frequency", trajectory_value=self_consistency.mode_frequency),
        Predictor("sc_agreement", "Self-consistency agreement", trajectory_value=self_consistency.agreement),
        Predictor(BASE_RATE, "Base-rate constant", constant=_base_rate, calibratable=False),
        Predictor("p_true", "Reflexive P(True) (probe)", probe="p_true"),
        # the stream is exp(-mean NLL), the observation tokens' geometric-mean probability: more surprise, less
        # confidence; a raw signal (rank metrics only) until Platt maps it to a probability
        Predictor("observation_surprise", "Observation surprise exp(−NLL) (probe)", probe="observation_surprise",
                  probe_confidence=lambda nll: float(np.exp(-nll)), rank_only_raw=True),
        Predictor(truth.TRUTH, "True q_t (oracle domains)", truth.truth_value, calibratable=False),
        # SAUP (arXiv:2412.01033): RMS of situation-weighted step NLLs to date, as exp(-U); a signal, not a probability
        Predictor("saup", "SAUP situation-weighted uncertainty exp(−U)",
                  signal_running=SignalRunning(saup.saup_terms, saup.saup_confidence), rank_only_raw=True),
        # HTC (arXiv:2601.15778): ridge-logistic on the prefix features, cross-fitted like Platt
        Predictor("htc", "HTC learned calibrator (cross-fitted)", learned=LearnedCalibrator(), calibratable=False),
    ]

class Registry(MutableMapping):
    """Entries by name, filled on first use from the entry points of ``group`` (uqh's own ``builtin`` first, then
    installed packages', see :mod:`uqh.rundir.entry_points`), in that order. An entry point names one entry or a
    function returning several; what it yields must be of type ``kind`` and pass ``check``."""

    def __init__(self, group: str, kind: type, check: Callable[[Any], None] = lambda entry: None):
        self.group, self.kind, self.check = group, kind, check
        self._entries: dict[str, Any] = {}
        self._loaded = False
        #: the entry point each loaded entry came from (entries registered in code have none)
        self.sources: dict[str, entry_points.Extension] = {}

    def _load(self) -> dict[str, Any]:
        if not self._loaded:
            self._loaded = True  # first, so that a registration from a plugin's import does not recurse
            for ext in entry_points.active(self.group).values():
                for entry in self._entries_of(ext):
                    self._entries.setdefault(entry.name, entry)
        return self._entries

    def _entries_of(self, ext: entry_points.Extension) -> list[Any]:
        obj = entry_points.load(ext)
        entries = obj() if callable(obj) and not isinstance(obj, self.kind) else obj
        entries = [entries] if isinstance(entries, self.kind) else list(entries)
        for entry in entries:
            if not isinstance(entry, self.kind):
                raise UserError(f"the {self.group} entry point {ext.name!r} (from {ext.source}) gave "
                                f"{type(entry).__name__}, not a {self.kind.__name__}")
            if not ext.builtin:
                self.check(entry)
        self.sources.update({e.name: ext for e in entries})
        return entries

    def __getitem__(self, name: str) -> Any:
        return self._load()[name]

    def __setitem__(self, name: str, entry: Any) -> None:
        self._load()[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def check_registered_metric(m: Metric) -> None:
    """A metric from outside uqh is a diagnostic with its own ``compute`` (the TPS families are built in)."""
    if m.kind != "diagnostic" or m.compute is None:
        raise UserError(f"metric {m.name!r}: only diagnostics with a compute function can be registered (TPS "
                        "metrics are built in)")


METRICS: Registry = Registry("uqh.metrics", Metric, check_registered_metric)
PREDICTORS: Registry = Registry("uqh.predictors", Predictor)

CALIBRATION_LABELS = {"raw": "raw", "platt": "Platt"}


# ------------------------------------------------------------------------------------------ access


def get_predictor(name: str) -> Predictor:
    if name not in PREDICTORS:
        raise UserError(f"unknown predictor {name!r}; use one of {', '.join(PREDICTORS)}")
    return PREDICTORS[name]


def get_metric(name: str) -> Metric:
    if name not in METRICS:
        raise KeyError(f"unknown metric {name!r}; registered: {', '.join(METRICS)}")
    return METRICS[name]


def default_predictors() -> list[str]:
    """Names of the predictors scored when none are named (registry order)."""
    return [p.name for p in PREDICTORS.values() if p.default]


def step_predictors() -> list[str]:
    """Names of the registered predictors with a stream of per-step values: per-step functions and trajectory
    predictors (registry order). Constants and learned calibrators (whose stream needs the scored sample's labels)
    are not among them."""
    return [p.name for p in PREDICTORS.values() if not p.is_constant and p.learned is None]


def diagnostic_metrics() -> list[Metric]:
    return [m for m in METRICS.values() if m.kind == "diagnostic"]


def score_label(score: str | None) -> str:
    """Display form of a score-family name: ``log``, ``Brier``, ``β(2,4)``."""
    if score is None:
        return ""
    if score == "brier":
        return "Brier"
    return "β" + score[len("beta"):] if score.startswith("beta") else score


def row_label(predictor: str, calibration: str) -> str:
    """``Verbal confidence (raw)``; uncalibratable predictors (the base rate) have one row and no suffix."""
    p = PREDICTORS.get(predictor)
    label = p.label if p else predictor
    if p is not None and not p.calibratable:
        return label
    return f"{label} ({CALIBRATION_LABELS.get(calibration, calibration)})"


def aggregator_label(aggregator: str) -> str:
    """``Φ_last`` etc. (the AUQ scalar aggregators of :data:`uqh.scoring.diagnostics.AGGREGATORS`)."""
    return f"Φ_{aggregator}"


def predictor_label(predictor: str) -> str:
    p = PREDICTORS.get(predictor)
    return p.label if p else predictor


# ------------------------------------------------------------------------------------------ registration


def register_predictor(p: Predictor) -> Predictor:
    if p.name in PREDICTORS:
        raise ValueError(f"predictor {p.name!r} is already registered")
    PREDICTORS[p.name] = p
    return p


def unregister_predictor(name: str) -> None:
    PREDICTORS.pop(name)


def register_metric(m: Metric) -> Metric:
    """Add a metric. A new diagnostic needs its ``compute`` (the built-in five are computed together)."""
    if m.name in METRICS:
        raise ValueError(f"metric {m.name!r} is already registered")
    try:
        check_registered_metric(m)
    except UserError as exc:
        raise ValueError(str(exc)) from None
    METRICS[m.name] = m
    return m


def unregister_metric(name: str) -> None:
    METRICS.pop(name)
