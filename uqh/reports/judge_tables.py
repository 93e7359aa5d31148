"""`uqh judge --report` output: the GPA-judge analysis (:class:`uqh.scoring.judges.judge_results.JudgeAnalysis`) arranged as
tables -- rich on a terminal, Markdown, or CSV + Markdown files -- and as JSON. Computes nothing."""
from __future__ import annotations

from pathlib import Path

from uqh.reports.tables import Table
from uqh.rundir.atomic import atomic_write_text
from uqh.rundir.judgments import JudgeMetric
from uqh.scoring.judges.judge_results import ALL_METRICS, GPA_MEAN, JudgeAnalysis
from uqh.scoring.registry import get_metric
from uqh.scoring.results import Comparison

JSON_FILE = "judge_report.json"


def _arrow(metric: str) -> str:
    return "↑" if get_metric(metric).higher_is_better else "↓"


def _judge(code: str) -> str:
    """``GF Goal Fulfillment``; the pooled rows by name."""
    if code == ALL_METRICS:
        return "All judges"
    return f"{code} {JudgeMetric(code).label}"


def distribution_table(a: JudgeAnalysis) -> Table:
    cols = ["Judge", "Group", "Judgments", "Missing", "Score 0", "Score 1", "Score 2", "Score 3", "Mean"]
    rows = [{"Judge": _judge(r.metric), "Group": r.group, "Judgments": r.n_judgments, "Missing": r.n_missing,
             **{f"Score {v}": c for v, c in enumerate(r.counts)}, "Mean": r.mean} for r in a.distributions]
    return Table(name="judge_scores", title="GPA judge scores by stop reason and outcome", columns=cols, rows=rows,
                 caption="Every judgment counted (repeats included). Missing: the judge's reply did not parse even "
                 "after one repair request (recorded, never guessed). Mean over the valid scores (0-3).")


def stability_table(a: JudgeAnalysis) -> Table:
    cols = ["Judge", "Episodes", "Ratings", "Repeats", "α ordinal", "α CI low", "α CI high", "α interval",
            "Mean SD", "Identical"]
    rows = [{"Judge": _judge(r.metric), "Episodes": r.n_episodes, "Ratings": r.n_ratings, "Repeats": r.max_repeats,
             "α ordinal": r.alpha_ordinal.value, "α CI low": r.alpha_ordinal.ci_low,
             "α CI high": r.alpha_ordinal.ci_high, "α interval": r.alpha_interval, "Mean SD": r.mean_sd,
             "Identical": r.share_identical} for r in a.stability]
    return Table(name="judge_stability", title="Judge stability across repeats (Agent GPA §4.1.4 shape)",
                 columns=cols, rows=rows, empty_note="No judge was repeated (use --repeats 2 or more).",
                 caption="Each repeat is a rater; episodes with at least two valid ratings. Krippendorff's α "
                 f"(ordinal; 95% bootstrap CI over episodes, {a.bootstrap} resamples) and α interval (the paper's "
                 "level); mean SD: per-episode standard deviation of the scores (0-3 scale, ddof 1); identical: "
                 "share of episodes whose repeats all agree. α is undefined (—) without variation in the scores.")


def _name(r) -> str:
    return _judge(r.predictor) if r.kind == "judge" and r.predictor != GPA_MEAN else r.label


def failure_table(a: JudgeAnalysis) -> Table:
    au, ap = f"AUROC{_arrow('auroc')}", f"AUPRC{_arrow('auprc')}"
    cols = ["Predictor", "Kind", "n", "Failures", "Skipped (missing)", au, "AUROC CI low", "AUROC CI high", ap,
            "AUPRC CI low", "AUPRC CI high"]
    rows = [{"Predictor": _name(r), "Kind": r.kind, "n": r.n, "Failures": r.n_failures,
             "Skipped (missing)": r.n_skipped_missing, au: r.auroc.value, "AUROC CI low": r.auroc.ci_low,
             "AUROC CI high": r.auroc.ci_high, ap: r.auprc.value, "AUPRC CI low": r.auprc.ci_low,
             "AUPRC CI high": r.auprc.ci_high} for r in a.failure_prediction]
    return Table(name="judge_failure_prediction",
                 title="Judges as failure predictors next to the agent's confidence streams",
                 columns=cols, rows=rows, empty_note="No judged episode is complete (clean with an observed outcome).",
                 caption="Judged complete episodes (clean, Y observed). Failure-oriented AUROC/AUPRC: positive class "
                 "Y = 0, risk = a low judge score (mean over repeats, /3) or low confidence (linear-front weighted "
                 "trajectory mean, as in `uqh score`); computed by uqh.scoring.diagnostics, 95% bootstrap CIs "
                 f"({a.bootstrap} resamples). GPA mean: the mean over every judge (an episode lacking one is skipped).")


