"""What `uqh score` shows: one table for all runs (rows run × predictor, 95% CIs under the values, 120 columns),
the censored extension, raw → Platt changes, the AUQ aggregators, the Platt maps, the fixed-rank rows, the paired
comparison (``--paired``) and the notes -- all arranged from :class:`uqh.scoring.results.RunScores` and
:class:`uqh.scoring.results.PairedComparison` into :class:`uqh.reports.render.Output`.

Terminal cells hold the value and, on a second line, its percentile interval (``lo–hi``); β-family scores are
shown ×10³ (the header says so) so that they fit; Markdown flattens the two lines, CSV is the long format of
:func:`uqh.scoring.long_records.csv_records`.
"""
from __future__ import annotations

import json

from pydantic import TypeAdapter

from uqh.reports.render import Output
from uqh.reports.tables import Table
from uqh.scoring.registry import (
    BASE_RATE,
    CALIBRATION_LABELS,
    DELTA_PRACTICE,
    TPS,
    TPS_COMPLETE_ONLY,
    TPS_GAP,
    TRUTH_MAE,
    MetricKey,
    aggregator_label,
    diagnostic_metrics,
    get_predictor,
)
from uqh.scoring.long_records import CSV_FIELDS, csv_records
from uqh.scoring.results import Comparison, Estimate, PairedComparison, RunScores

#: β-family scores are a few thousandths: shown ×10³ in the terminal table.
BETA_SCALE = 1000.0


def scale_of(key: MetricKey) -> float:
    return BETA_SCALE if (key.score or "").startswith("beta") else 1.0


def header_of(key: MetricKey) -> str:
    return key.header + ("\n×10³" if scale_of(key) != 1.0 else "")


def _num(v: float, digits: int) -> str:
    text = f"{v:.{digits}f}"
    return text.lstrip("-") if float(text) == 0 else text  # no "-0.00"


def value_ci(e: Estimate | None, scale: float = 1.0) -> str:
    """``0.812`` over ``0.70–0.91`` (the 95% percentile interval); ``—`` when missing."""
    if e is None or e.value is None:
        return "—"
    text = _num(e.value * scale, 3)
    if e.ci_low is not None and e.ci_high is not None:
        text += f"\n{_num(e.ci_low * scale, 2)}–{_num(e.ci_high * scale, 2)}"
    return text


def delta_ci(c: Comparison | None, scale: float = 1.0) -> str:
    """``+0.012`` over ``-0.01–0.03``; ``*`` when the interval leaves out 0."""
    if c is None or c.delta is None:
        return "—"
    text = f"{c.delta * scale:+.3f}"
    if c.ci_low is not None and c.ci_high is not None:
        star = "*" if c.ci_low > 0 or c.ci_high < 0 else ""
        text += f"{star}\n{_num(c.ci_low * scale, 2)}–{_num(c.ci_high * scale, 2)}"
    return text


def run_title(res: RunScores) -> str:
    c = res.counts
    return f"{res.run_dir} · {res.domain} · {res.model} · complete {c.complete}, censored {c.censored}"


def _predictor_cell(predictor: str, calibration: str) -> str:
    if not get_predictor(predictor).calibratable:
        return predictor
    return f"{predictor}\n{CALIBRATION_LABELS.get(calibration, calibration)}"


def _n_cell(n: int, skipped: int) -> str:
    return f"{n}" + (f"\n{skipped} miss" if skipped else "")


def labels_caption(results: list[RunScores]) -> str:
    s = results[0].settings
    return f"Base rate and Platt trained on labels={s.label_convention}: {s.label_description}."


def without_values(res: RunScores) -> list[str]:
    """Predictors without a value on any trajectory of the sample (e.g. self-consistency on one sample per task):
    left out of the tables, named in one note."""
    return [r.predictor for r in res.rows if r.calibration == "raw" and r.n_used == 0 and r.n_skipped_missing > 0]


def predictor_table(results: list[RunScores], keys: list[MetricKey], name: str, title: str, caption: str) -> Table:
    cols = ["Run", "Predictor", "n"] + [header_of(k) for k in keys]
    rows = []
    for res in results:
        empty = set(without_values(res))
        for r in res.rows:
            if r.predictor in empty:
                continue
            row = {"Run": run_title(res), "Predictor": _predictor_cell(r.predictor, r.calibration),
                   "n": _n_cell(r.n_used, r.n_skipped_missing)}
            row.update({header_of(k): value_ci(r.estimate(k.metric, k.score), scale_of(k)) for k in keys})
            rows.append(row)
    return Table(name, title, cols, rows, caption=caption, group="Run")


def main_keys(res: RunScores) -> list[MetricKey]:
    diagnostics = [MetricKey(m.name) for m in diagnostic_metrics() if m.main_table]
    return diagnostics + [MetricKey(TPS, s) for s in res.settings.scores]


