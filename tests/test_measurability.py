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
    rows = []
    for t in range(1, n_steps + 1):
        k = int(rng.integers(1, 5))
        rows.append(make_row("a#0", t, tokens(k), action_range=(0, k)))
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


def run_of(ep, rows, user=None):
    return run_data_from_records(Path("."), None, [ep], rows, user_rows=user)


def test_process_features_and_saup_are_functions_of_the_prefix():
    from uqh.scoring.process_features import FEATURES, prefix_features

    ep, rows, user = trajectory(n_steps=6, seed=2)
    full = run_of(ep, rows, user)
    full_features = prefix_features(full.signals, full.offsets, full.step_budget)
    assert full_features.shape == (6, len(FEATURES)) and np.isfinite(full_features).all()
    for t in range(1, 7):
        short_ep, short_rows, short_user = cut(ep, rows, user, t)
        short = run_of(short_ep, short_rows, short_user)
        np.testing.assert_allclose(prefix_features(short.signals, short.offsets, short.step_budget)[t - 1],
                                   full_features[t - 1], rtol=1e-12, atol=1e-12)
        assert short.streams["saup"][t - 1] == pytest.approx(full.streams["saup"][t - 1], rel=1e-12)


def test_the_applied_htc_model_at_t_does_not_change_when_later_steps_are_removed():
    """A fitted HTC model applied to the prefix features: its value at step t is the same on the whole trajectory
    and on the trajectory cut at t (the features at t read nothing after t)."""
    from uqh.scoring.learned import fit_logistic
    from uqh.scoring.process_features import FEATURES, prefix_features

    eps = [trajectory(n_steps=5, seed=s) for s in range(12)]
    feats, labels = [], []
    for i, (ep, rows, user) in enumerate(eps):
        data = run_of(ep, rows, user)
        feats.append(prefix_features(data.signals, data.offsets, data.step_budget))
        labels += [float(i % 2)] * 5
    x = np.vstack(feats)
    model = fit_logistic(x, np.array(labels), np.ones(len(labels)), list(FEATURES))
    ep, rows, user = trajectory(n_steps=5, seed=99)
    full = run_of(ep, rows, user)
    applied = model(prefix_features(full.signals, full.offsets, full.step_budget))
    for t in range(1, 6):
        short = run_of(*cut(ep, rows, user, t))
        assert model(prefix_features(short.signals, short.offsets, short.step_budget))[t - 1] == pytest.approx(
            applied[t - 1], rel=1e-12)


def test_every_registered_per_step_predictor_is_a_function_of_the_prefix():
    """All of them at once (self-consistency is a trajectory predictor -- one value per episode from its final
    answer -- and probes come from probe directories: neither is a per-step function of the records)."""
    from uqh.scoring.registry import PREDICTORS, step_predictors

    names = [n for n in step_predictors() if not PREDICTORS[n].is_trajectory and PREDICTORS[n].probe is None]
    assert {"verbal", "token_traj_prob", "user_entropy", "combined_min_prob", "saup"} <= set(names)
    ep, rows, user = trajectory(n_steps=5, seed=7)
    full = run_of(ep, rows, user).streams
    for t in range(1, 6):
        short = run_of(*cut(ep, rows, user, t)).streams
        for name in names:
            np.testing.assert_allclose(short[name][t - 1], full[name][t - 1], rtol=1e-12, err_msg=f"{name} at {t}")


def test_tiny_trajectory_probabilities_rank_through_uqh_score(tmp_path, capsys):
    """Defect 3 end to end: trajectory probabilities exp(−cumulative NLL) of about 1e-120..1e-30 keep their order in
    `uqh score` (they were one tie at 0: AUROC 0.5, Spearman and Kendall null)."""
    import json

    from scoring_fixtures import write_run_dir
    from uqh.cli import main

    eps, rows = [], []
    for i, (n_tokens, y) in enumerate([(60, 0), (50, 0), (40, 1), (30, 0), (20, 1), (15, 1)]):
        ep = make_episode(f"t{i}#0", "clean", [0.5], outcome=y)
        eps.append(ep)
        rows.append(make_row(ep.episode_id, 1, make_tokens([(0.01, [0.01, 0.99])] * n_tokens)))
    run = write_run_dir(tmp_path / "run", eps, rows)
    assert main(["score", str(run), "--predictor", "token_traj_prob", "--calibration", "none", "--bootstrap", "0",
                 "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    values = {m["metric"]: m["estimate"]["value"] for m in res["rows"][0]["metrics"]}
    assert values["auroc"] == pytest.approx(8 / 9) and values["kendall_failure"] > 0.4
    assert values["spearman_failure"] is not None and values["spearman_failure"] > 0.5
