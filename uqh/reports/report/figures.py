"""The report's figures (PNG + SVG, matplotlib Agg): calibration gap (Fig. 1), complete-only vs censored extension
(Fig. 2A), selection diagnostic (Fig. 2B). Each draws the rows of an already arranged :class:`uqh.reports.tables.Table`."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from uqh.reports.tables import Table

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


def figure_calibration_invariance(table: Table, run_label: str, out_dir: Path, stem: str) -> bool:
    plt = _mpl()
    rows = [r for r in table.rows if r["Run"] == run_label
            and any(r[k] is not None and math.isfinite(r[k]) for k in ("Raw", "Platt", "Base rate"))]
    if not rows:
        return False
    fig, axes = plt.subplots(1, len(rows), figsize=(2.6 * len(rows), 2.4))
    axes = np.atleast_1d(axes)
    for ax, r in zip(axes, rows):
        series = [("raw", "Raw", r["Raw"], r["Raw CI low"], r["Raw CI high"]),
                  ("platt", "Platt", r["Platt"], r["Platt CI low"], r["Platt CI high"]),
                  ("base", "Base rate", r["Base rate"], r["Base CI low"], r["Base CI high"])]
        for yi, (key, name, v, lo, hi) in enumerate(series):
            if v is None or not math.isfinite(v):
                continue
            ax.errorbar([v], [yi], xerr=_err(v, lo, hi), fmt="o", color=COLORS[key], capsize=3, label=name)
        base = r["Base rate"]
        if base is not None and math.isfinite(base):
            lo, hi = ax.get_xlim()
            worse_left = r.get("higher_is_better") is not False  # worse than the base rate = lower
            ax.axvspan(lo if worse_left else base, base if worse_left else hi, color="#999999", alpha=0.12, lw=0)
            ax.set_xlim(lo, hi)
        z = r["Δ/SE"]
        ax.set_title(f"{r['Metric']}\nΔ/SE = {z:.1f}" if z is not None and math.isfinite(z) else r["Metric"], fontsize=9)
        ax.set_yticks(range(3), ["raw", "Platt", "base"])
        ax.set_ylim(-0.6, 2.6)
        ax.invert_yaxis()
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(loc="lower left", fontsize=7, frameon=False)
    fig.suptitle(f"Calibration gap: {run_label} (n = {rows[0]['n']}); shaded = worse than base rate", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    plt.close(fig)
    return True


def figure_censored_shift(table: Table, run_label: str, out_dir: Path, stem: str, score: str = PRIMARY_SCORE) -> bool:
    plt = _mpl()
    rows = [r for r in table.rows if r["Run"] == run_label and r["Score"] == score]
    if not rows:
        return False
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 0.45 * len(rows) + 1.4), sharey=True)
    ys = np.arange(len(rows))
    for yi, r in zip(ys, rows):
        if r["TPS complete-only"] is not None:
            a1.plot([r["TPS complete-only"]], [yi], "o", color=COLORS["raw"], label="complete-only" if yi == 0 else None)
        if r["TPS cen-ext"] is not None:
            a1.plot([r["TPS cen-ext"]], [yi], "s", color=COLORS["platt"], label="censored extension" if yi == 0 else None)
        d = r["Δ_practice"]
        if d is not None and math.isfinite(d):
            a2.errorbar([d], [yi], xerr=_err(d, r["Δ CI low"], r["Δ CI high"]), fmt="o", color="#333333", capsize=3)
    a2.axvline(0, color="#999999", lw=0.8)
    a1.set_yticks(ys, [r["Predictor"] for r in rows])
    a1.invert_yaxis()
    a1.set_xlabel(f"TPS_{score} (nats)" if score == "log" else f"TPS_{score}")
    a2.set_xlabel("Δ_practice = cen-ext − complete-only (95% CI)")
    a1.legend(fontsize=7, frameon=False, loc="best")
    fig.suptitle(f"Complete-only vs censored extension: {run_label}", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    plt.close(fig)
    return True


def figure_selection(table: Table, out_dir: Path, stem: str = "selection_diagnostic") -> bool:
    plt = _mpl()
    runs = []
    for r in table.rows:
        if r["Subset"] in ("completed", "admin-censored") and r["n"]:
            if r["Run"] not in runs:
                runs.append(r["Run"])
    runs = [run for run in runs if any(r["Run"] == run and r["Subset"] == "admin-censored" and r["n"] for r in table.rows)]
    if not runs:
        return False
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 0.6 * len(runs) + 1.5), sharey=True)
    for yi, run in enumerate(runs):
        for off, subset, key in ((-0.15, "completed", "raw"), (0.15, "admin-censored", "platt")):
            r = next(x for x in table.rows if x["Run"] == run and x["Subset"] == subset)
            if r["Mean observed steps"] is not None:
                a1.errorbar([r["Mean observed steps"]], [yi + off],
                            xerr=_err(r["Mean observed steps"], r["Steps CI low"], r["Steps CI high"]),
                            fmt="o", color=COLORS[key], capsize=3, label=subset if yi == 0 else None)
            if r["Mean verbal confidence"] is not None:
                a2.errorbar([r["Mean verbal confidence"]], [yi + off],
                            xerr=_err(r["Mean verbal confidence"], r["Confidence CI low"], r["Confidence CI high"]),
                            fmt="o", color=COLORS[key], capsize=3)
    a1.set_yticks(range(len(runs)), runs)
    a1.invert_yaxis()
    a1.set_xlabel("mean observed steps")
    a2.set_xlabel("mean verbal confidence")
    a1.legend(fontsize=7, frameon=False)
    fig.suptitle("Selection diagnostic: completed vs admin-censored (95% bootstrap CI)", fontsize=9)
    fig.tight_layout()
    _save(fig, out_dir, stem)
    plt.close(fig)
    return True
