"""Table-2-shaped and Table-5-shaped results: the scoring pipeline from a run directory to rows.

:func:`score_run` turns one :class:`~scoring.streams.RunData` into a JSON-ready dict:

- ``rows``: one per predictor × {raw, Platt} plus the base-rate row (Appendix F, Tables 2–4): n used /
  complete / censored / skipped, the five scalar diagnostics on the complete trajectories, TPS for every
  requested score family (with the run's censoring mode), each with a paired-bootstrap 95% CI and SE; Platt
  rows also carry Δ and Δ/SE against the raw row (§6.1). With censoring, the complete-only TPS and
  Δ_practice = TPS_cen-ext − TPS_complete-only (§6.3) are added.
- ``auq``: scalar AUQ aggregators Φ_last, Φ_avg, Φ_min per stream (Table 5; no TPS for them).
- ``calibration``: Appendix D diagnostics of every Platt fit (slopes, fallback, calibrated range).
- ``fixed_rank``: Appendix E rows when requested.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scoring.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, compare, interval, paired_bootstrap, standard_error
from scoring.calibration import cross_fit_platt
from scoring.diagnostics import AGGREGATORS, ScalarDiagnostics, trajectory_scalar
from scoring.fixed_rank import fixed_rank_analysis
from scoring.rules import DEFAULT_SCORES, ScoreRule, parse_score
from scoring.streams import BASE_RATE, PREDICTOR_LABELS, PREDICTORS, RunData, Sample, build_sample
from scoring.tps import posterior_weight, tps
from scoring.weights import DEFAULT_WEIGHTS, trajectory_weights


@dataclass
class ScoreOptions:
    predictors: tuple[str, ...] = PREDICTORS
    calibrations: tuple[str, ...] = ("none", "platt")
    scores: tuple[ScoreRule, ...] = field(default_factory=lambda: tuple(parse_score(s) for s in DEFAULT_SCORES))
    weights: str = DEFAULT_WEIGHTS
    censoring: str = "exclude"
    q_z: dict[str, float] | None = None
    include_parse_errors: bool = False
    missing_qz: str = "error"
    n_bootstrap: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    auq: bool = True
    fixed_rank: bool = False
    level: float = 0.95

    def settings(self) -> dict:
        return {
            "predictors": list(self.predictors),
            "calibrations": list(self.calibrations),
            "scores": [r.name for r in self.scores],
            "weights": self.weights,
            "censoring": self.censoring,
            "include_parse_errors": self.include_parse_errors,
            "missing_qz": self.missing_qz,
            "bootstrap": self.n_bootstrap,
            "seed": self.seed,
            "ci_level": self.level,
        }


def _f(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def _stream_statistics(values, sample: Sample, w, rules, eta, complete, c_complete_diag, auq_diags):
    """A closure computing every bootstrapped quantity of one stream for a (b, n) count matrix."""
    per_traj = {f"tps_{r.name}": tps(values, sample.offsets, eta, r, w) for r in rules}
    any_censored = not complete.all()

    def stat(counts: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        tot = counts.sum(axis=1)
        cc = counts[:, complete]
        tot_c = cc.sum(axis=1)
        for k, v in per_traj.items():
            out[k] = np.einsum("ij,j->i", counts, v) / tot
            if any_censored:
                with np.errstate(invalid="ignore", divide="ignore"):
                    comp = np.einsum("ij,j->i", cc, v[complete]) / tot_c
                out[f"{k}_complete_only"] = comp
                out[f"delta_practice_{k[4:]}"] = out[k] - comp
        if c_complete_diag is not None:
            out.update(c_complete_diag.compute(cc))
        for name, diag in auq_diags.items():
            for m, v in diag.compute(cc).items():
                out[f"{name}:{m}"] = v
        return out

    return stat


def evaluate_predictor(sample: Sample, opts: ScoreOptions) -> dict:
    """Rows (raw / Platt) of one predictor on one sample, with paired-bootstrap CIs and Δ/SE vs raw."""
    rules = list(opts.scores)
    n = sample.n
    w = trajectory_weights(sample.offsets, opts.weights, sample.horizon)
    complete = sample.delta.copy()
    q = sample.q_z if opts.censoring == "exact" else None
    calibration = None
    streams: dict[str, np.ndarray | None] = {"raw": sample.values}
    notes: dict[str, str] = {}
    if "platt" in opts.calibrations and sample.predictor != BASE_RATE:
        try:
            if n == 0:
                raise ValueError("no trajectories to calibrate")
            fit = cross_fit_platt(sample.values, sample.offsets, sample.y, sample.delta, sample.episode_ids, w)
            streams["platt"] = fit.values
            calibration = fit.diagnostics()
        except ValueError as exc:
            streams["platt"] = None
            notes["platt"] = f"Platt unavailable: {exc}"
    if "none" not in opts.calibrations and sample.predictor != BASE_RATE:
        streams.pop("raw")
    result_rows = []
    stats = {}
    points = {}
    if n > 0:
        eta = posterior_weight(sample.y, sample.delta, q)
        y_c = sample.y[complete]
        for cal, values in streams.items():
            if values is None:
                continue
            c = trajectory_scalar(values, sample.offsets, w)[complete]
            diag = ScalarDiagnostics(c, y_c) if complete.any() else None
            auq = {}
            if opts.auq and sample.predictor != BASE_RATE and complete.any():
                for name, phi in AGGREGATORS.items():
                    auq[name] = ScalarDiagnostics(phi(values, sample.offsets)[complete], y_c)
            stat = _stream_statistics(values, sample, w, rules, eta, complete, diag, auq)
            stats[cal] = stat
            points[cal] = {k: float(v[0]) for k, v in stat(np.ones((1, n))).items()}
    boots: dict[str, dict[str, np.ndarray]] = {}
    if opts.n_bootstrap > 0 and stats:
        def joint(counts):
            out = {}
            for cal, st in stats.items():
                for k, v in st(counts).items():
                    out[f"{cal}|{k}"] = v
            return out

        joint_samples = paired_bootstrap(joint, n, opts.n_bootstrap, opts.seed)
        for key, v in joint_samples.items():
            cal, k = key.split("|", 1)
            boots.setdefault(cal, {})[k] = v
    auq_rows = []
    for cal in streams:
        label = "raw" if cal == "raw" else "platt"
        row = {
            "predictor": sample.predictor,
            "label": PREDICTOR_LABELS[sample.predictor],
            "calibration": label,
            "n_used": sample.n,
            "n_complete": int(complete.sum()),
            "n_censored": int((~complete).sum()),
            "n_skipped_missing": sample.counts["skipped_missing"],
            "ybar": _f(sample.ybar),
            "metrics": {},
            "note": notes.get(cal),
        }
        if cal in points:
            for k, v in points[cal].items():
                entry = {"value": _f(v)}
                if cal in boots and k in boots[cal]:
                    lo, hi = interval(boots[cal][k], opts.level)
                    entry.update({"ci": [_f(lo), _f(hi)], "se": _f(standard_error(boots[cal][k]))})
                if ":" in k:
                    agg, m = k.split(":", 1)
                    auq_row = next((r for r in auq_rows if r["aggregator"] == agg and r["calibration"] == label), None)
                    if auq_row is None:
                        auq_row = {"predictor": sample.predictor, "label": PREDICTOR_LABELS[sample.predictor],
                                   "aggregator": agg, "calibration": label, "n": int(complete.sum()), "metrics": {}}
                        auq_rows.append(auq_row)
                    auq_row["metrics"][m] = entry
                else:
                    row["metrics"][k] = entry
            if cal == "platt" and "raw" in points and boots.get("raw") and boots.get("platt"):
                row["vs_raw"] = {
                    k: {kk: (_f(vv) if not isinstance(vv, list) else [_f(x) for x in vv])
                        for kk, vv in compare(points["raw"][k], points["platt"][k], boots["raw"][k], boots["platt"][k], opts.level).items()}
                    for k in points["platt"] if ":" not in k and k in boots["raw"]
                }
        result_rows.append(row)
    fixed = None
    if opts.fixed_rank and sample.predictor != BASE_RATE and n > 0 and complete.any() and "raw" in streams:
        sub = sample.subset(complete)
        w_sub = trajectory_weights(sub.offsets, opts.weights, sub.horizon)
        platt_sub = None
        if streams.get("platt") is not None:
            platt_sub = streams["platt"][np.repeat(complete, np.diff(sample.offsets))]
        fixed = fixed_rank_analysis(sub.values, sub.offsets, sub.y, w_sub, rules, platt_sub)
    return {"rows": result_rows, "auq": auq_rows, "calibration": calibration, "fixed_rank": fixed}


def score_run(run: RunData, opts: ScoreOptions) -> dict:
    """Score one run directory: Table-2 rows (predictors × raw/Platt + base rate), Table-5 AUQ rows, Appendix D
    diagnostics and sample counts."""
    rows, auq, calib, fixed = [], [], {}, {}
    counts = None
    order = [p for p in opts.predictors if p != BASE_RATE] + ([BASE_RATE] if BASE_RATE in opts.predictors else [])
    for predictor in order:
        sample = build_sample(run, predictor, censoring=opts.censoring, q_z=opts.q_z,
                              include_parse_errors=opts.include_parse_errors, missing_qz=opts.missing_qz)
        if counts is None:
            counts = {k: v for k, v in sample.counts.items() if k not in ("skipped_missing", "used", "used_complete", "used_censored")}
        res = evaluate_predictor(sample, opts)
        rows += res["rows"]
        auq += res["auq"]
        if res["calibration"] is not None:
            calib[predictor] = res["calibration"]
        if res["fixed_rank"] is not None:
            fixed[predictor] = res["fixed_rank"]
    out = {
        "run_dir": run.label,
        "domain": run.manifest.config.domain,
        "model": run.manifest.config.model,
        "settings": opts.settings(),
        "counts": counts or {},
        "rows": rows,
        "auq": auq if opts.auq else [],
        "calibration": calib,
    }
    if opts.fixed_rank:
        out["fixed_rank"] = fixed
    return out


def pool_runs(runs: list[RunData]) -> RunData:
    """Concatenate run directories into one (episode ids prefixed ``<k>:`` so they stay unique)."""
    if len(runs) == 1:
        return runs[0]
    offs = [0]
    for r in runs:
        offs += list(offs[-1] + r.offsets[1:])
    return RunData(
        run_dir=type(runs[0].run_dir)("+".join(str(r.run_dir) for r in runs)),
        manifest=runs[0].manifest,
        episode_ids=np.concatenate([np.array([f"{k}:{e}" for e in r.episode_ids], dtype=object) for k, r in enumerate(runs)]),
        stop_reason=np.concatenate([r.stop_reason for r in runs]),
        outcome=np.concatenate([r.outcome for r in runs]),
        n_steps=np.concatenate([r.n_steps for r in runs]),
        step_budget=np.concatenate([r.step_budget for r in runs]),
        offsets=np.array(offs, dtype=np.int64),
        streams={k: np.concatenate([r.streams[k] for r in runs]) for k in runs[0].streams},
    )


# ------------------------------------------------------------------------------------------ rendering

METRIC_ORDER = ("auroc", "auprc", "aurc", "t_ece", "t_brier")
METRIC_HEAD = {"auroc": "AUROC↑", "auprc": "AUPRC↑", "aurc": "AURC↓", "t_ece": "T-ECE↓", "t_brier": "T-Brier↓"}


def _fmt(v: float | None, tps_beta: bool = False) -> str:
    if v is None:
        return "—"
    return f"{v:.5f}" if (tps_beta and abs(v) < 0.1) else f"{v:.3f}"


def table_columns(result: dict) -> list[str]:
    cols = list(METRIC_ORDER)
    for s in result["settings"]["scores"]:
        cols.append(f"tps_{s}")
    if result["settings"]["censoring"] != "exclude":
        for s in result["settings"]["scores"]:
            cols += [f"tps_{s}_complete_only", f"delta_practice_{s}"]
    return cols


def column_header(col: str) -> str:
    if col in METRIC_HEAD:
        return METRIC_HEAD[col]
    if col.startswith("delta_practice_"):
        return f"Δpractice {col[len('delta_practice_'):]}"
    if col.endswith("_complete_only"):
        return f"TPS {col[4:-len('_complete_only')]} (complete-only)↑"
    return f"TPS {col[4:]}↑"


def row_label(row: dict) -> str:
    if row["predictor"] == BASE_RATE:
        return row["label"]
    return f"{row['label']} ({'raw' if row['calibration'] == 'raw' else 'Platt'})"


def render_table(result: dict, console=None) -> None:
    """Print a rich table in the shape of the paper's Table 2 (and Table 5 / Δ-SE tables) to stdout."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=200)
    s = result["settings"]
    c = result["counts"]
    excl = ", ".join(f"{k[len('excluded_'):]}={v}" for k, v in c.items() if k.startswith("excluded_") and v)
    console.print(
        f"[bold]{result['run_dir']}[/bold]  domain={result['domain']}  model={result['model']}  "
        f"weights={s['weights']}  censoring={s['censoring']}  bootstrap={s['bootstrap']} (seed {s['seed']})"
    )
    console.print(
        f"episodes={c.get('episodes')}  complete={c.get('complete')}  censored={c.get('censored')}"
        + (f"  parse_errors_as_censored={c.get('parse_errors_included_as_censored')}" if s["include_parse_errors"] else "")
        + (f"  excluded: {excl}" if excl else "")
    )
    cols = table_columns(result)
    t = Table(title="Per-step predictors (Table 2 shape; diagnostics on complete trajectories, failure-oriented)")
    t.add_column("Predictor")
    t.add_column("n")
    t.add_column("skipped")
    for col in cols:
        t.add_column(column_header(col), justify="right")
    for row in result["rows"]:
        cells = [row_label(row), str(row["n_used"]), str(row["n_skipped_missing"])]
        for col in cols:
            m = row["metrics"].get(col)
            cells.append(_fmt(m["value"] if m else None, tps_beta=col.startswith("tps_beta") or col.startswith("delta_practice_beta")))
        t.add_row(*cells)
    console.print(t)
    notes = [f"{row_label(r)}: {r['note']}" for r in result["rows"] if r.get("note")]
    for n in notes:
        console.print(f"note: {n}")
    platt_rows = [r for r in result["rows"] if r.get("vs_raw")]
    if platt_rows:
        t2 = Table(title="Raw → Platt: Δ (Δ/SE, paired bootstrap)")
        t2.add_column("Predictor")
        keys = [k for k in cols if k in platt_rows[0]["vs_raw"]]
        for k in keys:
            t2.add_column(column_header(k), justify="right")
        for r in platt_rows:
            cells = [r["label"]]
            for k in keys:
                d = r["vs_raw"].get(k)
                if not d or d["delta"] is None:
                    cells.append("—")
                else:
                    z = d["delta_over_se"]
                    cells.append(f"{d['delta']:+.3g} ({'—' if z is None else f'{z:.1f}'})")
            t2.add_row(*cells)
        console.print(t2)
    if result.get("auq"):
        t3 = Table(title="Scalar AUQ aggregators (Table 5 shape; no TPS)")
        t3.add_column("Scalar predictor")
        t3.add_column("n")
        for col in METRIC_ORDER:
            t3.add_column(METRIC_HEAD[col], justify="right")
        for r in result["auq"]:
            cal = "raw" if r["calibration"] == "raw" else "Platt"
            cells = [f"{r['label']} Φ_{r['aggregator']} {cal}", str(r["n"])]
            cells += [_fmt(r["metrics"].get(m, {}).get("value")) for m in METRIC_ORDER]
            t3.add_row(*cells)
        console.print(t3)
    for pred, d in result.get("calibration", {}).items():
        a, b = d["split_A"], d["split_B"]
        rng = d["calibrated_range"]
        console.print(
            f"Platt {PREDICTOR_LABELS[pred]}: slope A {a['b_fitted']:.4f}{' (fallback)' if a['fallback'] else ''}, "
            f"slope B {b['b_fitted']:.4f}{' (fallback)' if b['fallback'] else ''}, "
            f"calibrated range [{rng[0]:.3f}, {rng[1]:.3f}]" if rng else ""
        )
    for pred, rows in (result.get("fixed_rank") or {}).items():
        t4 = Table(title=f"Fixed-rank analysis (Appendix E): {PREDICTOR_LABELS[pred]}")
        keys = [k for k in rows[0] if k != "transform"]
        t4.add_column("Transform")
        for k in keys:
            t4.add_column(column_header(k), justify="right")
        for r in rows:
            t4.add_row(r["transform"], *[_fmt(r[k], tps_beta=k.startswith("tps_beta")) for k in keys])
        console.print(t4)


