"""Report tables of the censoring and sensitivity analyses: score family × weight schedule (Appendix I),
artificial censoring (Table 10), complete-only vs censored extension (Fig. 2A), exact vs simple censored score
(Tables 8–9) and parse-error sensitivity (Appendix G.2).

Arranges the typed rows :mod:`uqh.reports.scoring_calls` collected; computes nothing. Every censored table names the
label convention the base rate and Platt were trained on (``Labels`` column, :mod:`uqh.scoring.labels`).
"""
from __future__ import annotations

from uqh.reports.scoring_calls import PRIMARY_WEIGHTS, ScoredRun
from uqh.reports.tables import Table
from uqh.scoring.labels import LABEL_CONVENTIONS
from uqh.scoring.registry import DELTA_PRACTICE, TPS, TPS_COMPLETE_ONLY, predictor_label, row_label

#: caption sentence naming the label conventions that can appear in a ``Labels`` column
LABELS_NOTE = ("Labels: what the base rate and Platt were trained on -- "
               + "; ".join(f"{c.name} = {c.description}" for c in LABEL_CONVENTIONS.values()) + ".")


def sensitivity_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Predictor", "Score", "Weight schedule", "Censoring", "Labels", "TPS", "TPS CI low", "TPS CI high",
            "TPS complete-only", "Δ_practice", "Δ CI low", "Δ CI high", "n"]
    rows = []
    for sr in scored:
        for scheme, res in sr.results.by_weights.items():
            for r in res.rows:
                for s in res.settings.scores:
                    t, d = r.estimate(TPS, s), r.estimate(DELTA_PRACTICE, s)
                    rows.append({
                        "Run": sr.label, "Predictor": r.display_label, "Score": s, "Weight schedule": scheme,
                        "Censoring": res.settings.censoring, "Labels": res.settings.label_convention,
                        "TPS": t.value, "TPS CI low": t.ci_low, "TPS CI high": t.ci_high,
                        "TPS complete-only": r.value(TPS_COMPLETE_ONLY, s),
                        "Δ_practice": d.value, "Δ CI low": d.ci_low, "Δ CI high": d.ci_high, "n": r.n_used,
                    })
    return Table(
        name="sensitivity",
        title="Score-family × weight-schedule sensitivity (Appendix I)",
        columns=cols,
        rows=rows,
        caption="Each weight schedule refits the Platt maps with matching weights (Appendix D). Runs with "
        "administratively censored trajectories are scored with the simple censored extension (q_Z ≈ 0) and report "
        "Δ_practice = TPS_cen-ext − TPS_complete-only (Table 11 shape); runs without use the complete sample. "
        + LABELS_NOTE,
    )


def by_score_family(table: Table) -> list[Table]:
    """``table`` (with ``Score``, ``Run``, ``Predictor`` and ``n`` columns) as one table per score family, in the
    order the families appear: the page shows these (Tables 11-12 print one family per block) while the full table
    stays one CSV file. Rows with n = 0 (a predictor the run does not have, or no trajectory to score) are left out
    of the family tables, and their caption names them."""
    families = list(dict.fromkeys(r["Score"] for r in table.rows))
    out = []
    for f in families:
        rows = [{k: v for k, v in r.items() if k != "Score"} for r in table.rows if r["Score"] == f]
        kept = [r for r in rows if r["n"]]
        out.append(Table(name=f"{table.name}__{family_slug(f)}", title=f"{table.title} — score family {f}",
                         columns=[c for c in table.columns if c != "Score"], rows=kept,
                         caption=table.caption + left_out_text([r for r in rows if not r["n"]], kept),
                         empty_note="Every row has n = 0: no predictor has a value on these runs' samples."))
    return out


def left_out_text(removed: list[dict], kept: list[dict]) -> str:
    """The caption sentence naming the predictors left out for n = 0, per run ("every predictor" when a run has no
    row left)."""
    if not removed:
        return ""
    parts = []
    for run in dict.fromkeys(r["Run"] for r in removed):
        if not any(r["Run"] == run for r in kept):
            parts.append(f"{run}: every predictor (no trajectory to score)")
        else:
            names = dict.fromkeys(r["Predictor"] for r in removed if r["Run"] == run)
            parts.append(f"{run}: {', '.join(names)}")
    return " Left out, n = 0 (no value on the sample): " + "; ".join(parts) + "."


def family_slug(score: str) -> str:
    """A score family as part of a file name: ``beta:2,4`` -> ``beta_2_4``."""
    return "".join(c if c.isalnum() else "_" for c in score).strip("_")


