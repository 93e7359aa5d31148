"""Scoring speed: vectorised numpy pipeline vs a straightforward per-trajectory Python loop.

Workload (issue 4): 100,000 trajectories x 20 steps; three score families (log, Brier, beta(2,4)); cross-fitted
Platt calibration (Appendix D); five diagnostics (AUROC, AUPRC, AURC, T-ECE, T-Brier) on the linear-front
trajectory scalar; 1,000 paired bootstrap resamples of everything (3 TPS means + 5 diagnostics, raw and Platt).

The loop baseline computes the same numbers one trajectory (and one resample) at a time in plain Python
(floats, lists, math, scalar scipy.special.betainc). It is run on a subsample and extrapolated linearly
(its sorts are n log n, so the extrapolation flatters the loop); on that subsample the vectorised pipeline
is run on the same data and the same bootstrap resamples and every number is checked to agree.

Usage: .venv/bin/python benchmarks/scoring_speed.py [--n 100000] [--steps 20] [--boot 1000]
Writes benchmarks/results/scoring_speed.md.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import time
from pathlib import Path

import numpy as np
from scipy.special import beta as beta_fn
from scipy.special import betainc

from uqh.scoring.bootstrap import paired_bootstrap
from uqh.scoring.calibration import cross_fit_platt, sigmoid
from uqh.scoring.diagnostics import ALL_DIAGNOSTICS, DIAGNOSTICS, ScalarDiagnostics, trajectory_scalar
from uqh.scoring.registry import step_predictors
from uqh.scoring.rules import parse_score
from uqh.scoring.tps import tps
from uqh.scoring.weights import trajectory_weights

RULES = ("log", "brier", "beta:2,4")


def make_data(n: int, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    offsets = np.arange(n + 1, dtype=np.int64) * steps
    z = rng.normal(0, 1.5, n)
    y = (rng.random(n) < sigmoid(z)).astype(float)
    values = sigmoid(np.repeat(z, steps) + rng.normal(0, 0.5, n * steps) + 1.5)  # over-confident raw stream
    ids = np.array([f"task{i:06d}#0" for i in range(n)], dtype=object)
    return values, offsets, y, ids


# ------------------------------------------------------------------------------------------ vectorised


def vectorised(values, offsets, y, ids, n_boot, seed=0, workers=1, which=DIAGNOSTICS):
    """``which``: the diagnostics bootstrapped (``ALL_DIAGNOSTICS`` adds agentuq's AUARC and correlations, as
    `uqh score` computes them for every predictor)."""
    n = offsets.size - 1
    rules = [parse_score(s) for s in RULES]
    w = trajectory_weights(offsets, "linear-front")
    platt = cross_fit_platt(values, offsets, y, np.ones(n, bool), ids, w)
    point, per_traj, diags = {}, [], {}
    keys = []
    for name, v in (("raw", values), ("platt", platt.values)):
        for r in rules:
            per_traj.append(tps(v, offsets, y, r, w))
            keys.append(f"{name}:tps_{r.name}")
        diags[name] = ScalarDiagnostics(trajectory_scalar(v, offsets, w), y)
    tps_matrix = np.stack(per_traj, axis=1)  # (n, 6)
    for k, col in zip(keys, tps_matrix.T):
        point[k] = float(col.mean())
    for name, d in diags.items():
        for m, v in d.compute(which=which).items():
            point[f"{name}:{m}"] = float(v[0])

    def stat(counts):
        out = {}
        means = np.einsum("ij,jk->ik", counts, tps_matrix) / counts.sum(axis=1)[:, None]
        for j, k in enumerate(keys):
            out[k] = means[:, j]
        for name, d in diags.items():
            for m, v in d.compute(counts, which, integer_weights=True).items():
                out[f"{name}:{m}"] = v
        return out

    boot = paired_bootstrap(stat, n, n_boot, seed, workers=workers)
    maps = [(m.a, m.b, m.mu, m.sigma, m.fallback) for m in platt.maps]
    return point, boot, maps


# ------------------------------------------------------------------------------------------ plain Python loop


def loop_weights(T):
    return [2.0 * (T - t + 1) / (T * (T + 1)) for t in range(1, T + 1)]


def loop_score(rule, p, y):
    if rule == "log":
        p = min(max(p, 1e-6), 1 - 1e-6)
        return math.log(p) if y == 1 else math.log(1 - p)
    if rule == "brier":
        return -((p - y) ** 2)
    a, b = 2.0, 4.0
    if y == 1:
        return -beta_fn(a, b + 1) * betainc(b + 1, a, 1 - p)
    return -beta_fn(a + 1, b) * betainc(a + 1, b, p)


def loop_logit(p):
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p) - math.log1p(-p)


def loop_sigmoid(u):
    return 0.5 * (1.0 + math.tanh(0.5 * u))


def loop_fit(recs, lam=1.0):
    """recs: list of (forecast, y, w). Same procedure as uqh.scoring.calibration.fit_platt, in plain Python."""
    sw = sum(w for _, _, w in recs)
    xr = [loop_logit(f) for f, _, _ in recs]
    mu = sum(w * x for x, (_, _, w) in zip(xr, recs)) / sw
    sd = math.sqrt(sum(w * (x - mu) ** 2 for x, (_, _, w) in zip(xr, recs)) / sw)
    xs = [(x - mu) / max(sd, 1e-6) for x in xr]
    ybar = sum(w * yy for _, yy, w in recs) / sw
    a_fb = loop_logit(ybar)
    if ybar <= 0 or ybar >= 1:
        return a_fb, 0.0, mu, sd

    def obj(a, b):
        tot = 0.0
        for x, (_, yy, w) in zip(xs, recs):
            u = a + b * x
            tot += w * ((max(u, 0) + math.log1p(math.exp(-abs(u)))) - yy * u)
        return tot + 0.5 * lam * b * b

    a, b = a_fb, 0.0
    f = obj(a, b)
    for _ in range(100):
        ga = gb = haa = hab = hbb = 0.0
        for x, (_, yy, w) in zip(xs, recs):
            p = loop_sigmoid(a + b * x)
            r = w * (p - yy)
            h = w * p * (1 - p)
            ga += r
            gb += r * x
            haa += h
            hab += h * x
            hbb += h * x * x
        gb += lam * b
        hbb += lam
        det = (haa + 1e-12) * (hbb + 1e-12) - hab * hab
        sa = ((hbb + 1e-12) * ga - hab * gb) / det
        sb = ((haa + 1e-12) * gb - hab * ga) / det
        t = 1.0
        while True:
            ca, cb = a - t * sa, b - t * sb
            fc = obj(ca, cb)
            if fc <= f + 1e-12 or t < 1e-8:
                break
            t *= 0.5
        a, b, f_old, f = ca, cb, f, fc
        if max(abs(t * sa), abs(t * sb)) < 1e-12 or abs(f_old - f) < 1e-15 * max(1.0, abs(f)):
            break
    if b < 0:
        return a_fb, 0.0, mu, sd
    return a, b, mu, sd


def loop_platt(trajs, ys, ids):
    order = {}
    k = 0
    half = [0] * len(trajs)
    for label in (0.0, 1.0):
        members = sorted((ids[i], i) for i in range(len(trajs)) if ys[i] == label)
        for _, i in members:
            half[i] = k % 2
            k += 1
    maps = []
    for h in (0, 1):
        recs = []
        for i, tr in enumerate(trajs):
            if half[i] == h:
                for f, w in zip(tr, loop_weights(len(tr))):
                    recs.append((f, ys[i], w))
        maps.append(loop_fit(recs))
    out = []
    for i, tr in enumerate(trajs):
        a, b, mu, sd = maps[1 - half[i]]
        out.append([min(max(loop_sigmoid(a + b * (loop_logit(f) - mu) / max(sd, 1e-6)), 1e-6), 1 - 1e-6) for f in tr])
    del order
    return out, maps


def loop_groups(c, y):
    """Distinct values ascending with (count, failures); ties at 12 decimals."""
    pairs = sorted((round(ci, 12), yi) for ci, yi in zip(c, y))
    groups = []
    for ci, yi in pairs:
        if groups and groups[-1][0] == ci:
            groups[-1][1] += 1
            groups[-1][2] += 1 - yi
        else:
            groups.append([ci, 1, 1 - yi])
    return groups


def loop_diagnostics(c, y, K=10):
    groups = loop_groups(c, y)
    N = len(c)
    F = sum(1 - yi for yi in y)
    S = N - F
    # AUROC (failure positive)
    num, s_seen = 0.0, 0.0
    for _, t, f in groups:
        s = t - f
        num += f * ((S - s_seen - s) + 0.5 * s)
        s_seen += s
    auroc = num / (F * S) if F and S else float("nan")
    # AUPRC
    ap, tp, pp = 0.0, 0.0, 0.0
    for _, t, f in groups:
        tp += f
        pp += t
        ap += f * tp / pp
    auprc = ap / F if F else float("nan")
    # AURC, expected over random tie-breaking
    tot, nb, fb = 0.0, 0, 0.0
    for _, t, f in reversed(groups):
        for j in range(1, t + 1):
            tot += (fb + j * f / t) / (nb + j)
        nb += t
        fb += f
    aurc = tot / N
    # T-ECE with tie-aware quantile bins
    sums = [[0.0, 0.0] for _ in range(K)]
    start = 0
    for ci, t, f in groups:
        b = min(int(math.floor(start * K / N + 1e-9)), K - 1)
        sums[b][0] += t - f
        sums[b][1] += t * ci
        start += t
    tece = sum(abs(s - cc) for s, cc in sums) / N
    tbrier = sum((round(ci, 12) - yi) ** 2 for ci, yi in zip(c, y)) / N
    return {"auroc": auroc, "auprc": auprc, "aurc": aurc, "t_ece": tece, "t_brier": tbrier}


def loop_pipeline(values, offsets, y, ids, n_boot, seed=0):
    trajs = [list(map(float, values[a:b])) for a, b in zip(offsets[:-1], offsets[1:])]
    ys = list(map(float, y))
    idl = list(ids)
    t0 = time.perf_counter()
    platt, maps = loop_platt(trajs, ys, idl)
    per = {}
    scal = {}
    for name, tr_list in (("raw", trajs), ("platt", platt)):
        for rule in ("log", "brier", "beta(2,4)"):
            key = "log" if rule == "log" else ("brier" if rule == "brier" else "beta")
            per[f"{name}:tps_{rule}"] = [
                sum(w * loop_score(key, f, yy) for f, w in zip(tr, loop_weights(len(tr)))) for tr, yy in zip(tr_list, ys)
            ]
        scal[name] = [sum(w * f for f, w in zip(tr, loop_weights(len(tr)))) / sum(loop_weights(len(tr))) for tr in tr_list]
    point = {k: sum(v) / len(v) for k, v in per.items()}
    for name, c in scal.items():
        for m, v in loop_diagnostics(c, ys).items():
            point[f"{name}:{m}"] = v
    t_point = time.perf_counter() - t0
    gen = np.random.default_rng(seed)
    n = len(trajs)
    boot = {k: [] for k in point}
    t1 = time.perf_counter()
    for _ in range(n_boot):
        idx = gen.integers(0, n, n).tolist()
        for k, v in per.items():
            boot[k].append(sum(v[i] for i in idx) / n)
        yy = [ys[i] for i in idx]
        for name, c in scal.items():
            for m, v in loop_diagnostics([c[i] for i in idx], yy).items():
                boot[f"{name}:{m}"].append(v)
    t_boot = time.perf_counter() - t1
    return point, {k: np.array(v) for k, v in boot.items()}, maps, t_point, t_boot


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--loop-n", type=int, default=2000, help="subsample size for the Python loop")
    ap.add_argument("--loop-boot", type=int, default=20, help="bootstrap resamples for the Python loop")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each pipeline; the fastest is reported")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "scoring_speed.md"))
    args = ap.parse_args()

    values, offsets, y, ids = make_data(args.n, args.steps)
    # best of `--repeat` runs for both pipelines: the machine is shared, the minimum is the least disturbed run
    t_vec = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        point, boot, _ = vectorised(values, offsets, y, ids, args.boot)
        t_vec = min(t_vec, time.perf_counter() - t0)
    print(f"vectorised: {args.n} x {args.steps}, {args.boot} resamples: {t_vec:.2f} s")
    # the same workload with agentuq's four diagnostics added (AUARC, Pearson, Spearman, Kendall tau-b), as `uqh
    # score` bootstraps them for every predictor; the ratio is their per-predictor cost
    t_all = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        point_all, boot_all, _ = vectorised(values, offsets, y, ids, args.boot, which=ALL_DIAGNOSTICS)
        t_all = min(t_all, time.perf_counter() - t0)
    assert all(np.array_equal(boot[k], boot_all[k]) for k in boot)  # the five are unchanged
    n_stream = len(step_predictors())
    print(f"vectorised with agentuq's four diagnostics: {t_all:.2f} s ({t_all / t_vec:.2f}x); {n_stream} stream "
          f"predictors -> about {n_stream * t_all:.0f} s for all of them")
    t0 = time.perf_counter()
    point2, boot2, _ = vectorised(values, offsets, y, ids, args.boot, workers=2)
    t_vec2 = time.perf_counter() - t0
    assert all(np.allclose(boot[k], boot2[k], rtol=0, atol=1e-12) for k in boot)
    print(f"vectorised, bootstrap on 2 threads: {t_vec2:.2f} s")

    # loop baseline on a subsample + agreement check on the same data and resamples
    sv, so, sy, sids = make_data(args.loop_n, args.steps, seed=1)
    t_point = t_boot = float("inf")
    for _ in range(args.repeat):
        lp, lb, lmaps, tp_, tb_ = loop_pipeline(sv, so, sy, sids, args.loop_boot)
        t_point, t_boot = min(t_point, tp_), min(t_boot, tb_)
    vp, vb, vmaps = vectorised(sv, so, sy, sids, args.loop_boot)
    max_point = max(abs(lp[k] - vp[k]) for k in lp)
    max_boot = max(float(np.max(np.abs(lb[k] - vb[k]))) for k in lb)
    max_map = max(abs(a - b) for m1, m2 in zip(lmaps, vmaps) for a, b in zip(m1[:4], m2[:4]))
    assert set(lp) == set(vp) and max_point < 1e-9 and max_boot < 1e-9 and max_map < 1e-8, (max_point, max_boot, max_map)
    scale = args.n / args.loop_n
    t_loop = t_point * scale + t_boot * scale * (args.boot / args.loop_boot)
    speedup = t_loop / t_vec
    print(f"loop (extrapolated): {t_loop:.0f} s; speed-up {speedup:.0f}x; max |diff| point {max_point:.1e}, "
          f"bootstrap {max_boot:.1e}, Platt maps {max_map:.1e}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    lines = [
        "# Scoring speed (benchmarks/scoring_speed.py)",
        "",
        f"Workload: {args.n:,} trajectories x {args.steps} steps; TPS under log, Brier, beta(2,4) (linear-front); "
        f"cross-fitted Platt; AUROC, AUPRC, AURC, T-ECE, T-Brier; {args.boot:,} paired bootstrap resamples of all "
        "of them, raw and Platt.",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| vectorised total (same process; best of {args.repeat}) | {t_vec:.2f} s |",
        f"| Python loop, measured on {args.loop_n:,} trajectories (best of {args.repeat}): point estimates | {t_point:.2f} s |",
        f"| Python loop, measured on {args.loop_n:,} trajectories: {args.loop_boot} resamples | {t_boot:.2f} s |",
        f"| Python loop extrapolated to the full workload (linear in n and resamples) | {t_loop:,.0f} s |",
        f"| speed-up | {speedup:,.0f}x |",
        f"| vectorised total, bootstrap chunks on 2 threads (same numbers) | {t_vec2:.2f} s ({t_loop / t_vec2:,.0f}x) |",
        f"| agreement on the subsample (max abs diff): point / bootstrap / Platt (a, b, mu, sd) | "
        f"{max_point:.1e} / {max_boot:.1e} / {max_map:.1e} |",
        f"| vectorised total per predictor with agentuq's AUARC, Pearson, Spearman, Kendall tau-b added (best of "
        f"{args.repeat}) | {t_all:.2f} s ({t_all / t_vec:.2f}x the five alone) |",
        f"| all {n_stream} registered stream predictors (per-predictor time x {n_stream}; extrapolated) | "
        f"{n_stream * t_all:.0f} s |",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (shared with other jobs), numpy {np.__version__}.",
        "",
        "Point estimates of the full workload (raw / Platt):",
        "",
        "| metric | raw | Platt |",
        "|---|---|---|",
    ]
    for m in ("tps_log", "tps_brier", "tps_beta(2,4)", *ALL_DIAGNOSTICS):
        lo_r, hi_r = np.quantile(boot_all[f"raw:{m}"], [0.025, 0.975])
        lo_p, hi_p = np.quantile(boot_all[f"platt:{m}"], [0.025, 0.975])
        lines.append(f"| {m} | {point_all[f'raw:{m}']:.5f} [{lo_r:.5f}, {hi_r:.5f}] | "
                     f"{point_all[f'platt:{m}']:.5f} [{lo_p:.5f}, {hi_p:.5f}] |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
