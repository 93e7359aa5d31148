"""Run directories as pandas DataFrames: one row per episode, per step, per generated token, per score.

    from uqh.scoring.export import episodes_df, steps_df, tokens_df, scores_df
    steps = steps_df(["runs/a", "runs/b"])          # one row per parsed step, every predictor a column
    steps.groupby(["run", "stop_reason"]).verbal.mean()

Runs are read through :class:`rundir.RunDir` and the predictor values are the ones the scoring package scores:
the per-step streams of :func:`uqh.scoring.streams.run_data_from_records` (same rows, same order: episodes sorted by
id, steps in order), so ``steps_df(run).verbal`` is ``load_run(run).streams["verbal"]``. ``scores_df`` is the
long format of :func:`uqh.scoring.pipeline.score_run` (the records of ``uqh score --format csv``). A missing value is
a missing value (pandas NA, null in Parquet, an empty CSV cell), never 0.

Column types are pandas' nullable ones: ``string``, ``Int64``, ``Float64``, ``boolean``. ``uqh export`` writes
these frames as Parquet or CSV (:mod:`uqh.cli.export_command`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from uqh.rundir.probes import ProbeDir
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import Episode
from uqh.scoring.registry import PREDICTORS, step_predictors
from uqh.scoring.streams import RunData, fill_probe_streams, run_data_from_records

if TYPE_CHECKING:
    import pandas as pd

    from uqh.scoring.pipeline import ScoreOptions

#: The frames of an export, in the order they are written.
FRAMES = ("episodes", "steps", "tokens", "scores")

_ID_COLUMNS = {"run": "string", "model": "string", "domain": "string", "task": "string", "episode": "string"}
EPISODE_COLUMNS = {
    **_ID_COLUMNS, "sample": "Int64", "stop_reason": "string", "outcome": "Int64", "reward": "Float64",
    "n_steps": "Int64", "step_budget": "Int64", "repairs": "Int64", "calls": "Int64", "retries": "Int64",
    "prompt_tokens": "Int64", "completion_tokens": "Int64", "cost_usd": "Float64", "unpriced_calls": "Int64",
    "seed": "Int64", "source_episode": "string", "branch": "Int64", "prefix_steps": "Int64",
    "started_at": "string", "finished_at": "string",
}
STEP_COLUMNS = {
    **_ID_COLUMNS, "t": "Int64", "action": "string", "observation_chars": "Int64", "repairs": "Int64",
    "verbal_confidence": "Float64", "confidence_raw": "string",
    # then one Float64 column per registered per-step predictor (uqh.scoring.registry.step_predictors())
}
STEP_TAIL_COLUMNS = {"stop_reason": "string", "outcome": "Int64", "reward": "Float64"}
TOKEN_COLUMNS = {
    **_ID_COLUMNS, "role": "string", "t": "Int64", "attempt": "Int64", "accepted": "boolean", "position": "Int64",
    "token": "string", "logprob": "Float64", "in_action": "boolean", "top_tokens": "string", "top_logprobs": "string",
}


@dataclass
class RunRecords:
    """One run directory as exported: its label, reader, episodes (sorted by id) and scoring arrays."""

    label: str
    reader: RunDir
    episodes: list[Episode]
    data: RunData


def load(runs: "Sequence[str | Path | RunDir | RunRecords]", probes: "Sequence[ProbeDir]" = ()) -> list[RunRecords]:
    """Open every run directory (UserError for bad input, before anything else is done); ``probes`` fill the probe
    predictors' streams (:func:`uqh.scoring.streams.fill_probe_streams`)."""
    out = []
    for r in runs:
        if isinstance(r, RunRecords):
            out.append(r)
            continue
        reader = r if isinstance(r, RunDir) else RunDir.open(r)
        episodes = sorted(reader.episodes() if reader.has_episodes_file else [], key=lambda e: e.episode_id)
        data = run_data_from_records(reader.path, reader.manifest, episodes,
                                     (row for row in reader.sidecar() if row.accepted),
                                     user_rows=reader.user_sidecar() if reader.has_user_sidecar else None)
        fill_probe_streams(data, probes)
        label = str(r) if not isinstance(r, RunDir) else str(reader.path)
        out.append(RunRecords(label, reader, episodes, data))
    return out


def _frame(records: list[dict], columns: dict[str, str]) -> "pd.DataFrame":
    import pandas as pd

    frame = pd.DataFrame.from_records(records, columns=list(columns)) if records else pd.DataFrame(
        {c: pd.Series([], dtype=object) for c in columns})
    return frame.astype(columns)


def _ids(run: RunRecords, ep: Episode) -> dict:
    cfg = run.reader.config
    return {"run": run.label, "model": cfg.model, "domain": cfg.domain, "task": ep.task_id, "episode": ep.episode_id}


