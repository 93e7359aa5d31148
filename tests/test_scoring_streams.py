"""Predictor streams and samples read from a run directory written in the exact run-directory schema."""
import math

import numpy as np
import pytest

from uqh.rundir.errors import UserError
from uqh.scoring.step_values import entropy_confidence, token_probability
from uqh.scoring.streams import build_sample, load_run
from scoring_fixtures import make_episode, make_row, make_tokens, write_run_dir


def H(ps):
    ps = np.asarray(ps, dtype=float)
    ps = ps / ps.sum()
    return float(-(ps * np.log(ps)).sum())


TOK = [(0.5, [0.5, 0.25, 0.25]), (0.8, [0.8, 0.1])]


@pytest.fixture
def run_dir(tmp_path):
    eps = [
        make_episode("a#0", "clean", [0.9, 0.8], outcome=1),
        make_episode("b#0", "clean", [0.3], outcome=0),
        make_episode("c#0", "max_steps", [0.6, 0.7, 0.2]),
        make_episode("d#0", "parse_error", [0.4]),
        make_episode("e#0", "tool_error", [0.5]),
        make_episode("f#0", "clean", [0.7, None], outcome=1),
        make_episode("g#0", "clean", [0.2, 0.1], outcome=0),
        make_episode("h#0", "parse_error", []),
    ]
    rows = [
        # step 1 of a#0: a rejected first attempt (must be ignored) and the accepted repair
        make_row("a#0", 1, make_tokens([(0.1, [0.1, 0.9])]), action_range=(0, 1), accepted=False, attempt=0),
        make_row("a#0", 1, make_tokens(TOK), action_range=(1, 2), accepted=True, attempt=1),
        make_row("a#0", 2, make_tokens([(0.9, [0.9, 0.05, 0.05])]), action_range=(0, 1)),
        make_row("b#0", 1, None),  # provider returned no logprobs
        *[make_row("c#0", t, make_tokens(TOK), action_range=(0, 2)) for t in (1, 2, 3)],
        make_row("d#0", 1, make_tokens(TOK), action_range=(0, 2)),
        make_row("e#0", 1, make_tokens(TOK), action_range=(0, 2)),
        make_row("f#0", 1, make_tokens(TOK), action_range=(0, 2)),
        make_row("f#0", 2, make_tokens(TOK), action_range=(0, 2)),
        make_row("g#0", 1, make_tokens(TOK), action_range=None),  # action span unknown
        make_row("g#0", 2, make_tokens(TOK), action_range=(0, 1)),
    ]
    return write_run_dir(tmp_path / "run", eps, rows)


def test_token_signals_hand_computed():
    toks = make_tokens(TOK)
    assert token_probability(toks) == pytest.approx(0.65)
    assert entropy_confidence(toks) == pytest.approx(1 - (H([0.5, 0.25, 0.25]) + H([0.8, 0.1])) / 2 / math.log(5))
    assert entropy_confidence(make_tokens([(0.2, [0.2] * 5)])) == pytest.approx(0.0, abs=1e-12)  # uniform top-5
    assert entropy_confidence(make_tokens([(1.0, [1.0])])) == pytest.approx(1.0)
    assert math.isnan(token_probability([])) and math.isnan(entropy_confidence(None))
    assert math.isnan(entropy_confidence(make_tokens([(0.5, [])])))


def test_streams_from_run_dir(run_dir):
    run = load_run(run_dir)
    assert list(run.episode_ids) == ["a#0", "b#0", "c#0", "d#0", "e#0", "f#0", "g#0", "h#0"]
    a = slice(run.offsets[0], run.offsets[1])
    np.testing.assert_allclose(run.streams["verbal"][a], [0.9, 0.8])
    # accepted attempt only
    np.testing.assert_allclose(run.streams["token_prob"][a], [0.65, 0.9])
    np.testing.assert_allclose(run.streams["action_prob"][a], [0.8, 0.9])
    np.testing.assert_allclose(run.streams["action_entropy"][a][0], 1 - H([0.8, 0.1]) / math.log(5))
    np.testing.assert_allclose(run.streams["token_entropy"][a][1], 1 - H([0.9, 0.05, 0.05]) / math.log(5))
    b = run.offsets[1]
    assert np.isnan(run.streams["token_prob"][b]) and run.streams["verbal"][b] == 0.3


def test_samples_skip_missing_and_count(run_dir):
    run = load_run(run_dir)
    s = build_sample(run, "verbal")
    assert list(s.episode_ids) == ["a#0", "b#0", "g#0"]  # f#0 has a null confidence -> skipped
    assert s.counts["skipped_missing"] == 1 and s.counts["used"] == 3
    assert s.counts["complete"] == 4
    assert s.counts["excluded_max_steps"] == 1 and s.counts["excluded_parse_error"] == 2
    assert s.counts["excluded_tool_error"] == 1
    np.testing.assert_array_equal(s.offsets, [0, 2, 3, 5])
    np.testing.assert_allclose(s.values, [0.9, 0.8, 0.3, 0.2, 0.1])
    tp = build_sample(run, "token_prob")
    assert list(tp.episode_ids) == ["a#0", "f#0", "g#0"] and tp.counts["skipped_missing"] == 1
    ap = build_sample(run, "action_prob")
    assert list(ap.episode_ids) == ["a#0", "f#0"] and ap.counts["skipped_missing"] == 2
    br = build_sample(run, "base_rate")
    assert br.ybar == pytest.approx(0.5)  # a, f succeed; b, g fail
    np.testing.assert_allclose(br.values, 0.5)
    assert br.counts["used"] == 4


def test_censoring_modes_and_parse_error_sensitivity(run_dir, tmp_path):
    run = load_run(run_dir)
    s = build_sample(run, "verbal", censoring="simple")
    assert "c#0" in s.episode_ids and s.counts["censored"] == 1
    i = list(s.episode_ids).index("c#0")
    assert not s.delta[i] and np.isnan(s.y[i]) and s.horizon[i] == 3
    p = build_sample(run, "verbal", censoring="simple", include_parse_errors=True)
    # d#0 included as censored at its failing step; h#0 has no parsed step -> excluded, counted
    assert "d#0" in p.episode_ids and "h#0" not in p.episode_ids
    assert p.counts["parse_errors_included_as_censored"] == 1 and p.counts["excluded_no_steps"] == 1
    assert p.counts["excluded_parse_error"] == 0
    with pytest.raises(UserError, match="include-parse-errors"):
        build_sample(run, "verbal", censoring="exclude", include_parse_errors=True)
    with pytest.raises(UserError, match="no q_hat_z for 1 censored"):
        build_sample(run, "verbal", censoring="exact", q_z={"zz#0": 0.5})
    e = build_sample(run, "verbal", censoring="exact", q_z={"c#0": 0.25})
    assert e.q_z[list(e.episode_ids).index("c#0")] == 0.25
    assert e.counts["excluded_no_qz"] == 0
    dropped = build_sample(run, "verbal", censoring="exact", q_z={"zz#0": 0.5}, missing_qz="exclude")
    assert "c#0" not in dropped.episode_ids and dropped.counts["excluded_no_qz"] == 1
    assert dropped.counts["censored"] == 0 and dropped.delta.all()


def test_bad_run_dirs(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="not a run directory"):
        load_run(tmp_path / "empty")
    with pytest.raises(UserError, match="unknown predictor"):
        build_sample(None, "vibes")
