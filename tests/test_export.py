"""`uqh export` and uqh.scoring.export: per-episode, per-step, per-token and score DataFrames whose values are the
scoring package's own (the streams it scores, the records of `uqh score`), with declared nullable dtypes."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from uqh.cli import main
from report_fixtures import tau2_like, webshop_like
from uqh.rundir.reader import RunDir
from uqh.scoring.export import (
    EPISODE_COLUMNS,
    STEP_COLUMNS,
    STEP_TAIL_COLUMNS,
    TOKEN_COLUMNS,
    episodes_df,
    export_frames,
    scores_df,
    steps_df,
    tokens_df,
)
from uqh.scoring.pipeline import ScoreOptions, score_run
from uqh.scoring.registry import step_predictors
from uqh.scoring.long_records import csv_records
from uqh.scoring.streams import load_run
from scoring_fixtures import synthetic_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    return [webshop_like(d / "ws"), tau2_like(d / "t2"), synthetic_run(d / "syn", n=12, censored=3, parse_errors=2)]


def _dtypes(frame) -> dict[str, str]:
    return {c: str(t) for c, t in frame.dtypes.items()}


def test_steps_columns_dtypes_and_values_are_the_scoring_streams(runs):
    steps = steps_df(runs)
    predictors = step_predictors()
    assert list(steps.columns) == [*STEP_COLUMNS, *predictors, *STEP_TAIL_COLUMNS]
    assert _dtypes(steps) == {**STEP_COLUMNS, **{p: "Float64" for p in predictors}, **STEP_TAIL_COLUMNS}
    for path in runs:
        data = load_run(path)
        mine = steps[steps.run == str(path)]
        assert len(mine) == int(data.offsets[-1])
        for p in predictors:  # same rows, same order, NaN (missing) exactly where the stream has it
            got = mine[p].to_numpy(dtype=float, na_value=np.nan)
            np.testing.assert_array_equal(got, data.streams[p])
        # one row per step of each episode, episodes in the scoring order (sorted ids)
        assert list(dict.fromkeys(mine.episode)) == list(data.episode_ids)
    ws = steps[steps.run == str(runs[0])]
    h = ws[ws.episode == "h#0"]
    assert h.verbal_confidence.isna().tolist() == [True, False]  # a missing confidence stays missing
    assert h.stop_reason.tolist() == ["clean", "clean"] and h.outcome.tolist() == [0, 0]
    d = ws[ws.episode == "d#0"]
    assert d.outcome.isna().all() and d.stop_reason.iloc[0] == "max_steps"
    assert ws.observation_chars.iloc[0] == len("observation 1 of a#0 <b>&amp;</b>")


def test_episodes_frame(runs):
    eps = episodes_df(runs)
    assert list(eps.columns) == list(EPISODE_COLUMNS) and _dtypes(eps) == EPISODE_COLUMNS
    for path in runs:
        reader = RunDir.open(path)
        mine = eps[eps.run == str(path)]
        assert sorted(mine.episode) == sorted(e.episode_id for e in reader.episodes())
    ws = eps[eps.run == str(runs[0])].set_index("episode")
    assert ws.loc["a#0", "outcome"] == 1 and pd.isna(ws.loc["d#0", "outcome"]) and ws.loc["a#0", "n_steps"] == 2
    assert ws.loc["g#0", "stop_reason"] == "parse_error" and ws.loc["g#0", "repairs"] == 2  # three failed attempts
    assert ws.loc["g#0", "calls"] == 4 and ws.loc["a#0", "calls"] == 2
    assert pd.isna(ws.loc["a#0", "cost_usd"]) and ws.loc["a#0", "unpriced_calls"] == 2  # unpriced: missing, not 0
    assert (ws.domain == "webshop").all() and (ws.model == "openai/fake").all()


def test_tokens_frame(runs):
    toks = tokens_df(runs[:1])
    assert list(toks.columns) == list(TOKEN_COLUMNS) and _dtypes(toks) == TOKEN_COLUMNS
    rows = list(RunDir.open(runs[0]).sidecar())
    assert len(toks) == sum(len(r.tokens) for r in rows if r.tokens)
    assert (toks.role == "agent").all()  # no user sidecar: the simulated user's rows are tests/test_tau2_user_logprobs
    first = toks[(toks.episode == "a#0") & (toks.t == 1)]
    assert first.position.tolist() == [0, 1, 2, 3, 4] and first.in_action.tolist() == [False, True, True, False, False]
    assert first.logprob.iloc[0] == pytest.approx(math.log(0.9))
    assert json.loads(first.top_tokens.iloc[0])[0] == "tok0" and len(json.loads(first.top_logprobs.iloc[0])) == 5


def test_scores_frame_is_the_score_commands_records(runs):
    opts = ScoreOptions(n_bootstrap=30, seed=2)
    scores = scores_df(runs[2:], opts)
    want = csv_records(score_run(load_run(runs[2]), opts))
    assert len(scores) == len(want)
    for got, rec in zip(scores.to_dict("records"), want):
        assert (got["predictor"], got["metric"], got["score"] if not pd.isna(got["score"]) else "") == (
            rec["predictor"], rec["metric"], rec["score"])
        for k in ("value", "ci_low", "ci_high", "se"):
            assert (pd.isna(got[k]) and rec[k] is None) or got[k] == rec[k]
    assert str(scores.value.dtype) == "Float64" and str(scores.n_used.dtype) == "Int64"


def test_every_frame_names_its_run_column_run(runs):
    """Issue 33: the scores frame called it run_dir, the others run."""
    frames = export_frames(runs[:1], options=ScoreOptions(n_bootstrap=0))
    for name, frame in frames.items():
        assert "run" in frame.columns and "run_dir" not in frame.columns, name


def test_uqh_export_parquet_round_trips_and_csv(runs, tmp_path, capsys):
    out = tmp_path / "exp"
    assert main(["export", *map(str, runs), "--to", str(out), "--tokens", "--bootstrap", "20"]) == 0
    assert "steps.parquet" in capsys.readouterr().out
    frames = export_frames(runs, tokens=True, options=ScoreOptions(n_bootstrap=20))
    for name, frame in frames.items():
        back = pd.read_parquet(out / f"{name}.parquet")
        pd.testing.assert_frame_equal(back, frame)  # values and nullable dtypes survive
    csv_out = tmp_path / "csv"
    assert main(["export", str(runs[0]), "--to", str(csv_out), "--format", "csv", "--bootstrap", "0"]) == 0
    steps = pd.read_csv(csv_out / "steps.csv")
    assert len(steps) == len(frames["steps"][frames["steps"].run == str(runs[0])])
    assert sorted(p.name for p in csv_out.iterdir()) == ["episodes.csv", "scores.csv", "steps.csv"]


def test_export_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["export", str(tmp_path / "missing"), "--to", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("uqh export: error: ") and not out.exists()
    assert main(["export", str(runs[0]), "--to", str(runs[1])]) == 2  # never into a run directory
    assert "is a run directory" in capsys.readouterr().err
    assert not (runs[1] / "steps.parquet").exists()


def test_the_steps_table_carries_the_user_and_combined_predictors(tmp_path):
    """With a user sidecar the steps table's user_* / combined_* columns hold the values `uqh score` scores (the
    streams of load_run), not missing values."""
    from report_fixtures import Ep, write_run
    from uqh.rundir.schema import StopReason
    from uqh.scoring.export import steps_df
    from uqh.scoring.streams import load_run

    eps = [Ep(f"t{i}", StopReason.clean, [0.6, 0.7, 0.8], outcome=i % 2, token_p=[0.7, 0.8, 0.9]) for i in range(4)]
    run = write_run(tmp_path / "run", "arithmetic", 5, eps, user_tokens=True)
    table = steps_df([run])
    data = load_run(run)
    for name in ("user_gmean_prob", "user_tokens", "combined_gmean_prob", "combined_min_prob"):
        column = table[name].astype(float).to_numpy()
        assert np.isfinite(column).all(), name
        np.testing.assert_allclose(column, data.streams[name], rtol=0, atol=1e-15)