def _num(x: float) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def episodes_df(runs: "Sequence[str | Path | RunDir | RunRecords]") -> "pd.DataFrame":
    """One row per finished episode: ids, stop reason, outcome, reward, steps, repairs and this episode's own
    calls, tokens and cost (a copied prefix left out; ``cost_usd`` missing when no call was priced)."""
    records = []
    for run in load(runs):
        for ep in run.episodes:
            calls = [a.call for s in ep.steps[ep.prefix_steps:] for a in s.attempts]
            calls += [a.call for a in ep.failed_step or []]
            priced = [c.cost_usd for c in calls if c.cost_usd is not None]
            records.append({
                **_ids(run, ep), "sample": ep.sample_index, "stop_reason": ep.stop_reason.value,
                "outcome": ep.outcome, "reward": ep.reward, "n_steps": ep.n_steps, "step_budget": ep.step_budget,
                "repairs": sum(s.repair_attempts for s in ep.steps) + max(0, len(ep.failed_step or []) - 1),
                "calls": len(calls), "retries": sum(c.retries for c in calls),
                "prompt_tokens": sum(c.usage.prompt_tokens or 0 for c in calls),
                "completion_tokens": sum(c.usage.completion_tokens or 0 for c in calls),
                "cost_usd": sum(priced) if priced else None, "unpriced_calls": len(calls) - len(priced),
                "seed": ep.seed, "source_episode": ep.source_episode_id, "branch": ep.branch_index,
                "prefix_steps": ep.prefix_steps, "started_at": ep.started_at, "finished_at": ep.finished_at,
            })
    return _frame(records, EPISODE_COLUMNS)


def steps_df(runs: "Sequence[str | Path | RunDir | RunRecords]") -> "pd.DataFrame":
    """One row per parsed step: ids, t, the action, the observation's length, repairs, the verbal confidence and
    every registered per-step predictor's value (the scoring streams), and the episode's stop reason, outcome and
    reward."""
    names = [p for p in step_predictors() if p in PREDICTORS]
    columns = {**STEP_COLUMNS, **{p: "Float64" for p in names}, **STEP_TAIL_COLUMNS}
    records = []
    for run in load(runs):
        k = 0
        streams = run.data.streams
        for ep in run.episodes:
            for step in ep.steps:
                rec = {**_ids(run, ep), "t": step.t, "action": step.action,
                       "observation_chars": len(step.observation), "repairs": step.repair_attempts,
                       "verbal_confidence": step.verbal_confidence, "confidence_raw": step.confidence_raw}
                rec.update({p: _num(streams[p][k]) for p in names})
                rec.update(stop_reason=ep.stop_reason.value, outcome=ep.outcome, reward=ep.reward)
                records.append(rec)
                k += 1
    return _frame(records, columns)


def tokens_df(runs: "Sequence[str | Path | RunDir | RunRecords]") -> "pd.DataFrame":
    """One row per generated token of every call (sidecar rows of accepted and rejected attempts): who generated it
    (``role``: the agent, then the simulated user where the run recorded the user's tokens), its logprob, whether it
    lies in the ``<action>`` span (missing for the user, who has none), and its top alternatives (JSON lists of
    tokens and logprobs). A call without logprobs has no rows."""
    records = []
    for run in load(runs):
        by_id = {ep.episode_id: ep for ep in run.episodes}
        for role, rows in (("agent", run.reader.sidecar()), ("user", run.reader.user_sidecar())):
            for row in rows:
                ep = by_id.get(row.episode_id)
                if ep is None or row.tokens is None:
                    continue
                span = row.action_token_range
                for i, tok in enumerate(row.tokens):
                    records.append({
                        **_ids(run, ep), "role": role, "t": row.t, "attempt": row.attempt, "accepted": row.accepted,
                        "position": i, "token": tok.token, "logprob": tok.logprob,
                        "in_action": None if span is None else span[0] <= i < span[1],
                        "top_tokens": json.dumps([a.token for a in tok.top_logprobs], ensure_ascii=False),
                        "top_logprobs": json.dumps([a.logprob for a in tok.top_logprobs]),
                    })
    return _frame(records, TOKEN_COLUMNS)


def scores_df(runs: "Sequence[str | Path | RunDir | RunRecords]", options: "ScoreOptions | None" = None) -> "pd.DataFrame":
    """The long-format scores of every run (:func:`uqh.scoring.long_records.csv_records` of :func:`uqh.scoring.pipeline.score_run`
    under ``options``; default: ``uqh score``'s defaults). Runs without a finished episode are left out."""
    from uqh.scoring.pipeline import ScoreOptions, score_run
    from uqh.scoring.long_records import CSV_FIELDS, csv_records

    options = options or ScoreOptions()
    # the run column is "run" in every exported table (score's CSV calls it run_dir)
    columns = {("run" if f == "run_dir" else f): "string" for f in CSV_FIELDS}
    columns.update({f: "Float64" for f in ("value", "ci_low", "ci_high", "se")})
    columns.update({f: "Int64" for f in ("n_used", "n_complete", "n_censored", "n_skipped_missing")})
    records = []
    for run in load(runs):
        if not run.episodes:
            continue
        res = score_run(run.data, options)
        for rec in csv_records(res):
            rec = {("run" if k == "run_dir" else k): v for k, v in rec.items()}
            rec["run"] = run.label
            records.append({k: (None if v == "" else v) for k, v in rec.items()})
    return _frame(records, columns)


def export_frames(runs: Iterable["str | Path | RunDir"], *, tokens: bool = False,
                  options: "ScoreOptions | None" = None, probes: "Sequence[ProbeDir]" = ()) -> dict[str, "pd.DataFrame"]:
    """Every frame of ``uqh export`` (``tokens`` only when asked: it is the large one), runs read once."""
    loaded = load(list(runs), probes)
    frames = {"episodes": episodes_df(loaded), "steps": steps_df(loaded)}
    if tokens:
        frames["tokens"] = tokens_df(loaded)
    frames["scores"] = scores_df(loaded, options)
    return frames
