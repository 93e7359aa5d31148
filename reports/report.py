"""`uqh report`: the paper's tables and figures for run directories, as CSV + Markdown + PNG/SVG + one HTML page.

Every number comes from the scoring package (:func:`scoring.tables.score_run` and the functions it composes);
this module only chooses the settings of each analysis, arranges the results into tables and draws figures.

Artefacts (``--out DIR``):

- ``termination_audit``, ``selection_diagnostic`` (Appendix G.1 Table 6; Fig. 2B) -- from :mod:`reports.audit`;
- ``transparency__<run>`` (Table 2 shape: predictor × raw/Platt + base rate, complete-observation sample);
- ``scores_long__<run>.csv`` -- the scoring package's own long-format records (values, 95% CI, SE, counts);
- ``auq_scalar`` (Table 5 shape), ``platt_diagnostics`` (Appendix D / Table 1 shape);
- ``calibration_invariance`` + figure ``calibration_invariance__<run>`` (Fig. 1 shape: raw vs Platt vs base rate
  with Δ and Δ/SE for AUROC, AUPRC, AURC, T-ECE, TPS_log; bootstrap whiskers);
- ``fixed_rank`` (Appendix E);
- ``sensitivity`` (Appendix I: score family × weight schedule; Δ_practice when censored trajectories exist);
- ``artificial_censoring`` (Appendix I.1, Table 10 shape: complete trajectories censored at rates 0.25/0.5/0.75);
- ``censored_shift`` + figure ``censored_shift__<run>`` (Fig. 2A: complete-only vs censored extension, CI);
- ``censored_exact`` (§4.3, Tables 8–9 shape: TPS^cen,exact with q_Z files from ``uqh continue`` vs simple);
- ``parse_error_sensitivity`` (Appendix G.2);
- figure ``selection_diagnostic`` (Fig. 2B);
- ``report.html`` (self-contained: everything above plus the per-trajectory trace explorer), ``report.md``,
  ``report.json`` (the raw scoring results the tables were arranged from).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from rundir.errors import UserError
from reports.audit import Run, load_runs, selection_diagnostic, termination_audit
from reports.html import Figure, Section, render_page
from reports.tables import Table

PRIMARY_PREDICTOR = "verbal"
NEED_COMPLETE = "No run has complete trajectories with an observed outcome (clean stop), which this analysis needs."
PRIMARY_SCORE = "log"
FIG1_METRICS = ("auroc", "auprc", "aurc", "t_ece", "tps_log")
METRIC_LABELS = {
    "auroc": "AUROC↑",
    "auprc": "AUPRC↑",
    "aurc": "AURC↓",
    "t_ece": "T-ECE↓",
    "t_brier": "T-Brier↓",
    "tps_log": "TPS_log↑",
    "tps_brier": "TPS_Brier↑",
    "tps_beta(2,4)": "TPS_β(2,4)↑",
}
LOWER_IS_BETTER = {"aurc", "t_ece", "t_brier"}
COLORS = {"raw": "#d95f02", "platt": "#2c7fb8", "base": "#1b9e77"}


@dataclass
class ReportOptions:
    n_bootstrap: int = 1000
    seed: int = 0
    max_traces: int = 300  # trajectories per run embedded in the HTML trace explorer
    pool: bool = False  # also score runs of the same dataset pooled (e.g. Tau2's three domains)
    q_z_files: tuple[Path, ...] = ()  # q_Z files from `uqh continue`: adds the exact censored score (§4.3)
    title: str = "uqh report"


@dataclass
class ScoredRun:
    run: Run  # episodes + manifest (audit view)
    data: Any  # scoring.streams.RunData
    slug: str
    main: dict  # score_run, censoring exclude (complete observation), fixed_rank on
    by_weights: dict[str, dict] = field(default_factory=dict)  # score_run per weight schedule (simple if censored)
    parse_sens: tuple[dict, dict] | None = None  # (working sample, parse errors as censored)
    pooled: bool = False  # several run directories scored together (not shown in the trace explorer)
    exact: dict | None = None  # score_run with censoring="exact" (linear-front) when q_Z covers the censored episodes
    exact_missing: int = 0  # censored episodes without a q_hat_z

    @property
    def label(self) -> str:
        return self.run.label

    @property
    def has_censored(self) -> bool:
        return bool((self.data.stop_reason == "max_steps").any())

    @property
    def has_parse_errors(self) -> bool:
        return bool((self.data.stop_reason == "parse_error").any())


def _slug(text: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"
    slug, k = base, 2
    while slug in taken:
        slug, k = f"{base}-{k}", k + 1
    taken.add(slug)
    return slug


def _metric(row: dict, key: str) -> dict:
    return row.get("metrics", {}).get(key) or {}


def _val(row: dict, key: str) -> float | None:
    return _metric(row, key).get("value")


def _ci(row: dict, key: str) -> tuple[float | None, float | None]:
    ci = _metric(row, key).get("ci") or [None, None]
    return ci[0], ci[1]


def _row_label(row: dict) -> str:
    from scoring.tables import row_label

    return row_label(row)


# --------------------------------------------------------------------------------------- scoring calls


def score_runs(runs: list[Run], opts: ReportOptions) -> list[ScoredRun]:
    from scoring.streams import load_run as load_run_data
    from scoring.tables import ScoreOptions, pool_runs, score_run
    from scoring.weights import WEIGHT_SCHEMES

    q_z: dict[str, float] = {}
    if opts.q_z_files:
        from rundir.qz_file import read_qz_file

        for f in opts.q_z_files:
            q_z.update({k: r.q_hat_z for k, r in read_qz_file(Path(f)).items()})
    items: list[tuple[Run, Any]] = [(r, load_run_data(r.path)) for r in runs]
    if opts.pool:
        groups: dict[str, list[tuple[Run, Any]]] = {}
        for r, d in items:
            groups.setdefault(r.dataset, []).append((r, d))
        for dataset, group in groups.items():
            if len(group) > 1:
                pooled_data = pool_runs([d for _, d in group])
                pooled_run = Run(
                    path=Path(f"pooled-{dataset}"),
                    manifest=group[0][0].manifest,
                    episodes=[e for r, _ in group for e in r.episodes],
                    name=f"pooled-{dataset}",
                    label_text=f"pooled {dataset} ({' + '.join(r.name or r.path.name for r, _ in group)})",
                )
                items.append((pooled_run, pooled_data))
    taken: set[str] = set()
    scored = []
    for run, data in items:
        n_ep = int(data.episode_ids.size)
        if n_ep == 0:
            raise UserError(f"{run.path} has no finished episodes yet; run `uqh run` first (or drop it from the list)")
        base = dict(n_bootstrap=opts.n_bootstrap, seed=opts.seed)
        main = score_run(data, ScoreOptions(censoring="exclude", fixed_rank=True, **base))
        sr = ScoredRun(run=run, data=data, slug=_slug(run.name or run.path.name, taken), main=main,
                       pooled=run.label_text is not None)
        censoring = "simple" if sr.has_censored else "exclude"
        for scheme in WEIGHT_SCHEMES:
            sr.by_weights[scheme] = score_run(data, ScoreOptions(weights=scheme, censoring=censoring, auq=False, **base))
        if sr.has_censored and q_z and not sr.pooled:
            censored_ids = [str(e) for e, st in zip(data.episode_ids, data.stop_reason) if st == "max_steps"]
            sr.exact_missing = sum(1 for e in censored_ids if e not in q_z)
            if sr.exact_missing == 0:
                sr.exact = score_run(data, ScoreOptions(censoring="exact", q_z=q_z, auq=False, **base))
        if sr.has_parse_errors:
            sr.parse_sens = (
                score_run(data, ScoreOptions(censoring="simple", auq=False, **base)),
                score_run(data, ScoreOptions(censoring="simple", include_parse_errors=True, auq=False, **base)),
            )
        scored.append(sr)
    return scored


# --------------------------------------------------------------------------------------- tables


def transparency_table(sr: ScoredRun) -> Table:
    res = sr.main
    scores = res["settings"]["scores"]
    metric_keys = ["auroc", "auprc", "aurc", "t_ece", "t_brier"] + [f"tps_{s}" for s in scores]
    cols = ["Predictor", "n", "skipped (missing)"] + [METRIC_LABELS.get(k, k) for k in metric_keys]
    rows = []
    for r in res["rows"]:
        row = {"Predictor": _row_label(r), "n": r["n_used"], "skipped (missing)": r["n_skipped_missing"]}
        for k in metric_keys:
            row[METRIC_LABELS.get(k, k)] = _val(r, k)
        if r.get("note"):
            row["Predictor"] += f" — {r['note']}"
        rows.append(row)
    c = res["counts"]
    ybar = next((r["ybar"] for r in res["rows"] if r.get("ybar") is not None), None)
    return Table(
        name=f"transparency__{sr.slug}",
        title=f"Predictor transparency (Table 2 shape): {sr.label}",
        columns=cols,
        rows=rows,
        caption=(
            f"Complete-observation sample: n = {c.get('complete')} clean trajectories with observed Y"
            + (f", ȳ = {ybar:.3f}" if ybar is not None else "")
            + f"; excluded: {c.get('excluded_max_steps', 0)} max_steps, {c.get('excluded_parse_error', 0)} parse_error, "
            f"{c.get('excluded_tool_error', 0) + c.get('excluded_env_terminated', 0)} other. AUROC/AUPRC failure-oriented "
            "(positive class Y = 0) on the linear-front weighted trajectory mean; T-ECE tie-aware, 10 quantile bins; "
            "TPS reward-oriented with linear-front weights. Platt = single-split cross-fitted (Appendix D). "
            "A trajectory with a missing value is skipped for that predictor (counted), never imputed. "
            f"95% CIs and SEs ({res['settings']['bootstrap']} paired bootstrap resamples) are in scores_long__{sr.slug}.csv."
        ),
    )


def scores_long_csv(sr: ScoredRun) -> str:
    import csv
    import io

    from scoring.tables import CSV_FIELDS, csv_records

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_FIELDS), lineterminator="\n")
    w.writeheader()
    for rec in csv_records(sr.main):
        w.writerow({k: ("" if v is None else (repr(v) if isinstance(v, float) else v)) for k, v in rec.items()})
    return buf.getvalue()


def auq_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Scalar predictor", "n"] + [METRIC_LABELS[k] for k in ("auroc", "auprc", "aurc", "t_ece", "t_brier")]
    rows = []
    for sr in scored:
        for r in sr.main.get("auq", []):
            cal = "raw" if r["calibration"] == "raw" else "Platt"
            row = {"Run": sr.label, "Scalar predictor": f"AUQ Φ_{r['aggregator']} {r['label']} {cal}", "n": r["n"]}
            for k in ("auroc", "auprc", "aurc", "t_ece", "t_brier"):
                row[METRIC_LABELS[k]] = (r["metrics"].get(k) or {}).get("value")
            rows.append(row)
    return Table(
        name="auq_scalar",
        empty_note=NEED_COMPLETE,
        title="Scalar AUQ-style predictors (Table 5 shape)",
        columns=cols,
        rows=rows,
        caption="Φ_last, Φ_avg, Φ_min collapse a trajectory to one scalar before evaluation; complete-observation "
        "sample; no TPS for them (they do not provide the per-step process).",
    )


def platt_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Predictor", "Split A slope b", "Split A fallback", "Split B slope b", "Split B fallback",
            "Calibrated min", "Calibrated max", "n A", "n B"]
    rows = []
    from scoring.streams import PREDICTOR_LABELS

    for sr in scored:
        for pred, d in sr.main.get("calibration", {}).items():
            rng = d.get("calibrated_range") or [None, None]
            rows.append({
                "Run": sr.label, "Predictor": PREDICTOR_LABELS.get(pred, pred),
                "Split A slope b": d["split_A"].get("b_fitted"), "Split A fallback": bool(d["split_A"].get("fallback")),
                "Split B slope b": d["split_B"].get("b_fitted"), "Split B fallback": bool(d["split_B"].get("fallback")),
                "Calibrated min": rng[0], "Calibrated max": rng[1], "n A": d.get("n_A"), "n B": d.get("n_B"),
            })
    return Table(
        name="platt_diagnostics",
        empty_note="No Platt map could be fitted (each half of the split needs complete trajectories).",
        title="Platt calibration diagnostics (Appendix D, Table 1 shape)",
        columns=cols,
        rows=rows,
        caption="Fitted slopes of the two cross-fitted maps (before the monotone fallback, which sets b = 0 when "
        "b < 0) and the calibrated probability range.",
    )


def _find(rows: list[dict], predictor: str, calibration: str) -> dict | None:
    return next((r for r in rows if r["predictor"] == predictor and r["calibration"] == calibration), None)


def calibration_invariance_table(scored: list[ScoredRun], predictor: str = PRIMARY_PREDICTOR) -> Table:
    cols = ["Run", "Metric", "Raw", "Raw CI low", "Raw CI high", "Platt", "Platt CI low", "Platt CI high",
            "Base rate", "Base CI low", "Base CI high", "Δ (Platt − raw)", "SE(Δ)", "Δ/SE", "n"]
    rows = []
    for sr in scored:
        raw, platt = _find(sr.main["rows"], predictor, "raw"), _find(sr.main["rows"], predictor, "platt")
        base = _find(sr.main["rows"], "base_rate", "raw")
        if raw is None or raw["n_used"] == 0:
            continue
        for k in FIG1_METRICS:
            cmp = ((platt or {}).get("vs_raw") or {}).get(k) or {}
            rows.append({
                "Run": sr.label, "Metric": METRIC_LABELS[k],
                "Raw": _val(raw, k), "Raw CI low": _ci(raw, k)[0], "Raw CI high": _ci(raw, k)[1],
                "Platt": _val(platt, k) if platt else None,
                "Platt CI low": _ci(platt, k)[0] if platt else None, "Platt CI high": _ci(platt, k)[1] if platt else None,
                "Base rate": _val(base, k) if base else None,
                "Base CI low": _ci(base, k)[0] if base else None, "Base CI high": _ci(base, k)[1] if base else None,
                "Δ (Platt − raw)": cmp.get("delta"), "SE(Δ)": cmp.get("se"), "Δ/SE": cmp.get("delta_over_se"),
                "n": raw["n_used"],
            })
    from scoring.streams import PREDICTOR_LABELS

    return Table(
        name="calibration_invariance",
        empty_note=NEED_COMPLETE,
        title=f"Calibration invariance: {PREDICTOR_LABELS[predictor]} raw vs Platt vs base rate (Fig. 1 shape)",
        columns=cols,
        rows=rows,
        caption="Complete-observation sample. Δ/SE: the raw-to-Platt change over its paired bootstrap standard "
        "error (§6.1). Rank metrics barely move under recalibration while TPS_log can move by many SEs.",
    )


def fixed_rank_table(scored: list[ScoredRun]) -> Table:
    from scoring.streams import PREDICTOR_LABELS

    rows = []
    keys: list[str] = []
    for sr in scored:
        for pred, frs in (sr.main.get("fixed_rank") or {}).items():
            for fr in frs:
                keys = keys or [k for k in fr if k != "transform"]
                rows.append({"Run": sr.label, "Predictor": PREDICTOR_LABELS.get(pred, pred), "Transform": fr["transform"],
                             **{METRIC_LABELS.get(k, k): fr[k] for k in fr if k != "transform"}})
    return Table(
        name="fixed_rank",
        empty_note=NEED_COMPLETE,
        title="Fixed-rank sensitivity (Appendix E)",
        columns=["Run", "Predictor", "Transform"] + [METRIC_LABELS.get(k, k) for k in keys],
        rows=rows,
        caption="One trajectory scalar from the RAW stream feeds AUROC/AUPRC/AURC in every row (identical by "
        "construction); only the per-step stream scored by TPS is transformed.",
    )


def sensitivity_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Predictor", "Score", "Weight schedule", "Censoring", "TPS", "TPS CI low", "TPS CI high",
            "TPS complete-only", "Δ_practice", "Δ CI low", "Δ CI high", "n"]
    rows = []
    for sr in scored:
        for scheme, res in sr.by_weights.items():
            for r in res["rows"]:
                for s in res["settings"]["scores"]:
                    k = f"tps_{s}"
                    d = f"delta_practice_{s}"
                    rows.append({
                        "Run": sr.label, "Predictor": _row_label(r), "Score": s, "Weight schedule": scheme,
                        "Censoring": res["settings"]["censoring"], "TPS": _val(r, k),
                        "TPS CI low": _ci(r, k)[0], "TPS CI high": _ci(r, k)[1],
                        "TPS complete-only": _val(r, f"{k}_complete_only"), "Δ_practice": _val(r, d),
                        "Δ CI low": _ci(r, d)[0], "Δ CI high": _ci(r, d)[1], "n": r["n_used"],
                    })
    return Table(
        name="sensitivity",
        title="Score-family × weight-schedule sensitivity (Appendix I)",
        columns=cols,
        rows=rows,
        caption="Each weight schedule refits the Platt maps with matching weights (Appendix D). Runs with "
        "administratively censored trajectories are scored with the simple censored extension (q_Z ≈ 0) and report "
        "Δ_practice = TPS_cen-ext − TPS_complete-only (Table 11 shape); runs without use the complete sample.",
    )


def censored_shift_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Predictor", "Score", "n complete", "n censored", "Censoring rate", "TPS complete-only",
            "TPS cen-ext", "Δ_practice", "Δ CI low", "Δ CI high", "Δ/SE", "Δ / censoring rate"]
    rows = []
    for sr in scored:
        if not sr.has_censored:
            continue
        res = sr.by_weights["linear-front"]
        for r in res["rows"]:
            for s in res["settings"]["scores"]:
                d = _metric(r, f"delta_practice_{s}")
                n_c, n_z = r["n_complete"], r["n_censored"]
                rate = n_z / (n_c + n_z) if (n_c + n_z) else None
                delta, se = d.get("value"), d.get("se")
                rows.append({
                    "Run": sr.label, "Predictor": _row_label(r), "Score": s, "n complete": n_c, "n censored": n_z,
                    "Censoring rate": rate, "TPS complete-only": _val(r, f"tps_{s}_complete_only"),
                    "TPS cen-ext": _val(r, f"tps_{s}"), "Δ_practice": delta,
                    "Δ CI low": _ci(r, f"delta_practice_{s}")[0], "Δ CI high": _ci(r, f"delta_practice_{s}")[1],
                    "Δ/SE": (delta / se) if (delta is not None and se) else None,
                    "Δ / censoring rate": (delta / rate) if (delta is not None and rate) else None,
                })
    return Table(
        name="censored_shift",
        empty_note="No run has administratively censored (max_steps) trajectories.",
        title="Complete-only vs censored extension (Fig. 2A, §6.3)",
        columns=cols,
        rows=rows,
        caption="Linear-front weights. TPS_cen-ext adds the max_steps prefixes under TPS^cen,simple (q_Z ≈ 0); "
        "parse errors excluded (informative). Δ_practice CI: paired bootstrap over the working sample.",
    )


def exact_censoring_table(scored: list[ScoredRun]) -> Table:
    """Table 8/9 shape: the exact q_Z-weighted censored score next to the simple one (linear-front weights)."""
    cols = ["Run", "Predictor", "Score", "n complete", "n censored", "TPS cen-simple", "TPS cen-exact",
            "TPS cen-exact CI low", "TPS cen-exact CI high", "Exact − simple", "TPS complete-only"]
    rows = []
    for sr in scored:
        if sr.exact is None:
            continue
        simple = sr.by_weights["linear-front"]
        for r in sr.exact["rows"]:
            r_s = _find(simple["rows"], r["predictor"], r["calibration"])
            for sc in sr.exact["settings"]["scores"]:
                k = f"tps_{sc}"
                a, b = (_val(r_s, k) if r_s else None), _val(r, k)
                rows.append({
                    "Run": sr.label, "Predictor": _row_label(r), "Score": sc, "n complete": r["n_complete"],
                    "n censored": r["n_censored"], "TPS cen-simple": a, "TPS cen-exact": b,
                    "TPS cen-exact CI low": _ci(r, k)[0], "TPS cen-exact CI high": _ci(r, k)[1],
                    "Exact − simple": (b - a) if (a is not None and b is not None) else None,
                    "TPS complete-only": _val(r, f"{k}_complete_only"),
                })
    missing = [f"{sr.label}: {sr.exact_missing} censored episode(s) without q_hat_z" for sr in scored if sr.exact_missing]
    return Table(
        name="censored_exact",
        title="Exact vs simple censored score (§4.3, Tables 8–9 shape)",
        columns=cols,
        rows=rows,
        caption="TPS^cen,exact weights each censored prefix's success and failure branches by q_hat_Z from "
        "`uqh continue` (Eq. 4); TPS^cen,simple takes q_Z ≈ 0 (Eq. 5). Linear-front weights; Platt refit per sample."
        + (" Not scored (missing q_Z): " + "; ".join(missing) + "." if missing else ""),
        empty_note=("Give --q-z FILE (written by `uqh continue`) to add the exact censored score."
                    if not missing else "No run has a q_hat_z for every censored episode: " + "; ".join(missing) + "."),
    )


def parse_error_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Predictor", "Score", "n working", "n with parse errors", "parse errors as censored",
            "TPS working sample", "TPS incl. parse errors", "Difference"]
    rows = []
    for sr in scored:
        if sr.parse_sens is None:
            continue
        base, alt = sr.parse_sens
        for r in base["rows"]:
            r2 = _find(alt["rows"], r["predictor"], r["calibration"])
            if r2 is None:
                continue
            for s in base["settings"]["scores"]:
                a, b = _val(r, f"tps_{s}"), _val(r2, f"tps_{s}")
                rows.append({
                    "Run": sr.label, "Predictor": _row_label(r), "Score": s, "n working": r["n_used"],
                    "n with parse errors": r2["n_used"],
                    "parse errors as censored": alt["counts"].get("parse_errors_included_as_censored"),
                    "TPS working sample": a, "TPS incl. parse errors": b,
                    "Difference": (b - a) if (a is not None and b is not None) else None,
                })
    return Table(
        name="parse_error_sensitivity",
        empty_note="No run has parse-error trajectories.",
        title="Parse-error sensitivity (Appendix G.2)",
        columns=cols,
        rows=rows,
        caption="Contra-assumption check: parse-error trajectories treated as administratively censored at the "
        "failing step (simple censored score, linear-front weights) vs the assumption-disciplined working sample.",
    )


def length_stratified_censoring(lengths: np.ndarray, rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Which complete trajectories to censor artificially, and where (Appendix I.1's length-stratified rates).

    Within every length stratum T >= 2, ``round(rate * n_T)`` trajectories drawn with a seeded generator are
    censored at Z uniform on {1, ..., T-1}; one-step trajectories have no proper prefix and are never censored.
    Returns (z, censored); z = T for the uncensored ones.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    censored = np.zeros(lengths.size, dtype=bool)
    z = lengths.copy()
    for T in np.unique(lengths):
        if T < 2:
            continue
        idx = np.flatnonzero(lengths == T)
        k = int(round(rate * idx.size))
        chosen = rng.permutation(idx)[:k]
        censored[chosen] = True
        z[chosen] = rng.integers(1, T, size=k)
    return z, censored


ARTIFICIAL_RATES = (0.25, 0.5, 0.75)


def artificial_censoring_table(scored: list[ScoredRun], seed: int, predictor: str = PRIMARY_PREDICTOR) -> Table:
    """Table 10 shape: complete-data TPS and the mean shift under TPS^cen,simple at artificial censoring rates."""
    from scoring.calibration import cross_fit_platt
    from scoring.rules import DEFAULT_SCORES, parse_score
    from scoring.streams import PREDICTOR_LABELS, build_sample
    from scoring.tps import artificial_censoring
    from scoring.weights import WEIGHT_SCHEMES, trajectory_weights

    cols = ["Run", "Predictor", "Rate r", "Score", "Weight schedule", "n", "n censored", "TPS complete", "Δ_mean",
            "Δ_Y=0", "Δ_Y=1", "Mean prefix-swap", "Mean tail-omission", "Max abs decomposition error"]
    rows = []
    for sr in scored:
        s = build_sample(sr.data, predictor, censoring="exclude")
        if s.n < 2:
            continue
        lengths = np.diff(s.offsets)
        y = s.y
        for scheme in WEIGHT_SCHEMES:
            w = trajectory_weights(s.offsets, scheme, s.horizon)
            try:
                values = cross_fit_platt(s.values, s.offsets, s.y, s.delta, s.episode_ids, w).values
                label = f"{PREDICTOR_LABELS[predictor]} (Platt)"
            except ValueError:
                values, label = s.values, f"{PREDICTOR_LABELS[predictor]} (raw; Platt unavailable)"
            for k, rate in enumerate(ARTIFICIAL_RATES):
                z, cens = length_stratified_censoring(lengths, rate, seed + k)
                for spec in DEFAULT_SCORES:
                    rule = parse_score(spec)
                    out = artificial_censoring(values, s.offsets, y, z, cens, rule, scheme)
                    d = out["censored"] - out["complete"]
                    err = np.abs(d - (out["prefix_swap"] + out["tail_omission"]))
                    rows.append({
                        "Run": sr.label, "Predictor": label, "Rate r": rate, "Score": rule.name,
                        "Weight schedule": scheme, "n": s.n, "n censored": int(cens.sum()),
                        "TPS complete": float(out["complete"].mean()), "Δ_mean": float(d.mean()),
                        "Δ_Y=0": float(d[y == 0].mean()) if (y == 0).any() else None,
                        "Δ_Y=1": float(d[y == 1].mean()) if (y == 1).any() else None,
                        "Mean prefix-swap": float(out["prefix_swap"].mean()),
                        "Mean tail-omission": float(out["tail_omission"].mean()),
                        "Max abs decomposition error": float(err.max()),
                    })
    return Table(
        name="artificial_censoring",
        empty_note="Needs at least two complete trajectories with an observed outcome.",
        title="Artificial-censoring validation (Appendix I.1, Table 10 shape)",
        columns=cols,
        rows=rows,
        caption="Complete trajectories only. Outcomes hidden at length-stratified rates r (in each length stratum "
        "T >= 2, round(r n_T) seeded draws, Z uniform on 1..T-1); weights from the full length, truncated at Z, not "
        "renormalised. Δ = TPS^cen,simple − TPS^complete, averaged over all trajectories (Δ_Y=0 / Δ_Y=1 over each "
        "label); it decomposes exactly into prefix-swap + tail-omission (last column: the numerical residual).",
    )


# --------------------------------------------------------------------------------------- figures


def _mpl():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "uqh-report", "font.size": 9})
    return plt


def _save(fig, out_dir: Path, stem: str) -> None:
    fig.savefig(out_dir / f"{stem}.png", dpi=130, bbox_inches="tight")
    fig.savefig(out_dir / f"{stem}.svg", bbox_inches="tight", metadata={"Date": None})


def _err(v, lo, hi):
    if v is None or lo is None or hi is None:
        return None
    return [[max(v - lo, 0.0)], [max(hi - v, 0.0)]]


def figure_calibration_invariance(table: Table, run_label: str, out_dir: Path, stem: str) -> bool:
    plt = _mpl()
    rows = [r for r in table.rows if r["Run"] == run_label
            and any(r[k] is not None and math.isfinite(r[k]) for k in ("Raw", "Platt", "Base rate"))]
    if not rows:
        return False
    fig, axes = plt.subplots(1, len(rows), figsize=(2.6 * len(rows), 2.4))
    axes = np.atleast_1d(axes)
    for ax, r in zip(axes, rows):
        series = [("raw", "Raw", r["Raw"], r["Raw CI low"], r["Raw CI high"]),
                  ("platt", "Platt", r["Platt"], r["Platt CI low"], r["Platt CI high"]),
                  ("base", "Base rate", r["Base rate"], r["Base CI low"], r["Base CI high"])]
        for yi, (key, name, v, lo, hi) in enumerate(series):
            if v is None or not math.isfinite(v):
                continue
            ax.errorbar([v], [yi], xerr=_err(v, lo, hi), fmt="o", color=COLORS[key], capsize=3, label=name)
        base = r["Base rate"]
        if base is not None and math.isfinite(base):
            lo, hi = ax.get_xlim()
            worse_left = not any(x in r["Metric"] for x in ("AURC", "T-ECE"))
            ax.axvspan(lo if worse_left else base, base if worse_left else hi, color="#999999", alpha=0.12, lw=0)
            ax.set_xlim(lo, hi)
        z = r["Δ/SE"]
        ax.set_title(f"{r['Metric']}\nΔ/SE = {z:.1f}" if z is not None and math.isfinite(z) else r["Metric"], fontsize=9)
        ax.set_yticks(range(3), ["raw", "Platt", "base"])
        ax.set_ylim(-0.6, 2.6)
        ax.invert_yaxis()
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(loc="lower left", fontsize=7, frameon=False)
    fig.suptitle(f"Calibration gap: {run_label} (n = {rows[0]['n']}); shaded = worse than base rate", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    plt.close(fig)
    return True


def figure_censored_shift(table: Table, run_label: str, out_dir: Path, stem: str, score: str = PRIMARY_SCORE) -> bool:
    plt = _mpl()
    rows = [r for r in table.rows if r["Run"] == run_label and r["Score"] == score]
    if not rows:
        return False
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 0.45 * len(rows) + 1.4), sharey=True)
    ys = np.arange(len(rows))
    for yi, r in zip(ys, rows):
        if r["TPS complete-only"] is not None:
            a1.plot([r["TPS complete-only"]], [yi], "o", color=COLORS["raw"], label="complete-only" if yi == 0 else None)
        if r["TPS cen-ext"] is not None:
            a1.plot([r["TPS cen-ext"]], [yi], "s", color=COLORS["platt"], label="censored extension" if yi == 0 else None)
        d = r["Δ_practice"]
        if d is not None and math.isfinite(d):
            a2.errorbar([d], [yi], xerr=_err(d, r["Δ CI low"], r["Δ CI high"]), fmt="o", color="#333333", capsize=3)
    a2.axvline(0, color="#999999", lw=0.8)
    a1.set_yticks(ys, [r["Predictor"] for r in rows])
    a1.invert_yaxis()
    a1.set_xlabel(f"TPS_{score} (nats)" if score == "log" else f"TPS_{score}")
    a2.set_xlabel("Δ_practice = cen-ext − complete-only (95% CI)")
    a1.legend(fontsize=7, frameon=False, loc="best")
    fig.suptitle(f"Complete-only vs censored extension: {run_label}", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    plt.close(fig)
    return True


def figure_selection(table: Table, out_dir: Path, stem: str = "selection_diagnostic") -> bool:
    plt = _mpl()
    runs = []
    for r in table.rows:
        if r["Subset"] in ("completed", "admin-censored") and r["n"]:
            if r["Run"] not in runs:
                runs.append(r["Run"])
    runs = [run for run in runs if any(r["Run"] == run and r["Subset"] == "admin-censored" and r["n"] for r in table.rows)]
    if not runs:
        return False
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 0.6 * len(runs) + 1.5), sharey=True)
    for yi, run in enumerate(runs):
        for off, subset, key in ((-0.15, "completed", "raw"), (0.15, "admin-censored", "platt")):
            r = next(x for x in table.rows if x["Run"] == run and x["Subset"] == subset)
            if r["Mean observed steps"] is not None:
                a1.errorbar([r["Mean observed steps"]], [yi + off],
                            xerr=_err(r["Mean observed steps"], r["Steps CI low"], r["Steps CI high"]),
                            fmt="o", color=COLORS[key], capsize=3, label=subset if yi == 0 else None)
            if r["Mean verbal confidence"] is not None:
                a2.errorbar([r["Mean verbal confidence"]], [yi + off],
                            xerr=_err(r["Mean verbal confidence"], r["Confidence CI low"], r["Confidence CI high"]),
                            fmt="o", color=COLORS[key], capsize=3)
    a1.set_yticks(range(len(runs)), runs)
    a1.invert_yaxis()
    a1.set_xlabel("mean observed steps")
    a2.set_xlabel("mean verbal confidence")
    a1.legend(fontsize=7, frameon=False)
    fig.suptitle("Selection diagnostic: completed vs admin-censored (95% bootstrap CI)", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------- traces


def _clean(v: float) -> float | None:
    return float(v) if (v is not None and math.isfinite(v)) else None


def trace_data(scored: list[ScoredRun], max_traces: int) -> dict[str, Any]:
    """Per run, per trajectory: steps (action, observation) and every predictor's per-step values (null = missing)."""
    from scoring.calibration import cross_fit_platt
    from scoring.streams import PREDICTOR_LABELS, STEP_PREDICTORS, build_sample
    from scoring.weights import trajectory_weights

    runs_out = []
    for sr in scored:
        if sr.pooled:
            continue
        data = sr.data
        index = {str(e): i for i, e in enumerate(data.episode_ids)}
        # Platt-calibrated verbal stream of the complete trajectories (the primary calibrated predictor).
        platt: dict[str, list[float | None]] = {}
        try:
            s = build_sample(data, PRIMARY_PREDICTOR, censoring="exclude")
            if s.n:
                w = trajectory_weights(s.offsets, "linear-front", s.horizon)
                fit = cross_fit_platt(s.values, s.offsets, s.y, s.delta, s.episode_ids, w)
                for i, eid in enumerate(s.episode_ids):
                    platt[str(eid)] = [_clean(v) for v in fit.values[s.offsets[i]:s.offsets[i + 1]]]
        except ValueError:
            platt = {}
        ybar = next((r["ybar"] for r in sr.main["rows"] if r["predictor"] == "base_rate"), None)
        predictors = [{"key": p, "label": PREDICTOR_LABELS[p], "available": bool(np.isfinite(data.streams[p]).any())}
                      for p in STEP_PREDICTORS]
        if platt:
            predictors.append({"key": "verbal_platt", "label": PREDICTOR_LABELS[PRIMARY_PREDICTOR] + " (Platt)", "dashed": True})
        if ybar is not None:
            predictors.append({"key": "base_rate", "label": f"Base rate ȳ = {ybar:.3f}", "dashed": True})
        episodes = sorted(sr.run.episodes, key=lambda e: e.episode_id)
        out_eps = []
        for ep in episodes[:max_traces]:
            i = index.get(ep.episode_id)
            if i is None:
                continue
            a, b = int(data.offsets[i]), int(data.offsets[i + 1])
            values = {p: [_clean(v) for v in data.streams[p][a:b]] for p in STEP_PREDICTORS}
            if ep.episode_id in platt:
                values["verbal_platt"] = platt[ep.episode_id]
            if ybar is not None:
                values["base_rate"] = [ybar] * (b - a)
            out_eps.append({
                "id": ep.episode_id,
                "task": ep.task_id,
                "stop": ep.stop_reason.value,
                "y": ep.outcome,
                "steps": [{"t": st.t, "action": st.action[:600], "obs": st.observation[:1200],
                           "conf_raw": st.confidence_raw} for st in ep.steps],
                "values": values,
                "failed": [{"attempt": a.attempt, "error": a.error, "raw": a.raw_text[:600]}
                           for a in (ep.failed_step or [])],
            })
        runs_out.append({"label": sr.label, "predictors": predictors, "episodes": out_eps,
                         "truncated": len(episodes) > max_traces})
    return {"runs": runs_out}


