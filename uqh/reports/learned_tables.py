"""The learned and propagated trajectory calibrators (HTC, SAUP) next to verbal confidence and white-box signals,
and the HTC feature weights: arranged from the typed results of :func:`uqh.reports.scoring_calls.
learned_calibrator_scores` (nothing is computed here)."""
from __future__ import annotations

from uqh.reports.scoring_calls import ScoredRun
from uqh.reports.tables import Table
from uqh.scoring.registry import TPS, MetricKey

KEYS = [MetricKey("auroc"), MetricKey("t_ece"), MetricKey("t_brier"), MetricKey(TPS, "log"), MetricKey(TPS, "brier")]


def learned_scores_table(scored: list[ScoredRun]) -> Table:
    """One row per run × censoring convention × predictor stream."""
    cols = ["Run", "Censoring", "Predictor", "n", "skipped (missing)"] + [k.header for k in KEYS]
    rows = []
    for sr in scored:
        for mode, res in sr.results.learned.items():
            for r in res.rows:
                row = {"Run": sr.label, "Censoring": mode, "n": r.n_used, "skipped (missing)": r.n_skipped_missing,
                       "Predictor": r.display_label + (f" — {r.note}" if r.note else "")}
                row.update({k.header: r.value(k.metric, k.score) for k in KEYS})
                rows.append(row)
    return Table(
        name="learned_calibrators",
        title="Learned and propagated trajectory calibrators (HTC, SAUP) by TPS",
        columns=cols,
        rows=rows,
        caption="HTC: ridge-logistic on the prefix features, cross-fitted across trajectories as Platt is; SAUP: RMS "
                "of situation-weighted step NLLs, exp(−U) (raw: rank metrics only). Each under every censoring "
                "convention the run supports; TPS linear-front, diagnostics on complete trajectories.",
    )


def htc_weights_table(scored: list[ScoredRun]) -> Table:
    """The fitted weight of every standardised feature (split A, split B, mean), complete-observation sample."""
    cols = ["Run", "Feature", "Weight A", "Weight B", "Mean weight"]
    rows = []
    for sr in scored:
        res = sr.results.learned.get("exclude")
        for fit in res.learned if res is not None else []:
            means = fit.mean_weights()
            order = sorted(range(len(fit.features)), key=lambda j: -abs(means[j]))
            for j in order:
                rows.append({"Run": sr.label, "Feature": fit.features[j],
                             "Weight A": fit.models[0].weights[j],
                             "Weight B": fit.models[-1].weights[j] if len(fit.models) > 1 else None,
                             "Mean weight": means[j]})
    return Table(
        name="htc_weights",
        title="HTC feature weights (standardised features; largest first)",
        columns=cols,
        rows=rows,
        caption="Weights of the two cross-fitted ridge-logistic models on standardised features (comparable across "
                "features): positive raises the confidence. Features a run does not record are left out.",
        empty_note="No HTC model could be fitted (each half of the split needs trajectories of both outcomes).",
    )
