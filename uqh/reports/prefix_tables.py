"""Report tables of the "Censored prefixes: exact vs simple" section (Appendix H.2): the q̂_Z distribution
(Table 7), the primary comparison (Table 8), every predictor row (Table 9), the unresolved-branch sensitivity and
the plug-in bias diagnostic (Remarks C.4/C.5), all over the retained prefixes of each ``--continuations`` run.

Arranges the typed :class:`uqh.scoring.qz.prefixes.CensoredPrefixAudit` results :mod:`uqh.reports.scoring_calls`
collected; computes nothing.
"""
from __future__ import annotations

from uqh.reports.scoring_calls import ScoredRun
from uqh.reports.tables import Table
from uqh.scoring.qz.prefixes import PRIMARY, CensoredPrefixAudit, PrefixCounts
from uqh.scoring.registry import row_label

EMPTY = "Give --continuations CONT_DIR (written by `uqh continue`) to compare the exact and simple censored scores."
POPULATION = ("Over the retained prefixes: continued prefixes with at least min_valid resolved non-parse branches "
              "(the paper's 87 of 100 sampled); the counts of the others are in the q̂_Z table and the notes.")


def _audits(scored: list[ScoredRun]):
    for sr in scored:
        for audit in sr.results.censored_prefixes:
            yield sr, audit


def selection_text(counts: PrefixCounts) -> str:
    sel = counts.selection
    if sel and sel.get("method") == "random":
        return f"random sample of {sel.get('n')} (seed {sel.get('seed')}, from {sel.get('population')})"
    return "first N / listed ids"


def branches_text(counts: PrefixCounts) -> str:
    """``4 of 20 branches`` (written of asked for; the maximum under a sequential rule)."""
    of = "at most " if counts.stop_rule != "fixed" else ""
    return f"{counts.branches_written} of {of}{counts.branches_planned} branches"


def continued_text(counts: PrefixCounts) -> str:
    """The "Continued" cell: the prefixes with a branch, and for a partial continuation how far it got."""
    text = f"{counts.continued} of {counts.sampled - counts.skipped}"
    return f"{text} ({branches_text(counts)}: partial)" if counts.partial else text


def population_note(label: str, audit: CensoredPrefixAudit) -> str:
    """One sentence stating the population of a continuation's tables: retained of sampled, and the rest; for a
    partial continuation (fewer branches than asked for), how many were written."""
    c = audit.counts
    partial = (f" PARTIAL: the continuation has {branches_text(c)} (stopped or still running; re-run `uqh continue` "
               "to finish it), so q̂_Z rests on fewer branches than planned." if c.partial else "")
    return (f"{label} ({audit.continuation_dir}): {c.censored_in_source} censored prefixes in the run; "
            f"{c.sampled} sampled ({selection_text(c)}); {c.skipped} skipped (not replayable); "
            f"{c.continued} continued ({branches_text(c)}); {c.retained} retained (>= {c.min_valid} resolved "
            f"branches) -- the tables are over these {c.retained}; {c.sampled - c.retained} sampled prefixes are "
            f"not scored.{partial}")


def no_retained_note(scored: list[ScoredRun]) -> str:
    """The empty tables' line when continuations were given: which ones, and that none retained a prefix."""
    where = "; ".join(f"{a.continuation_dir}: {a.counts.retained} of {a.counts.sampled} retained "
                      f"(>= {a.counts.min_valid} resolved branches needed, {branches_text(a.counts)})"
                      for _, a in _audits(scored))
    return f"No retained prefix to score ({where}). Run more branches, or lower --min-valid."


def qz_distribution_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Continuation", "Selection", "Censored in run", "Sampled", "Skipped", "Continued", "Branches",
            "Retained",
            "min valid", "Mean q̂_Z", "CI low", "CI high", "Median q̂_Z", "Fraction q̂_Z = 0", "Fraction q̂_Z > 0.5"]
    rows = []
    for sr, a in _audits(scored):
        c, d = a.counts, a.distribution
        rows.append({"Run": sr.label, "Continuation": a.continuation_dir, "Selection": selection_text(c),
                     "Censored in run": c.censored_in_source, "Sampled": c.sampled, "Skipped": c.skipped,
                     "Continued": continued_text(c), "Branches": branches_text(c), "Retained": c.retained, "min valid": c.min_valid, "Mean q̂_Z": d.mean,
                     "CI low": d.ci[0], "CI high": d.ci[1], "Median q̂_Z": d.median,
                     "Fraction q̂_Z = 0": d.frac_zero, "Fraction q̂_Z > 0.5": d.frac_above_half})
    return Table(name="prefix_qz_distribution", title="q̂_Z^MC on the retained prefixes (Appendix H.2, Table 7 shape)",
                 columns=cols, rows=rows, empty_note=EMPTY,
                 caption="Monte Carlo q̂_Z = mean outcome of the resolved non-parse branches of a prefix; CI: "
                 "percentile bootstrap over prefixes. " + POPULATION)


