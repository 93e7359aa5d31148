"""Self-consistency as a trajectory-level predictor (Mouzouni, "Black-box reliability certification", §4.6, Definition 4.8) for the scoring tables.

Both values come from the canonical answers recorded with the episodes (``Episode.info["canonical_answer"]``,
``uqh.rundir.schema.CANONICAL_ANSWER_KEY``) of all samples of the episode's task in the same run, and are constant
along the trajectory:

- ``sc_mode_freq`` -- the consensus strength of the task: the share of its K samples that give its most common
  answer (the "no answer" class is not an answer: a task whose samples mostly fail to answer has a low value);
- ``sc_agreement`` -- the share of the task's K samples that give this episode's own answer (0 for an episode
  without an answer): the self-consistency confidence in the episode's answer, equal to the mode frequency for an
  episode that answered with the mode.

Missing (NaN, never imputed): an episode whose task has a sample without a recorded canonical answer (runs recorded
before canonical answers were, or a domain without them), a task with a single sample, a continuation branch.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Callable, Sequence

import numpy as np

from uqh.rundir.schema import CANONICAL_ANSWER_KEY, Episode


def _task_counts(episodes: Sequence[Episode]) -> dict[str, Counter | None]:
    """Per task: the counts of its samples' canonical classes (None class included), or None when unknown."""
    groups: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        if ep.source_episode_id is None:
            groups[ep.task_id].append(ep)
    out: dict[str, Counter | None] = {}
    for task, eps in groups.items():
        if len(eps) < 2 or any(CANONICAL_ANSWER_KEY not in ep.info for ep in eps):
            out[task] = None
        else:
            out[task] = Counter(ep.info[CANONICAL_ANSWER_KEY] for ep in eps)
    return out


def _per_episode(episodes: Sequence[Episode], count: Callable[[Episode, Counter], int]) -> np.ndarray:
    """Per episode: ``count(episode, its task's class counts)`` over the task's samples (NaN: missing)."""
    counts = _task_counts(episodes)
    out = np.full(len(episodes), np.nan)
    for i, ep in enumerate(episodes):
        c = counts.get(ep.task_id) if ep.source_episode_id is None else None
        if c is not None:
            out[i] = count(ep, c) / sum(c.values())
    return out


def mode_frequency(episodes: Sequence[Episode]) -> np.ndarray:
    """Per episode: the share of its task's samples that give the task's most common answer (NaN: missing)."""

    def mode_count(ep: Episode, c: Counter) -> int:
        return max((n for cls, n in c.items() if cls is not None), default=0)

    return _per_episode(episodes, mode_count)


def agreement(episodes: Sequence[Episode]) -> np.ndarray:
    """Per episode: the share of its task's samples that give the episode's own answer (0 without an answer)."""

    def own_count(ep: Episode, c: Counter) -> int:
        cls = ep.info[CANONICAL_ANSWER_KEY]
        return 0 if cls is None else c[cls]

    return _per_episode(episodes, own_count)
