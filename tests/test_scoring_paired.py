"""`uqh score A B --paired`: Δ = B − A per metric on the shared tasks, CI by a paired bootstrap over task ids --
checked against a case computed by hand (closed-form scores, the resamples redrawn and averaged here)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from uqh.rundir.errors import UserError
from uqh.rundir.schema import Manifest, RunConfig
from uqh.scoring.bootstrap import resample_counts
from uqh.scoring.paired import compare_runs, shared_tasks
from uqh.scoring.pipeline import ScoreOptions
from uqh.scoring.registry import step_predictors
from uqh.scoring.rules import parse_score
from uqh.scoring.streams import RunData

STEPS = 2  # every trajectory: two steps with the same forecast, so the weight schedule does not matter


def make_run(name: str, episodes: list[tuple[str, int, float, int]]) -> RunData:
    """(task, sample, forecast F of every step, outcome Y) per episode; every episode clean."""
    tasks = sorted({t for t, *_ in episodes})
    cfg = RunConfig(domain="arithmetic", task_ids=tasks, model=f"openai/{name}", step_budget=5,
                    prompt_sha256="0" * 64, package_version="0.1.0")
    manifest = Manifest(config=cfg, config_hash=cfg.config_hash(), created_at="2026-01-01T00:00:00Z",
                        system_prompt="s")
    n = len(episodes)
    values = np.repeat([f for _, _, f, _ in episodes], STEPS).astype(float)
    return RunData(
        run_dir=Path(name), manifest=manifest,
        episode_ids=np.array([f"{t}#{k}" for t, k, _, _ in episodes], dtype=object),
        stop_reason=np.array(["clean"] * n, dtype=object),
        outcome=np.array([float(y) for *_, y in episodes]), n_steps=np.full(n, STEPS), step_budget=np.full(n, 5),
        offsets=np.arange(0, STEPS * n + 1, STEPS, dtype=np.int64),
        streams={p: values.copy() for p in step_predictors()},
        task_ids=np.array([t for t, *_ in episodes], dtype=object),
    )


A = make_run("a", [("t0", 0, 0.9, 1), ("t1", 0, 0.6, 1), ("t2", 0, 0.3, 0), ("t3", 0, 0.8, 0),
                   ("t4", 0, 0.5, 1)])  # t4: only in A
B = make_run("b", [("t0", 0, 0.7, 1), ("t1", 0, 0.5, 1), ("t1", 1, 0.9, 0), ("t2", 0, 0.2, 0), ("t3", 0, 0.4, 0),
                   ("t5", 0, 0.5, 0)])  # t1 twice; t5: only in B


def log_score(f: float, y: int) -> float:
    return math.log(f) if y else math.log(1 - f)


def brier(f: float, y: int) -> float:
    return -((f - y) ** 2)


# per shared task (t0..t3): the scores of each run's trajectories of that task
SCORES_A = {"log": [[log_score(0.9, 1)], [log_score(0.6, 1)], [log_score(0.3, 0)], [log_score(0.8, 0)]],
            "brier": [[brier(0.9, 1)], [brier(0.6, 1)], [brier(0.3, 0)], [brier(0.8, 0)]]}
SCORES_B = {"log": [[log_score(0.7, 1)], [log_score(0.5, 1), log_score(0.9, 0)], [log_score(0.2, 0)],
                    [log_score(0.4, 0)]],
            "brier": [[brier(0.7, 1)], [brier(0.5, 1), brier(0.9, 0)], [brier(0.2, 0)], [brier(0.4, 0)]]}


def by_hand(per_task: list[list[float]], counts: np.ndarray) -> np.ndarray:
    """Mean trajectory score when task j is drawn counts[:, j] times (all its trajectories with it)."""
    sums = np.array([sum(s) for s in per_task])
    sizes = np.array([len(s) for s in per_task])
    return (counts @ sums) / (counts @ sizes)


OPTS = dict(predictors=("verbal",), calibrations=("none",), scores=(parse_score("log"), parse_score("brier")),
            auq=False, seed=3)


def test_delta_and_its_paired_bootstrap_ci_equal_a_hand_computed_case():
    res = compare_runs(A, B, ScoreOptions(n_bootstrap=400, **OPTS))
    assert shared_tasks(A, B) == ["t0", "t1", "t2", "t3"]
    assert (res.shared_tasks, res.only_a, res.only_b) == (4, 1, 1)
    (row,) = res.rows
    assert (row.predictor, row.calibration, row.n_a, row.n_b) == ("verbal", "raw", 4, 5)
    counts = np.concatenate(list(resample_counts(4, 400, seed=3)))
    for score in ("log", "brier"):
        m = row.get("tps", score)
        a_point = np.mean([s for task in SCORES_A[score] for s in task])
        b_point = np.mean([s for task in SCORES_B[score] for s in task])
        assert m.a.value == pytest.approx(a_point, abs=1e-12) and m.b.value == pytest.approx(b_point, abs=1e-12)
        assert m.delta.delta == pytest.approx(b_point - a_point, abs=1e-12)
        diffs = by_hand(SCORES_B[score], counts) - by_hand(SCORES_A[score], counts)
        lo, hi = np.quantile(diffs, [0.025, 0.975])
        assert (m.delta.ci_low, m.delta.ci_high) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))
        assert m.delta.se == pytest.approx(np.std(diffs, ddof=1), abs=1e-12)
        assert m.delta.delta_over_se == pytest.approx((b_point - a_point) / np.std(diffs, ddof=1), abs=1e-9)
    # the two runs' own CIs come from the same resamples
    a_boot = by_hand(SCORES_A["log"], counts)
    assert row.get("tps", "log").a.ci_low == pytest.approx(np.quantile(a_boot, 0.025), abs=1e-12)


def test_swapping_the_runs_flips_the_sign_and_the_interval():
    ab = compare_runs(A, B, ScoreOptions(n_bootstrap=200, **OPTS)).rows[0].get("tps", "log").delta
    ba = compare_runs(B, A, ScoreOptions(n_bootstrap=200, **OPTS)).rows[0].get("tps", "log").delta
    assert ba.delta == pytest.approx(-ab.delta) and ba.se == pytest.approx(ab.se)
    assert (ba.ci_low, ba.ci_high) == (pytest.approx(-ab.ci_high), pytest.approx(-ab.ci_low))


def test_a_run_compared_with_itself_has_delta_zero_and_a_degenerate_interval():
    m = compare_runs(A, A, ScoreOptions(n_bootstrap=100, **OPTS)).rows[0].get("tps", "log").delta
    assert m.delta == 0.0 and m.ci_low == 0.0 and m.ci_high == 0.0


def test_no_bootstrap_gives_the_point_difference_only():
    m = compare_runs(A, B, ScoreOptions(n_bootstrap=0, **OPTS)).rows[0].get("tps", "brier")
    assert m.delta.delta is not None and m.delta.ci_low is None and m.a.ci_low is None


def test_runs_without_shared_tasks_are_one_user_error():
    other = make_run("c", [("x9", 0, 0.5, 1)])
    with pytest.raises(UserError, match="share no task id"):
        compare_runs(A, other, ScoreOptions(n_bootstrap=0, **OPTS))
