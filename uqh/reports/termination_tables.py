"""Termination audit (paper Appendix G.1, Table 6) and the WebShop-style selection diagnostic (Fig. 2B) as tables.

Reads run directories only through :class:`rundir.RunDir` (the same episodes `uqh score` counts); the numbers come
from :mod:`uqh.scoring.termination`. Categories (Appendix G):

- ``clean``       benchmark-completed, Y observed: enters complete-observation scoring (delta = 1);
- ``max_steps``   step budget spent: administratively censored (delta = 0);
- ``parse_error`` informative failure: excluded from complete and censored scoring;
- other           (Tau2 ``tool_error`` / ``env_terminated``): no label, no administrative stop: excluded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uqh.rundir.errors import UserError
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import Episode, Manifest
from uqh.reports.tables import Table
from uqh.scoring.termination import selection_diagnostic as selection_stats
from uqh.scoring.termination import termination_counts

#: Display names of runs recorded before the manifest carried the domain's own (``info.display_name``).
EARLIER_DISPLAY_NAMES = {"strategyqa": "StrategyQA", "hotpotqa": "HotpotQA", "webshop": "WebShop",
                         "tau2-airline": "Tau2-Bench", "tau2-retail": "Tau2-Bench", "tau2-telecom": "Tau2-Bench",
                         "arithmetic": "Arithmetic"}


@dataclass
class Run:
    path: Path
    manifest: Manifest
    episodes: list[Episode]
    planned: int = 0  # episodes the manifest plans
    name: str = ""  # unique short name among the runs of one report (default: the directory name)
    label_text: str | None = None  # overrides the label (pooled runs)

    @property
    def domain(self) -> str:
        return self.manifest.config.domain

    @property
    def label(self) -> str:
        if self.label_text:
            return self.label_text
        return f"{self.name or self.path.name} ({self.domain})"

    @property
    def dataset(self) -> str:
        return self.manifest.info.get("display_name") or EARLIER_DISPLAY_NAMES.get(self.domain, self.domain)


def open_audited_run(path: str | Path) -> Run:
    reader = RunDir.open(path)
    return Run(reader.path, reader.manifest, reader.episodes(), planned=reader.planned)


def load_runs(paths: list[str | Path]) -> list[Run]:
    if not paths:
        raise UserError("give at least one run directory")
    runs = [open_audited_run(p) for p in paths]
    names = [r.path.resolve() for r in runs]
    if len(set(names)) != len(names):
        raise UserError("the same run directory was given twice; give each once")
    # Short unique names: the directory name, plus parent parts only where two runs would otherwise collide.
    depth = [1] * len(names)
    while True:
        short = ["/".join(p.parts[-d:]) for p, d in zip(names, depth)]
        clash = [i for i, n in enumerate(short) if short.count(n) > 1 and depth[i] < len(names[i].parts)]
        if not clash:
            break
        for i in clash:
            depth[i] += 1
    for r, n in zip(runs, short):
        r.name = n
    return runs


# --------------------------------------------------------------------------------------- Table 6


AUDIT_COLUMNS = [
    "Run",
    "Dataset",
    "Step budget",
    "Total",
    "Clean Y",
    "max_steps",
    "parse_error",
    "Other",
    "Other breakdown",
    "Uncensored n",
    "ȳ (uncensored)",
    "Working n",
    "Admin-censoring rate",
    "Planned",
    "Unfinished",
]


def _audit_row(label: str, dataset: str, budget: str | int, episodes: list[Episode], planned: int) -> dict:
    k = termination_counts(episodes)
    return {
        "Run": label,
        "Dataset": dataset,
        "Step budget": budget,
        "Total": k.total,
        "Clean Y": k.clean_y,
        "max_steps": k.max_steps,
        "parse_error": k.parse_error,
        "Other": k.other,
        "Other breakdown": ", ".join(f"{n} {reason}" for reason, n in k.other_breakdown.items()),
        "Uncensored n": k.uncensored_n,
        "ȳ (uncensored)": k.success_rate,
        "Working n": k.working_n,
        "Admin-censoring rate": k.censoring_rate,
        "Planned": planned,
        "Unfinished": planned - k.total,
    }


def termination_audit(runs: list[Run]) -> Table:
    """Table 6: one row per run directory, plus one pooled row per dataset made of several runs (Tau2)."""
    rows = []
    for r in runs:
        cfg = r.manifest.config
        rows.append(_audit_row(r.label, r.dataset, cfg.step_budget, r.episodes, r.planned))
    by_dataset: dict[str, list[Run]] = {}
    for r in runs:
        by_dataset.setdefault(r.dataset, []).append(r)
    for dataset, group in by_dataset.items():
        if len(group) < 2:
            continue
        budgets = sorted({g.manifest.config.step_budget for g in group})
        rows.append(
            _audit_row(
                f"all {dataset} runs ({len(group)})",
                dataset,
                budgets[0] if len(budgets) == 1 else "/".join(map(str, budgets)),
                [e for g in group for e in g.episodes],
                sum(g.planned for g in group),
            )
        )
    return Table(
        name="termination_audit",
        title="Termination audit (Table 6)",
        columns=AUDIT_COLUMNS,
        rows=rows,
        caption=(
            "Clean Y: benchmark-completed with an observed outcome (complete-observation sample). max_steps: "
            "step budget spent, administratively censored. parse_error: repairs exhausted, informative, excluded "
            "from complete and censored scoring. Other: tool_error / env_terminated, excluded. Working n = "
            "uncensored n + max_steps; admin-censoring rate = max_steps / working n. Planned = tasks x samples "
            "in the manifest; Unfinished = planned episodes not (yet) in episodes.jsonl."
        ),
    )


# --------------------------------------------------------------------------------------- Fig. 2B


SELECTION_COLUMNS = [
    "Run",
    "Subset",
    "n",
    "Mean observed steps",
    "Steps CI low",
    "Steps CI high",
    "Mean verbal confidence",
    "Confidence CI low",
    "Confidence CI high",
    "n without confidence",
]


def selection_diagnostic_table(runs: list[Run], *, n_boot: int = 2000, seed: int = 0) -> Table:
    """Fig. 2B: completed (clean, Y observed) vs administratively censored (max_steps) trajectories.

    Per subset: mean observed steps and mean verbal confidence (per trajectory: the mean of its numeric
    raw <confidence> values; trajectories without any are counted, not imputed), with 95% percentile
    bootstrap intervals over trajectories. A third row per run gives censored minus completed.
    """
    rows = []
    for r in runs:
        d = selection_stats(r.episodes, n_boot=n_boot, seed=seed)
        for name, sub in (("completed", d.completed), ("admin-censored", d.censored)):
            rows.append({
                "Run": r.label,
                "Subset": name,
                "n": sub.n,
                "Mean observed steps": sub.mean_steps.value,
                "Steps CI low": sub.mean_steps.ci_low,
                "Steps CI high": sub.mean_steps.ci_high,
                "Mean verbal confidence": sub.mean_confidence.value,
                "Confidence CI low": sub.mean_confidence.ci_low,
                "Confidence CI high": sub.mean_confidence.ci_high,
                "n without confidence": sub.n_without_confidence,
            })
        rows.append({
            "Run": r.label,
            "Subset": "censored − completed",
            "n": None,
            "Mean observed steps": d.steps_difference,
            "Mean verbal confidence": d.confidence_difference,
        })
    return Table(
        name="selection_diagnostic",
        title="Selection diagnostic: completed vs admin-censored (Fig. 2B)",
        columns=SELECTION_COLUMNS,
        rows=rows,
        caption=(
            "Completed = clean stop with observed Y; admin-censored = max_steps. Verbal confidence is the raw "
            "<confidence> stream, averaged within each trajectory, then across trajectories. Intervals: 95% "
            f"percentile bootstrap over trajectories ({n_boot} resamples)."
        ),
    )


def audit(paths: list[str | Path], *, n_boot: int = 2000) -> list[Table]:
    runs = load_runs(paths)
    return [termination_audit(runs), selection_diagnostic_table(runs, n_boot=n_boot)]
