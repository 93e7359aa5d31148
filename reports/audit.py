"""Termination audit (paper Appendix G.1, Table 6) and the WebShop-style selection diagnostic (Fig. 2B).

Reads run directories only through :class:`rundir.RunDir` (the same episodes `uqh score` counts). Categories (Appendix G):

- ``clean``       benchmark-completed, Y observed: enters complete-observation scoring (delta = 1);
- ``max_steps``   step budget spent: administratively censored (delta = 0);
- ``parse_error`` informative failure: excluded from complete and censored scoring;
- other           (Tau2 ``tool_error`` / ``env_terminated``): no label, no administrative stop: excluded.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rundir.errors import UserError
from rundir.reader import RunDir
from rundir.schema import Episode, Manifest, StopReason
from reports.tables import Table

OTHER_REASONS = [r for r in StopReason if r not in (StopReason.clean, StopReason.max_steps, StopReason.parse_error)]

#: Display names of the paper's datasets by domain (Tau2's three domains form one dataset in the paper).
DATASET_NAMES = {
    "strategyqa": "StrategyQA",
    "hotpotqa": "HotpotQA",
    "webshop": "WebShop",
    "tau2-airline": "Tau2-Bench",
    "tau2-retail": "Tau2-Bench",
    "tau2-telecom": "Tau2-Bench",
    "arithmetic": "Arithmetic",
}


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
        return DATASET_NAMES.get(self.domain, self.domain)


def load_run(path: str | Path) -> Run:
    reader = RunDir.open(path)
    return Run(reader.path, reader.manifest, reader.episodes(), planned=reader.planned)


def load_runs(paths: list[str | Path]) -> list[Run]:
    if not paths:
        raise UserError("give at least one run directory")
    runs = [load_run(p) for p in paths]
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


def termination_counts(episodes: list[Episode]) -> dict[str, int | float | None | str]:
    c = Counter(e.stop_reason for e in episodes)
    clean = [e for e in episodes if e.stop_reason == StopReason.clean]
    labelled = [e.outcome for e in clean if e.outcome is not None]
    other = sum(c[r] for r in OTHER_REASONS)
    working = len(labelled) + c[StopReason.max_steps]
    return {
        "total": len(episodes),
        "clean_y": c[StopReason.clean],
        "max_steps": c[StopReason.max_steps],
        "parse_error": c[StopReason.parse_error],
        "other": other,
        "other_breakdown": ", ".join(f"{c[r]} {r.value}" for r in OTHER_REASONS if c[r]) or "",
        "uncensored_n": len(labelled),
        "successes": int(sum(labelled)),
        "success_rate": (sum(labelled) / len(labelled)) if labelled else None,
        "working_n": working,
        "censoring_rate": (c[StopReason.max_steps] / working) if working else None,
    }


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
        "Total": k["total"],
        "Clean Y": k["clean_y"],
        "max_steps": k["max_steps"],
        "parse_error": k["parse_error"],
        "Other": k["other"],
        "Other breakdown": k["other_breakdown"],
        "Uncensored n": k["uncensored_n"],
        "ȳ (uncensored)": k["success_rate"],
        "Working n": k["working_n"],
        "Admin-censoring rate": k["censoring_rate"],
        "Planned": planned,
        "Unfinished": planned - k["total"],
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


def _mean_ci(values: np.ndarray, *, n_boot: int, seed: int) -> tuple[float | None, float | None, float | None]:
    if values.size == 0:
        return None, None, None
    mean = float(values.mean())
    if values.size < 2:
        return mean, None, None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    boots = values[idx].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return mean, float(lo), float(hi)


def trajectory_mean_confidence(e: Episode) -> float | None:
    """Mean of the numeric per-step verbal confidences of one trajectory; None if it has none."""
    vals = [c for c in e.verbal_confidences if c is not None]
    return sum(vals) / len(vals) if vals else None


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


def selection_diagnostic(runs: list[Run], *, n_boot: int = 2000, seed: int = 0) -> Table:
    """Fig. 2B: completed (clean, Y observed) vs administratively censored (max_steps) trajectories.

    Per subset: mean observed steps and mean verbal confidence (per trajectory: the mean of its numeric
    raw <confidence> values; trajectories without any are counted, not imputed), with 95% percentile
    bootstrap intervals over trajectories. A third row per run gives censored minus completed.
    """
    rows = []
    for r in runs:
        subsets = {
            "completed": [e for e in r.episodes if e.stop_reason == StopReason.clean and e.outcome is not None],
            "admin-censored": [e for e in r.episodes if e.stop_reason == StopReason.max_steps],
        }
        stats = {}
        for name, eps in subsets.items():
            steps = np.array([e.n_steps for e in eps], dtype=float)
            confs = [trajectory_mean_confidence(e) for e in eps]
            conf_arr = np.array([c for c in confs if c is not None], dtype=float)
            s = _mean_ci(steps, n_boot=n_boot, seed=seed)
            c = _mean_ci(conf_arr, n_boot=n_boot, seed=seed + 1)
            stats[name] = (s, c)
            rows.append(
                {
                    "Run": r.label,
                    "Subset": name,
                    "n": len(eps),
                    "Mean observed steps": s[0],
                    "Steps CI low": s[1],
                    "Steps CI high": s[2],
                    "Mean verbal confidence": c[0],
                    "Confidence CI low": c[1],
                    "Confidence CI high": c[2],
                    "n without confidence": sum(1 for x in confs if x is None),
                }
            )
        (s0, c0), (s1, c1) = stats["completed"], stats["admin-censored"]
        rows.append(
            {
                "Run": r.label,
                "Subset": "censored − completed",
                "n": None,
                "Mean observed steps": None if s0[0] is None or s1[0] is None else s1[0] - s0[0],
                "Mean verbal confidence": None if c0[0] is None or c1[0] is None else c1[0] - c0[0],
            }
        )
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
    return [termination_audit(runs), selection_diagnostic(runs, n_boot=n_boot)]
