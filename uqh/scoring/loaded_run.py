"""A run directory from Python: :func:`load` (``uqh.load``) returns its manifest and its episodes, steps and tokens as
pandas DataFrames; :func:`score` (``uqh.score``) scores it as ``uqh score`` does.

    import uqh
    run = uqh.load("runs/a")
    run.steps.groupby("stop_reason").verbal_confidence.mean()
    scores = uqh.score(run)                 # the RunScores of `uqh score runs/a --format json`

The frames are those of ``uqh export`` (:mod:`uqh.scoring.export`: same columns, nullable types, a missing value is
missing); the run is read once, through :class:`uqh.rundir.reader.RunDir`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from uqh.rundir.errors import UserError
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import Manifest
from uqh.scoring.export import episodes_df, load as load_records, steps_df, tokens_df
from uqh.scoring.pipeline import ScoreOptions, score_run
from uqh.scoring.results import RunScores
from uqh.scoring.streams import load_run

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LoadedRun", "load", "score"]


@dataclass(frozen=True)
class LoadedRun:
    """One run directory, read: where it is, its manifest (config, system prompt, execution) and one DataFrame
    per episode, per parsed step and per generated token (:mod:`uqh.scoring.export`'s columns)."""

    path: Path
    manifest: Manifest
    episodes: pd.DataFrame
    steps: pd.DataFrame
    tokens: pd.DataFrame
    reader: RunDir

    @property
    def config_hash(self) -> str:
        return self.manifest.config_hash


def load(run_dir: str | Path | RunDir) -> LoadedRun:
    """Read a run directory (UserError, one line, when it is not one) into a :class:`LoadedRun`."""
    reader = run_dir if isinstance(run_dir, RunDir) else RunDir.open(run_dir)
    records = load_records([reader])
    return LoadedRun(path=reader.path, manifest=reader.manifest, episodes=episodes_df(records),
                     steps=steps_df(records), tokens=tokens_df(records), reader=reader)


def score(run: str | Path | RunDir | LoadedRun, options: ScoreOptions | None = None) -> RunScores:
    """Score one run as ``uqh score RUN`` does (``options``: its flags; None: its defaults) and return the
    :class:`uqh.scoring.results.RunScores` that ``uqh score RUN --format json`` prints. A run without a finished
    episode is a UserError, as there."""
    reader = run.reader if isinstance(run, LoadedRun) else run if isinstance(run, RunDir) else RunDir.open(run)
    data = load_run(reader)
    if len(data.episode_ids) == 0:
        raise UserError(f"{reader.path} has no finished episodes yet; run `uqh run` first")
    return score_run(data, options or ScoreOptions())
