"""The report's figures (PNG + SVG, matplotlib Agg): calibration gap (Fig. 1), complete-only vs censored extension
(Fig. 2A), selection diagnostic (Fig. 2B). Each draws the rows of an already arranged :class:`uqh.reports.tables.Table`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from uqh.reports.tables import Table


@dataclass
class FigureResult:
    """What a figure function drew (typed, so tests and the page can check it without looking at pixels): whether a
    file was written, its rows (y labels) and panels, the legend's labels, and a line per thing left out and why."""

    stem: str
    drawn: bool = False
    rows: list[str] = field(default_factory=list)
    panels: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.drawn


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def _legend_labels(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []

COLORS = {"raw": "#d95f02", "platt": "#2c7fb8", "base": "#1b9e77"}
PRIMARY_SCORE = "log"


def _mpl():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "uqh-report", "font.size": 9})
    return plt


def _save(fig, out_dir: Path, stem: str) -> None:
    fig.savefig(out_dir / f"{stem}.png", dpi=130, bbox_inches="tight")
    fig.savefig(out_dir / f"{stem}.svg", bbox_inches="tight", metadata={"Date": None})


def _err(v, lo, hi):
    if v is None or lo is None or hi is None:
        return None
    return [[max(v - lo, 0.0)], [max(hi - v, 0.0)]]


