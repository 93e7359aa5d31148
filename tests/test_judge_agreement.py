"""Krippendorff's α and Cohen's κ (uqh.scoring.judges.agreement): hand-computed cases, Krippendorff's (2011) printed worked
example, and numbers produced by other implementations (tests/data/judge_agreement_reference.json: the
``krippendorff`` package and scikit-learn, see tests/data/make_judge_agreement_reference.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from uqh.scoring.judges.agreement import (
    alpha_from_coincidences,
    cohen_kappa,
    exact_agreement,
    krippendorff_alpha,
    unit_coincidences,
    unit_value_counts,
    within_one_agreement,
)
from uqh.scoring.judges.analysis import first_confidence_drop

REFERENCE = json.loads((Path(__file__).parent / "data" / "judge_agreement_reference.json").read_text())
SCORES = np.arange(4)
nan = np.nan


def test_alpha_hand_computed_binary():
    # units (0,0), (1,1), (0,1): coincidences o = [[2,1],[1,2]], n_0 = n_1 = 3, n = 6.
    # nominal: observed sum o_01 + o_10 = 2; expected sum 2 n_0 n_1 = 18; alpha = 1 - (n-1) 2/18 = 4/9.
    r = np.array([[0, 0], [1, 1], [0, 1]], dtype=float)
    assert krippendorff_alpha(r, "nominal") == pytest.approx(4 / 9)
    # with two values every metric is a constant times [c != k]: the same alpha
    assert krippendorff_alpha(r, "ordinal") == pytest.approx(4 / 9)
    assert krippendorff_alpha(r, "interval") == pytest.approx(4 / 9)


def test_alpha_hand_computed_ordinal_three_values():
    # units (0,1), (1,2), (2,2), (0,0): o_01 = o_10 = o_12 = o_21 = 1, o_00 = o_22 = 2; n = (3, 2, 3), n = 8.
    # ordinal: d2_01 = (3+2 - 5/2)^2 = 6.25, d2_12 = (2+3 - 5/2)^2 = 6.25, d2_02 = (8 - 3)^2 = 25.
    # observed = 2 (6.25 + 6.25) = 25; expected = 2 (3*2*6.25 + 2*3*6.25 + 3*3*25) = 600.
    # alpha = 1 - 7 * 25 / 600.  The unused value 3 of the domain (n_3 = 0) changes nothing.
    r = np.array([[0, 1], [1, 2], [2, 2], [0, 0]], dtype=float)
    assert krippendorff_alpha(r, "ordinal", values=SCORES) == pytest.approx(1 - 7 * 25 / 600)
    # interval: d2 = 1, 1, 4 -> observed 4, expected 2 (6 + 6 + 9*4) = 96
    assert krippendorff_alpha(r, "interval", values=SCORES) == pytest.approx(1 - 7 * 4 / 96)
    # nominal: observed 4, expected 2 (3*2 + 2*3 + 3*3) = 42
    assert krippendorff_alpha(r, "nominal", values=SCORES) == pytest.approx(1 - 7 * 4 / 42)


def test_alpha_krippendorff_2011_printed_example():
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers x 12 units with
    # missing values; printed alpha nominal 0.743, ordinal 0.815, interval 0.849.
    obs = np.array([
        [1, 2, 3, 3, 2, 1, 4, 1, 2, nan, nan, nan],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, nan, 3],
        [nan, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, nan],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, nan],
    ])
    r = obs.T  # units x raters
    assert round(krippendorff_alpha(r, "nominal"), 3) == 0.743
    assert round(krippendorff_alpha(r, "ordinal"), 3) == 0.815
    assert round(krippendorff_alpha(r, "interval"), 3) == 0.849


@pytest.mark.parametrize("case", range(len(REFERENCE["alpha"])))
def test_alpha_matches_the_krippendorff_package(case):
    c = REFERENCE["alpha"][case]
    r = np.array([[nan if x is None else x for x in row] for row in c["ratings"]], dtype=float)
    for level, expected in c["alpha"].items():
        assert krippendorff_alpha(r, level, values=SCORES) == pytest.approx(expected, abs=1e-10), level


def test_alpha_undefined_and_unpairable_units():
    assert np.isnan(krippendorff_alpha(np.array([[2, 2], [2, 2.0]]), "ordinal", values=SCORES))  # no variation
    assert np.isnan(krippendorff_alpha(np.array([[1, nan], [nan, 3.0]]), "ordinal", values=SCORES))  # nothing pairable
    base = np.array([[0, 1], [1, 2], [2, 2], [0, 0]], dtype=float)
    with_single = np.vstack([base, [[3, nan]]])  # a unit with one rating contributes nothing
    alpha = krippendorff_alpha(base, "ordinal", values=SCORES)
    assert krippendorff_alpha(with_single, "ordinal", values=SCORES) == alpha
    with pytest.raises(ValueError, match="not one of the given values"):
        krippendorff_alpha(np.array([[0, 4.0]]), values=SCORES)


def test_alpha_weights_equal_duplicated_units():
    rng = np.random.default_rng(3)
    r = rng.integers(0, 4, size=(9, 3)).astype(float)
    r[rng.random(r.shape) < 0.2] = nan
    counts = rng.integers(0, 3, size=(5, 9)).astype(float)
    per_unit = unit_coincidences(unit_value_counts(r, SCORES))
    batch = alpha_from_coincidences(per_unit, SCORES, "ordinal", counts)
    for row, w in zip(batch, counts):
        dup = np.repeat(r, w.astype(int), axis=0)
        expected = krippendorff_alpha(dup, "ordinal", values=SCORES)
        assert (np.isnan(row) and np.isnan(expected)) or row == pytest.approx(expected)


def test_kappa_hand_computed():
    # a = (0,0,1,1), b = (0,1,1,1): p_o = 3/4; margins (1/2, 1/2) and (1/4, 3/4): p_e = 1/8 + 3/8 = 1/2;
    # kappa = (3/4 - 1/2) / (1 - 1/2) = 1/2
    assert cohen_kappa([0, 0, 1, 1], [0, 1, 1, 1], SCORES) == pytest.approx(0.5)
    # a = (0,1,2,3), b = (1,1,2,3): p_o = 3/4, rows 1/4 each, columns (0, 1/2, 1/4, 1/4): p_e = 1/4 -> 2/3.
    assert cohen_kappa([0, 1, 2, 3], [1, 1, 2, 3], SCORES) == pytest.approx(2 / 3)
    # quadratic: observed (0-1)^2 / 4 = 1/4; expected 1/4 sum_j c_j sum_i (i-j)^2 = 1/4 (6/2 + 6/4 + 14/4) = 2
    assert cohen_kappa([0, 1, 2, 3], [1, 1, 2, 3], SCORES, "quadratic") == pytest.approx(1 - 0.25 / 2)
    # linear: observed 1/4; expected 1/4 (1/2 * 4 + 1/4 * 4 + 1/4 * 6) = 9/8
    assert cohen_kappa([0, 1, 2, 3], [1, 1, 2, 3], SCORES, "linear") == pytest.approx(1 - 0.25 / (9 / 8))
    assert cohen_kappa([2, 2, 2], [2, 2, 2], SCORES) != cohen_kappa([2, 2, 2], [2, 2, 2], SCORES)  # NaN: undefined
    assert np.isnan(cohen_kappa([], [], SCORES))
    with pytest.raises(ValueError):
        cohen_kappa([0, 5], [0, 1], SCORES)


@pytest.mark.parametrize("case", range(len(REFERENCE["kappa"])))
def test_kappa_matches_scikit_learn(case):
    c = REFERENCE["kappa"][case]
    for w, expected in c["kappa"].items():
        weights = None if w == "None" else w
        assert cohen_kappa(c["a"], c["b"], SCORES, weights) == pytest.approx(expected, abs=1e-12), w


def test_exact_and_within_one():
    a, b = [0, 1, 2, 3, 3], [0, 2, 0, 3, 2]
    assert exact_agreement(a, b) == pytest.approx(2 / 5)
    assert within_one_agreement(a, b) == pytest.approx(4 / 5)
    assert np.isnan(exact_agreement([], []))


@pytest.mark.parametrize("conf,expected", [
    ([0.9, 0.9, 0.5], 3),
    ([0.5, 0.6, 0.4, 0.2], 3),
    ([0.3, 0.5, 0.8], None),
    ([0.8], None),
    ([0.8, None, 0.2, 0.1], 4),  # pairs with a missing value are skipped: 0.2 -> 0.1 at step 4
    ([], None),
])
def test_first_confidence_drop(conf, expected):
    assert first_confidence_drop(conf) == expected
