"""The report's scoring calls: which analyses run on which run directory, with which settings.

Every number comes from :mod:`scoring` (``score_run`` and the analyses of :mod:`uqh.scoring.analyses`,
:mod:`uqh.scoring.regimes` and :mod:`uqh.scoring.artificial`); this module only chooses the settings and collects
the typed results into :class:`RunReport` (dumped as ``report.json``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from uqh.rundir.errors import UserError
from uqh.reports.termination_tables import Run
from uqh.scoring.analyses import CalibratedStream
from uqh.scoring.qz.prefixes import CensoredPrefixAudit
from uqh.scoring.results import (
    ArtificialCensoringRow,
    CensoredShiftRow,
    ExactVsSimpleRow,
    MarginRow,
    ParseErrorRow,
    RunScores,
    SignRegimeRow,
)
from uqh.scoring.streams import RunData

PRIMARY_PREDICTOR = "verbal"
PRIMARY_WEIGHTS = "linear-front"


@dataclass
class ReportOptions:
    n_bootstrap: int = 1000
    seed: int = 0
    max_traces: int = 300  # trajectories per run embedded in the HTML trace explorer
    pool: bool = False  # also score runs of the same dataset pooled (e.g. Tau2's three domains)
    q_z_files: tuple[Path, ...] = ()  # q_Z files from `uqh continue`: adds the exact censored score (§4.3)
    continuation_dirs: tuple[Path, ...] = ()  # continuation runs: adds Tables 7–9 over their retained prefixes
    min_valid: int = 5  # resolved branches a continued prefix needs to be retained (Appendix H.2)
    judgments_dir: Path | None = None  # `uqh judge --out` directory: adds the judge analysis and trace links
    certify_files: tuple[Path, ...] = ()  # `uqh certify --format json` output: adds the certificate
    probe_dirs: tuple[Path, ...] = ()  # probe directories from `uqh probe`: their values become the p_true predictor
    title: str = "uqh report"


class RunReport(BaseModel):
    """Every scoring result the report arranges for one run directory (or pooled dataset)."""

    label: str
    slug: str
    pooled: bool
    main: RunScores  # censoring exclude (complete observation), fixed-rank rows
    by_weights: dict[str, RunScores]  # per weight schedule; simple censored extension when the run has max_steps
    censored_shift: list[CensoredShiftRow] = []  # linear-front, runs with max_steps
    exact: RunScores | None = None  # censoring exact, when q_Z covers every censored episode
    exact_missing: int = 0  # censored episodes without a q_hat_z
    exact_vs_simple: list[ExactVsSimpleRow] = []
    parse_error_scores: list[RunScores] = []  # (working sample, parse errors as censored), runs with parse errors
    parse_error_sensitivity: list[ParseErrorRow] = []
    artificial_censoring: list[ArtificialCensoringRow] = []
    sign_regime: list[SignRegimeRow] = []  # Table 13, runs with max_steps
    base_rate_margin: list[MarginRow] = []  # Table 14 (log score), runs with max_steps
    censored_prefixes: list[CensoredPrefixAudit] = []  # Tables 7–9 per continuation of this run (--continuations)
    #: the learned and propagated trajectory calibrators (HTC, SAUP) next to verbal confidence and white-box signals,
    #: per censoring convention the run supports (exclude; simple with max_steps; exact with a covering q_Z)
    learned: dict[str, RunScores] = {}


class ReportData(BaseModel):
    runs: list[RunReport]


@dataclass
class ScoredRun:
    run: Run  # episodes + manifest (audit view)
    data: RunData
    results: RunReport
    platt_trace: CalibratedStream | None = None  # primary predictor, for the trace explorer (non-pooled runs)
    judgments: dict[str, list] = field(default_factory=dict)  # episode id -> judgments shown in the trace explorer

    @property
    def label(self) -> str:
        return self.results.label

    @property
    def slug(self) -> str:
        return self.results.slug

    @property
    def pooled(self) -> bool:
        return self.results.pooled


def _slug(text: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"
    slug, k = base, 2
    while slug in taken:
        slug, k = f"{base}-{k}", k + 1
    taken.add(slug)
    return slug


def _with_pooled(items: list[tuple[Run, RunData]]) -> list[tuple[Run, RunData]]:
    """Add one pooled run per dataset made of several run directories."""
    from uqh.scoring.pipeline import pool_runs

    groups: dict[str, list[tuple[Run, RunData]]] = {}
    for r, d in items:
        groups.setdefault(r.dataset, []).append((r, d))
    out = list(items)
    for dataset, group in groups.items():
        if len(group) > 1:
            pooled_run = Run(
                path=Path(f"pooled-{dataset}"),
                manifest=group[0][0].manifest,
                episodes=[e for r, _ in group for e in r.episodes],
                name=f"pooled-{dataset}",
                label_text=f"pooled {dataset} ({' + '.join(r.name or r.path.name for r, _ in group)})",
            )
            out.append((pooled_run, pool_runs([d for _, d in group])))
    return out


def continuations_by_run(cont_dirs, datas: list[RunData], min_valid: int, seed: int) -> dict[int, list]:
    """Per source run (by ``id`` of its RunData) the (continuation dir, retained prefixes, counts) of each
    ``--continuations`` directory; UserError for a directory that is not a continuation run or whose source run is
    not among the report's runs."""
    from uqh.rundir.reader import RunDir, is_run_dir
    from uqh.scoring.qz.prefixes import retained_prefixes

    by_path = {Path(d.run_dir).resolve(): d for d in datas}
    out: dict[int, list] = {}
    for cont_dir in cont_dirs:
        if not is_run_dir(cont_dir):
            raise UserError(f"--continuations {cont_dir} is not a run directory; pass a directory written by "
                            "`uqh continue`")
        cont = RunDir.open(cont_dir)
        if not cont.is_continuation:
            raise UserError(f"--continuations {cont_dir} is not a continuation run; pass a directory written by "
                            "`uqh continue`")
        source = Path(cont.config.continuation["source_run_dir"]).resolve()
        if source not in by_path:
            raise UserError(f"--continuations {cont_dir} continues {source}, which is not among the report's runs; "
                            "add that run directory")
        prefixes, counts, _ = retained_prefixes(cont, min_valid=min_valid, seed=seed)
        out.setdefault(id(by_path[source]), []).append((str(cont_dir), prefixes, counts))
    return out


