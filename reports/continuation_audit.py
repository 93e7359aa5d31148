"""The continuation audit as text, and its files in a continuation run directory (``uqh continue``).

Numbers come from :func:`scoring.qz_audit.estimate_qz`; this module only arranges them (Markdown tables in the
shape of the paper's Tables 7 and 8) and writes ``qz.jsonl``, ``audit.json`` and ``audit.md``.
"""
from __future__ import annotations

import math
from pathlib import Path

from rundir.atomic import atomic_write_text
from rundir.qz_file import write_qz_file
from rundir.reader import RunDir
from rundir.schema import AUDIT_JSON, AUDIT_MD, QZ_FILE


def _f(x, p: int = 3) -> str:
    return "NA" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{p}f}"


def _pct(x) -> str:
    return "NA" if x is None else f"{100 * x:.1f}%"


def audit_tables(audit) -> str:
    """Markdown tables in the shape of Tables 7 and 8 (plus counts, sensitivity rows and the identity check)."""
    lines = []
    c = audit.counts
    lines.append(
        f"Prefixes: {c.prefixes_with_branches} continued, {c.retained} retained (>= {c.min_valid} valid resolved "
        f"non-parse branches); mean valid branches per retained prefix {_f(c.mean_valid, 2)}; mean parse-error "
        f"branches per prefix {_f(c.mean_parse, 3)}; unresolved branches {c.unresolved}; skipped (not replayable) "
        f"{c.skipped}."
    )
    lines.append("")
    d = audit.distribution
    if audit.cost is not None:
        lines += cost_table(audit.cost, d) + [""]
    lines += [
        f"| Diagnostic (n = {d.n}) | Value |",
        "|---|---|",
        f"| Mean q_hat_Z^MC | {_f(d.mean)} [{_f(d.ci[0])}, {_f(d.ci[1])}] |",
        f"| Median q_hat_Z^MC | {_f(d.median)} |",
        f"| Fraction with q_hat_Z^MC = 0 | {_pct(d.frac_zero)} |",
        f"| Fraction with q_hat_Z^MC > 0.5 | {_pct(d.frac_above_half)} |",
    ]
    cmp = audit.comparison
    if cmp is not None:
        lines += [
            "",
            f"| Quantity (n = {cmp.n}) | Value | 95% CI |",
            "|---|---|---|",
            f"| TPS^cen,simple | {_f(cmp.simple.mean)} | [{_f(cmp.simple.ci[0])}, {_f(cmp.simple.ci[1])}] |",
            f"| TPS^cen,exact-MC | {_f(cmp.exact.mean)} | [{_f(cmp.exact.ci[0])}, {_f(cmp.exact.ci[1])}] |",
            f"| Delta exact-simple | {_f(cmp.difference.mean)} | "
            f"[{_f(cmp.difference.ci[0])}, {_f(cmp.difference.ci[1])}] |",
        ]
    if audit.sensitivity:
        lines += ["", "| Unresolved branches | mean q_hat_Z | Delta exact-simple | 95% CI |", "|---|---|---|---|"]
        for name, row in audit.sensitivity.items():
            dd = row.difference
            lines.append(f"| {name} | {_f(row.mean_q)} | {_f(dd.mean)} | [{_f(dd.ci[0])}, {_f(dd.ci[1])}] |")
    if audit.identity_max_error is not None:
        lines += ["", "Conditional-projection identity: max_i |TPS_exact-MC - branch average| = "
                  f"{audit.identity_max_error:.3g}"]
    return "\n".join(lines)


def _n(x: int) -> str:
    return f"{x:,}"