# --------------------------------------------------------------------------------------- driver


PER_RUN_PREFIXES = ("transparency__", "scores_long__", "calibration_invariance__", "censored_shift__")


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


def build_report(paths: list[str | Path], out_dir: str | Path, opts: ReportOptions | None = None) -> ReportResult:
    opts = opts or ReportOptions()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} exists and is not a directory; pick a directory path")
    runs = load_runs(paths)
    scored = score_runs(runs, opts)  # everything that can fail on the inputs fails before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_artefacts(out_dir)
    files: list[Path] = []

    audit_t = termination_audit(runs)
    select_t = selection_diagnostic(runs, n_boot=opts.n_bootstrap, seed=opts.seed)
    transparency = [transparency_table(sr) for sr in scored]
    auq_t, platt_t = auq_table(scored), platt_table(scored)
    calib_t, fixed_t = calibration_invariance_table(scored), fixed_rank_table(scored)
    sens_t, shift_t, parse_t = sensitivity_table(scored), censored_shift_table(scored), parse_error_table(scored)
    art_t = artificial_censoring_table(scored, opts.seed)
    exact_t = exact_censoring_table(scored)
    tables = [audit_t, select_t, *transparency, auq_t, platt_t, calib_t, fixed_t, sens_t, art_t, shift_t, exact_t,
              parse_t]
    for t in tables:
        files += t.write(out_dir)
    for sr in scored:
        p = out_dir / f"scores_long__{sr.slug}.csv"
        p.write_text(scores_long_csv(sr))
        files.append(p)

    fig1, fig2a = [], []
    for sr in scored:
        stem = f"calibration_invariance__{sr.slug}"
        if figure_calibration_invariance(calib_t, sr.label, out_dir, stem):
            fig1.append(Figure(stem, f"Calibration gap on {sr.label}: raw verbal confidence (orange), Platt (blue), "
                                     "base rate (green); whiskers are 95% bootstrap intervals."))
        stem = f"censored_shift__{sr.slug}"
        if figure_censored_shift(shift_t, sr.label, out_dir, stem):
            fig2a.append(Figure(stem, f"Complete-only vs censored-extension TPS_log on {sr.label}, with Δ_practice "
                                      "and its 95% bootstrap CI."))
    fig2b = [Figure("selection_diagnostic", "Selection diagnostic (Fig. 2B): completed vs admin-censored.")] if figure_selection(select_t, out_dir) else []
    for f in fig1 + fig2a + fig2b:
        files += [out_dir / f"{f.stem}.png", out_dir / f"{f.stem}.svg"]

    no_cens = "No run has administratively censored (max_steps) trajectories: the censored extension does not apply."
    no_parse = "No run has parse-error trajectories: nothing to test."
    sections = [
        Section("audit", "Termination audit", "Appendix G.1: stop reasons per run.", [audit_t]),
        Section("selection", "Selection diagnostic", "Fig. 2B: are censored trajectories structurally different?",
                [select_t], fig2b),
        Section("transparency", "Predictor transparency", "Appendix F: per-step streams on the complete sample.",
                transparency),
        Section("calibration", "Calibration invariance", "§6.1 / Fig. 1.", [calib_t, platt_t], fig1),
        Section("fixed-rank", "Fixed-rank sensitivity", "Appendix E.", [fixed_t]),
        Section("auq", "Scalar AUQ predictors", "Appendix F.2 / Table 5.", [auq_t]),
        Section("censored", "Complete-only vs censored extension", "§6.3 / Fig. 2A; exact censored score §4.3.",
                [shift_t, exact_t] if shift_t.rows else [], fig2a, notes=[] if shift_t.rows else [no_cens]),
        Section("sensitivity", "Score family × weight schedule", "Appendix I.", [sens_t, art_t]),
        Section("parse-errors", "Parse-error sensitivity", "Appendix G.2.", [parse_t] if parse_t.rows else [],
                notes=[] if parse_t.rows else [no_parse]),
    ]
    meta = [
        f"generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} · bootstrap {opts.n_bootstrap} "
        f"resamples (seed {opts.seed}) · all numbers computed by the scoring package",
        *[f"{sr.label}: {sr.data.episode_ids.size} episodes · model {sr.run.manifest.config.model} · "
          f"budget {sr.run.manifest.config.step_budget}" for sr in scored],
    ]
    html_path = out_dir / "report.html"
    html_path.write_text(render_page(title=opts.title, meta=meta, sections=sections,
                                     trace_data=trace_data(scored, opts.max_traces), out_dir=out_dir))
    md_path = out_dir / "report.md"
    md_path.write_text(f"# {opts.title}\n\n" + "\n".join(m + "  " for m in meta) + "\n\n"
                       + "\n".join(t.to_markdown() for t in tables))
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps({"runs": [{"label": sr.label, "slug": sr.slug, "main": sr.main,
                                               "by_weights": sr.by_weights,
                                               "parse_error_sensitivity": list(sr.parse_sens) if sr.parse_sens else None}
                                              for sr in scored]}, indent=1, default=str))
    files += [html_path, md_path, json_path]
    return ReportResult(out_dir=out_dir, files=files, html=html_path)