def censored_shift_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Predictor", "Score", "Labels", "n complete", "n censored", "Censoring rate", "TPS complete-only",
            "TPS cen-ext", "Δ_practice", "Δ CI low", "Δ CI high", "Δ/SE", "Δ / censoring rate"]
    rows = []
    for sr in scored:
        labels = sr.results.by_weights[PRIMARY_WEIGHTS].settings.label_convention
        for r in sr.results.censored_shift:
            rows.append({
                "Run": sr.label, "Predictor": row_label(r.predictor, r.calibration), "Score": r.score, "Labels": labels,
                "n complete": r.n_complete, "n censored": r.n_censored, "Censoring rate": r.censoring_rate,
                "TPS complete-only": r.tps_complete_only.value, "TPS cen-ext": r.tps_censored.value,
                "Δ_practice": r.delta_practice.value, "Δ CI low": r.delta_practice.ci_low,
                "Δ CI high": r.delta_practice.ci_high, "Δ/SE": r.delta_over_se,
                "Δ / censoring rate": r.delta_per_censoring_rate,
            })
    return Table(
        name="censored_shift",
        empty_note="No run has administratively censored (max_steps) trajectories.",
        title="Complete-only vs censored extension (Fig. 2A, §6.3)",
        columns=cols,
        rows=rows,
        caption="Linear-front weights. TPS_cen-ext adds the max_steps prefixes under TPS^cen,simple (q_Z ≈ 0); "
        "parse errors excluded (informative). Δ_practice CI: paired bootstrap over the working sample. " + LABELS_NOTE,
    )


def exact_censoring_table(scored: list[ScoredRun]) -> Table:
    """Table 8/9 shape: the exact q_Z-weighted censored score next to the simple one (linear-front weights)."""
    cols = ["Run", "Predictor", "Score", "Labels (exact)", "n complete", "n censored", "TPS cen-simple",
            "TPS cen-exact", "TPS cen-exact CI low", "TPS cen-exact CI high", "Exact − simple", "TPS complete-only"]
    rows = []
    for sr in scored:
        labels = sr.results.exact.settings.label_convention if sr.results.exact is not None else None
        for r in sr.results.exact_vs_simple:
            rows.append({
                "Run": sr.label, "Predictor": row_label(r.predictor, r.calibration), "Score": r.score,
                "Labels (exact)": labels, "n complete": r.n_complete, "n censored": r.n_censored,
                "TPS cen-simple": r.tps_simple,
                "TPS cen-exact": r.tps_exact.value, "TPS cen-exact CI low": r.tps_exact.ci_low,
                "TPS cen-exact CI high": r.tps_exact.ci_high, "Exact − simple": r.exact_minus_simple,
                "TPS complete-only": r.tps_complete_only,
            })
    missing = [f"{sr.label}: {sr.results.exact_missing} censored episode(s) without q_hat_z"
               for sr in scored if sr.results.exact_missing]
    return Table(
        name="censored_exact",
        title="Exact vs simple censored score (§4.3, Tables 8–9 shape)",
        columns=cols,
        rows=rows,
        caption="TPS^cen,exact weights each censored prefix's success and failure branches by q_hat_Z from "
        "`uqh continue` (Eq. 4); TPS^cen,simple takes q_Z ≈ 0 (Eq. 5). Linear-front weights; Platt refit per sample "
        "(the simple column with ΔY labels; with every q_hat_Z = 0 the two columns are equal). " + LABELS_NOTE
        + (" Not scored (missing q_Z): " + "; ".join(missing) + "." if missing else ""),
        empty_note=("Give --q-z FILE (written by `uqh continue`) to add the exact censored score."
                    if not missing else "No run has a q_hat_z for every censored episode: " + "; ".join(missing) + "."),
    )


def parse_error_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Predictor", "Score", "Labels", "n working", "n with parse errors", "parse errors as censored",
            "TPS working sample", "TPS incl. parse errors", "Difference"]
    rows = []
    for sr in scored:
        pe = sr.results.parse_error_scores
        labels = pe[-1].settings.label_convention if pe else None
        for r in sr.results.parse_error_sensitivity:
            rows.append({
                "Run": sr.label, "Predictor": row_label(r.predictor, r.calibration), "Score": r.score, "Labels": labels,
                "n working": r.n_working, "n with parse errors": r.n_with_parse_errors,
                "parse errors as censored": r.parse_errors_as_censored, "TPS working sample": r.tps_working,
                "TPS incl. parse errors": r.tps_with_parse_errors, "Difference": r.difference,
            })
    return Table(
        name="parse_error_sensitivity",
        empty_note="No run has parse-error trajectories.",
        title="Parse-error sensitivity (Appendix G.2)",
        columns=cols,
        rows=rows,
        caption="Contra-assumption check: parse-error trajectories treated as administratively censored at the "
        "failing step (simple censored score, linear-front weights) vs the assumption-disciplined working sample. "
        + LABELS_NOTE,
    )


