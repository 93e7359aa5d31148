"""The continuation audit as tables and text (``uqh continue``).

Numbers come from :func:`uqh.scoring.qz.run_estimate.estimate_qz`; this module only arranges them (tables in the shape of
the paper's Tables 7 and 8, for :mod:`uqh.reports.render`, and the text of ``audit.md``). :func:`audit_continuation`
is the whole step of ``uqh continue`` after its branches: estimate, arrange, and write the files
(:func:`uqh.rundir.qz_file.write_continuation_audit`).
"""
from __future__ import annotations

import math
from pathlib import Path

from uqh.reports.render import Output, markdown_text
from uqh.reports.tables import Table
from uqh.rundir.qz_file import write_continuation_audit
from uqh.rundir.reader import RunDir
from uqh.scoring.qz.run_estimate import QzEstimate, estimate_qz


def _f(x, p: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{p}f}"


def _n(x: int) -> str:
    return f"{x:,}"


def counts_line(audit) -> str:
    c = audit.counts
    return (f"Prefixes: {c.prefixes_with_branches} continued, {c.retained} retained (>= {c.min_valid} valid resolved "
            f"non-parse branches); mean valid branches per retained prefix {_f(c.mean_valid, 2)}; mean parse-error "
            f"branches per prefix {_f(c.mean_parse, 3)}; unresolved branches {c.unresolved}; skipped (not "
            f"replayable) {c.skipped}.")


def _ci_cells(ci) -> dict:
    lo, hi = (ci or (None, None))
    return {"CI low": lo, "CI high": hi}


def audit_tables(audit) -> list[Table]:
    """The tables of the audit: run cost (with a stop rule's figures), the q_hat_Z^MC distribution (Table 7
    shape), simple vs exact (Table 8 shape), and the sensitivity to unresolved branches. Cells hold numbers (CSV
    keeps them at full precision; the terminal and Markdown round them)."""
    d = audit.distribution
    tables = []
    if audit.cost is not None:
        tables.append(cost_table(audit.cost, d))
    tables.append(Table("qz_distribution", f"q_hat_Z^MC over retained prefixes (Table 7 shape; n = {d.n})",
                        ["Diagnostic", "Value", "CI low", "CI high"], [
                            {"Diagnostic": "Mean q_hat_Z^MC", "Value": d.mean, **_ci_cells(d.ci)},
                            {"Diagnostic": "Median q_hat_Z^MC", "Value": d.median},
                            {"Diagnostic": "Fraction with q_hat_Z^MC = 0", "Value": d.frac_zero},
                            {"Diagnostic": "Fraction with q_hat_Z^MC > 0.5", "Value": d.frac_above_half},
                        ], empty_note="No prefix retained.", caption="CI: 95% bootstrap interval over prefixes."))
    cmp = audit.comparison
    if cmp is not None:
        tables.append(Table("qz_scores", f"Simple vs exact censored score on retained prefixes (Table 8 shape; "
                            f"n = {cmp.n})", ["Quantity", "Value", "CI low", "CI high"], [
                                {"Quantity": "TPS^cen,simple", "Value": cmp.simple.mean, **_ci_cells(cmp.simple.ci)},
                                {"Quantity": "TPS^cen,exact-MC", "Value": cmp.exact.mean, **_ci_cells(cmp.exact.ci)},
                                {"Quantity": "Delta exact-simple", "Value": cmp.difference.mean,
                                 **_ci_cells(cmp.difference.ci)},
                            ], caption="CI: 95% paired bootstrap interval over prefixes."))
    if audit.sensitivity:
        tables.append(Table("qz_sensitivity", "Unresolved branches: sensitivity",
                            ["Unresolved branches", "mean q_hat_Z", "Delta exact-simple", "CI low", "CI high"],
                            [{"Unresolved branches": name, "mean q_hat_Z": row.mean_q,
                              "Delta exact-simple": row.difference.mean, **_ci_cells(row.difference.ci)}
                             for name, row in audit.sensitivity.items()]))
    return tables