def figure_calibration_invariance(table: Table, run_label: str, out_dir: Path, stem: str) -> FigureResult:
    """Fig. 1: one panel per metric with a finite value (raw, Platt, base rate); a run the table has no row of (no
    complete trajectory with verbal confidence) is not drawn, and the result says so."""
    plt = _mpl()
    res = FigureResult(stem)
    run_rows = [r for r in table.rows if r["Run"] == run_label]
    rows = [r for r in run_rows if any(_finite(r[k]) for k in ("Raw", "Platt", "Base rate"))]
    if not rows:
        res.notes.append(f"Fig. 1 leaves out {run_label}: " + (
            "no metric could be computed on its complete trajectories." if run_rows else
            "it has no complete trajectory with verbal confidence (the calibration gap is measured on those)."))
        return res
    empty = [r["Metric"] for r in run_rows if r not in rows]
    if empty:
        res.notes.append(f"Fig. 1 ({run_label}) leaves out the panels of {', '.join(empty)}: no value.")
    fig, axes = plt.subplots(1, len(rows), figsize=(2.6 * len(rows), 2.4))
    axes = np.atleast_1d(axes)
    labels: dict[str, object] = {}
    for ax, r in zip(axes, rows):
        series = [("raw", "Raw", r["Raw"], r["Raw CI low"], r["Raw CI high"]),
                  ("platt", "Platt", r["Platt"], r["Platt CI low"], r["Platt CI high"]),
                  ("base", "Base rate", r["Base rate"], r["Base CI low"], r["Base CI high"])]
        for yi, (key, name, v, lo, hi) in enumerate(series):
            if not _finite(v):
                continue
            handle = ax.errorbar([v], [yi], xerr=_err(v, lo, hi), fmt="o", color=COLORS[key], capsize=3)
            labels.setdefault(name, handle)
        base = r["Base rate"]
        if _finite(base):
            lo, hi = ax.get_xlim()
            worse_left = r.get("higher_is_better") is not False  # worse than the base rate = lower
            ax.axvspan(lo if worse_left else base, base if worse_left else hi, color="#999999", alpha=0.12, lw=0)
            ax.set_xlim(lo, hi)
        z = r["Δ/SE"]
        ax.set_title(f"{r['Metric']}\nΔ/SE = {z:.1f}" if _finite(z) else r["Metric"], fontsize=9)
        ax.set_yticks(range(3), ["raw", "Platt", "base"])
        ax.set_ylim(-0.6, 2.6)
        ax.invert_yaxis()
    if labels:  # every series drawn in any panel, not only the first panel's
        axes[0].legend(list(labels.values()), list(labels), loc="lower left", fontsize=7, frameon=False)
    fig.suptitle(f"Calibration gap: {run_label} (n = {rows[0]['n']}); shaded = worse than base rate", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    res.legend = _legend_labels(axes[0])
    plt.close(fig)
    res.drawn, res.panels, res.rows = True, [r["Metric"] for r in rows], ["raw", "Platt", "base"]
    return res


def figure_censored_shift(table: Table, run_label: str, out_dir: Path, stem: str,
                          score: str = PRIMARY_SCORE) -> FigureResult:
    """Fig. 2A: complete-only vs censored-extension TPS per predictor row with a value, and the Δ_practice panel
    when some Δ is finite. Rows and panels without any value are left out, each with a line saying why."""
    plt = _mpl()
    res = FigureResult(stem)
    run_rows = [r for r in table.rows if r["Run"] == run_label and r["Score"] == score]
    rows = [r for r in run_rows if _finite(r["TPS complete-only"]) or _finite(r["TPS cen-ext"])]
    empty = [r["Predictor"] for r in run_rows if r not in rows]
    if empty:
        res.notes.append(f"Fig. 2A ({run_label}) leaves out {len(empty)} predictor rows without a TPS_{score} value "
                         f"(the run has no values of these streams): {', '.join(empty)}.")
    if not rows:
        return res
    with_delta = any(_finite(r["Δ_practice"]) for r in rows)
    if not with_delta:
        res.notes.append(f"Fig. 2A ({run_label}) has no Δ_practice panel: no predictor row has a finite Δ_practice "
                         "(Δ_practice = censored extension − complete-only needs both; a run whose trajectories are all censored "
                         "has no complete-only score).")
    fig, axes = plt.subplots(1, 2 if with_delta else 1, figsize=(9 if with_delta else 5, 0.45 * len(rows) + 1.4),
                             sharey=True, squeeze=False)
    a1 = axes[0][0]
    ys = np.arange(len(rows))
    drawn: dict[str, object] = {}
    for yi, r in zip(ys, rows):
        for column, marker, key, name in (("TPS complete-only", "o", "raw", "complete-only"),
                                          ("TPS cen-ext", "s", "platt", "censored extension")):
            if _finite(r[column]):
                (handle,) = a1.plot([r[column]], [yi], marker, color=COLORS[key])
                drawn.setdefault(name, handle)
        if with_delta and _finite(r["Δ_practice"]):
            d = r["Δ_practice"]
            axes[0][1].errorbar([d], [yi], xerr=_err(d, r["Δ CI low"], r["Δ CI high"]), fmt="o", color="#333333",
                                capsize=3)
    a1.set_yticks(ys, [r["Predictor"] for r in rows])
    a1.invert_yaxis()
    a1.set_xlabel(f"TPS_{score} (nats)" if score == "log" else f"TPS_{score}")
    res.panels = [f"TPS_{score}"]
    if with_delta:
        axes[0][1].axvline(0, color="#999999", lw=0.8)
        axes[0][1].set_xlabel("Δ_practice = cen-ext − complete-only (95% CI)")
        res.panels.append("Δ_practice")
    a1.legend(list(drawn.values()), list(drawn), fontsize=7, frameon=False, loc="best")
    fig.suptitle(f"Complete-only vs censored extension: {run_label}", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    res.legend = _legend_labels(a1)
    plt.close(fig)
    res.drawn, res.rows = True, [r["Predictor"] for r in rows]
    return res


def figure_selection(table: Table, out_dir: Path, stem: str = "selection_diagnostic") -> FigureResult:
    """Fig. 2B: completed vs admin-censored per run that has admin-censored trajectories. The legend names every
    subset drawn in any run (not only the first run's)."""
    plt = _mpl()
    res = FigureResult(stem)
    runs = list(dict.fromkeys(r["Run"] for r in table.rows if r["Subset"] == "admin-censored" and r["n"]))
    without = [r for r in dict.fromkeys(x["Run"] for x in table.rows) if r not in runs]
    if without:
        res.notes.append(f"Fig. 2B leaves out {', '.join(without)}: no admin-censored (max_steps) trajectory to "
                         "compare with.")
    if not runs:
        return res
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 0.6 * len(runs) + 1.5), sharey=True)
    drawn: dict[str, object] = {}
    for yi, run in enumerate(runs):
        for off, subset, key in ((-0.15, "completed", "raw"), (0.15, "admin-censored", "platt")):
            r = next((x for x in table.rows if x["Run"] == run and x["Subset"] == subset), None)
            if r is None or not r["n"]:
                continue
            if _finite(r["Mean observed steps"]):
                handle = a1.errorbar([r["Mean observed steps"]], [yi + off],
                                     xerr=_err(r["Mean observed steps"], r["Steps CI low"], r["Steps CI high"]),
                                     fmt="o", color=COLORS[key], capsize=3)
                drawn.setdefault(subset, handle)
            if _finite(r["Mean verbal confidence"]):
                a2.errorbar([r["Mean verbal confidence"]], [yi + off],
                            xerr=_err(r["Mean verbal confidence"], r["Confidence CI low"], r["Confidence CI high"]),
                            fmt="o", color=COLORS[key], capsize=3)
    a1.set_yticks(range(len(runs)), runs)
    a1.invert_yaxis()
    a1.set_xlabel("mean observed steps")
    a2.set_xlabel("mean verbal confidence")
    a1.legend(list(drawn.values()), list(drawn), fontsize=7, frameon=False)
    fig.suptitle("Selection diagnostic: completed vs admin-censored (95% bootstrap CI)", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    res.legend = _legend_labels(a1)
    plt.close(fig)
    res.drawn, res.rows, res.panels = True, runs, ["mean observed steps", "mean verbal confidence"]
    return res
