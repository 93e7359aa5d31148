"""Report tables of the complete-observation scores: transparency (Table 2), long-format CSV, AUQ (Table 5),
Platt diagnostics (Table 1), calibration invariance (Fig. 1) and fixed rank (Appendix E).

Arranges :class:`uqh.scoring.results.RunScores`; headers, labels and directions come from :mod:`uqh.scoring.registry`.
"""
from __future__ import annotations

import csv
import io

from uqh.reports.scoring_calls import PRIMARY_PREDICTOR, ScoredRun
from uqh.reports.tables import Table
from uqh.scoring.registry import (
    BASE_RATE,
    CALIBRATION_LABELS,
    TPS,
    MetricKey,
    aggregator_label,
    diagnostic_metrics,
    get_metric,
    predictor_label,
)
from uqh.scoring.long_records import CSV_FIELDS, csv_records
from uqh.scoring.results import Comparison, Estimate

NEED_COMPLETE = "No run has complete trajectories with an observed outcome (clean stop), which this analysis needs."
#: Fig. 1 metrics of the primary predictor
FIG1_KEYS = [MetricKey("auroc"), MetricKey("auprc"), MetricKey("aurc"), MetricKey("t_ece"), MetricKey(TPS, "log")]


def _diagnostic_keys() -> list[MetricKey]:
    return [MetricKey(m.name) for m in diagnostic_metrics()]


def transparency_table(sr: ScoredRun) -> Table:
    res = sr.results.main
    keys = _diagnostic_keys() + [MetricKey(TPS, s) for s in res.settings.scores]
    cols = ["Predictor", "n", "skipped (missing)"] + [k.header for k in keys]
    rows, absent = [], []
    for r in res.rows:
        label = r.display_label + (f" — {r.note}" if r.note else "")
        if not r.n_used:  # a predictor the run does not record (or nothing to score): left out, named below
            absent.append(label)
            continue
        row = {"Predictor": label, "n": r.n_used, "skipped (missing)": r.n_skipped_missing}
        row.update({k.header: r.value(k.metric, k.score) for k in keys})
        rows.append(row)
    c = res.counts
    ybar = next((r.ybar for r in res.rows if r.ybar is not None), None)
    return Table(
        name=f"transparency__{sr.slug}",
        title=f"Predictor transparency (Table 2 shape): {sr.label}",
        columns=cols,
        rows=rows,
        caption=(
            f"Complete-observation sample: n = {c.complete} clean trajectories with observed Y"
            + (f", ȳ = {ybar:.3f}" if ybar is not None else "")
            + f"; excluded: {c.excluded_max_steps} max_steps, {c.excluded_parse_error} parse_error, "
            f"{c.excluded_tool_error + c.excluded_env_terminated} other. AUROC/AUPRC failure-oriented "
            "(positive class Y = 0) on the linear-front weighted trajectory mean; T-ECE tie-aware, 10 quantile bins; "
            "TPS reward-oriented with linear-front weights. Platt = single-split cross-fitted (Appendix D). "
            "A trajectory with a missing value is skipped for that predictor (counted), never imputed. "
            f"95% CIs and SEs ({res.settings.bootstrap} paired bootstrap resamples) are in scores_long__{sr.slug}.csv."
            + (f" Left out, n = 0 (no value on this sample): {'; '.join(absent)}." if absent else "")
        ),
        empty_note="No predictor has a value on the complete-observation sample (n = 0 for every row: no clean "
        "trajectory with an observed outcome).",
    )


def scores_long_csv(sr: ScoredRun) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_FIELDS), lineterminator="\n")
    w.writeheader()
    for rec in csv_records(sr.results.main):
        w.writerow({k: ("" if v is None else (repr(v) if isinstance(v, float) else v)) for k, v in rec.items()})
    return buf.getvalue()


def auq_table(scored: list[ScoredRun]) -> Table:
    keys = _diagnostic_keys()
    rows = []
    for sr in scored:
        for r in sr.results.main.auq:
            name = f"AUQ {aggregator_label(r.aggregator)} {r.label} {CALIBRATION_LABELS[r.calibration]}"
            rows.append({"Run": sr.label, "Scalar predictor": name, "n": r.n,
                         **{k.header: r.value(k.metric) for k in keys}})
    return Table(
        name="auq_scalar",
        empty_note=NEED_COMPLETE,
        title="Scalar AUQ-style predictors (Table 5 shape)",
        columns=["Run", "Scalar predictor", "n"] + [k.header for k in keys],
        rows=rows,
        caption="Φ_last, Φ_avg, Φ_min collapse a trajectory to one scalar before evaluation; complete-observation "
        "sample; no TPS for them (they do not provide the per-step process).",
    )