def artificial_censoring_table(scored: list[ScoredRun]) -> Table:
    """Table 10 shape: complete-data TPS and the mean shift under TPS^cen,simple at artificial censoring rates."""
    cols = ["Run", "Predictor", "Rate r", "Score", "Weight schedule", "n", "n censored", "TPS complete", "Δ_mean",
            "Δ_Y=0", "Δ_Y=1", "Mean prefix-swap", "Mean tail-omission", "Max abs decomposition error"]
    rows = []
    for sr in scored:
        for r in sr.results.artificial_censoring:
            label = (f"{predictor_label(r.predictor)} (raw; Platt unavailable)" if r.note
                     else row_label(r.predictor, r.calibration))
            rows.append({
                "Run": sr.label, "Predictor": label, "Rate r": r.rate, "Score": r.score, "Weight schedule": r.weights,
                "n": r.n, "n censored": r.n_censored, "TPS complete": r.tps_complete, "Δ_mean": r.delta_mean,
                "Δ_Y=0": r.delta_y0, "Δ_Y=1": r.delta_y1, "Mean prefix-swap": r.prefix_swap_mean,
                "Mean tail-omission": r.tail_omission_mean, "Max abs decomposition error": r.max_abs_decomposition_error,
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


def sign_regime_table(scored: list[ScoredRun]) -> Table:
    """Table 13 shape: per predictor row, F̄ next to the sign of Δ_practice under each weight schedule."""
    schemes = list(dict.fromkeys(k for sr in scored for r in sr.results.sign_regime for k in r.signs))
    cols = ["Run", "Predictor", "F̄", *schemes, "Δ > 0 cells", "Δ < 0 cells", "cells"]
    rows = []
    for sr in scored:
        for r in sr.results.sign_regime:
            rows.append({"Run": sr.label, "Predictor": row_label(r.predictor, r.calibration), "F̄": r.mean_forecast,
                         **{k: r.signs.get(k) for k in schemes}, "Δ > 0 cells": r.n_positive,
                         "Δ < 0 cells": r.n_negative, "cells": r.n_cells})
    return Table(
        name="sign_regime",
        empty_note="No run has administratively censored (max_steps) trajectories: no Δ_practice to sign.",
        title="Sign regime of Δ_practice (Appendix I.2, Table 13 shape)",
        columns=cols,
        rows=rows,
        caption="Per weight schedule, the sign of Δ_practice = TPS_cen-ext − TPS_complete-only over every score "
        "family: + (all positive), - (all negative), mixed. F̄: mean per-step forecast of the stream over the "
        "censored-extension sample (every observed step pooled; Platt: the linear-front cross-fitted stream). "
        "The paper's rows are the Platt rows; raw rows are added. " + LABELS_NOTE,
    )


def base_rate_margin_table(scored: list[ScoredRun]) -> Table:
    """Table 14 shape: each predictor row's log-score margin over the base rate, complete-only vs censored."""
    cols = ["Run", "Predictor", "Weight schedule", "Score", "TPS_comp − TPS_base", "TPS_cen-ext − TPS_base",
            "Shrinkage % (− = toward 0)", "Rank change?"]
    rows = []
    for sr in scored:
        for r in sr.results.base_rate_margin:
            rows.append({"Run": sr.label, "Predictor": row_label(r.predictor, r.calibration),
                         "Weight schedule": r.weights, "Score": r.score, "TPS_comp − TPS_base": r.margin_complete_only,
                         "TPS_cen-ext − TPS_base": r.margin_censored, "Shrinkage % (− = toward 0)": r.shrinkage_percent,
                         "Rank change?": None if r.rank_flip is None else ("Yes" if r.rank_flip else "No")})
    return Table(
        name="base_rate_margin",
        empty_note="No run has administratively censored (max_steps) trajectories: no censored margin.",
        title="Margin over the base-rate reference (Appendix I.2, Table 14 shape)",
        columns=cols,
        rows=rows,
        caption="Log score. Margin = TPS_predictor − TPS_base-rate on the same sample, complete-only and with the "
        "simple censored extension (a margin within rounding noise of 0 is 0). Shrinkage % = 100 (|m_cen| − |m_comp|) "
        "/ |m_comp|: negative = the margin shrinks toward 0 with the censored extension, positive = it grows, on "
        "either side of the base rate (the paper's +0.0123 → +0.0086 is −30%). A rank change is a change of sign "
        "of the margin (the paper's \"rank flip\"); its shrinkage is left empty. " + LABELS_NOTE,
    )