CSV_FIELDS = ("run_dir", "table", "predictor", "calibration", "aggregator", "metric", "value", "ci_low", "ci_high", "se",
              "n_used", "n_complete", "n_censored", "n_skipped_missing")


def csv_records(result: dict) -> list[dict]:
    """Long-format records: one per (row, metric)."""
    recs = []
    for row in result["rows"]:
        for k, m in row["metrics"].items():
            ci = m.get("ci") or [None, None]
            recs.append({"run_dir": result["run_dir"], "table": "predictors", "predictor": row["predictor"],
                         "calibration": row["calibration"], "aggregator": "", "metric": k, "value": m["value"],
                         "ci_low": ci[0], "ci_high": ci[1], "se": m.get("se"), "n_used": row["n_used"],
                         "n_complete": row["n_complete"], "n_censored": row["n_censored"],
                         "n_skipped_missing": row["n_skipped_missing"]})
    for row in result.get("auq", []):
        for k, m in row["metrics"].items():
            ci = m.get("ci") or [None, None]
            recs.append({"run_dir": result["run_dir"], "table": "auq", "predictor": row["predictor"],
                         "calibration": row["calibration"], "aggregator": row["aggregator"], "metric": k,
                         "value": m["value"], "ci_low": ci[0], "ci_high": ci[1], "se": m.get("se"), "n_used": row["n"],
                         "n_complete": row["n"], "n_censored": 0, "n_skipped_missing": ""})
    return recs
