"""`uqh certify` output: the certificate tables (Tables 2, 4, 6 and 10 of Mouzouni, "Black-box reliability certification" in shape) and long-format CSV
records, arranged from :class:`uqh.scoring.certify.certificate_results.CertifyResult` for :mod:`uqh.reports.render`."""
from __future__ import annotations

from typing import Any

from uqh.reports.tables import Table, fmt
from uqh.scoring.certify.certificate_results import AlphaRow, CertifyResult, Proportion
from uqh.scoring.results import Estimate


def _ci(x: Proportion | Estimate | None, digits: int = 3) -> str:
    """``0.956 (0.930–0.970)``; ``—`` when missing."""
    if x is None or x.value is None:
        return "—"
    if x.ci_low is None or x.ci_high is None:
        return fmt(x.value, digits)
    return f"{x.value:.{digits}f} ({x.ci_low:.{digits}f}–{x.ci_high:.{digits}f})"


def _threshold_name(r: CertifyResult) -> str:
    return "M*" if r.settings.score == "rank" else "q̂"


def _threshold(t: Any) -> str:
    return "∞" if t == "inf" else fmt(t, 4) if isinstance(t, float) else str(t)


def summary_table(results: list[CertifyResult]) -> Table:
    """One row per run: the reliability level and the certificate at the requested α (Tables 2 and 10 shape)."""
    rows = []
    for r in results:
        rows.append({
            "Run": r.run_dir, "Domain": r.domain, "Model": r.model,
            "n_cal / n_test": f"{r.n_cal} / {r.n_test}",
            "Reliability 1−α*": r.reliability_level,
            "α": f"{r.settings.alpha:g}",
            "Threshold": f"{_threshold_name(r)} = {_threshold(r.main.threshold)}",
            "Coverage": _ci(r.main.coverage),
            "Avg |S|": _ci(r.main.set_size, 2),
            "Cov | solvable": _ci(r.main.conditional_coverage),
            "Mode acc": _ci(r.mode_accuracy),
            "Single-sample acc": _ci(r.single_sample_accuracy),
        })
    cols = ["Run", "Domain", "Model", "n_cal / n_test", "Reliability 1−α*", "α", "Threshold", "Coverage",
            "Avg |S|", "Cov | solvable", "Mode acc", "Single-sample acc"]
    return Table("certify_summary", "Reliability certificate (Mouzouni's reliability certification, Tables 2 and 10 shape; 95% Wilson / "
                 "bootstrap CIs)", cols, rows,
                 caption="Reliability 1−α* = #{s_i ≤ 1}/(n_cal+1) on the calibration split (Definition 2.4). "
                         "Accuracies on the test split (all items without one).")


def alpha_table(r: CertifyResult) -> Table:
    rows = [_alpha_row(r, row) for row in r.alpha_sweep]
    name = _threshold_name(r)
    return Table("certify_alpha_sweep", f"α sweep: {r.run_dir}",
                 ["α", "k", name, "mode suffices", "Coverage", "Avg |S|", "Cov | solvable"], rows,
                 caption=f"k = ⌈(n+1)(1−α)⌉; {name} = the k-th smallest calibration score (Eq. 6.3); ∞ when k > "
                         "n or the k-th score is infinite. 'mode suffices': M* = 1 for the rank score.")


def _alpha_row(r: CertifyResult, row: AlphaRow) -> dict[str, Any]:
    return {"α": f"{row.alpha:g}", "k": row.k, _threshold_name(r): _threshold(row.threshold),
            "mode suffices": row.mode_suffices, "Coverage": _ci(row.coverage), "Avg |S|": _ci(row.set_size, 2),
            "Cov | solvable": _ci(row.conditional_coverage)}


def stability_table(r: CertifyResult) -> Table | None:
    s = r.stability
    if s is None:
        return None
    name = _threshold_name(r)
    dist = ", ".join(f"{'∞' if k == 'inf' else k}: {v}" for k, v in s.threshold_counts.items())
    row = {"Resplits": s.resplits, "n_cal / n_test": f"{s.n_cal} / {s.n_test}", "α": f"{s.alpha:g}",
           f"{name} per split": dist, f"{name} mean ± sd": _pm(s.threshold_mean, s.threshold_sd),
           "Coverage mean ± sd": _pm(s.coverage_mean, s.coverage_sd),
           "Avg |S| mean ± sd": _pm(s.set_size_mean, s.set_size_sd),
           "Reliability mean ± sd": _pm(s.reliability_mean, s.reliability_sd)}
    return Table("certify_stability", f"Split stability (Table 4 shape): {r.run_dir}", list(row), [row],
                 caption=f"{name} mean ± sd over the splits with a finite threshold ({s.infinite_splits} infinite).")


def _pm(mean: float | None, sd: float | None) -> str:
    if mean is None:
        return "—"
    return f"{mean:.3f} ± {sd:.3f}" if sd is not None else f"{mean:.3f}"