def platt_table(scored: list[ScoredRun]) -> Table:
    """Table 1 shape: per predictor the two cross-fitted maps' slopes and fallback, the calibrated range, and what
    each map sends the paper's reference forecasts 0.90 / 0.95 / 1.00 to."""
    refs = list(dict.fromkeys(k for sr in scored for d in sr.results.main.calibration
                              for k in (*d.split_a.reference_map, *d.split_b.reference_map)))
    ref_cols = [f"{half} {v} →" for half in ("A:", "B:") for v in refs]
    cols = ["Run", "Predictor", "Split A slope b", "Split A fallback", "Split B slope b", "Split B fallback",
            "Calibrated min", "Calibrated max", *ref_cols, "n A", "n B"]
    rows = []
    for sr in scored:
        for d in sr.results.main.calibration:
            rows.append({
                "Run": sr.label, "Predictor": predictor_label(d.predictor),
                "Split A slope b": d.split_a.b_fitted, "Split A fallback": d.split_a.fallback,
                "Split B slope b": d.split_b.b_fitted, "Split B fallback": d.split_b.fallback,
                "Calibrated min": d.calibrated_min, "Calibrated max": d.calibrated_max,
                **{f"A: {v} →": d.split_a.reference_map.get(v) for v in refs},
                **{f"B: {v} →": d.split_b.reference_map.get(v) for v in refs},
                "n A": d.n_a, "n B": d.n_b,
            })
    return Table(
        name="platt_diagnostics",
        empty_note="No Platt map could be fitted (each half of the split needs complete trajectories).",
        title="Platt calibration diagnostics (Appendix D, Table 1 shape)",
        columns=cols,
        rows=rows,
        caption="Fitted slopes of the two cross-fitted maps (before the monotone fallback, which sets b = 0 when "
        "b < 0), the calibrated probability range, and the calibrated value each map gives the raw forecasts "
        f"{' / '.join(refs) or '0.90 / 0.95 / 1.00'} (A: the map fitted on split A, applied to split B; B: the "
        "reverse).",
    )


def calibration_invariance_table(scored: list[ScoredRun], predictor: str = PRIMARY_PREDICTOR) -> Table:
    """Fig. 1 shape. Each row also carries ``higher_is_better`` (not a column) for the figure's shading."""
    cols = ["Run", "Metric", "Raw", "Raw CI low", "Raw CI high", "Platt", "Platt CI low", "Platt CI high",
            "Base rate", "Base CI low", "Base CI high", "Δ (Platt − raw)", "SE(Δ)", "Δ/SE", "n"]
    rows = []
    for sr in scored:
        main = sr.results.main
        raw, platt, base = main.row(predictor, "raw"), main.row(predictor, "platt"), main.row(BASE_RATE, "raw")
        if raw is None or raw.n_used == 0:
            continue
        for k in FIG1_KEYS:
            r, p, b = (x.estimate(k.metric, k.score) if x is not None else Estimate() for x in (raw, platt, base))
            m = platt.get(k.metric, k.score) if platt is not None else None
            cmp = (m.vs_raw if m is not None else None) or Comparison()
            rows.append({
                "Run": sr.label, "Metric": k.header,
                "Raw": r.value, "Raw CI low": r.ci_low, "Raw CI high": r.ci_high,
                "Platt": p.value, "Platt CI low": p.ci_low, "Platt CI high": p.ci_high,
                "Base rate": b.value, "Base CI low": b.ci_low, "Base CI high": b.ci_high,
                "Δ (Platt − raw)": cmp.delta, "SE(Δ)": cmp.se, "Δ/SE": cmp.delta_over_se,
                "n": raw.n_used, "higher_is_better": get_metric(k.metric).higher_is_better,
            })
    return Table(
        name="calibration_invariance",
        empty_note=NEED_COMPLETE,
        title=f"Calibration invariance: {predictor_label(predictor)} raw vs Platt vs base rate (Fig. 1 shape)",
        columns=cols,
        rows=rows,
        caption="Complete-observation sample. Δ/SE: the raw-to-Platt change over its paired bootstrap standard "
        "error (§6.1). Rank metrics barely move under recalibration while TPS_log can move by many SEs.",
    )


def fixed_rank_table(scored: list[ScoredRun]) -> Table:
    rows = []
    keys: list[MetricKey] = []
    for sr in scored:
        for fr in sr.results.main.fixed_rank:
            keys = keys or [m.key for m in fr.metrics]
            rows.append({"Run": sr.label, "Predictor": predictor_label(fr.predictor), "Transform": fr.transform,
                         **{m.key.header: m.estimate.value for m in fr.metrics}})
    return Table(
        name="fixed_rank",
        empty_note=NEED_COMPLETE,
        title="Fixed-rank sensitivity (Appendix E)",
        columns=["Run", "Predictor", "Transform"] + [k.header for k in keys],
        rows=rows,
        caption="One trajectory scalar from the RAW stream feeds AUROC/AUPRC/AURC in every row (identical by "
        "construction); only the per-step stream scored by TPS is transformed.",
    )
