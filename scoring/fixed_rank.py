"""Fixed-rank sensitivity analysis (Appendix E).

One trajectory scalar r_i = Φ(F^raw_{i,1:T_i}) is computed from the RAW stream and reused for AUROC, AUPRC
and AURC in every row, so those are identical by construction; only the per-step stream scored by TPS is
transformed: identity, affine compression g(x) = 0.4 + 0.2x, square root, square, and (when given) the
cross-fitted Platt stream.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from scoring.diagnostics import ScalarDiagnostics, trajectory_scalar
from scoring.rules import ScoreRule
from scoring.tps import tps

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
) -> list[dict]:
    """Rows ``{transform, auroc, auprc, aurc, tps_<rule>...}`` of Appendix E (complete trajectories)."""
    values = np.asarray(values, dtype=float)
    r = trajectory_scalar(values, offsets, weights)
    rank = ScalarDiagnostics(r, y).compute(which=("auroc", "auprc", "aurc"))
    streams = {name: f(values) for name, f in TRANSFORMS.items()}
    if platt_values is not None:
        streams["platt"] = np.asarray(platt_values, dtype=float)
    rows = []
    for name, stream in streams.items():
        row = {"transform": name, **{k: float(v[0]) for k, v in rank.items()}}
        for rule in rules:
            row[f"tps_{rule.name}"] = float(np.mean(tps(stream, offsets, y, rule, weights)))
        rows.append(row)
    return rows
