"""The trace explorer's data: per run and trajectory, its steps and every predictor's per-step values.

Values come from the scored :class:`uqh.scoring.streams.RunData` (the registered per-step predictors), the Platt stream
from :func:`uqh.scoring.analyses.calibrated_stream` (collected in :mod:`uqh.reports.scoring_calls`) and the base rate
from the main scoring result; missing values are null (the plot leaves a gap).
"""
from __future__ import annotations

import math
from typing import Any

from uqh.reports.scoring_calls import PRIMARY_PREDICTOR, ScoredRun
from uqh.scoring.registry import BASE_RATE, PREDICTORS, predictor_label, step_predictors


def _clean(v: float | None) -> float | None:
    return float(v) if (v is not None and math.isfinite(v)) else None


#: Line styles of the raw predictor streams, in registry order: colour-blind-safe colours (Okabe-Ito) and distinct
#: dash patterns, so that two series never differ by colour alone. The Platt stream is dashed in its predictor's
#: colour, the base rate dotted grey.
STYLES = [("#0072B2", ""), ("#D55E00", "10 2 2 2"), ("#009E73", "8 3"), ("#CC79A7", "2 2"), ("#E69F00", "8 3 2 3"),
          ("#56B4E9", "4 2"), ("#000000", "1 3"), ("#999933", "12 4")]
PLATT_DASH = "6 4"
BASE_RATE_STYLE = ("#777777", "2 3")


def style_of(index: int) -> dict[str, str]:
    color, dash = STYLES[index % len(STYLES)]
    return {"color": color, "dash": dash}


def trace_data(scored: list[ScoredRun], max_traces: int) -> dict[str, Any]:
    """Per run, per trajectory: steps (action, observation) and every predictor's per-step values (null = missing).
    Predictors without a single value in a run are left out of its plot and table and listed in ``missing``."""
    runs_out = []
    for sr in scored:
        if sr.pooled:
            continue
        data = sr.data
        index = {str(e): i for i, e in enumerate(data.episode_ids)}
        platt = {}
        if sr.platt_trace is not None:
            platt = {eid: [_clean(v) for v in vals] for eid, vals in sr.platt_trace.by_episode().items()}
        base_row = sr.results.main.row(BASE_RATE, "raw")
        ybar = base_row.ybar if base_row is not None else None
        # the predictors scored by default (the opt-in token signals stay out of the chart: uqh view shows them)
        every = [p for p in step_predictors() if p in data.streams and PREDICTORS[p].default]
        names = [p for p in every if data.has_values(p)]
        style = {p: style_of(i) for i, p in enumerate(names)}  # by drawn series: no two alike up to len(STYLES)
        missing = [predictor_label(p) for p in every if p not in names]
        predictors = [{"key": p, "label": predictor_label(p), **style[p]} for p in names]
        if platt:
            predictors.append({"key": f"{PRIMARY_PREDICTOR}_platt", "label": predictor_label(PRIMARY_PREDICTOR) + " (Platt)",
                               "color": style.get(PRIMARY_PREDICTOR, style_of(0))["color"], "dash": PLATT_DASH})
        if ybar is not None:
            predictors.append({"key": BASE_RATE, "label": f"Base rate ȳ = {ybar:.3f}", "color": BASE_RATE_STYLE[0],
                               "dash": BASE_RATE_STYLE[1]})
        episodes = sorted(sr.run.episodes, key=lambda e: e.episode_id)
        out_eps = []
        for ep in episodes[:max_traces]:
            i = index.get(ep.episode_id)
            if i is None:
                continue
            a, b = int(data.offsets[i]), int(data.offsets[i + 1])
            values = {p: [_clean(v) for v in data.streams[p][a:b]] for p in names}
            if ep.episode_id in platt:
                values[f"{PRIMARY_PREDICTOR}_platt"] = platt[ep.episode_id]
            if ybar is not None:
                values[BASE_RATE] = [ybar] * (b - a)
            out_eps.append({
                "id": ep.episode_id,
                "task": ep.task_id,
                "stop": ep.stop_reason.value,
                "y": ep.outcome,
                "steps": [{"t": st.t, "action": st.action[:600], "obs": st.observation[:1200],
                           "conf_raw": st.confidence_raw} for st in ep.steps],
                "values": values,
                "failed": [{"attempt": at.attempt, "error": at.error, "raw": at.text_with_calls[:600]}
                           for at in (ep.failed_step or [])],
                "judgments": sr.judgments.get(ep.episode_id, []),
            })
        runs_out.append({"label": sr.label, "domain": sr.run.domain, "predictors": predictors, "missing": missing,
                         "episodes": out_eps, "truncated": len(episodes) > max_traces})
    return {"runs": runs_out}