def primary_table(scored: list[ScoredRun]) -> Table:
    """Table 8: the primary stream (Platt verbal, linear-front) and its raw counterpart, one row per quantity."""
    cols = ["Run", "Predictor", "Weight schedule", "Quantity", "Value", "CI low", "CI high", "SE", "Δ/SE", "n",
            "Identity max error"]
    rows = []
    for sr, a in _audits(scored):
        for r in scored_rows(a):
            if (r.predictor, r.weights) != (PRIMARY[0], PRIMARY[2]):
                continue
            for name, m in (("TPS cen,simple", r.simple), ("TPS cen,exact-MC", r.exact),
                            ("Δ exact − simple", r.difference)):
                rows.append({"Run": sr.label, "Predictor": row_label(r.predictor, r.calibration),
                             "Weight schedule": r.weights, "Quantity": name, "Value": m.mean, "CI low": m.ci_low,
                             "CI high": m.ci_high, "SE": m.se, "Δ/SE": r.delta_over_se if m is r.difference else None,
                             "n": r.n, "Identity max error": r.identity_max_error})
    return Table(name="prefix_exact_primary", columns=cols, rows=rows, empty_note=EMPTY,
                 title="Exact-MC vs simple censored log score (Appendix H.2, Table 8 shape)",
                 caption="Primary: Platt cross-fitted verbal confidence, linear-front weights (the raw row follows). "
                 "Paired percentile bootstrap over prefixes. Identity: max_i |TPS_i^cen,exact-MC − mean over the "
                 "prefix's resolved branches of TPS(F_1:Z, Y^(m))|. " + POPULATION)


def predictors_table(scored: list[ScoredRun]) -> Table:
    """Table 9: every predictor row × raw/Platt × weight schedule."""
    cols = ["Run", "Predictor", "Weight schedule", "n", "n missing", "Simple", "Exact-MC", "Δ exact − simple",
            "Δ CI low", "Δ CI high", "Δ/SE", "Identity max error", "Eq. 17 max error", "Note"]
    rows = []
    for sr, a in _audits(scored):
        for r in scored_rows(a):
            rows.append({"Run": sr.label, "Predictor": row_label(r.predictor, r.calibration),
                         "Weight schedule": r.weights, "n": r.n, "n missing": r.n_missing, "Simple": r.simple.mean,
                         "Exact-MC": r.exact.mean, "Δ exact − simple": r.difference.mean,
                         "Δ CI low": r.difference.ci_low, "Δ CI high": r.difference.ci_high,
                         "Δ/SE": r.delta_over_se, "Identity max error": r.identity_max_error,
                         "Eq. 17 max error": r.eq17_max_error, "Note": r.note})
    return Table(name="prefix_exact_predictors", columns=cols, rows=rows, empty_note=EMPTY,
                 title="Predictor-level exact-q_Z audit (Appendix H.2, Table 9 shape)",
                 caption="Log score. The paper prints linear-front and uniform; exponential-front is added. Platt: "
                 "the run's cross-fitted stream on the simple censored-extension sample with the schedule's weights. "
                 "Eq. 17: max_i |Δ_i − q̂_Z Σ w log(F/(1 − F))|. n missing: retained prefixes lacking a value of "
                 "the stream (left out). " + POPULATION)


