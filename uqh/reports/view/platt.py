"""The Platt stream of the viewer's trajectory chart: the report's (``uqh report``'s trace explorer draws the same
one) cross-fitted Platt map of the verbal confidence stream, fitted with the report's weights on the episodes the
viewer has summarised, by :func:`uqh.scoring.analyses.calibrated_stream`. Only arrays are arranged here."""
from __future__ import annotations

from typing import Any

import numpy as np

from uqh.reports.scoring_calls import PRIMARY_PREDICTOR, PRIMARY_WEIGHTS
from uqh.rundir.reader import RunDir
from uqh.scoring.analyses import calibrated_stream
from uqh.scoring.streams import RunData


def platt_by_episode(reader: RunDir, summaries: list[dict[str, Any]],
                     verbal: dict[str, list[float]]) -> dict[str, list[float | None]]:
    """Episode id -> its Platt-calibrated verbal stream (null: missing); empty when no map can be fitted. Episodes
    are ordered by id, as :func:`uqh.scoring.streams.run_data_from_records` orders them, so the cross-fitting folds
    and values equal the report's on the same episodes."""
    rows = sorted(summaries, key=lambda s: s["id"])
    if not rows:
        return {}
    lengths = np.array([s["steps"] for s in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.array([v for s in rows for v in verbal[s["id"]]], dtype=float)
    data = RunData(
        run_dir=reader.path, manifest=reader.manifest,
        episode_ids=np.array([s["id"] for s in rows], dtype=object),
        stop_reason=np.array([s["stop"] for s in rows], dtype=object),
        outcome=np.array([float(s["y"]) if (s["stop"] == "clean" and s["y"] is not None) else np.nan for s in rows]),
        n_steps=lengths, step_budget=np.array([s["budget"] for s in rows], dtype=np.int64), offsets=offsets,
        streams={PRIMARY_PREDICTOR: flat}, task_ids=np.array([s["task"] for s in rows], dtype=object),
    )
    stream = calibrated_stream(data, PRIMARY_PREDICTOR, PRIMARY_WEIGHTS)
    if stream is None:
        return {}
    return {eid: [float(v) if np.isfinite(v) else None for v in vals] for eid, vals in stream.by_episode().items()}
