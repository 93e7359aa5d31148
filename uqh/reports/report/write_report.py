"""`uqh report`: the paper's tables and figures for run directories, as CSV + Markdown + PNG/SVG + one HTML page.

Every number comes from the scoring package (typed results of :func:`uqh.scoring.pipeline.score_run`,
:mod:`uqh.scoring.analyses` and :mod:`uqh.scoring.artificial`, collected by :mod:`uqh.reports.scoring_calls`); the tables
(:mod:`uqh.reports.score_tables`, :mod:`uqh.reports.censoring_tables`), figures (:mod:`uqh.reports.report.figures`) and the trace
explorer's data (:mod:`uqh.reports.report.traces`) only arrange them. This module is the driver: it writes the files.

Artefacts (``--out DIR``):

- ``termination_audit``, ``selection_diagnostic`` (Appendix G.1 Table 6; Fig. 2B) -- from :mod:`uqh.reports.termination_tables`;
- ``transparency__<run>`` (Table 2 shape: predictor × raw/Platt + base rate, complete-observation sample);
- ``scores_long__<run>.csv`` -- the scoring package's own long-format records (values, 95% CI, SE, counts);
- ``auq_scalar`` (Table 5 shape), ``platt_diagnostics`` (Appendix D / Table 1 shape);
- ``calibration_invariance`` + figure ``calibration_invariance__<run>`` (Fig. 1 shape: raw vs Platt vs base rate
  with Δ and Δ/SE for AUROC, AUPRC, AURC, T-ECE, TPS_log; bootstrap whiskers);
- ``fixed_rank`` (Appendix E);
- ``sensitivity`` (Appendix I: score family × weight schedule; Δ_practice when censored trajectories exist);
- ``sign_regime`` (Appendix I.2, Table 13: F̄ next to the sign of Δ_practice per weight schedule) and
  ``base_rate_margin`` (Table 14: log-score margin over the base rate, shrinkage, rank flip) -- runs with max_steps;
- ``artificial_censoring`` (Appendix I.1, Table 10 shape: complete trajectories censored at rates 0.25/0.5/0.75);
- ``censored_shift`` + figure ``censored_shift__<run>`` (Fig. 2A: complete-only vs censored extension, CI);
- ``censored_exact`` (§4.3, Tables 8–9 shape: TPS^cen,exact with q_Z files from ``uqh continue`` vs simple);
- ``prefix_qz_distribution``, ``prefix_exact_primary``, ``prefix_plugin_bias``, ``prefix_exact_predictors``,
  ``prefix_unresolved_sensitivity`` (Appendix H.2 Tables 7, 8, 9, Remarks C.4/C.5; with ``--continuations``:
  over the retained prefixes of each continuation run, :mod:`uqh.reports.prefix_tables`);
- ``parse_error_sensitivity`` (Appendix G.2);
- with ``--judgments DIR``: the ``uqh judge --report`` tables (``judge_scores``, ...), and each trajectory's
  judgments in the trace explorer; with ``--certify FILE``: the ``uqh certify`` tables (``certify_summary``, ...);
- figure ``selection_diagnostic`` (Fig. 2B);
- ``report.html`` (self-contained, from a Jinja2 template: the per-trajectory trace explorer with filters first,
  the comparison across runs, then everything above in collapsible sections), ``report.md``,
  ``report.json`` (:class:`uqh.reports.scoring_calls.ReportData`: the typed scoring results the tables were arranged
  from).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from uqh.rundir.atomic import check_creatable
from uqh.rundir.errors import OutputWriteError, UserError
from uqh.rundir.output_dir import WRITING_MARK, check_output_dir, writing
from uqh.reports.termination_tables import load_runs, selection_diagnostic_table, termination_audit
from uqh.reports.censoring_tables import (
    artificial_censoring_table,
    by_score_family,
    base_rate_margin_table,
    censored_shift_table,
    exact_censoring_table,
    parse_error_table,
    sensitivity_table,
    sign_regime_table,
)
from uqh.reports.certify_tables import header_lines as certify_header
from uqh.reports.certify_tables import tables as certify_tables
from uqh.reports.judge_tables import header_lines as judge_header
from uqh.reports.judge_tables import judge_tables
from uqh.reports.judged_runs import judgments_for_report, read_certificates
from uqh.reports.prefix_tables import EMPTY as NO_CONTINUATIONS, censored_prefix_tables
from uqh.reports.learned_tables import htc_weights_table, learned_scores_table
from uqh.reports.report.figures import figure_calibration_invariance, figure_censored_shift, figure_selection
from uqh.reports.report.html import Figure, Section, render_page
from uqh.reports.score_tables import (
    auq_table,
    calibration_invariance_table,
    fixed_rank_table,
    platt_table,
    scores_long_csv,
    transparency_table,
)
from uqh.reports.scoring_calls import ReportData, ReportOptions, score_runs
from uqh.reports.report.traces import trace_data

__all__ = ["ReportOptions", "ReportResult", "build_report"]

NO_JUDGES = "Give --judgments DIR (the --out of `uqh judge`) to add the judge analysis."
NO_CERTIFICATE = "Give --certify FILE (`uqh certify RUN... --format json > FILE`) to add the certificate."
PER_RUN_PREFIXES = ("transparency__", "scores_long__", "calibration_invariance__", "censored_shift__", "sensitivity__")


def _remove_stale_artefacts(out_dir: Path) -> None:
    """Drop per-run files of an earlier report in the same directory (only when it holds our report.json)."""
    if not (out_dir / "report.json").is_file():
        return
    for p in out_dir.iterdir():
        if p.is_file() and p.name.startswith(PER_RUN_PREFIXES) and p.suffix in (".csv", ".md", ".png", ".svg"):
            p.unlink()


@dataclass
class ReportResult:
    out_dir: Path
    files: list[Path]
    html: Path


def is_report_dir(path: Path) -> bool:
    """Whether ``path`` holds an earlier report (its ``report.json``, or only the staging folder of one that was
    stopped): the one non-empty ``--out`` a report replaces its files in."""
    path = Path(path)
    return (path / "report.json").is_file() or all(p.name.startswith(STAGING_PREFIX) for p in path.iterdir()
                                                    if p.name != WRITING_MARK)


def check_out_writable(out_dir: Path, flag: str = "--out") -> None:
    """UserError unless ``out_dir`` may receive the report (:func:`uqh.rundir.output_dir.check_output_dir`: not in a
    run directory, writable, empty or an earlier report). Writes nothing."""
    check_output_dir(out_dir, flag, is_own=is_report_dir)


def build_report(paths: list[str | Path], out_dir: str | Path, opts: ReportOptions | None = None) -> ReportResult:
    """Write the report of ``paths`` into ``out_dir``. UserError (one line) for bad input and for an ``out_dir``
    that cannot be written -- checked before any scoring, and again if a write fails on the way."""
    out_dir = Path(out_dir)
    opts = opts or ReportOptions()
    check_out_writable(out_dir)
    runs = load_runs(paths)
    certificates = [c for f in opts.certify_files for c in read_certificates(f, [Path(p) for p in paths])]
    scored = score_runs(runs, opts)  # everything that can fail on the inputs fails before anything is written
    judges = None
    if opts.judgments_dir is not None:
        judges, by_run = judgments_for_report(opts.judgments_dir, [sr.run.path for sr in scored],
                                              n_bootstrap=opts.n_bootstrap, seed=opts.seed)
        for sr, judged in zip(scored, by_run):
            sr.judgments = judged
    try:
        with writing(out_dir, "--out"):  # a second report writing here at the same time is refused, one line
            return _write_staged(runs, scored, out_dir, opts, judges, certificates)
    except OSError as exc:  # the directory was usable when checked: a fault on the way (disk full), exit 1
        raise OutputWriteError(out_dir, exc) from None


#: Prefix of the folder inside ``--out`` where a report is written before its files are moved into place.
STAGING_PREFIX = ".report-staging-"


def _write_staged(runs, scored, out_dir: Path, opts: ReportOptions, judges=None, certificates=()) -> ReportResult:
    """Write the whole report into a staging folder inside ``out_dir`` (same file system), then move its files
    into place: a report that fails half-way (disk full, an error) leaves ``out_dir`` as it was, never a mix of
    new and old files. Only our files are replaced; anything else in ``out_dir`` is left alone."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(STAGING_PREFIX + "*"):  # left by a report that was killed
        shutil.rmtree(old, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
    try:
        staged = _write_report(runs, scored, staging, opts, judges, certificates)
        _remove_stale_artefacts(out_dir)
        for f in sorted(p for p in staging.rglob("*") if p.is_file()):
            dest = out_dir / f.relative_to(staging)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
        moved = [out_dir / f.relative_to(staging) for f in staged.files]
        return ReportResult(out_dir=out_dir, files=moved, html=out_dir / staged.html.relative_to(staging))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def comparison_table(scored):
    """Every run's predictors on the complete-observation sample in one table (value over its 95% CI), as
    ``uqh score`` shows several runs."""
    from uqh.reports.score_view import labels_caption, main_keys, predictor_table

    results = [sr.results.main.model_copy(update={"run_dir": sr.label}) for sr in scored]
    return predictor_table(results, main_keys(results[0]), "comparison", "Per-step predictors by run (Table 2 "
                           "shape; diagnostics on complete trajectories, failure-oriented)", labels_caption(results))


def protocol_note(manifest) -> str:
    """What a run's header line must say about where it departs from the paper's data: WebShop with synthetic
    goals (the offline catalog has no items_human_ins.json; the paper's test split uses the human goals)."""
    webshop = manifest.info.get("webshop") if isinstance(manifest.info, dict) else None
    if isinstance(webshop, dict) and webshop.get("goal_source") == "synthetic":
        return (" · SYNTHETIC WebShop goals (not the paper's human-goal test split: the data has no "
                "items_human_ins.json)")
    return ""


@dataclass
class DrawnFigures:
    """The report's figures and, per figure family, the lines saying what was left out and why."""

    fig1: list[Figure]
    fig2a: list[Figure]
    fig2b: list[Figure]
    notes_1: list[str]
    notes_2a: list[str]
    notes_2b: list[str]


def draw_figures(scored, calib_t, shift_t, select_t, out_dir: Path) -> DrawnFigures:
    """Fig. 1 and Fig. 2A per run, Fig. 2B over the runs; nothing is left out silently."""
    out = DrawnFigures([], [], [], [], [], [])
    for sr in scored:
        res = figure_calibration_invariance(calib_t, sr.label, out_dir, f"calibration_invariance__{sr.slug}")
        out.notes_1 += res.notes
        if res:
            out.fig1.append(Figure(res.stem, f"Calibration gap on {sr.label}: {', '.join(res.legend)} (raw verbal "
                                   "confidence orange, Platt blue, base rate green); whiskers are 95% bootstrap "
                                   "intervals."))
        res = figure_censored_shift(shift_t, sr.label, out_dir, f"censored_shift__{sr.slug}")
        out.notes_2a += res.notes
        if res:
            delta = " and Δ_practice with its 95% bootstrap CI" if "Δ_practice" in res.panels else ""
            out.fig2a.append(Figure(res.stem, f"{' vs '.join(res.legend)} TPS_log on {sr.label}{delta}."))
    res = figure_selection(select_t, out_dir)
    out.notes_2b += res.notes
    if res:
        out.fig2b.append(Figure(res.stem, f"Selection diagnostic (Fig. 2B): {' vs '.join(res.legend)}."))
    return out


def _write_report(runs, scored, out_dir: Path, opts: ReportOptions, judges=None, certificates=()) -> ReportResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_artefacts(out_dir)
    files: list[Path] = []

    audit_t = termination_audit(runs)
    select_t = selection_diagnostic_table(runs, n_boot=opts.n_bootstrap, seed=opts.seed)
    transparency = [transparency_table(sr) for sr in scored]
    auq_t, platt_t = auq_table(scored), platt_table(scored)
    calib_t, fixed_t = calibration_invariance_table(scored), fixed_rank_table(scored)
    sens_t, shift_t, parse_t = sensitivity_table(scored), censored_shift_table(scored), parse_error_table(scored)
    art_t = artificial_censoring_table(scored)
    exact_t = exact_censoring_table(scored)
    regime_t, margin_t = sign_regime_table(scored), base_rate_margin_table(scored)
    prefix_ts, prefix_notes = censored_prefix_tables(scored)
    judge_ts = judge_tables(judges) if judges is not None else []
    certify_ts = certify_tables(list(certificates)) if certificates else []
    learned_t, weights_t = learned_scores_table(scored), htc_weights_table(scored)
    sens_ts = by_score_family(sens_t)  # the page and report.md: one table per family; sensitivity.csv: all rows
    tables = [audit_t, select_t, *transparency, auq_t, platt_t, calib_t, fixed_t, *sens_ts, regime_t, margin_t,
              art_t, shift_t, exact_t, *prefix_ts, parse_t, *judge_ts, *certify_ts, learned_t, weights_t]
    for t in [sens_t, *tables]:
        files += t.write(out_dir)
    for sr in scored:
        p = out_dir / f"scores_long__{sr.slug}.csv"
        p.write_text(scores_long_csv(sr))
        files.append(p)

    figs = draw_figures(scored, calib_t, shift_t, select_t, out_dir)
    fig1, fig2a, fig2b = figs.fig1, figs.fig2a, figs.fig2b
    for f in fig1 + fig2a + fig2b:
        files += [out_dir / f"{f.stem}.png", out_dir / f"{f.stem}.svg"]

    no_cens = "No run has administratively censored (max_steps) trajectories: the censored extension does not apply."
    no_parse = "No run has parse-error trajectories: nothing to test."
    sections = [
        Section("audit", "Termination audit", "Appendix G.1: stop reasons per run.", [audit_t], open=True),
        Section("selection", "Selection diagnostic", "Fig. 2B: are censored trajectories structurally different?",
                [select_t], fig2b, notes=figs.notes_2b),
        Section("transparency", "Predictor transparency", "Appendix F: per-step streams on the complete sample.",
                transparency),
        Section("calibration", "Calibration invariance", "§6.1 / Fig. 1.", [calib_t, platt_t], fig1,
                notes=figs.notes_1),
        Section("fixed-rank", "Fixed-rank sensitivity", "Appendix E.", [fixed_t]),
        Section("auq", "Scalar AUQ predictors", "Appendix F.2 / Table 5.", [auq_t]),
        Section("learned", "Learned trajectory calibrators", "HTC and SAUP by TPS under each censoring convention, "
                "next to verbal confidence and white-box signals; HTC's feature weights.", [learned_t, weights_t]),
        Section("censored", "Complete-only vs censored extension", "§6.3 / Fig. 2A; exact censored score §4.3.",
                [shift_t, exact_t] if shift_t.rows else [], fig2a, notes=figs.notes_2a if shift_t.rows else [no_cens]),
        Section("censored-prefixes", "Censored prefixes: exact vs simple",
                "Appendix H.2 / Tables 7–9, Remarks C.4/C.5: continuation branches of sampled censored prefixes.",
                prefix_ts if prefix_notes else [], notes=prefix_notes or [NO_CONTINUATIONS]),
        Section("sensitivity", "Score family × weight schedule", "Appendix I / Tables 11–12, one table per score "
                "family (all families in sensitivity.csv); type in a table's filter box to keep the rows with every "
                "word, e.g. \"platt uniform\".", [*sens_ts, art_t] if sens_t.rows else [sens_t, art_t]),
        Section("sign-regime", "Sign regime of Δ_practice", "Appendix I.2 / Table 13.",
                [regime_t] if regime_t.rows else [], notes=[] if regime_t.rows else [no_cens]),
        Section("base-rate-margin", "Margin over the base rate", "Appendix I.2 / Table 14.",
                [margin_t] if margin_t.rows else [], notes=[] if margin_t.rows else [no_cens]),
        Section("parse-errors", "Parse-error sensitivity", "Appendix G.2.", [parse_t] if parse_t.rows else [],
                notes=[] if parse_t.rows else [no_parse]),
        Section("judges", "GPA judges", "Judge scores, stability, failure detection and localisation (Agent GPA judges); "
                "a trajectory's judgments are shown under it in the trace explorer.", judge_ts,
                notes=judge_header(judges) if judges is not None else [NO_JUDGES]),
        Section("certificate", "Reliability certificate", "Self-consistency + conformal certificate (Mouzouni).",
                certify_ts, notes=certify_header(list(certificates)) if certificates else [NO_CERTIFICATE]),
    ]
    meta = [
        f"generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} · bootstrap {opts.n_bootstrap} "
        f"resamples (seed {opts.seed}) · all numbers computed by the scoring package",
        *[f"{sr.label}: {len(sr.run.episodes)} episodes · model {sr.run.manifest.config.model} · "
          f"budget {sr.run.manifest.config.step_budget}{protocol_note(sr.run.manifest)}" for sr in scored],
    ]
    html_path = out_dir / "report.html"
    html_path.write_text(render_page(title=opts.title, meta=meta, sections=sections,
                                     comparison=comparison_table(scored),
                                     trace_data=trace_data(scored, opts.max_traces), out_dir=out_dir))
    md_path = out_dir / "report.md"
    md_path.write_text(f"# {opts.title}\n\n" + "\n".join(m + "  " for m in meta) + "\n\n"
                       + "\n".join(t.to_markdown() for t in tables))
    json_path = out_dir / "report.json"
    json_path.write_text(ReportData(runs=[sr.results for sr in scored]).model_dump_json(indent=1))
    files += [html_path, md_path, json_path]
    return ReportResult(out_dir=out_dir, files=files, html=html_path)