def sensitivity_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Predictor", "Weight schedule", "n", "Δ (unresolved excluded)", "Δ unresolved as failures",
            "CI low (failures)", "CI high (failures)", "Δ unresolved as successes", "CI low (successes)",
            "CI high (successes)"]
    rows = []
    for sr, a in _audits(scored):
        for r in scored_rows(a):
            f, s = r.unresolved_as_failure, r.unresolved_as_success
            rows.append({"Run": sr.label, "Predictor": row_label(r.predictor, r.calibration),
                         "Weight schedule": r.weights, "n": r.n, "Δ (unresolved excluded)": r.difference.mean,
                         "Δ unresolved as failures": f.mean, "CI low (failures)": f.ci_low,
                         "CI high (failures)": f.ci_high, "Δ unresolved as successes": s.mean,
                         "CI low (successes)": s.ci_low, "CI high (successes)": s.ci_high})
    return Table(name="prefix_unresolved_sensitivity", columns=cols, rows=rows, empty_note=EMPTY,
                 title="Unresolved-branch sensitivity (Appendix H.2, last paragraph)",
                 caption="Δ = TPS^cen,exact-MC − TPS^cen,simple with the budget-hit (unresolved) branches excluded "
                 "(primary), counted as failures, or as successes; retention is the same in all three. " + POPULATION)


def plugin_bias_table(scored: list[ScoredRun]) -> Table:
    cols = ["Run", "Continuation", "n", "Mean r = q̂_plugin − q̂_MC", "CI low", "CI high", "Mean |r|",
            "Exact-score shift (primary)", "Shift CI low", "Shift CI high", "Note"]
    rows = []
    for sr, a in _audits(scored):
        b = a.plugin_bias
        if b is None:
            continue
        rows.append({"Run": sr.label, "Continuation": a.continuation_dir, "n": b.n,
                     "Mean r = q̂_plugin − q̂_MC": b.mean_bias.mean, "CI low": b.mean_bias.ci_low,
                     "CI high": b.mean_bias.ci_high, "Mean |r|": b.mean_abs_bias,
                     "Exact-score shift (primary)": b.primary_score_shift.mean,
                     "Shift CI low": b.primary_score_shift.ci_low, "Shift CI high": b.primary_score_shift.ci_high,
                     "Note": b.note})
    return Table(name="prefix_plugin_bias", columns=cols, rows=rows, empty_note=EMPTY,
                 title="Plug-in bias diagnostic (Remarks C.4/C.5)",
                 caption="On the retained prefixes, where both exist: the cross-fitted (out-of-fold) plug-in q̂_Z "
                 "of the hybrid route against the Monte Carlo q̂_Z. r estimates C.5's conditional-mean bias of the "
                 "plug-in surrogate at the prefix level (the plug-in preserves propriety iff it is 0, C.4); the "
                 "shift is what using the plug-in instead of MC moves the primary stream's exact score by, "
                 "r Σ w (S(F,1) − S(F,0)).")


def scored_rows(audit: CensoredPrefixAudit):
    """The rows with at least one retained prefix scored (a stream the run does not have is left out; see
    :func:`absent_streams_note`)."""
    return [r for r in audit.rows if r.n > 0]


def absent_streams_note(label: str, audit: CensoredPrefixAudit) -> str | None:
    """The line naming the streams left out of Table 9 and the sensitivity table: no value on any retained
    prefix (the run does not record that predictor, or not on these prefixes). None when there are none."""
    if audit.counts.retained == 0:
        return None
    absent = list(dict.fromkeys(row_label(r.predictor, r.calibration) + (f" ({r.note})" if r.note else "")
                                for r in audit.rows if r.n == 0))
    if not absent:
        return None
    return (f"{label} ({audit.continuation_dir}): left out of the predictor tables, no value on any of the "
            f"{audit.counts.retained} retained prefixes: {', '.join(absent)}.")


def censored_prefix_tables(scored: list[ScoredRun]) -> tuple[list[Table], list[str]]:
    """The section's tables and its notes: one population note per continuation, then the streams left out.
    With continuations given, an empty table says why (no retained prefix, no plug-in), never how to give them."""
    audits = list(_audits(scored))
    retained = any(a.counts.retained for _, a in audits)
    notes = [population_note(sr.label, a) for sr, a in audits]
    notes += [no_retained_note(scored)] if audits and not retained else []
    notes += [n for sr, a in audits if (n := absent_streams_note(sr.label, a))]
    tables = [qz_distribution_table(scored), primary_table(scored), plugin_bias_table(scored),
              predictors_table(scored), sensitivity_table(scored)]
    if audits:
        for t in tables:
            if t.rows:
                continue
            t.empty_note = "No retained prefix to score: see the notes above." if not retained else (
                "No plug-in q̂_Z to compare on the retained prefixes (it could not be fitted)."
                if t.name == "prefix_plugin_bias" else "No stream has a value on the retained prefixes.")
    return tables, notes
