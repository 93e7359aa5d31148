"""The scoring pipeline: one run directory's :class:`~uqh.scoring.streams.RunData` to typed :class:`RunScores`.

:func:`score_run` composes, per registered predictor (:data:`uqh.scoring.registry.PREDICTORS`):

- ``rows``: the raw and cross-fitted Platt streams (Appendix F, Tables 2–4; uncalibratable predictors such as
  the base rate have one row): n used / complete / censored / skipped, every diagnostic metric on the complete
  trajectories' scalar, TPS per score family under the run's censoring mode, each with a paired-bootstrap CI and
  SE; Platt metrics carry Δ and Δ/SE against raw (§6.1). With censored trajectories, the complete-only TPS and
  Δ_practice = TPS_cen-ext − TPS_complete-only (§6.3) are added. The base rate and Platt are trained on the labels
  of the convention in force (:mod:`uqh.scoring.labels`; by default the paper's: ΔY over the working sample under
  ``simple``, soft labels Y / q̂_Z under ``exact``).
- ``auq``: the scalar AUQ aggregators Φ_last, Φ_avg, Φ_min per stream (Table 5; no TPS for them).
- ``calibration``: Appendix D diagnostics of every Platt fit; ``fixed_rank``: Appendix E rows when requested.

Every bootstrapped quantity is keyed by ``(calibration, aggregator, MetricKey)`` -- typed, never a built string.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from uqh.scoring.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, compare, interval, paired_bootstrap, standard_error
from uqh.scoring.calibration import cross_fit_platt
from uqh.scoring.diagnostics import AGGREGATORS, ScalarDiagnostics, trajectory_scalar
from uqh.scoring.fixed_rank import fixed_rank_analysis
from uqh.scoring.labels import DEFAULT_LABELS, label_convention
from uqh.scoring.registry import (
    DELTA_PRACTICE,
    METRICS,
    PREDICTORS,
    RANK_METRICS,
    TPS,
    TPS_COMPLETE_ONLY,
    TPS_GAP,
    TRUTH_MAE,
    MetricKey,
    default_predictors,
    diagnostic_metrics,
    get_predictor,
    predictor_label,
)
from uqh.scoring.results import (
    finite_or_none,
    AuqResult,
    Comparison,
    Estimate,
    FixedRankRow,
    LearnedCalibration,
    MetricEstimate,
    PlattDiagnostics,
    PredictorResult,
    RunScores,
    SampleCounts,
    ScoreSettings,
)
from uqh.scoring.rules import DEFAULT_SCORES, ScoreRule, parse_score
from uqh.scoring.streams import LearnedSettings, RunData, Sample, build_sample, greedy_refusal
from uqh.scoring.tps import posterior_weight, tps
from uqh.scoring.truth import mean_abs_error, tps_gap
from uqh.scoring.weights import DEFAULT_WEIGHTS, trajectory_weights

#: (calibration, aggregator or None for the row itself, metric)
StatKey = tuple[str, "str | None", MetricKey]


@dataclass
class ScoreOptions:
    predictors: tuple[str, ...] | None = None  # None: the default ones (all registered with every_predictor)
    calibrations: tuple[str, ...] = ("none", "platt")
    scores: tuple[ScoreRule, ...] = field(default_factory=lambda: tuple(parse_score(s) for s in DEFAULT_SCORES))
    weights: str = DEFAULT_WEIGHTS
    censoring: str = "exclude"
    labels: str = DEFAULT_LABELS  # "working" (the paper's convention) or "complete" -- uqh.scoring.labels
    q_z: dict[str, float] | None = None
    include_parse_errors: bool = False
    missing_qz: str = "error"
    n_bootstrap: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    auq: bool = True
    fixed_rank: bool = False
    level: float = 0.95
    every_predictor: bool = False  # with predictors=None: every registered predictor (`--predictor all`)
    learned_penalty: str = "ridge"  # the learned calibrators' (HTC) penalty: ridge or lasso
    #: fit the learned calibrators on this run and apply them to the scored one (HTC's General Agent Calibrator);
    #: None: cross-fitted on the scored run
    calibrator_from: RunData | None = None
    #: agentuq's conventions: AUARC on ties in input order (here); the per-role streams must have been loaded with
    #: them too (load_run(..., agentuq_conventions=True)): docs/scoring.md, "uqh and agentuq"
    agentuq_conventions: bool = False

    def predictor_names(self) -> list[str]:
        """The predictors to score: per-step ones first, constants (the base rate) last."""
        if self.predictors is not None:
            names = list(self.predictors)
        else:
            names = list(PREDICTORS) if self.every_predictor else default_predictors()
        specs = [get_predictor(n) for n in names]
        return [p.name for p in specs if not p.is_constant] + [p.name for p in specs if p.is_constant]

    def learned_settings(self) -> LearnedSettings:
        """How the learned calibrators (HTC) are fitted under these options."""
        return LearnedSettings(self.learned_penalty, self.weights, self.calibrator_from)

    def settings(self) -> ScoreSettings:
        return ScoreSettings(
            predictors=self.predictor_names(),
            calibrations=list(self.calibrations),
            scores=[r.name for r in self.scores],
            weights=self.weights,
            censoring=self.censoring,
            labels=self.labels,
            label_convention=label_convention(self.censoring, self.labels),
            include_parse_errors=self.include_parse_errors,
            missing_qz=self.missing_qz,
            bootstrap=self.n_bootstrap,
            seed=self.seed,
            ci_level=self.level,
            learned_penalty=self.learned_penalty,
            calibrator_from=None if self.calibrator_from is None else self.calibrator_from.label,
            agentuq_conventions=self.agentuq_conventions,
        )


@dataclass
class PredictorEvaluation:
    """Everything :func:`evaluate_predictor` produces for one predictor on one sample."""

    rows: list[PredictorResult]
    auq: list[AuqResult]
    calibration: PlattDiagnostics | None
    fixed_rank: list[FixedRankRow]
    learned: LearnedCalibration | None = None


def _diagnostic_statistic(c: np.ndarray, y: np.ndarray, auarc_ties: str = "mean"
                          ) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
    """Every registered diagnostic of the scalar ``c`` against ``y`` for a (B, n) count matrix: the built-in ones
    from one :class:`ScalarDiagnostics` sort, registered ones through their ``compute``."""
    metrics = diagnostic_metrics()
    builtin = tuple(m.name for m in metrics if m.compute is None)
    extra = [m for m in metrics if m.compute is not None]
    diag = ScalarDiagnostics(c, y, auarc_ties=auarc_ties)

    def compute(counts: np.ndarray) -> dict[str, np.ndarray]:
        out = diag.compute(counts, builtin) if builtin else {}
        for m in extra:
            out[m.name] = np.asarray(m.compute(c, y, counts), dtype=float)
        return out

    return compute


def _stream_statistic(values, sample: Sample, w, rules, eta, complete, row_diag, auq_diags):
    """A closure computing every bootstrapped quantity of one stream for a (b, n) count matrix."""
    per_traj = {r.name: tps(values, sample.offsets, eta, r, w) for r in rules}
    any_censored = not complete.all()
    per_traj_vs_truth: dict[MetricKey, np.ndarray] = {}
    if sample.truth is not None:  # an oracle domain: distance of the stream from q_t on the same trajectories
        for r in rules:
            per_traj_vs_truth[MetricKey(TPS_GAP, r.name)] = tps_gap(values, sample.truth, sample.offsets, eta, r, w)
        per_traj_vs_truth[MetricKey(TRUTH_MAE)] = mean_abs_error(values, sample.truth, sample.offsets)

    def stat(counts: np.ndarray) -> dict[tuple[str | None, MetricKey], np.ndarray]:
        out = {}
        tot = counts.sum(axis=1)
        cc = counts[:, complete]
        tot_c = cc.sum(axis=1)
        for score, v in per_traj.items():
            mean = np.einsum("ij,j->i", counts, v) / tot
            out[(None, MetricKey(TPS, score))] = mean
            if any_censored:
                with np.errstate(invalid="ignore", divide="ignore"):
                    comp = np.einsum("ij,j->i", cc, v[complete]) / tot_c
                out[(None, MetricKey(TPS_COMPLETE_ONLY, score))] = comp
                out[(None, MetricKey(DELTA_PRACTICE, score))] = mean - comp
        for key, v in per_traj_vs_truth.items():
            out[(None, key)] = np.einsum("ij,j->i", counts, v) / tot
        if row_diag is not None:
            for name, v in row_diag(cc).items():
                out[(None, MetricKey(name))] = v
        for agg, diag in auq_diags.items():
            for name, v in diag(cc).items():
                out[(agg, MetricKey(name))] = v
        return out

    return stat


def _rank_metrics_only(stat: Callable[[np.ndarray], dict]) -> Callable[[np.ndarray], dict]:
    """``stat`` restricted to the rank metrics (:data:`RANK_METRICS`), AUQ aggregates included."""
    return lambda counts: {k: v for k, v in stat(counts).items() if k[1].metric in RANK_METRICS}


def _estimates(cal: str, agg: str | None, points, boots, level: float, with_vs_raw: bool) -> list[MetricEstimate]:
    keys = sorted((k for (a, k) in points[cal] if a == agg), key=lambda k: list(METRICS).index(k.metric))
    out = []
    for key in keys:
        point = points[cal][(agg, key)]
        est = Estimate(value=finite_or_none(point))
        samples = boots.get((cal, agg, key))
        if samples is not None:
            lo, hi = interval(samples, level)
            est = Estimate(value=finite_or_none(point), ci_low=finite_or_none(lo), ci_high=finite_or_none(hi), se=finite_or_none(standard_error(samples)))
        vs_raw = None
        raw_samples = boots.get(("raw", agg, key))
        if with_vs_raw and samples is not None and raw_samples is not None:
            c = compare(points["raw"][(agg, key)], point, raw_samples, samples, level)
            vs_raw = Comparison(delta=finite_or_none(c["delta"]), se=finite_or_none(c["se"]), delta_over_se=finite_or_none(c["delta_over_se"]),
                                ci_low=finite_or_none(c["ci"][0]), ci_high=finite_or_none(c["ci"][1]))
        out.append(MetricEstimate(metric=key.metric, score=key.score, estimate=est, vs_raw=vs_raw))
    return out


def evaluate_predictor(sample: Sample, opts: ScoreOptions) -> PredictorEvaluation:
    """Rows (raw / Platt) of one predictor on one sample, with paired-bootstrap CIs and Δ/SE vs raw."""
    spec = get_predictor(sample.predictor)
    rules = list(opts.scores)
    n = sample.n
    w = trajectory_weights(sample.offsets, opts.weights, sample.horizon)
    complete = sample.delta.copy()
    q = sample.q_z if opts.censoring == "exact" else None
    calibration = None
    notes: dict[str, str] = {}
    if sample.learned_error is not None:
        notes["raw"] = sample.learned_error
    streams: dict[str, np.ndarray | None] = {"raw": None if sample.learned_error is not None else sample.values}
    if "platt" in opts.calibrations and spec.calibratable:
        try:
            if n == 0:
                raise ValueError("no trajectories to calibrate")
            fit = cross_fit_platt(sample.values, sample.offsets, sample.y, sample.delta, sample.episode_ids, w,
                                  labels=sample.label_convention, q_z=sample.q_z)
            streams["platt"] = fit.values
            calibration = fit.diagnostics(sample.predictor)
        except ValueError as exc:
            streams["platt"] = None
            notes["platt"] = f"Platt unavailable: {exc}"
    if "none" not in opts.calibrations and spec.calibratable:
        streams.pop("raw")
    auq_on = opts.auq and not spec.is_constant and not spec.is_trajectory  # Φ_last = Φ_avg = Φ_min for a constant
    stats, points = {}, {}
    if n > 0:
        eta = posterior_weight(sample.y, sample.delta, q)
        y_c = sample.y[complete]
        for cal, values in streams.items():
            if values is None:
                continue
            c = trajectory_scalar(values, sample.offsets, w)[complete]
            ties = "input" if opts.agentuq_conventions else "mean"
            row_diag = _diagnostic_statistic(c, y_c, ties) if complete.any() else None
            auq = {}
            if auq_on and complete.any():
                for name, phi in AGGREGATORS.items():
                    auq[name] = _diagnostic_statistic(phi(values, sample.offsets)[complete], y_c, ties)
            stat = _stream_statistic(values, sample, w, rules, eta, complete, row_diag, auq)
            if cal == "raw" and spec.rank_only_raw:
                stat = _rank_metrics_only(stat)
                notes["raw"] = "raw: a signal, not a probability: rank metrics only (Platt: every metric)"
            stats[cal] = stat
            points[cal] = {k: float(v[0]) for k, v in stat(np.ones((1, n))).items()}
    boots: dict[StatKey, np.ndarray] = {}
    if opts.n_bootstrap > 0 and stats:
        def joint(counts):
            return {(cal, agg, key): v for cal, st in stats.items() for (agg, key), v in st(counts).items()}

        boots = paired_bootstrap(joint, n, opts.n_bootstrap, opts.seed)
    label = predictor_label(sample.predictor)
    n_complete = int(complete.sum())
    rows, auq_rows = [], []
    for cal in streams:
        metrics = []
        if cal in points:
            metrics = _estimates(cal, None, points, boots, opts.level, with_vs_raw=(cal == "platt" and "raw" in points))
        rows.append(PredictorResult(
            predictor=sample.predictor, label=label, calibration=cal, n_used=n, n_complete=n_complete,
            n_censored=int((~complete).sum()), n_skipped_missing=sample.counts["skipped_missing"],
            ybar=finite_or_none(sample.ybar), label_mean=finite_or_none(sample.label_mean), note=notes.get(cal), metrics=metrics,
        ))
    for cal in streams:
        if cal not in points:
            continue
        for agg in AGGREGATORS:
            if any(a == agg for (a, _) in points[cal]):
                auq_rows.append(AuqResult(predictor=sample.predictor, label=label, aggregator=agg, calibration=cal,
                                          n=n_complete, metrics=_estimates(cal, agg, points, boots, opts.level, False)))
    fixed: list[FixedRankRow] = []
    if opts.fixed_rank and not spec.is_constant and n > 0 and complete.any() and "raw" in streams:
        sub = sample.subset(complete)
        w_sub = trajectory_weights(sub.offsets, opts.weights, sub.horizon)
        platt_sub = None
        if streams.get("platt") is not None:
            platt_sub = streams["platt"][np.repeat(complete, np.diff(sample.offsets))]
        fixed = fixed_rank_analysis(sub.values, sub.offsets, sub.y, w_sub, rules, platt_sub, predictor=sample.predictor)
    return PredictorEvaluation(rows=rows, auq=auq_rows, calibration=calibration, fixed_rank=fixed, learned=sample.learned_fit)


def stream_statistic(sample: Sample, values: np.ndarray, opts: ScoreOptions) -> Callable[[np.ndarray], dict]:
    """Every metric of one stream of ``sample`` as a function of a (B, n) count matrix over its trajectories:
    ``{MetricKey: (B,)}`` -- the diagnostics on the complete trajectories and TPS per score family (with censored
    trajectories also the complete-only TPS and Δ_practice), exactly as :func:`evaluate_predictor` computes a row."""
    w = trajectory_weights(sample.offsets, opts.weights, sample.horizon)
    complete = sample.delta.copy()
    eta = posterior_weight(sample.y, sample.delta, sample.q_z if opts.censoring == "exact" else None)
    row_diag = None
    if complete.any():
        row_diag = _diagnostic_statistic(trajectory_scalar(values, sample.offsets, w)[complete], sample.y[complete])
    stat = _stream_statistic(values, sample, w, list(opts.scores), eta, complete, row_diag, {})
    return lambda counts: {key: v for (_, key), v in stat(counts).items()}


def platt_stream(sample: Sample, opts: ScoreOptions) -> tuple[np.ndarray | None, str | None]:
    """The cross-fitted Platt stream of ``sample`` (as :func:`evaluate_predictor` fits it), or (None, why not)."""
    if sample.n == 0:
        return None, "Platt unavailable: no trajectories to calibrate"
    w = trajectory_weights(sample.offsets, opts.weights, sample.horizon)
    try:
        fit = cross_fit_platt(sample.values, sample.offsets, sample.y, sample.delta, sample.episode_ids, w,
                              labels=sample.label_convention, q_z=sample.q_z)
    except ValueError as exc:
        return None, f"Platt unavailable: {exc}"
    return fit.values, None


def score_run(run: RunData, opts: ScoreOptions) -> RunScores:
    """Score one run directory: Table-2 rows (predictors × raw/Platt + base rate), Table-5 AUQ rows, Appendix D
    diagnostics, Appendix E rows (``opts.fixed_rank``) and sample counts."""
    rows, auq, calib, fixed, learned_fits = [], [], [], [], []
    counts = SampleCounts()
    names = opts.predictor_names()
    if opts.predictors is None:  # by default a greedy-only predictor is left out of a sampled run (explicit: refused)
        names = [p for p in names if greedy_refusal(run, p) is None]
    for k, predictor in enumerate(names):
        sample = build_sample(run, predictor, censoring=opts.censoring, q_z=opts.q_z,
                              include_parse_errors=opts.include_parse_errors, missing_qz=opts.missing_qz,
                              labels=opts.labels, learned=opts.learned_settings())
        if k == 0:
            counts = SampleCounts(**{f: sample.counts[f] for f in SampleCounts.model_fields if f in sample.counts})
        res = evaluate_predictor(sample, opts)
        rows += res.rows
        auq += res.auq
        if res.calibration is not None:
            calib.append(res.calibration)
        if res.learned is not None:
            learned_fits.append(res.learned)
        fixed += res.fixed_rank
    tiers = run.tier_counts()
    counts = counts.model_copy(update={"steps_full_logprobs": tiers["full"],
                                       "steps_selected_logprobs_only": tiers["selected_only"],
                                       "steps_no_logprobs": tiers["none"]})
    return RunScores(
        run_dir=run.label,
        domain=run.manifest.config.domain,
        model=run.manifest.config.model,
        settings=opts.settings(),
        counts=counts,
        rows=rows,
        auq=auq if opts.auq else [],
        calibration=calib,
        fixed_rank=fixed,
        learned=learned_fits,
    )


def pool_runs(runs: list[RunData]) -> RunData:
    """Concatenate run directories into one (episode ids prefixed ``<k>:`` so they stay unique)."""
    if len(runs) == 1:
        return runs[0]
    offs = [0]
    for r in runs:
        offs += list(offs[-1] + r.offsets[1:])
    # the pool is labelled by what it contains, not by its first run: "model-a + model-b" when models differ
    label = {key: " + ".join(dict.fromkeys(getattr(r.manifest.config, key) for r in runs)) for key in ("model", "domain")}
    manifest = runs[0].manifest.model_copy(update={"config": runs[0].manifest.config.model_copy(update=label)})
    return RunData(
        run_dir=type(runs[0].run_dir)("+".join(str(r.run_dir) for r in runs)),
        manifest=manifest,
        episode_ids=np.concatenate([np.array([f"{k}:{e}" for e in r.episode_ids], dtype=object) for k, r in enumerate(runs)]),
        stop_reason=np.concatenate([r.stop_reason for r in runs]),
        outcome=np.concatenate([r.outcome for r in runs]),
        n_steps=np.concatenate([r.n_steps for r in runs]),
        step_budget=np.concatenate([r.step_budget for r in runs]),
        offsets=np.array(offs, dtype=np.int64),
        streams={k: np.concatenate([r.streams[k] for r in runs]) for k in runs[0].streams},
        task_ids=np.concatenate([np.array([f"{k}:{t}" for t in r.tasks], dtype=object) for k, r in enumerate(runs)]),
        step_tier=None if any(r.step_tier is None for r in runs) else np.concatenate([r.step_tier for r in runs]),
        signals=None if any(r.signals is None for r in runs) else np.concatenate([r.signals for r in runs]),
    )