def sequential_table(r: CertifyResult) -> Table | None:
    if not r.sequential:
        return None
    name = _threshold_name(r)
    rows = [{"Rule": s.rule, "δ": f"{s.delta:g}", "Avg K used": _ci(s.avg_samples, 2),
             "Samples used / recorded": f"{s.samples_used} / {s.samples_recorded}", "Savings": f"{s.savings:.1%}",
             "Items stopped": s.items_stopped, name: _threshold(s.threshold), "Reliability": s.reliability_level,
             "Seq. coverage": _ci(s.coverage), "Seq. avg |S|": _ci(s.set_size, 2)} for s in r.sequential]
    caption = ("Each rule replayed on the recorded samples in sample order (Table 6 shape): an item uses its "
               "samples up to the rule's stopping time, or all of them; the certificate is recomputed from those.")
    if r.run_stopping is not None:
        rs = r.run_stopping
        caption += (f" The run itself stopped with the {rs.rule} rule at δ={rs.delta}: {rs.samples_skipped} of "
                    f"{rs.samples_planned} planned samples skipped ({rs.tasks_stopped} tasks certified early).")
    return Table("certify_sequential", f"Sequential stopping: {r.run_dir}", list(rows[0]), rows, caption=caption)


def tables(results: list[CertifyResult]) -> list[Table]:
    out = [summary_table(results)]
    for r in results:
        out.append(alpha_table(r))
        out += [t for t in (stability_table(r), sequential_table(r)) if t is not None]
    return out


def header_lines(results: list[CertifyResult]) -> list[str]:
    lines = []
    for r in results:
        c = r.counts
        lines.append(f"{r.run_dir}  domain={r.domain}  model={r.model}  items={c.items}  samples={c.samples} "
                     f"({c.samples_min}–{c.samples_max} per item)  no-answer samples={c.no_answer_samples}  "
                     f"acceptability={r.settings.acceptability}  score={r.settings.score}  seed={r.settings.seed}")
    return lines


def certify_output(results: list[CertifyResult]):
    """The certificate for :func:`uqh.reports.render.emit` (json: the :class:`CertifyResult` dump, a list for
    several runs; csv: :func:`csv_records`)."""
    from pydantic import TypeAdapter

    from uqh.reports.render import Output

    json_text = (results[0].model_dump_json(indent=2) if len(results) == 1
                 else TypeAdapter(list[CertifyResult]).dump_json(results, indent=2).decode())
    records = [rec for r in results for rec in csv_records(r)]
    return Output(tables=tables(results), json_text=json_text, header=header_lines(results),
                  notes=[f"{r.run_dir}: {n}" for r in results for n in r.notes],
                  csv_table=Table("certify_long", "long format", list(CSV_FIELDS), records), prog="uqh certify")


CSV_FIELDS = ("run_dir", "table", "alpha", "rule", "metric", "value", "ci_low", "ci_high", "successes", "n")


def _rec(run: str, table: str, metric: str, x: Any, alpha: float | None = None, rule: str = "") -> dict:
    rec = {"run_dir": run, "table": table, "alpha": alpha, "rule": rule, "metric": metric, "value": None,
           "ci_low": None, "ci_high": None, "successes": None, "n": None}
    if isinstance(x, Proportion):
        rec.update(value=x.value, ci_low=x.ci_low, ci_high=x.ci_high, successes=x.successes, n=x.n)
    elif isinstance(x, Estimate):
        rec.update(value=x.value, ci_low=x.ci_low, ci_high=x.ci_high)
    else:
        rec["value"] = x
    return rec


def csv_records(r: CertifyResult) -> list[dict]:
    """Long format: one record per (table, α or rule, metric); thresholds as numbers or ``inf``."""
    run = r.run_dir
    out = [_rec(run, "summary", "reliability_level", r.reliability_level),
           _rec(run, "summary", "reliability_count", r.reliability_count),
           _rec(run, "summary", "n_cal", r.n_cal), _rec(run, "summary", "n_test", r.n_test),
           _rec(run, "summary", "mode_accuracy", r.mode_accuracy),
           _rec(run, "summary", "single_sample_accuracy", r.single_sample_accuracy),
           _rec(run, "summary", "sample_accuracy", r.sample_accuracy),
           _rec(run, "summary", "solvable_fraction", r.solvable_fraction)]
    for table, rows in (("main", [r.main]), ("alpha_sweep", r.alpha_sweep)):
        for row in rows:
            for metric, x in (("k", row.k), ("threshold", row.threshold), ("mode_suffices", row.mode_suffices),
                              ("coverage", row.coverage), ("set_size", row.set_size),
                              ("conditional_coverage", row.conditional_coverage)):
                out.append(_rec(run, table, metric, x, alpha=row.alpha))
    if r.stability is not None:
        s = r.stability
        for metric in ("threshold_mean", "threshold_sd", "infinite_splits", "coverage_mean", "coverage_sd",
                       "set_size_mean", "set_size_sd", "reliability_mean", "reliability_sd"):
            out.append(_rec(run, "stability", metric, getattr(s, metric), alpha=s.alpha))
    for s in r.sequential:
        for metric, x in (("avg_samples", s.avg_samples), ("samples_used", s.samples_used),
                          ("samples_recorded", s.samples_recorded), ("savings", s.savings),
                          ("items_stopped", s.items_stopped), ("threshold", s.threshold),
                          ("reliability_level", s.reliability_level), ("coverage", s.coverage),
                          ("set_size", s.set_size)):
            out.append(_rec(run, "sequential", metric, x, alpha=r.settings.alpha, rule=s.rule))
    return out
