"""Binary scores: closed forms of Appendix J against hand values and quadrature."""
import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import beta as B

from uqh.rundir.errors import UserError
from uqh.scoring.rules import EPS, ScoreRule, parse_score

P = np.linspace(0.0, 1.0, 41)


def test_beta_1_1_is_half_brier_up_to_affinity():
    s1, s0 = ScoreRule("beta", 1.0, 1.0).pair(P)
    np.testing.assert_allclose(s1, -((1 - P) ** 2) / 2, atol=1e-15)
    np.testing.assert_allclose(s0, -(P**2) / 2, atol=1e-15)
    b1, b0 = parse_score("brier").pair(P)
    np.testing.assert_allclose(s1, b1 / 2, atol=1e-15)
    np.testing.assert_allclose(s0, b0 / 2, atol=1e-15)


@pytest.mark.parametrize("a,b", [(2.0, 4.0), (0.5, 0.5), (1.0, 3.0), (3.5, 1.2)])
def test_beta_boundary_floors(a, b):
    s1, s0 = ScoreRule("beta", a, b).pair(np.array([0.0, 1.0]))
    assert s1[0] == pytest.approx(-B(a, b + 1), rel=1e-12)
    assert s0[1] == pytest.approx(-B(a + 1, b), rel=1e-12)
    assert s1[1] == 0.0 and s0[0] == 0.0  # right-boundary forecasts cost nothing


@pytest.mark.parametrize("a,b", [(2.0, 4.0), (0.7, 1.9)])
def test_beta_matches_defining_integrals(a, b):
    rule = ScoreRule("beta", a, b)
    for p in (0.05, 0.3, 0.62, 0.97):
        s1, s0 = rule.pair(np.array([p]))
        q1 = -quad(lambda c: c ** (a - 1) * (1 - c) ** b, p, 1, epsabs=1e-15, epsrel=1e-13, limit=200)[0]
        q0 = -quad(lambda c: c**a * (1 - c) ** (b - 1), 0, p, epsabs=1e-15, epsrel=1e-13, limit=200)[0]
        assert s1[0] == pytest.approx(q1, rel=1e-9)
        assert s0[0] == pytest.approx(q0, rel=1e-9)


def test_log_endpoint_behaviour():
    rule = parse_score("log")
    s1, s0 = rule.pair(np.array([0.0, 1.0, 0.5]))
    # clipped to [1e-6, 1-1e-6]: finite at the wrong boundary, exactly log(1e-6)
    assert s1[0] == pytest.approx(math.log(EPS)) and s0[1] == pytest.approx(math.log(EPS))
    assert s1[1] == pytest.approx(math.log1p(-EPS)) and s0[0] == pytest.approx(math.log1p(-EPS))
    assert s1[2] == s0[2] == pytest.approx(math.log(0.5))
    # unbounded without the clip: the penalty keeps growing toward the wrong boundary
    s1_small = rule.pair(np.array([1e-3, 1e-5]))[0]
    assert s1_small[1] < s1_small[0] < math.log(0.01)


@pytest.mark.parametrize("spec", ["log", "brier", "beta:2,4", "beta:0.5,1.5"])
def test_strict_propriety_on_a_grid(spec):
    rule = parse_score(spec)
    grid = np.linspace(0.001, 0.999, 999)
    s1, s0 = rule.pair(grid)
    for q in (0.1, 0.37, 0.842):
        expected = q * s1 + (1 - q) * s0
        assert grid[np.argmax(expected)] == pytest.approx(q, abs=1.5e-3)
        # soft-label call form equals the expectation
        np.testing.assert_allclose(rule(grid, np.full(grid.shape, q)), expected)


def test_parse_score():
    assert parse_score("beta:2,4") == ScoreRule("beta", 2.0, 4.0)
    assert parse_score("beta(2,4)").name == "beta(2,4)"
    assert parse_score(" LOG ").kind == "log"
    with pytest.raises(ValueError):
        ScoreRule("beta", -1.0, 2.0)
    for bad in ("beta:0,4", "beta:2", "beta:-1,2", "spherical", "beta:a,b", ""):
        with pytest.raises(UserError, match="unknown score"):
            parse_score(bad)
