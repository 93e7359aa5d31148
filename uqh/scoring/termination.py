"""Termination counts (Appendix G.1, Table 6) and the selection diagnostic (Fig. 2B) of a list of episodes.

Categories (Appendix G): ``clean`` with an observed Y enters complete-observation scoring; ``max_steps`` is
administratively censored; ``parse_error`` is an informative failure, excluded; other stops (Tau2 ``tool_error``
/ ``env_terminated``) have no label and are excluded.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
from pydantic import BaseModel

from uqh.rundir.schema import Episode, StopReason
from uqh.scoring.results import Estimate

OTHER_REASONS = [r for r in StopReason if r not in (StopReason.clean, StopReason.max_steps, StopReason.parse_error)]


class TerminationCounts(BaseModel):
    total: int
    clean_y: int  # clean stops (Y observed unless the domain gave none)
    max_steps: int
    parse_error: int
    other: int
    other_breakdown: dict[str, int]  # other stop reason -> count (reasons with none left out)
    uncensored_n: int  # clean stops with an observed Y
    successes: int
    success_rate: float | None = None  # ȳ of the uncensored
    working_n: int  # uncensored + max_steps
    censoring_rate: float | None = None  # max_steps / working n


def termination_counts(episodes: list[Episode]) -> TerminationCounts:
    c = Counter(e.stop_reason for e in episodes)
    labelled = [e.outcome for e in episodes if e.stop_reason == StopReason.clean and e.outcome is not None]
    working = len(labelled) + c[StopReason.max_steps]
    return TerminationCounts(
        total=len(episodes),
        clean_y=c[StopReason.clean],
        max_steps=c[StopReason.max_steps],
        parse_error=c[StopReason.parse_error],
        other=sum(c[r] for r in OTHER_REASONS),
        other_breakdown={r.value: c[r] for r in OTHER_REASONS if c[r]},
        uncensored_n=len(labelled),
        successes=int(sum(labelled)),
        success_rate=(sum(labelled) / len(labelled)) if labelled else None,
        working_n=working,
        censoring_rate=(c[StopReason.max_steps] / working) if working else None,
    )


def mean_ci(values: np.ndarray, *, n_boot: int, seed: int) -> Estimate:
    """Mean with a 95% percentile bootstrap interval over the values (no interval for fewer than two)."""
    if values.size == 0:
        return Estimate()
    mean = float(values.mean())
    if values.size < 2:
        return Estimate(value=mean)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    boots = values[idx].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return Estimate(value=mean, ci_low=float(lo), ci_high=float(hi))


def trajectory_mean_confidence(e: Episode) -> float | None:
    """Mean of the numeric per-step verbal confidences of one trajectory; None if it has none."""
    vals = [c for c in e.verbal_confidences if c is not None]
    return sum(vals) / len(vals) if vals else None


class SelectionSubset(BaseModel):
    n: int
    mean_steps: Estimate
    mean_confidence: Estimate
    n_without_confidence: int


class SelectionDiagnostic(BaseModel):
    """Completed (clean, Y observed) vs administratively censored (max_steps) trajectories of one run."""

    completed: SelectionSubset
    censored: SelectionSubset
    steps_difference: float | None = None  # censored − completed
    confidence_difference: float | None = None


def _subset(eps: list[Episode], n_boot: int, seed: int) -> SelectionSubset:
    confs = [trajectory_mean_confidence(e) for e in eps]
    return SelectionSubset(
        n=len(eps),
        mean_steps=mean_ci(np.array([e.n_steps for e in eps], dtype=float), n_boot=n_boot, seed=seed),
        mean_confidence=mean_ci(np.array([c for c in confs if c is not None], dtype=float), n_boot=n_boot, seed=seed + 1),
        n_without_confidence=sum(1 for x in confs if x is None),
    )


def selection_diagnostic(episodes: list[Episode], *, n_boot: int = 2000, seed: int = 0) -> SelectionDiagnostic:
    """Fig. 2B: mean observed steps and mean verbal confidence (per trajectory the mean of its numeric raw
    <confidence> values; trajectories without any are counted, not imputed) of each subset, with 95% percentile
    bootstrap intervals over trajectories, and the censored − completed differences."""
    done = _subset([e for e in episodes if e.stop_reason == StopReason.clean and e.outcome is not None], n_boot, seed)
    cens = _subset([e for e in episodes if e.stop_reason == StopReason.max_steps], n_boot, seed)

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    return SelectionDiagnostic(
        completed=done, censored=cens,
        steps_difference=diff(done.mean_steps.value, cens.mean_steps.value),
        confidence_difference=diff(done.mean_confidence.value, cens.mean_confidence.value),
    )
