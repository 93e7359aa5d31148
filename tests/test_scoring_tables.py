"""Library-level pipeline: fixed-rank analysis (Appendix E), evaluate_predictor, pooling."""
import math

import numpy as np
import pytest

from uqh.scoring.calibration import sigmoid
from uqh.scoring.fixed_rank import fixed_rank_analysis
from uqh.scoring.rules import parse_score
from uqh.scoring.streams import load_run
from uqh.scoring.pipeline import ScoreOptions, pool_runs, score_run
from uqh.scoring.weights import trajectory_weights
from scoring_fixtures import synthetic_run


def test_fixed_rank_rows():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, 200)
    off = np.concatenate([[0], np.cumsum(lengths)])
    z = rng.normal(0, 1, 200)
    y = (rng.random(200) < sigmoid(z)).astype(float)
    v = sigmoid(np.repeat(z, lengths) + 1.0)
    w = trajectory_weights(off, "linear-front")
    rows = fixed_rank_analysis(v, off, y, w, [parse_score("log")], platt_values=np.full(v.size, 0.5), predictor="p")
    assert [r.transform for r in rows] == ["identity", "affine 0.4+0.2x", "sqrt", "square", "platt"]
    assert {r.predictor for r in rows} == {"p"}
    for key in ("auroc", "auprc", "aurc"):
        assert len({r.value(key) for r in rows}) == 1  # identical by construction
    aff = rows[1].value("tps", "log")
    manual = np.mean([
        sum(wt * (math.log(0.4 + 0.2 * f) if yy else math.log(0.6 - 0.2 * f)) for wt, f in zip(w[a:b], v[a:b]))
        for a, b, yy in zip(off[:-1], off[1:], y)
    ])
    assert aff == pytest.approx(manual, abs=1e-12)
    assert rows[4].value("tps", "log") == pytest.approx(math.log(0.5), abs=1e-12)
    assert len({round(r.value("tps", "log"), 6) for r in rows}) == 5  # TPS moves while the rank metrics do not


def test_score_run_and_pooling(tmp_path):
    a = load_run(synthetic_run(tmp_path / "a", n=30, seed=1))
    b = load_run(synthetic_run(tmp_path / "b", n=20, seed=2))
    pooled = pool_runs([a, b])
    assert pooled.offsets[-1] == a.offsets[-1] + b.offsets[-1] and len(set(pooled.episode_ids)) == 50
    opts = ScoreOptions(predictors=("verbal", "base_rate"), n_bootstrap=0, auq=False,
                        scores=(parse_score("log"),))
    ra, rb, rp = (score_run(r, opts) for r in (a, b, pooled))
    va, vb, vp = (r.rows[0].value("tps", "log") for r in (ra, rb, rp))
    assert vp == pytest.approx((30 * va + 20 * vb) / 50, abs=1e-12)  # raw TPS is a per-trajectory mean
    assert [r.calibration for r in ra.rows] == ["raw", "platt", "raw"]
    only_platt = score_run(a, ScoreOptions(predictors=("verbal",), calibrations=("platt",), n_bootstrap=0, auq=False))
    assert [r.calibration for r in only_platt.rows] == ["platt"]