def truth_table(results: list[RunScores], caption: str) -> Table | None:
    """Distance of every stream from the truthful q_t (oracle domains only): mean |F−q| and the TPS gap."""
    keys = [MetricKey(TRUTH_MAE)] + [MetricKey(TPS_GAP, s) for s in results[0].settings.scores]
    if not any(r.get(TRUTH_MAE) is not None for res in results for r in res.rows):
        return None
    table = predictor_table(results, keys, "truth", "Distance from the truthful q_t (oracle domain): mean |F_t − q_t| "
                            "and TPS gap = TPS(q) − TPS(F) on the same trajectories (Theorem 4.1: ≥ 0 in expectation)",
                            caption + " The truth row itself has distance 0.")
    table.rows = [row for row in table.rows if any(row[header_of(k)] != "—" for k in keys)]
    return table


def platt_delta_table(results: list[RunScores], keys: list[MetricKey], caption: str) -> Table | None:
    cols = ["Run", "Predictor"] + [header_of(k) for k in keys]
    rows = []
    for res in results:
        for r in res.rows:
            if not any(m.vs_raw is not None for m in r.metrics) or r.predictor in without_values(res):
                continue
            row = {"Run": run_title(res), "Predictor": r.predictor}
            for k in keys:
                m = r.get(k.metric, k.score)
                row[header_of(k)] = delta_ci(m.vs_raw if m is not None else None, scale_of(k))
            rows.append(row)
    if not rows:
        return None
    return Table("platt_delta", "Raw → Platt: Δ and its 95% CI (paired bootstrap; * the CI leaves out 0)", cols, rows,
                 caption=caption, group="Run")


def auq_table(results: list[RunScores], caption: str) -> Table | None:
    keys = [MetricKey(m.name) for m in diagnostic_metrics()]
    cols = ["Run", "Predictor", "Φ", "n"] + [header_of(k) for k in keys]
    rows = []
    for res in results:
        for r in res.auq:
            row = {"Run": run_title(res), "Predictor": _predictor_cell(r.predictor, r.calibration),
                   "Φ": aggregator_label(r.aggregator), "n": str(r.n)}
            row.update({header_of(k): value_ci(r.estimate(k.metric), scale_of(k)) for k in keys})
            rows.append(row)
    if not rows:
        return None
    return Table("auq", "Scalar AUQ aggregators (Table 5 shape; no TPS)", cols, rows, caption=caption, group="Run")


def platt_map_table(results: list[RunScores]) -> Table | None:
    cols = ["Run", "Predictor", "slope A", "slope B", "calibrated range", "trained on"]
    rows = []
    for res in results:
        for d in res.calibration:
            a, b = d.split_a, d.split_b
            rng = f"{d.calibrated_min:.3f}–{d.calibrated_max:.3f}" if d.calibrated_min is not None else "—"
            rows.append({"Run": run_title(res), "Predictor": d.predictor,
                         "slope A": f"{a.b_fitted:.4f}" + (" (fallback)" if a.fallback else ""),
                         "slope B": f"{b.b_fitted:.4f}" + (" (fallback)" if b.fallback else ""),
                         "calibrated range": rng, "trained on": res.settings.label_convention})
    if not rows:
        return None
    return Table("platt_maps", "Platt maps (Appendix D; two cross-fitted splits)", cols, rows, group="Run")


def fixed_rank_tables(results: list[RunScores], caption: str) -> list[Table]:
    out = []
    for res in results:
        for pred in dict.fromkeys(r.predictor for r in res.fixed_rank):
            rows = [r for r in res.fixed_rank if r.predictor == pred]
            keys = [m.key for m in rows[0].metrics]
            cols = ["Run", "Transform"] + [header_of(k) for k in keys]
            out.append(Table(f"fixed_rank_{pred}", f"Fixed-rank analysis (Appendix E): {pred}", cols,
                             [{"Run": run_title(res), "Transform": r.transform,
                               **{header_of(k): value_ci(r.estimate(k.metric, k.score), scale_of(k)) for k in keys}}
                              for r in rows], caption=caption, group="Run"))
    return out


def paired_table(comparisons: list[PairedComparison], keys: list[MetricKey]) -> Table:
    cols = ["Comparison", "Predictor", "n a/b"] + [header_of(k) for k in keys]
    rows = []
    for cmp in comparisons:
        title = (f"{cmp.run_b} − {cmp.run_a} on {cmp.shared_tasks} shared tasks"
                 + (f" ({cmp.only_a} only in a, {cmp.only_b} only in b: left out)" if cmp.only_a or cmp.only_b else ""))
        for r in cmp.rows:
            row = {"Comparison": title, "Predictor": _predictor_cell(r.predictor, r.calibration),
                   "n a/b": f"{r.n_a}/{r.n_b}"}
            for k in keys:
                m = r.get(k.metric, k.score)
                row[header_of(k)] = delta_ci(m.delta if m is not None else None, scale_of(k))
            rows.append(row)
    return Table("paired", "Paired comparison: Δ = second run − first run, 95% CI by a paired bootstrap over shared "
                 "task ids (* the CI leaves out 0)", cols, rows, group="Comparison",
                 caption="Arrows give each metric's better direction: for ↑ metrics Δ > 0 favours the second run, for "
                         "↓ metrics Δ < 0 does.")