def cost_table(cost, distribution) -> list[str]:
    """The run's branches, calls, prompt tokens (cached / uncached) and cost next to mean q_hat_Z^MC and its CI."""
    branches = f"{_n(cost.branches)} of {_n(cost.branches_max)}" if cost.branches_max else _n(cost.branches)
    if cost.branches_max:
        branches += f" ({100 * cost.branches / cost.branches_max:.0f}%)"
    if cost.calls_reporting_cache:
        cached = f"{_n(cost.cached_prompt_tokens)} / {_n(cost.uncached_prompt_tokens)}"
        if cost.calls_reporting_cache < cost.calls:
            cached += f" ({cost.calls - cost.calls_reporting_cache} calls did not report)"
    else:
        cached = f"not reported / {_n(cost.prompt_tokens)}"
    if cost.unpriced_calls == cost.calls:
        price = "NA (unpriced)"
    else:
        price = f"{cost.cost_usd:.4f}" + (f" + {cost.unpriced_calls} unpriced calls" if cost.unpriced_calls else "")
    d = distribution
    rows = [
        "| Stop rule | Branches run (of max) | Model calls | Prompt tokens cached / uncached | Completion tokens | "
        "Cost (USD) | Mean q_hat_Z^MC [95% CI] |",
        "|---|---|---|---|---|---|---|",
        f"| {cost.stop_rule} | {branches} | {_n(cost.calls)} | {cached} | {_n(cost.completion_tokens)} | {price} | "
        f"{_f(d.mean)} [{_f(d.ci[0])}, {_f(d.ci[1])}] |",
    ]
    notes = []
    if cost.stop_rule != "fixed":
        note = (f"{cost.stopped_half_width} prefixes stopped at the half-width, {cost.stopped_max_branches} at "
                f"--branches {cost.max_branches}")
        notes.append(note + (f", {cost.open} open (a branch failed: re-run to resume)" if cost.open else ""))
    if cost.cache_write_prompt_tokens:
        notes.append(f"{_n(cost.cache_write_prompt_tokens)} uncached prompt tokens were written to the cache")
    if cost.decision_mismatch:
        notes.append(f"WARNING: {cost.decision_mismatch} recorded stop decisions disagree with the branches found")
    return rows + ([f"({'; '.join(notes)}.)"] if notes else [])


def audit_text(audit) -> str:
    """The whole audit as printed by ``uqh continue`` and written to ``audit.md``."""
    c, s = audit.counts, audit.settings
    tail = [
        "",
        f"Scores: {s.rule} rule, {s.weights} weights, predictor {s.predictor}; {c.scored} retained prefixes scored, "
        f"{c.missing_confidence} left out (missing confidence).",
        f"q_Z file: {c.records} records ({c.records_mc} mc, {c.records_plugin} plug-in); "
        f"{c.without_estimate} censored prefixes without an estimate.",
    ]
    if c.join_mismatch_branches:
        tail.append(f"WARNING: {c.join_mismatch_branches} branches whose prefix differs from the source were ignored.")
    if s.plugin_note:
        tail.append(s.plugin_note)
    return audit_tables(audit) + "\n" + "\n".join(tail)


def write_continuation_audit(cont_dir: Path, estimate) -> str:
    """Write ``qz.jsonl``, ``audit.json`` and ``audit.md`` into the continuation run directory; return the text."""
    cont_dir = Path(cont_dir)
    text = audit_text(estimate.audit)
    write_qz_file(cont_dir / QZ_FILE, estimate.records)
    atomic_write_text(cont_dir / AUDIT_JSON, estimate.audit.model_dump_json(indent=2) + "\n")
    atomic_write_text(cont_dir / AUDIT_MD, text + "\n")
    return text


def audit_continuation(cont_dir: Path, *, write: bool = True, **options):
    """:func:`scoring.qz_audit.estimate_qz` on ``cont_dir`` (options as there), written unless ``write=False``.

    Returns (estimate, text)."""
    from scoring.qz_audit import estimate_qz

    estimate = estimate_qz(RunDir.open(cont_dir), **options)
    text = write_continuation_audit(cont_dir, estimate) if write else audit_text(estimate.audit)
    return estimate, text
