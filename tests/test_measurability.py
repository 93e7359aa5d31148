"""Measurability: a per-step predictor F_t is a function of the prefix H_t (the task prompt, steps 1..t with their
calls, the observations up to step t - 1's, and the user turns those observations hold). So F_t computed on the
whole trajectory equals F_t computed after the trajectory is cut at t -- the property TPS's propriety rests on."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scoring_fixtures import make_episode, make_row, make_tokens
from uqh.rundir.schema import StopReason
from uqh.scoring.streams import run_data_from_records

USER_PREDICTORS = [f"{role}_{s}" for role in ("user", "combined")
                   for s in ("gmean_prob", "traj_prob", "min_prob", "entropy", "tokens")]


def trajectory(n_steps: int = 5, seed: int = 0):
    """One episode with varied tokens per step, a user turn after every action (t = 0..n: the opening and one reply
    per step, the last one the final reply) and the episode's records."""
    rng = np.random.default_rng(seed)

    def tokens(k):
        out = []
        for _ in range(k):
            p = float(rng.uniform(0.2, 0.95))
            out.append((p, [p, *((1 - p) * np.array([0.6, 0.4])).tolist()]))
        return make_tokens(out)

    ep = make_episode("a#0", "clean", [float(rng.uniform(0.2, 0.9)) for _ in range(n_steps)], outcome=1)
    rows = [make_row("a#0", t, tokens(int(rng.integers(1, 5)))) for t in range(1, n_steps + 1)]
    user = [make_row("a#0", t, tokens(int(rng.integers(1, 4)))) for t in range(0, n_steps + 1)]
    return ep, rows, user


def cut(ep, rows, user, t: int):
    """The records of the prefix H_t: steps 1..t and their calls, the user turns numbered < t (row t answers step t's
    action: it is in step t + 1's information set)."""
    short = ep.model_copy(update={"steps": ep.steps[:t], "n_steps": t, "stop_reason": StopReason.max_steps, "outcome": None})
    return short, [r for r in rows if r.t <= t], [r for r in user if r.t < t]


def streams(ep, rows, user):
    return run_data_from_records(Path("."), None, [ep], rows, user_rows=user).streams


@pytest.mark.parametrize("name", USER_PREDICTORS)
def test_user_streams_are_functions_of_the_prefix(name):
    ep, rows, user = trajectory()
    full = streams(ep, rows, user)[name]
    assert np.isfinite(full).all()
    for t in range(1, len(ep.steps) + 1):
        prefix = streams(*cut(ep, rows, user, t))[name]
        assert prefix[t - 1] == pytest.approx(full[t - 1], rel=1e-12), (name, t)


def test_the_final_reply_enters_no_step():
    ep, rows, user = trajectory()
    without_final = [r for r in user if r.t < len(ep.steps)]
    for name in USER_PREDICTORS:
        np.testing.assert_array_equal(streams(ep, rows, user)[name], streams(ep, rows, without_final)[name])