def notes_of(res: RunScores) -> list[str]:
    """One note per reason and run (predictors sharing a reason are listed together)."""
    by_reason: dict[str, list[str]] = {}
    empty = without_values(res)
    if empty:
        by_reason["no value on any trajectory (every one missing, never imputed): left out of the tables"] = empty
    for r in res.rows:
        if r.note and r.predictor not in empty:
            by_reason.setdefault(r.note, []).append(r.predictor if r.calibration == "raw" else f"{r.predictor} "
                                                    f"({CALIBRATION_LABELS.get(r.calibration, r.calibration)})")
    return [f"{res.run_dir}: {', '.join(who)}: {why}" for why, who in by_reason.items()]


def header_lines(results: list[RunScores]) -> list[str]:
    s = results[0].settings
    intervals = (f"seed {s.seed}; 95% percentile CIs under each value" if s.bootstrap > 0
                 else "no bootstrap: no confidence intervals")
    lines = [f"weights={s.weights}  censoring={s.censoring}  labels={s.label_convention}  "
             f"bootstrap={s.bootstrap} ({intervals})"]
    for res in results:
        c = res.counts
        excl = ", ".join(f"{k}={v}" for k, v in c.exclusions().items())
        base = res.row(BASE_RATE, "raw")
        rate = f"; base rate {base.label_mean:.4f}" if base is not None and base.label_mean is not None else ""
        extra = f"; parse_errors_as_censored={c.parse_errors_included_as_censored}" if s.include_parse_errors else ""
        lines.append(f"{res.run_dir}  {res.domain} · {res.model}")
        lines.append(f"  episodes={c.episodes} complete={c.complete} censored={c.censored}"
                     + (f"; excluded: {excl}" if excl else "") + extra + rate)
        lines.append(f"  steps by logprob tier: full={c.steps_full_logprobs} "
                     f"selected-only={c.steps_selected_logprobs_only} none={c.steps_no_logprobs}")
    return lines


def score_output(results: list[RunScores], comparisons: list[PairedComparison] | None = None,
                 notes: list[str] | None = None) -> Output:
    """Everything `uqh score` prints, for :func:`uqh.reports.render.emit`."""
    caption = labels_caption(results)
    keys = main_keys(results[0])
    tables = [predictor_table(
        results, keys, "predictors",
        "Per-step predictors (Table 2 shape; diagnostics on complete trajectories, failure-oriented)",
        caption + " n: trajectories scored; 'k miss': skipped for a missing value (never imputed).")]
    if results[0].settings.censoring != "exclude":
        cen = [MetricKey(m, s) for s in results[0].settings.scores for m in (TPS_COMPLETE_ONLY, DELTA_PRACTICE)]
        tables.append(predictor_table(results, cen, "censored", "Censored extension (§6.3): complete-only TPS and "
                                      "Δ_practice = TPS_cen-ext − TPS_complete-only", caption))
    tables += [t for t in (truth_table(results, caption), platt_delta_table(results, keys, caption),
                           auq_table(results, caption),
                           platt_map_table(results)) if t is not None]
    tables += fixed_rank_tables(results, caption)
    if comparisons:
        tables.append(paired_table(comparisons, keys))
    all_notes = list(notes or []) + [n for res in results for n in notes_of(res)]
    if comparisons:
        json_text = json.dumps({"runs": [r.model_dump(mode="json") for r in results],
                                "paired": [c.model_dump(mode="json") for c in comparisons]}, indent=2)
    elif len(results) == 1:
        json_text = results[0].model_dump_json(indent=2)
    else:
        json_text = TypeAdapter(list[RunScores]).dump_json(results, indent=2).decode()
    records = [rec for res in results for rec in csv_records(res)]
    for cmp in comparisons or []:
        records += paired_records(cmp)
    csv_table = Table("scores_long", "long format", list(CSV_FIELDS) + (list(PAIRED_FIELDS) if comparisons else []),
                      records)
    return Output(tables=tables, json_text=json_text, header=header_lines(results), notes=all_notes,
                  csv_table=csv_table, prog="uqh score")


PAIRED_FIELDS = ("run_a", "run_b", "shared_tasks", "delta", "delta_ci_low", "delta_ci_high", "delta_se")


def paired_records(cmp: PairedComparison) -> list[dict]:
    """Long-format records of a paired comparison (``table`` = ``paired``; ``value`` etc. are run b's)."""
    recs = []
    for r in cmp.rows:
        for m in r.metrics:
            recs.append({"run_dir": cmp.run_b, "table": "paired", "predictor": r.predictor,
                         "calibration": r.calibration, "aggregator": "", "metric": m.metric, "score": m.score or "",
                         "value": m.b.value, "ci_low": m.b.ci_low, "ci_high": m.b.ci_high, "se": m.b.se,
                         "n_used": r.n_b, "censoring": cmp.settings.censoring,
                         "label_convention": cmp.settings.label_convention, "run_a": cmp.run_a, "run_b": cmp.run_b,
                         "shared_tasks": cmp.shared_tasks, "delta": m.delta.delta, "delta_ci_low": m.delta.ci_low,
                         "delta_ci_high": m.delta.ci_high, "delta_se": m.delta.se})
    return recs
