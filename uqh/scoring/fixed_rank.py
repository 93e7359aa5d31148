"""Fixed-rank sensitivity analysis (Appendix E).

One trajectory scalar r_i = Φ(F^raw_{i,1:T_i}) is computed from the RAW stream and reused for AUROC, AUPRC
and AURC in every row, so those are identical by construction; only the per-step stream scored by TPS is
transformed: identity, affine compression g(x) = 0.4 + 0.2x, square root, square, and (when given) the
cross-fitted Platt stream.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from uqh.scoring.diagnostics import ScalarDiagnostics, trajectory_scalar
from uqh.scoring.registry import TPS
from uqh.scoring.results import Estimate, FixedRankRow, MetricEstimate, finite_or_none
from uqh.scoring.rules import ScoreRule
from uqh.scoring.tps import tps

RANK_METRICS = ("auroc", "auprc", "aurc")  # depend on the ranking of the scalar only

TRANSFORMS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda x: x,
    "affine 0.4+0.2x": lambda x: 0.4 + 0.2 * x,
    "sqrt": np.sqrt,
    "square": np.square,
}


def fixed_rank_analysis(
    values: np.ndarray,
    offsets: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray,
    rules: list[ScoreRule],
    platt_values: np.ndarray | None = None,
    *,
    predictor: str = "",
) -> list[FixedRankRow]:
    """Appendix E rows (complete trajectories): per transform, AUROC, AUPRC, AURC and the mean TPS per rule."""
    values = np.asarray(values, dtype=float)
    r = trajectory_scalar(values, offsets, weights)
    rank = ScalarDiagnostics(r, y).compute(which=RANK_METRICS)
    streams = {name: f(values) for name, f in TRANSFORMS.items()}
    if platt_values is not None:
        streams["platt"] = np.asarray(platt_values, dtype=float)
    rows = []
    for name, stream in streams.items():
        metrics = [MetricEstimate(metric=k, estimate=Estimate(value=finite_or_none(rank[k][0]))) for k in RANK_METRICS]
        for rule in rules:
            mean = np.mean(tps(stream, offsets, y, rule, weights))
            metrics.append(MetricEstimate(metric=TPS, score=rule.name, estimate=Estimate(value=finite_or_none(mean))))
        rows.append(FixedRankRow(predictor=predictor, transform=name, metrics=metrics))
    return rows


