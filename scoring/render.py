"""`uqh score` output: the rich tables (Table 2 / Δ-SE / Table 5 / Appendix D / Appendix E shapes) and the
long-format CSV records, both derived from :class:`scoring.results.RunScores`. Headers, labels and directions
come from :mod:`scoring.registry`."""
from __future__ import annotations

from scoring.registry import (
    BASE_RATE,
    CALIBRATION_LABELS,
    MetricKey,
    aggregator_label,
    diagnostic_metrics,
    predictor_label,
)
from scoring.results import HasMetrics, RunScores


def fmt_value(v: float | None, key: MetricKey | None = None) -> str:
    if v is None:
        return "—"
    small = key is not None and (key.score or "").startswith("beta")  # β-family scores are small numbers
    return f"{v:.5f}" if (small and abs(v) < 0.1) else f"{v:.3f}"


def _cells(row: HasMetrics, keys: list[MetricKey]) -> list[str]:
    return [fmt_value(row.value(k.metric, k.score), k) for k in keys]


def render_table(result: RunScores, console=None) -> None:
    """Print the result as rich tables to stdout."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=200)
    s, c = result.settings, result.counts
    excl = ", ".join(f"{k}={v}" for k, v in c.exclusions().items())
    console.print(
        f"[bold]{result.run_dir}[/bold]  domain={result.domain}  model={result.model}  "
        f"weights={s.weights}  censoring={s.censoring}  labels={s.label_convention}  "
        f"bootstrap={s.bootstrap} (seed {s.seed})"
    )
    labels = labels_line(result)
    console.print(
        f"episodes={c.episodes}  complete={c.complete}  censored={c.censored}"
        + (f"  parse_errors_as_censored={c.parse_errors_included_as_censored}" if s.include_parse_errors else "")
        + (f"  excluded: {excl}" if excl else "")
    )
    keys = result.metric_keys()
    t = Table(title="Per-step predictors (Table 2 shape; diagnostics on complete trajectories, failure-oriented)",
              caption=labels)
    for name in ("Predictor", "n", "skipped"):
        t.add_column(name)
    for k in keys:
        t.add_column(k.header, justify="right")
    for row in result.rows:
        t.add_row(row.display_label, str(row.n_used), str(row.n_skipped_missing), *_cells(row, keys))
    console.print(t)
    for row in result.rows:
        if row.note:
            console.print(f"note: {row.display_label}: {row.note}")
    platt_rows = [r for r in result.rows if any(m.vs_raw is not None for m in r.metrics)]
    if platt_rows:
        t2 = Table(title="Raw → Platt: Δ (Δ/SE, paired bootstrap)", caption=labels)
        t2.add_column("Predictor")
        compared = [k for k in keys if any((m := r.get(k.metric, k.score)) and m.vs_raw for r in platt_rows)]
        for k in compared:
            t2.add_column(k.header, justify="right")
        for r in platt_rows:
            cells = [r.label]
            for k in compared:
                m = r.get(k.metric, k.score)
                d = m.vs_raw if m is not None else None
                if d is None or d.delta is None:
                    cells.append("—")
                else:
                    z = d.delta_over_se
                    cells.append(f"{d.delta:+.3g} ({'—' if z is None else f'{z:.1f}'})")
            t2.add_row(*cells)
        console.print(t2)
    if result.auq:
        diag_keys = [MetricKey(m.name) for m in diagnostic_metrics()]
        t3 = Table(title="Scalar AUQ aggregators (Table 5 shape; no TPS)", caption=labels)
        t3.add_column("Scalar predictor")
        t3.add_column("n")
        for k in diag_keys:
            t3.add_column(k.header, justify="right")
        for r in result.auq:
            name = f"{r.label} {aggregator_label(r.aggregator)} {CALIBRATION_LABELS[r.calibration]}"
            t3.add_row(name, str(r.n), *_cells(r, diag_keys))
        console.print(t3)
    for d in result.calibration:
        a, b = d.split_a, d.split_b
        rng = f", calibrated range [{d.calibrated_min:.3f}, {d.calibrated_max:.3f}]" if d.calibrated_min is not None else ""
        console.print(
            f"Platt {predictor_label(d.predictor)}: slope A {a.b_fitted:.4f}{' (fallback)' if a.fallback else ''}, "
            f"slope B {b.b_fitted:.4f}{' (fallback)' if b.fallback else ''}{rng}; trained on {s.label_convention}"
        )
    for pred in dict.fromkeys(r.predictor for r in result.fixed_rank):
        rows = [r for r in result.fixed_rank if r.predictor == pred]
        fr_keys = [m.key for m in rows[0].metrics]
        t4 = Table(title=f"Fixed-rank analysis (Appendix E): {predictor_label(pred)}", caption=labels)
        t4.add_column("Transform")
        for k in fr_keys:
            t4.add_column(k.header, justify="right")
        for r in rows:
            t4.add_row(r.transform, *_cells(r, fr_keys))
        console.print(t4)


def labels_line(result: RunScores) -> str:
    """The label convention of the base rate and Platt, printed with every table."""
    s = result.settings
    base = result.row(BASE_RATE, "raw")
    value = f"; base rate = {base.label_mean:.4f}" if base is not None and base.label_mean is not None else ""
    return f"base rate and Platt trained on labels={s.label_convention}: {s.label_description}{value}"


CSV_FIELDS = ("run_dir", "table", "predictor", "calibration", "aggregator", "metric", "score", "value", "ci_low",
              "ci_high", "se", "n_used", "n_complete", "n_censored", "n_skipped_missing", "censoring",
              "label_convention")


def csv_records(result: RunScores) -> list[dict]:
    """Long-format records: one per (row, metric); ``metric`` is the registry name, ``score`` the score family;
    every record carries the censoring mode and the label convention the numbers were computed under."""
    settings = {"censoring": result.settings.censoring, "label_convention": result.settings.label_convention}
    recs = []
    for row in result.rows:
        for m in row.metrics:
            e = m.estimate
            recs.append({"run_dir": result.run_dir, "table": "predictors", "predictor": row.predictor,
                         "calibration": row.calibration, "aggregator": "", "metric": m.metric, "score": m.score or "",
                         "value": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high, "se": e.se,
                         "n_used": row.n_used, "n_complete": row.n_complete, "n_censored": row.n_censored,
                         "n_skipped_missing": row.n_skipped_missing, **settings})
    for row in result.auq:
        for m in row.metrics:
            e = m.estimate
            recs.append({"run_dir": result.run_dir, "table": "auq", "predictor": row.predictor,
                         "calibration": row.calibration, "aggregator": row.aggregator, "metric": m.metric,
                         "score": m.score or "", "value": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high,
                         "se": e.se, "n_used": row.n, "n_complete": row.n, "n_censored": 0, "n_skipped_missing": "",
                         **settings})
    return recs