def score_runs(runs: list[Run], opts: ReportOptions) -> list[ScoredRun]:
    from uqh.scoring.analyses import calibrated_stream, censored_shift, exact_vs_simple, missing_qz, parse_error_sensitivity
    from uqh.scoring.artificial import artificial_censoring_analysis
    from uqh.scoring.pipeline import ScoreOptions, score_run
    from uqh.scoring.qz.prefixes import censored_prefix_audit
    from uqh.scoring.regimes import margin_over_base_rate, mean_forecasts, sign_regime
    from uqh.scoring.streams import load_run as load_run_data
    from uqh.scoring.weights import WEIGHT_SCHEMES

    from uqh.rundir.probes import ProbeDir

    probes = [ProbeDir.open(p) for p in opts.probe_dirs]
    items = [(r, load_run_data(r.path, probes)) for r in runs]
    q_z_of: dict[int, dict[str, float]] = {}  # by id(RunData): each run's own q_Z (episode ids repeat across runs)
    if opts.q_z_files:
        from uqh.rundir.qz_file import qz_for_runs

        runs_and_hashes = [(d.run_dir, d.manifest.config_hash) for _, d in items]
        per_run = qz_for_runs([Path(f) for f in opts.q_z_files], runs_and_hashes)
        q_z_of = {id(d): q for (_, d), q in zip(items, per_run)}
    continued = continuations_by_run(opts.continuation_dirs, [d for _, d in items], opts.min_valid, opts.seed)
    if opts.pool:
        items = _with_pooled(items)
    taken: set[str] = set()
    scored = []
    for run, data in items:
        if data.episode_ids.size == 0:
            raise UserError(f"{run.path} has no finished episodes yet; run `uqh run` first (or drop it from the list)")
        base = dict(n_bootstrap=opts.n_bootstrap, seed=opts.seed)
        pooled = run.label_text is not None
        has_censored = data.count("max_steps") > 0
        res = RunReport(
            label=run.label, slug=_slug(run.name or run.path.name, taken), pooled=pooled,
            main=score_run(data, ScoreOptions(censoring="exclude", fixed_rank=True, **base)),
            by_weights={scheme: score_run(data, ScoreOptions(weights=scheme, censoring="simple" if has_censored else "exclude",
                                                             auq=False, **base))
                        for scheme in WEIGHT_SCHEMES},
        )
        if has_censored:
            res.censored_shift = censored_shift(res.by_weights[PRIMARY_WEIGHTS])
            forecasts = mean_forecasts(data, res.by_weights[PRIMARY_WEIGHTS])
            res.sign_regime = sign_regime(res.by_weights, forecasts)
            res.base_rate_margin = margin_over_base_rate(res.by_weights, "log")
            q_z = q_z_of.get(id(data))
            if q_z is not None and not pooled:
                res.exact_missing = missing_qz(data, q_z)
                if res.exact_missing == 0:
                    res.exact = score_run(data, ScoreOptions(censoring="exact", q_z=q_z, auq=False, **base))
                    res.exact_vs_simple = exact_vs_simple(res.exact, res.by_weights[PRIMARY_WEIGHTS])
        if data.count("parse_error") > 0:
            working = score_run(data, ScoreOptions(censoring="simple", auq=False, **base))
            with_pe = score_run(data, ScoreOptions(censoring="simple", include_parse_errors=True, auq=False, **base))
            res.parse_error_scores = [working, with_pe]
            res.parse_error_sensitivity = parse_error_sensitivity(working, with_pe)
        res.censored_prefixes = [
            censored_prefix_audit(data, prefixes, counts, str(cont_dir), predictors=ScoreOptions().predictor_names(),
                                  n_boot=opts.n_bootstrap, seed=opts.seed)
            for cont_dir, prefixes, counts in continued.get(id(data), [])
        ]
        res.learned = learned_calibrator_scores(data, has_censored, q_z_of.get(id(data)) if not pooled else None, base)
        res.artificial_censoring = artificial_censoring_analysis(data, PRIMARY_PREDICTOR, opts.seed)
        trace = None if pooled else calibrated_stream(data, PRIMARY_PREDICTOR, PRIMARY_WEIGHTS)
        scored.append(ScoredRun(run=run, data=data, results=res, platt_trace=trace))
    return scored


#: the predictors of the report's "learned calibrators" section: verbal confidence, white-box signals, SAUP, HTC
LEARNED_COMPARISON = ("verbal", "token_prob", "token_traj_gmean_prob", "saup", "htc", "base_rate")


def learned_calibrator_scores(data: RunData, has_censored: bool, q_z: dict[str, float] | None,
                              base: dict) -> dict[str, RunScores]:
    """HTC and SAUP scored by TPS with verbal confidence and white-box signals, under every censoring convention the
    run supports (``exact`` only when ``q_z`` covers every censored episode)."""
    from uqh.scoring.analyses import missing_qz
    from uqh.scoring.pipeline import ScoreOptions, score_run

    modes: dict[str, dict] = {"exclude": {}}
    if has_censored:
        modes["simple"] = {}
        if q_z is not None and missing_qz(data, q_z) == 0:
            modes["exact"] = {"q_z": q_z}
    return {mode: score_run(data, ScoreOptions(predictors=LEARNED_COMPARISON, censoring=mode, auq=False, **kw, **base))
            for mode, kw in modes.items()}