def cost_table(cost, distribution) -> Table:
    """The run's branches, calls, prompt tokens (cached / uncached) and cost next to mean q_hat_Z^MC and its CI;
    numbers in the cells, None where a provider reported nothing (the caption says which)."""
    d = distribution
    notes = []
    if cost.stop_rule != "fixed":
        note = (f"{cost.stopped_half_width} prefixes stopped at the half-width, {cost.stopped_max_branches} at "
                f"--branches {cost.max_branches}")
        notes.append(note + (f", {cost.open} open (a branch failed: re-run to resume)" if cost.open else ""))
    if cost.calls_reporting_cache and cost.calls_reporting_cache < cost.calls:
        notes.append(f"{cost.calls - cost.calls_reporting_cache} calls did not report cached tokens")
    elif not cost.calls_reporting_cache:
        notes.append("no call reported cached tokens")
    if cost.unpriced_calls:
        notes.append(f"{cost.unpriced_calls} unpriced calls" + (" (every call)" if cost.unpriced_calls == cost.calls
                                                                 else ", not in the cost"))
    if cost.cache_write_prompt_tokens:
        notes.append(f"{_n(cost.cache_write_prompt_tokens)} uncached prompt tokens were written to the cache")
    if cost.decision_mismatch:
        notes.append(f"WARNING: {cost.decision_mismatch} recorded stop decisions disagree with the branches found")
    row = {"Stop rule": cost.stop_rule, "Branches run": cost.branches, "Branches max": cost.branches_max or None,
           "Model calls": cost.calls,
           "Prompt tokens cached": cost.cached_prompt_tokens if cost.calls_reporting_cache else None,
           "Prompt tokens uncached": cost.uncached_prompt_tokens if cost.calls_reporting_cache else cost.prompt_tokens,
           "Completion tokens": cost.completion_tokens,
           "Cost (USD)": None if cost.unpriced_calls == cost.calls else cost.cost_usd,
           "Mean q_hat_Z^MC": d.mean, **_ci_cells(d.ci)}
    return Table("qz_cost", "Branches, calls and cost", list(row), [row],
                 caption=f"({'; '.join(notes)}.)" if notes else "")


def audit_notes(audit) -> list[str]:
    c, s = audit.counts, audit.settings
    notes = [f"scores: {s.rule} rule, {s.weights} weights, predictor {s.predictor}; {c.scored} retained prefixes "
             f"scored, {c.missing_confidence} left out (missing confidence)",
             f"q_Z file: {c.records} records ({c.records_mc} mc, {c.records_plugin} plug-in); {c.without_estimate} "
             "censored prefixes without an estimate"]
    if audit.identity_max_error is not None:
        notes.append("conditional-projection identity: max_i |TPS_exact-MC - branch average| = "
                     f"{audit.identity_max_error:.3g}")
    if c.join_mismatch_branches:
        notes.append(f"WARNING: {c.join_mismatch_branches} branches whose prefix differs from the source were ignored")
    if s.plugin_note:
        notes.append(s.plugin_note)
    return notes


def audit_output(audit) -> Output:
    """The audit for :func:`uqh.reports.render.emit` (json: the :class:`uqh.scoring.qz.run_estimate.ContinuationAudit` dump)."""
    return Output(tables=audit_tables(audit), json_text=audit.model_dump_json(indent=2),
                  header=[counts_line(audit), *audit_notes(audit)], prog="uqh continue")


def audit_text(audit) -> str:
    """The whole audit in Markdown, as written to ``audit.md``."""
    return markdown_text(audit_output(audit))


def audit_continuation(cont_dir: Path | str, *, write: bool = True, min_valid: int = 5, method: str = "hybrid",
                       rule: str = "log", weights: str = "linear-front", n_boot: int = 1000,
                       train_complete: bool = False) -> tuple[QzEstimate, str]:
    """q_Z and the audit of a continuation run (:func:`uqh.scoring.qz.run_estimate.estimate_qz`, options as
    there), its files (``qz.jsonl``, ``audit.json``, ``audit.md``) written unless ``write=False``. Returns
    (estimate, the audit's Markdown text)."""
    estimate = estimate_qz(RunDir.open(cont_dir), min_valid=min_valid, method=method, rule=rule, weights=weights,
                           n_boot=n_boot, train_complete=train_complete)
    text = audit_text(estimate.audit)
    if write:
        write_continuation_audit(Path(cont_dir), estimate.records, estimate.audit.model_dump_json(indent=2), text)
    return estimate, text
