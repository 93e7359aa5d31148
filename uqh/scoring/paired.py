"""Paired comparison of two runs on the tasks both ran: "is model A better calibrated than model B?"

Both runs are restricted to their shared task ids; every metric of every predictor stream (raw, and the
cross-fitted Platt stream fitted on that restricted sample) is computed as :func:`uqh.scoring.pipeline.score_run`
computes it, and the difference b − a gets a paired-bootstrap CI: each resample draws task ids with replacement
and applies the same multiplicity to both runs' trajectories of each task (all samples of a task move together),
so the variation the two runs share through the tasks cancels in Δ (§6.1's pairing, over tasks instead of
trajectories).
"""
from __future__ import annotations

import numpy as np

from uqh.rundir.errors import UserError
from uqh.scoring.bootstrap import compare, interval, paired_bootstrap, standard_error
from uqh.scoring.pipeline import ScoreOptions, platt_stream, stream_statistic
from uqh.scoring.registry import METRICS, get_predictor, predictor_label
from uqh.scoring.results import Comparison, Estimate, PairedComparison, PairedMetric, PairedRow, finite_or_none
from uqh.scoring.streams import RunData, Sample, build_sample




def shared_tasks(a: RunData, b: RunData) -> list[str]:
    """Task ids both runs have finished episodes of (sorted)."""
    return sorted(set(map(str, a.tasks)) & set(map(str, b.tasks)))


def _estimate(point: float, samples: np.ndarray | None, level: float) -> Estimate:
    if samples is None:
        return Estimate(value=finite_or_none(point))
    lo, hi = interval(samples, level)
    return Estimate(value=finite_or_none(point), ci_low=finite_or_none(lo), ci_high=finite_or_none(hi), se=finite_or_none(standard_error(samples)))


def _streams(sample: Sample, opts: ScoreOptions) -> dict[str, tuple[np.ndarray | None, str | None]]:
    spec = get_predictor(sample.predictor)
    out: dict[str, tuple[np.ndarray | None, str | None]] = {}
    if "none" in opts.calibrations or not spec.calibratable:
        out["raw"] = (sample.values, None)
    if "platt" in opts.calibrations and spec.calibratable:
        out["platt"] = platt_stream(sample, opts)
    return out


def compare_runs(a: RunData, b: RunData, opts: ScoreOptions, opts_b: ScoreOptions | None = None) -> PairedComparison:
    """Every metric of ``b`` minus ``a`` on their shared tasks (module docstring). UserError when they share none.
    ``opts_b``: ``opts`` with ``b``'s own q_Z (episode ids repeat across runs); default ``opts``."""
    q_z_of = {"a": opts.q_z, "b": (opts_b or opts).q_z}
    tasks = shared_tasks(a, b)
    if not tasks:
        raise UserError(f"--paired needs runs of the same tasks: {a.run_dir} and {b.run_dir} share no task id")
    index = {t: i for i, t in enumerate(tasks)}
    keep = set(tasks)
    ra = a.subset(np.isin(a.tasks.astype(str), list(keep)))
    rb = b.subset(np.isin(b.tasks.astype(str), list(keep)))
    task_of = {run: dict(zip(map(str, r.episode_ids), map(str, r.tasks))) for run, r in (("a", ra), ("b", rb))}
    rows: list[PairedRow] = []
    for predictor in opts.predictor_names():
        samples = {run: build_sample(r, predictor, censoring=opts.censoring, q_z=q_z_of[run],
                                     include_parse_errors=opts.include_parse_errors, missing_qz=opts.missing_qz,
                                     labels=opts.labels, learned=opts.learned_settings())
                   for run, r in (("a", ra), ("b", rb))}
        streams = {run: _streams(s, opts) for run, s in samples.items()}
        # trajectory -> position of its task among the shared tasks
        where = {run: np.array([index[task_of[run][str(e)]] for e in s.episode_ids], dtype=np.int64)
                 for run, s in samples.items()}
        for cal in streams["a"]:
            (va, note_a), (vb, note_b) = streams["a"][cal], streams["b"][cal]
            sa, sb = samples["a"], samples["b"]
            note = "; ".join(f"{run}: {n}" for run, n in (("a", note_a), ("b", note_b)) if n) or None
            row = PairedRow(predictor=predictor, label=predictor_label(predictor), calibration=cal, n_a=sa.n,
                            n_b=sb.n, note=note)
            rows.append(row)
            if va is None or vb is None or sa.n == 0 or sb.n == 0:
                continue
            stat_a, stat_b = stream_statistic(sa, va, opts), stream_statistic(sb, vb, opts)
            point_a = {k: float(v[0]) for k, v in stat_a(np.ones((1, sa.n))).items()}
            point_b = {k: float(v[0]) for k, v in stat_b(np.ones((1, sb.n))).items()}
            wa, wb = where["a"], where["b"]

            def joint(task_counts: np.ndarray, stat_a=stat_a, stat_b=stat_b, wa=wa, wb=wb) -> dict:
                out = {("a", k): v for k, v in stat_a(task_counts[:, wa]).items()}
                out.update({("b", k): v for k, v in stat_b(task_counts[:, wb]).items()})
                return out

            boots = paired_bootstrap(joint, len(tasks), opts.n_bootstrap, opts.seed) if opts.n_bootstrap else {}
            keys = sorted(point_a.keys() & point_b.keys(), key=lambda k: (list(METRICS).index(k.metric),
                                                                       str(k.score)))
            for key in keys:
                ba, bb = boots.get(("a", key)), boots.get(("b", key))
                if ba is not None and bb is not None:
                    c = compare(point_a[key], point_b[key], ba, bb, opts.level)
                    delta = Comparison(delta=finite_or_none(c["delta"]), se=finite_or_none(c["se"]), delta_over_se=finite_or_none(c["delta_over_se"]),
                                       ci_low=finite_or_none(c["ci"][0]), ci_high=finite_or_none(c["ci"][1]))
                else:
                    delta = Comparison(delta=finite_or_none(point_b[key] - point_a[key]))
                row.metrics.append(PairedMetric(metric=key.metric, score=key.score,
                                                a=_estimate(point_a[key], ba, opts.level),
                                                b=_estimate(point_b[key], bb, opts.level), delta=delta))
    return PairedComparison(
        run_a=a.label, run_b=b.label, shared_tasks=len(tasks), only_a=len(set(map(str, a.tasks)) - keep),
        only_b=len(set(map(str, b.tasks)) - keep), settings=opts.settings(), rows=rows,
    )
