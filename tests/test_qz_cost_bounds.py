"""The q_Z cost benchmark's floor for any stop rule (``benchmarks/qz_cost.py::oracle_bayes``) against closed forms.

Under q ~ U[0, 1], n outcomes that all agree leave q ~ Beta(n + 1, 1) (or its mirror), whose best interval of
half-width 0.1 holds 1 - 0.8^(n+1) of the probability; outcomes that disagree hold less. Each success count
0..n is equally likely (1 / (n + 1)), so the share of prefixes an oracle can stop at n is 2 / (n + 1).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def qz_cost():
    spec = importlib.util.spec_from_file_location("qz_cost", ROOT / "benchmarks" / "qz_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("n", [3, 5, 9])
def test_oracle_stops_exactly_the_agreeing_paths_at_the_first_count_that_allows_it(qz_cost, n):
    share = 1 - 0.8 ** (n + 1)
    just_below = qz_cost.oracle_bayes("uniform", 0.1, n + 1, level=share - 1e-4, grid_size=10000)
    assert just_below["stopped_early"] == pytest.approx(2 / (n + 1), abs=1e-3)  # grid of 10,000 cells
    assert just_below["coverage"] >= share - 1e-4
    just_above = qz_cost.oracle_bayes("uniform", 0.1, n + 1, level=share + 1e-4, grid_size=10000)
    assert just_above["stopped_early"] == 0.0
    assert just_above["branches"] == pytest.approx(1.0)


def test_oracle_cannot_stop_a_uniform_prefix_at_half_width_0_1_within_ten_branches(qz_cost):
    # 1 - 0.8^11 = 0.914 < 0.95: not even the oracle stops early, so every rule runs all M = 10 branches
    r = qz_cost.oracle_bayes("uniform", 0.1, 10, level=0.95, grid_size=4000)
    assert r["stopped_early"] == 0.0 and r["branches"] == pytest.approx(1.0)


def test_lower_bound_half_width_is_the_n_failures_bound(qz_cost):
    # at q = 1 - 0.05^(1/n), n failures happen with probability exactly 0.05
    for n in (1, 5, 10):
        u = 2 * qz_cost.lower_bound_half_width(n)
        assert (1 - u) ** n == pytest.approx(0.05)
    assert qz_cost.lower_bound_half_width(10) == pytest.approx(0.1294, abs=1e-4)


def test_coverage_floor_at_a_low_target_stops_every_prefix_after_one_branch(qz_cost):
    # after one outcome q ~ Beta(2, 1) (or its mirror): the best interval [0.8, 1] holds 1 - 0.8^2 = 0.36
    r = qz_cost.coverage_floor("uniform", 0.1, 10, target=0.3, grid_size=4000)
    assert r["branches"] == pytest.approx(0.1)
    assert r["coverage"] == pytest.approx(0.36, abs=1e-3)


def test_coverage_floor_at_full_coverage_stops_no_prefix_early(qz_cost):
    # every early interval of half-width 0.1 misses with positive probability, so only [0, 1] at M covers all
    r = qz_cost.coverage_floor("uniform", 0.1, 10, target=1.0, grid_size=4000)
    assert r["branches"] == pytest.approx(1.0)


def test_coverage_floor_hits_the_target_and_is_below_the_per_interval_oracle(qz_cost):
    # trading coverage between prefixes can only help: the floor is never above the per-interval oracle
    for kind in ("uniform", "table7"):
        floor = qz_cost.coverage_floor(kind, 0.1, 10, target=0.95, grid_size=4000)
        oracle = qz_cost.oracle_bayes(kind, 0.1, 10, level=0.95, grid_size=4000)
        assert floor["coverage"] == pytest.approx(0.95)
        assert floor["branches"] <= oracle["branches"] + 1e-9