def versus_verbal_table(a: JudgeAnalysis) -> Table:
    cols = ["Judge", "n paired", "ΔAUROC", "SE ΔAUROC", "Δ/SE AUROC", "ΔAUPRC", "SE ΔAUPRC", "Δ/SE AUPRC"]
    rows = []
    for r in a.failure_prediction:
        if r.vs_verbal_n is None:
            continue
        roc, prc = r.vs_verbal_auroc or Comparison(), r.vs_verbal_auprc or Comparison()
        rows.append({"Judge": _name(r), "n paired": r.vs_verbal_n, "ΔAUROC": roc.delta, "SE ΔAUROC": roc.se,
                     "Δ/SE AUROC": roc.delta_over_se, "ΔAUPRC": prc.delta, "SE ΔAUPRC": prc.se,
                     "Δ/SE AUPRC": prc.delta_over_se})
    return Table(name="judge_vs_verbal", title="Judge − verbal confidence as failure predictors (paired)",
                 columns=cols, rows=rows, empty_note="No judged complete episode has both a judge score and a verbal confidence stream.",
                 caption="Δ = metric(judge) − metric(verbal confidence) on the judged complete episodes that have "
                 f"both; SE and Δ/SE from the paired bootstrap ({a.bootstrap} resamples). Δ > 0: the judge ranks "
                 "failures better than the agent's own confidence.")


def localisation_table(a: JudgeAnalysis) -> Table:
    cols = ["Judge", "Failed episodes", "With a confidence drop", "Share citing the drop step", "Chance share",
            "Cited steps per judgment"]
    rows = [{"Judge": _judge(r.metric) if r.metric != ALL_METRICS else "All judges (union per repeat)",
             "Failed episodes": r.n_failed, "With a confidence drop": r.n_with_drop,
             "Share citing the drop step": r.share, "Chance share": r.chance,
             "Cited steps per judgment": r.mean_cited} for r in a.localisation]
    return Table(name="judge_localisation", title="Step localisation: judges' cited steps vs the first confidence drop",
                 columns=cols, rows=rows, empty_note="No judged failed episode (clean, Y = 0).",
                 caption="Failed episodes (clean, Y = 0) whose verbal confidence drops somewhere: the share of "
                 "judgments whose cited steps include the first step where the confidence fell below the previous "
                 "step's. Chance share: expected if each judgment cited as many steps at random.")


def human_table(a: JudgeAnalysis) -> Table:
    cols = ["Judge", "Labels", "Unjudged", "Pairs", "Exact", "Within 1", "κ", "κ quadratic"]
    rows = [{"Judge": _judge(r.metric), "Labels": r.n_labels,
             "Unjudged": r.n_unjudged, "Pairs": r.n_pairs, "Exact": r.exact, "Within 1": r.within_one,
             "κ": r.kappa, "κ quadratic": r.kappa_quadratic} for r in (a.human or [])]
    return Table(name="judge_human_agreement", title="Judges vs human labels", columns=cols, rows=rows,
                 caption="Every valid repeat paired with the human score of its episode and metric. Exact and "
                 "within-one agreement (the paper's off-by-one accuracy), Cohen's κ unweighted and quadratic-weighted.")


def judge_tables(a: JudgeAnalysis) -> list[Table]:
    tables = [distribution_table(a), stability_table(a), failure_table(a), versus_verbal_table(a),
              localisation_table(a)]
    if a.human is not None:
        tables.append(human_table(a))
    return tables


def header_lines(a: JudgeAnalysis) -> list[str]:
    c = a.counts
    cost = "cost n/a (unpriced model)" if c.cost_usd is None else f"cost ${c.cost_usd:.4f}" + (
        f" (+{c.unpriced_calls} unpriced calls)" if c.unpriced_calls else "")
    lines = [f"judge directory {a.judge_dir}  judge {a.judge_model}",
             f"judged runs     {', '.join(a.runs)}",
             f"judgments       {c.judgments} on {c.episodes} episodes: {c.scored} scored ({c.repaired} after a "
             f"repair), {c.missing} missing; judges {','.join(a.metrics)}",
             f"judge calls     {c.calls}; tokens {c.prompt_tokens:,} prompt + {c.completion_tokens:,} completion; "
             f"{cost}"]
    if c.duplicate_lines:
        lines.append(f"note            {c.duplicate_lines} duplicate judgment lines ignored (first kept)")
    lines += [f"note            {n}" for n in a.notes]
    return lines


def judge_output(a: JudgeAnalysis):
    """The analysis for :func:`uqh.reports.render.emit` (json: the :class:`JudgeAnalysis` dump)."""
    from uqh.reports.render import Output

    return Output(tables=judge_tables(a), json_text=a.model_dump_json(indent=2), header=header_lines(a))


def write_files(a: JudgeAnalysis, out_dir: Path) -> list[Path]:
    """Every table as CSV + Markdown, and the analysis as JSON, into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in judge_tables(a):
        paths += t.write(out_dir)
    atomic_write_text(out_dir / JSON_FILE, a.model_dump_json(indent=2) + "\n", fsync=False)
    paths.append(out_dir / JSON_FILE)
    return paths
