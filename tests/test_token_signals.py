"""The white-box token signals (uqh.scoring.token_signals) on hand-made token rows, in closed form: a uniform top-k,
a one-hot token, missing top-k, an empty action span, the running trajectory NLL and the greedy-only refusal."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from uqh.scoring import token_signals as ts
from uqh.scoring.pipeline import ScoreOptions, score_run
from uqh.scoring.registry import PREDICTORS
from uqh.scoring.streams import build_sample, cumulative_within, load_run, run_data_from_records
from uqh.rundir.schema import RunConfig
from scoring_fixtures import make_episode, make_row, make_tokens, write_run_dir

NEW = [f"{span}_{s}" for span in ("token", "action")
       for s in ("gmean_prob", "min_prob", "topk_mass", "entropy_max", "traj_prob", "traj_gmean_prob", "traj_entropy",
                 "gnll")]
UNIFORM4 = [(0.25, [0.25] * 4)] * 3  # three tokens, each a uniform top-4
ONE_HOT = [(1.0, [1.0, 1e-30])] * 2  # the chosen token has all the mass


def value(name, step_tokens, action_range=None, manifest=None):
    """The per-step value of predictor ``name`` on a one-step episode whose accepted row holds ``step_tokens``."""
    ep = make_episode("a#0", "clean", [0.5], outcome=1)
    row = make_row("a#0", 1, step_tokens, action_range=action_range)
    run = run_data_from_records(Path("."), manifest, [ep], [row])
    return float(run.streams[name][0])


def test_every_new_signal_is_one_registry_entry():
    assert set(NEW) <= set(PREDICTORS)
    assert [n for n in NEW if PREDICTORS[n].greedy_only] == ["token_gnll", "action_gnll"]


def test_uniform_top_k_closed_form():
    toks = make_tokens(UNIFORM4)
    assert ts.geometric_mean_probability(toks) == pytest.approx(0.25)
    assert ts.minimum_probability(toks) == pytest.approx(0.25)
    assert ts.topk_mass(toks) == pytest.approx(1.0)
    assert ts.max_entropy_confidence(toks) == pytest.approx(0.0, abs=1e-12)  # H = ln 4 = ln K
    assert ts.mean_topk_entropy(toks) == pytest.approx(math.log(4))
    assert ts.sequence_probability(toks) == pytest.approx(0.25 ** 3)
    assert ts.nll_terms(toks) == pytest.approx((3 * math.log(4), 3.0))


def test_one_hot_token_closed_form():
    toks = make_tokens(ONE_HOT)
    for f in (ts.geometric_mean_probability, ts.minimum_probability, ts.topk_mass, ts.sequence_probability):
        assert f(toks) == pytest.approx(1.0)
    assert ts.max_entropy_confidence(toks) == pytest.approx(1.0, abs=1e-12)


def test_mixed_tokens_min_and_max_pick_the_worst_token():
    toks = make_tokens([(0.5, [0.5, 0.5]), (0.9, [0.9, 0.05])])
    assert ts.minimum_probability(toks) == pytest.approx(0.5)
    assert ts.geometric_mean_probability(toks) == pytest.approx(math.sqrt(0.45))
    assert ts.topk_mass(toks) == pytest.approx((1.0 + 0.95) / 2)
    assert ts.max_entropy_confidence(toks) == pytest.approx(0.0, abs=1e-12)  # the 50/50 token: H = ln 2 = ln K


def test_normalised_entropy_terms_closed_form():
    h, n = ts.normalised_entropy_terms(make_tokens([(0.5, [0.5, 0.5]), (1.0, [1.0, 1e-30]), (0.25, [0.25] * 4)]))
    # K = 4 (the span's widest top-k): ln 2 / ln 4 + 0 + ln 4 / ln 4
    assert (h, n) == (pytest.approx(1.5), 3.0)
    assert all(math.isnan(x) for x in ts.normalised_entropy_terms(make_tokens([(0.5, [0.5, 0.5]), (0.8, [])])))


def test_missing_top_k_is_missing_not_imputed():
    toks = make_tokens([(0.5, [0.5, 0.5]), (0.8, [])])  # selected-token logprob only at the second token
    assert math.isnan(ts.topk_mass(toks)) and math.isnan(ts.max_entropy_confidence(toks))
    assert math.isnan(ts.mean_topk_entropy(toks))
    assert ts.geometric_mean_probability(toks) == pytest.approx(math.sqrt(0.4))  # needs no top-k
    assert math.isnan(ts.max_entropy_confidence(make_tokens([(0.9, [0.9])])))  # K = 1: no entropy scale


def test_no_tokens_is_missing():
    for f in (ts.geometric_mean_probability, ts.minimum_probability, ts.topk_mass, ts.max_entropy_confidence,
              ts.sequence_probability):
        assert math.isnan(f(None)) and math.isnan(f([]))
    assert all(math.isnan(x) for x in ts.nll_terms([]))


def test_registry_entries_on_the_completion_and_the_action_span():
    toks = make_tokens([(0.5, [0.5, 0.5]), (0.25, [0.25] * 4)])
    assert value("token_gmean_prob", toks, (1, 2)) == pytest.approx(math.sqrt(0.125))
    assert value("action_gmean_prob", toks, (1, 2)) == pytest.approx(0.25)
    assert value("action_min_prob", toks, (0, 1)) == pytest.approx(0.5)
    assert value("action_entropy_max", toks, (0, 1)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("action_range", [None, (1, 1), (2, 5)])  # unknown, empty, out of range
def test_empty_action_span_makes_every_action_signal_missing(action_range):
    toks = make_tokens(UNIFORM4[:2])
    for name in NEW:
        v = value(name, toks, action_range)
        assert math.isnan(v) == name.startswith("action_"), name


def test_cumulative_within_restarts_per_trajectory_and_keeps_missing():
    terms = np.array([[1.0, 2], [2.0, 1], [0.5, 1], [np.nan, np.nan], [1.0, 1], [3.0, 3]])
    offsets = np.array([0, 2, 5, 6])
    out = cumulative_within(terms, offsets)
    np.testing.assert_allclose(out[:3], [[1, 2], [3, 3], [0.5, 1]])
    assert np.isnan(out[3:5]).all()  # a step without tokens: missing from there to the end of its trajectory
    np.testing.assert_allclose(out[5], [3, 3])


def test_running_trajectory_nll_along_a_trajectory(tmp_path):
    ep = make_episode("a#0", "clean", [0.5, 0.5, 0.5], outcome=1)
    rows = [make_row("a#0", 1, make_tokens([(0.5, [0.5, 0.5]), (0.5, [0.5, 0.5])]), action_range=(0, 1)),
            make_row("a#0", 2, make_tokens([(0.25, [0.25] * 4)]), action_range=(0, 1)),
            make_row("a#0", 3, None)]  # no logprobs: the running value is missing from here on
    run = load_run(write_run_dir(tmp_path / "r", [ep], rows))
    np.testing.assert_allclose(run.streams["token_traj_prob"][:2], [0.25, 0.0625])
    np.testing.assert_allclose(run.streams["token_traj_gmean_prob"][:2], [0.5, 0.0625 ** (1 / 3)])
    np.testing.assert_allclose(run.streams["action_traj_prob"][:2], [0.5, 0.125])
    # step 1: two 50/50 tokens (H/ln 2 = 1); step 2: one uniform top-4 (H/ln 4 = 1): no confidence at all
    np.testing.assert_allclose(run.streams["token_traj_entropy"][:2], [0.0, 0.0], atol=1e-12)
    assert np.isnan(run.streams["token_traj_entropy"][2])
    assert np.isnan(run.streams["token_traj_prob"][2])
    sample = build_sample(run, "token_traj_prob")
    assert sample.counts["skipped_missing"] == 1 and sample.n == 0


def _two_episode_run(tmp_path, temperature):
    eps = [make_episode("a#0", "clean", [0.9], outcome=1), make_episode("b#0", "clean", [0.2], outcome=0)]
    rows = [make_row("a#0", 1, make_tokens([(0.9, [0.9, 0.1])])), make_row("b#0", 1, make_tokens([(0.4, [0.4, 0.6])]))]
    path = write_run_dir(tmp_path / f"t{temperature}", eps, rows)
    m = json.loads((path / "manifest.json").read_text())
    m["config"].setdefault("decoding", {})["temperature"] = temperature
    m["config_hash"] = RunConfig.model_validate(m["config"]).config_hash()  # a manifest written that way
    (path / "manifest.json").write_text(json.dumps(m))
    return load_run(path)


def test_gnll_refused_on_a_sampled_run_and_left_out_by_default(tmp_path, capsys):
    from uqh.cli import main

    run = _two_episode_run(tmp_path, 0.7)
    assert np.isnan(run.streams["token_gnll"]).all()  # missing, never a sampled-token value
    assert main(["score", str(run.run_dir), "--predictor", "token_gnll", "--bootstrap", "0"]) == 2
    err = capsys.readouterr().err
    assert "greedy-only" in err and "temperature 0.7" in err and len(err.strip().splitlines()) == 1
    assert main(["score", str(run.run_dir), "--predictor", "all,verbal", "--bootstrap", "0"]) == 2
    assert "--predictor all" in capsys.readouterr().err
    assert main(["score", str(run.run_dir), "--bootstrap", "0", "--calibration", "none"]) == 0
    assert "token_gmean_prob" not in capsys.readouterr().out  # the token signals are scored when asked for
    assert main(["score", str(run.run_dir), "--predictor", "all", "--bootstrap", "0", "--calibration", "none"]) == 0
    out = " ".join(capsys.readouterr().err.split())  # notes go to stderr
    assert "greedy-only predictors not scored (temperature 0.7 > 0): token_gnll, action_gnll" in out
    scores = score_run(run, ScoreOptions(n_bootstrap=0, every_predictor=True))
    scored = {r.predictor for r in scores.rows}
    assert "token_gnll" not in scored and "action_gnll" not in scored and "token_gmean_prob" in scored


def test_gnll_scored_on_a_greedy_run(tmp_path):
    run = _two_episode_run(tmp_path, 0.0)
    sample = build_sample(run, "token_gnll")
    np.testing.assert_allclose(sample.values, [0.9, 0.4])
    assert "token_gnll" in {r.predictor for r in score_run(run, ScoreOptions(n_bootstrap=0, every_predictor=True)).rows}


def test_capability_tiers_per_step_counted_by_uqh_score(tmp_path, capsys):
    from uqh.cli import main

    eps = [make_episode("a#0", "clean", [0.9, 0.8, 0.7, 0.6], outcome=1), make_episode("b#0", "clean", [0.2], outcome=0)]
    rows = [make_row("a#0", 1, make_tokens([(0.9, [0.9, 0.1])])),  # full
            make_row("a#0", 2, make_tokens([(0.9, [0.9, 0.1]), (0.8, [])])),  # selected-token logprobs only
            make_row("a#0", 3, None),  # the provider returned none
            # a#0 step 4 has no row at all: none
            make_row("b#0", 1, make_tokens([(0.5, [])]))]
    path = write_run_dir(tmp_path / "r", eps, rows)
    run = load_run(path)
    assert list(run.step_tier) == ["full", "selected_only", "none", "none", "selected_only"]
    assert run.tier_counts() == {"full": 1, "selected_only": 2, "none": 2}
    # a signal that needs top-k is missing below the full tier; one that needs the chosen token only is not
    assert np.isfinite(run.streams["token_topk_mass"][0]) and np.isnan(run.streams["token_topk_mass"][1])
    assert np.isfinite(run.streams["token_gmean_prob"][1]) and np.isnan(run.streams["token_gmean_prob"][2])
    args = ["score", str(path), "--bootstrap", "0", "--predictor", "verbal", "--calibration", "none"]
    assert main(args) == 0
    assert "steps by logprob tier: full=1 selected-only=2 none=2" in capsys.readouterr().out
    assert main(args + ["--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert (counts["steps_full_logprobs"], counts["steps_selected_logprobs_only"], counts["steps_no_logprobs"]) == (1, 2, 2)
