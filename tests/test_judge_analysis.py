"""The GPA-judge analysis (uqh.scoring.judges.analysis) on hand-made judgments: distributions, stability, failure prediction
by the scoring package's own diagnostics (and equal to `uqh score` for the confidence streams), localisation and
human agreement against hand-computed values; and `uqh judge --report` end to end on a fake-served run."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fake_openai_server import FakeOpenAIServer
from uqh.cli import main
from uqh.harness.judge.judge_runner import JudgmentStore, build_judge_config, open_runs
from judge_fixtures import agent, judge
from uqh.rundir.errors import UserError
from uqh.rundir.judgments import JudgeAttempt, JudgeMetric, Judgment
from uqh.rundir.schema import CallRecord, DecodingConfig, Usage
from uqh.scoring.judges.agreement import krippendorff_alpha
from uqh.scoring.diagnostics import auprc, auroc
from uqh.scoring.judges.judge_results import JudgeAnalysis
from uqh.scoring.judges.analysis import analyse_judgments
from uqh.scoring.pipeline import ScoreOptions, score_run
from uqh.scoring.streams import load_run
from scoring_fixtures import make_episode, write_run_dir

GF, LC = JudgeMetric.GF, JudgeMetric.LC
#: episode -> (stop reason, verbal confidences, outcome)
EPISODES = {
    "e1#0": ("clean", [0.5, 0.7], 1),
    "e2#0": ("clean", [0.8, 0.4, 0.3], 0),  # first drop at step 2
    "e3#0": ("clean", [0.6, 0.6, 0.2], 0),  # first drop at step 3
    "e4#0": ("max_steps", [0.5, 0.5], None),
    "e5#0": ("clean", [0.9], 1),
    "e6#0": ("clean", [0.3, 0.5], 0),  # a failure without a drop
}
#: (episode, metric, repeat) -> (score or None, cited steps)
SCORES = {
    ("e1#0", GF, 0): (3, []), ("e1#0", GF, 1): (3, []), ("e1#0", LC, 0): (2, [1]), ("e1#0", LC, 1): (3, []),
    ("e2#0", GF, 0): (0, [2, 3]), ("e2#0", GF, 1): (1, [3]), ("e2#0", LC, 0): (1, [2]), ("e2#0", LC, 1): (None, []),
    ("e3#0", GF, 0): (1, [3]), ("e3#0", GF, 1): (0, [1]), ("e3#0", LC, 0): (2, [1]), ("e3#0", LC, 1): (2, [3]),
    ("e4#0", GF, 0): (0, [2]), ("e4#0", GF, 1): (0, [2]), ("e4#0", LC, 0): (3, []), ("e4#0", LC, 1): (2, []),
    ("e5#0", GF, 0): (2, []), ("e5#0", GF, 1): (3, []), ("e5#0", LC, 0): (3, []),  # LC repeat 1 never made
    ("e6#0", GF, 0): (2, [2]), ("e6#0", GF, 1): (2, []), ("e6#0", LC, 0): (None, []), ("e6#0", LC, 1): (None, []),
}


def _judgment(eid, metric, repeat, score, cited, n_steps, run=0):
    call = CallRecord(model="openai/j", usage=Usage(prompt_tokens=100, completion_tokens=10), cost_usd=0.5)
    attempts = [JudgeAttempt(attempt=0, raw_text="x", call=call)]
    if score is None:
        attempts.append(JudgeAttempt(attempt=1, raw_text="y", error="bad", call=call))
    return Judgment(run=run, episode_id=eid, metric=metric, repeat=repeat, score=score,
                    rationale=None if score is None else "r", cited_steps=cited, n_steps=n_steps,
                    missing_reason="bad" if score is None else None, attempts=attempts)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis")
    run = write_run_dir(root / "run", [make_episode(e, sr, c, outcome=y) for e, (sr, c, y) in EPISODES.items()])
    readers = open_runs([run])
    config = build_judge_config(readers, "openai/j", None, DecodingConfig(logprobs=False))
    with JudgmentStore.open_or_create(root / "judges", config) as store:
        for (eid, metric, r), (score, cited) in SCORES.items():
            store.append(_judgment(eid, metric, r, score, cited, len(EPISODES[eid][1])))
    return root / "judges"


@pytest.fixture(scope="module")
def analysis(judge_dir) -> JudgeAnalysis:
    return analyse_judgments(judge_dir, n_bootstrap=200, seed=1)


def test_counts_and_distributions(analysis):
    c = analysis.counts
    assert (c.judgments, c.scored, c.missing, c.episodes) == (23, 20, 3, 6)
    assert c.calls == 26 and c.cost_usd == pytest.approx(13.0) and c.prompt_tokens == 2600
    assert analysis.metrics == ["GF", "LC"]
    rows = {(r.metric, r.group): r for r in analysis.distributions}
    gf0 = rows[("GF", "clean, Y=0")]  # e2, e3, e6: scores 0, 1, 1, 0, 2, 2
    assert (gf0.n_judgments, gf0.n_missing, gf0.counts) == (6, 0, [2, 2, 2, 0]) and gf0.mean == pytest.approx(1.0)
    lc0 = rows[("LC", "clean, Y=0")]  # 1, None, 2, 2, None, None
    assert (lc0.n_judgments, lc0.n_missing, lc0.counts) == (6, 3, [0, 1, 2, 0]) and lc0.mean == pytest.approx(5 / 3)
    assert rows[("GF", "max_steps")].counts == [2, 0, 0, 0]
    assert [r.group for r in analysis.distributions if r.metric == "GF"] == ["clean, Y=1", "clean, Y=0", "max_steps"]


def test_stability_is_krippendorff_over_repeats(analysis):
    rows = {r.metric: r for r in analysis.stability}
    gf = np.array([[3, 3], [0, 1], [1, 0], [0, 0], [2, 3], [2, 2]], dtype=float)
    assert rows["GF"].alpha_ordinal.value == pytest.approx(krippendorff_alpha(gf, "ordinal", np.arange(4)))
    assert rows["GF"].alpha_interval == pytest.approx(krippendorff_alpha(gf, "interval", np.arange(4)))
    assert rows["GF"].n_episodes == 6 and rows["GF"].n_ratings == 12 and rows["GF"].max_repeats == 2
    # SD (ddof 1) of two scores differing by d is d / sqrt(2): three pairs differ by 1, three agree
    assert rows["GF"].mean_sd == pytest.approx(3 * (1 / np.sqrt(2)) / 6)
    assert rows["GF"].share_identical == pytest.approx(3 / 6)
    a = rows["GF"].alpha_ordinal
    assert a.ci_low <= a.value <= a.ci_high
    lc = np.array([[2, 3], [2, 2], [3, 2]], dtype=float)  # e2, e5, e6 have fewer than two valid ratings
    assert rows["LC"].n_episodes == 3 and rows["LC"].alpha_ordinal.value == pytest.approx(
        krippendorff_alpha(lc, "ordinal", np.arange(4)))


def test_failure_prediction_uses_the_scoring_diagnostics(analysis, judge_dir):
    rows = {r.predictor: r for r in analysis.failure_prediction}
    complete = ["e1#0", "e2#0", "e3#0", "e5#0", "e6#0"]  # e4 (max_steps) is not a complete trajectory
    y = np.array([EPISODES[e][2] for e in complete], dtype=float)
    gf = np.array([3, 0.5, 0.5, 2.5, 2]) / 3  # mean over repeats / 3
    assert rows["GF"].n == 5 and rows["GF"].n_failures == 3 and rows["GF"].n_skipped_missing == 0
    assert rows["GF"].auroc.value == pytest.approx(auroc(gf, y))
    assert rows["GF"].auprc.value == pytest.approx(auprc(gf, y))
    # by hand: failures (0.5/3, 0.5/3, 2/3) vs successes (1, 2.5/3): every pair ranked right -> AUROC 1
    assert rows["GF"].auroc.value == 1.0
    lc = {"e1#0": 2.5 / 3, "e2#0": 1 / 3, "e3#0": 2 / 3, "e5#0": 1.0}  # e6: both LC judgments missing
    assert rows["LC"].n == 4 and rows["LC"].n_skipped_missing == 1
    assert rows["LC"].auroc.value == pytest.approx(auroc(np.array(list(lc.values())), np.array([1, 0, 0, 1.0])))
    mean = rows["gpa_mean"]
    assert mean.n == 4 and mean.n_skipped_missing == 1  # e6 lacks LC
    gpa = np.array([(3 / 3 + lc["e1#0"]) / 2, (0.5 / 3 + lc["e2#0"]) / 2, (0.5 / 3 + lc["e3#0"]) / 2,
                    (2.5 / 3 + lc["e5#0"]) / 2])
    assert mean.auroc.value == pytest.approx(auroc(gpa, np.array([1, 0, 0, 1.0])))
    # the confidence rows are exactly what `uqh score` reports on the same complete episodes
    scores = score_run(load_run(analysis.runs[0]), ScoreOptions(calibrations=("none",), n_bootstrap=0, auq=False))
    verbal = rows["verbal"]
    assert verbal.kind == "confidence" and verbal.n == 5
    assert verbal.auroc.value == pytest.approx(scores.row("verbal", "raw").value("auroc"))
    assert verbal.auprc.value == pytest.approx(scores.row("verbal", "raw").value("auprc"))
    assert "token_prob" not in rows  # the fixture has no logprobs: no stream, no row
    # judge minus verbal, paired on the episodes both have
    assert rows["GF"].vs_verbal_n == 5
    assert rows["GF"].vs_verbal_auroc.delta == pytest.approx(rows["GF"].auroc.value - verbal.auroc.value)
    assert rows["LC"].vs_verbal_n == 4 and rows["LC"].vs_verbal_auroc.se is not None
    assert verbal.vs_verbal_auroc is None


def test_localisation_by_hand(analysis):
    rows = {r.metric: r for r in analysis.localisation}
    # GF, failed episodes e2 (drop at 2), e3 (drop at 3), e6 (no drop):
    # e2 cites {2,3} and {3} -> 1/2 cite step 2; e3 cites {3} and {1} -> 1/2 -> share 1/2
    # chance: e2 (2/3 + 1/3)/2 = 1/2, e3 (1/3 + 1/3)/2 = 1/3 -> 5/12
    gf = rows["GF"]
    assert (gf.n_failed, gf.n_with_drop) == (3, 2)
    assert gf.share == pytest.approx(0.5) and gf.chance == pytest.approx(5 / 12)
    assert gf.mean_cited == pytest.approx((2 + 1 + 1 + 1 + 1 + 0) / 6)
    # LC: e2 only repeat 0 is valid and cites {2} -> 1; e3 cites {1} and {3} -> 1/2; e6 has none valid
    lc = rows["LC"]
    assert (lc.n_failed, lc.n_with_drop) == (2, 2) and lc.share == pytest.approx(0.75)
    # all judges, union per repeat: e2 r0 {2,3} (yes), r1 {3} (no) -> 1/2; e3 r0 {3,1} yes, r1 {1,3} yes -> 1
    assert rows["all"].share == pytest.approx(0.75) and rows["all"].n_with_drop == 2


def test_human_agreement_by_hand(judge_dir, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("episode_id,metric,score\ne1#0,GF,3\ne2#0,GF,1\ne6#0,LC,1\ne5#0,LC,2\n")
    human = {r.metric: r for r in analyse_judgments(judge_dir, labels_file=labels, n_bootstrap=0).human}
    # GF pairs (human, judge): e1 (3,3) (3,3); e2 (1,0) (1,1) -> exact 3/4, within one 4/4
    gf = human["GF"]
    assert (gf.n_labels, gf.n_pairs, gf.n_unjudged) == (2, 4, 0)
    assert gf.exact == pytest.approx(0.75) and gf.within_one == 1.0
    # kappa over categories 0..3: p_o = 3/4; human margins (1/2 at 1, 1/2 at 3), judge (1/4 at 0, 1/4 at 1,
    # 1/2 at 3): p_e = 1/2 * 1/4 + 1/2 * 1/2 = 3/8 -> kappa = (3/4 - 3/8) / (5/8) = 3/5
    assert gf.kappa == pytest.approx(0.6)
    lc = human["LC"]  # e6's LC judgments are all missing: unjudged; e5 (2, 3)
    assert (lc.n_labels, lc.n_pairs, lc.n_unjudged) == (2, 1, 1) and lc.exact == 0.0 and lc.within_one == 1.0
    assert human["all"].n_pairs == 5 and human["all"].exact == pytest.approx(3 / 5)


def test_labels_that_do_not_match_are_user_errors(judge_dir, tmp_path):
    bad = tmp_path / "l.jsonl"
    bad.write_text('{"episode_id": "nope#0", "metric": "GF", "score": 1}\n')
    with pytest.raises(UserError, match="no such episode"):
        analyse_judgments(judge_dir, labels_file=bad, n_bootstrap=0)
    bad.write_text('{"episode_id": "e1#0", "metric": "GF", "score": 1, "run": "elsewhere"}\n')
    with pytest.raises(UserError, match="not a judged run"):
        analyse_judgments(judge_dir, labels_file=bad, n_bootstrap=0)
    bad.write_text('{"episode_id": "e1#0", "metric": "GF", "score": 1, "run": 0}\n'
                   '{"episode_id": "e1#0", "metric": "gf", "score": 2, "run": "run"}\n')
    with pytest.raises(UserError, match="two labels"):
        analyse_judgments(judge_dir, labels_file=bad, n_bootstrap=0)
    bad.write_text('{"episode_id": "e1#0", "metric": "XX", "score": 1}\n')
    with pytest.raises(UserError, match=r"l.jsonl:1: not a label \(metric"):
        analyse_judgments(judge_dir, labels_file=bad, n_bootstrap=0)


# ------------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A small arithmetic run made by `uqh run`, judged by `uqh judge` with every judge, twice."""
    root = tmp_path_factory.mktemp("e2e")
    with FakeOpenAIServer(agent) as srv:
        assert main(["run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", srv.base_url,
                     "--tasks", "16", "--step-budget", "3", "--out", str(root / "run"), "--no-progress"]) == 0
    with FakeOpenAIServer(judge) as srv:
        assert main(["judge", str(root / "run"), "--judge-model", "openai/judge", "--api-base", srv.base_url,
                     "--repeats", "2", "--out", str(root / "judges"), "--no-progress"]) == 0
    return root


def test_report_end_to_end(served, capsys):
    capsys.readouterr()
    code = main(["judge", "--report", "--out", str(served / "judges"), "--format", "json", "--bootstrap", "100",
                 "--tables", str(served / "tables")])
    out, err = capsys.readouterr()
    assert code == 0, err
    a = JudgeAnalysis.model_validate_json(out)
    assert a.metrics == [m.value for m in JudgeMetric] and a.counts.missing == 0
    assert a.counts.judgments == 16 * 7 * 2
    rows = {r.predictor: r for r in a.failure_prediction}
    episodes = {e.episode_id: e for e in load_run_episodes(served / "run")}
    complete = sorted(e for e, ep in episodes.items() if ep.stop_reason.value == "clean")
    y = np.array([episodes[e].outcome for e in complete], dtype=float)
    assert 0 < y.sum() < y.size  # both outcomes among the judged complete episodes
    # the fake GF judge sees a wrong final answer in the trace: a perfect failure predictor
    gf = np.array([np.mean([j.score for j in judgments(served) if j.episode_id == e and j.metric == JudgeMetric.GF])
                   for e in complete]) / 3
    assert rows["GF"].auroc.value == pytest.approx(auroc(gf, y)) == 1.0
    scores = score_run(load_run(served / "run"), ScoreOptions(calibrations=("none",), n_bootstrap=0, auq=False))
    for p in ("verbal", "token_prob", "action_entropy"):
        assert rows[p].auroc.value == pytest.approx(scores.row(p, "raw").value("auroc"))
    # every failed episode's confidence drops at its final step, which every fake judge cites
    assert {r.metric: r.share for r in a.localisation}["GF"] == 1.0
    stab = {r.metric: r for r in a.stability}
    assert stab["GF"].alpha_ordinal.value == 1.0  # the fake GF judge never varies across repeats
    assert stab["GF"].share_identical == 1.0 and stab["LC"].alpha_ordinal.value is not None
    names = sorted(p.name for p in (served / "tables").iterdir())
    for t in ("judge_scores", "judge_stability", "judge_failure_prediction", "judge_vs_verbal", "judge_localisation"):
        assert f"{t}.csv" in names and f"{t}.md" in names
    assert json.loads((served / "tables" / "judge_report.json").read_text())["counts"]["judgments"] == 224
    code = main(["judge", str(served / "run"), "--report", "--out", str(served / "judges"), "--format", "md",
                 "--bootstrap", "0"])
    md = capsys.readouterr().out
    assert code == 0 and "### Judges as failure predictors" in md
    assert re.search(r"\| GF Goal Fulfillment +\| clean, Y=0 +\|", md)
    code = main(["judge", "--report", "--out", str(served / "judges"), "--bootstrap", "0"])
    table = capsys.readouterr().out
    assert code == 0 and "Judge stability across repeats" in table and "GPA mean" in table


def load_run_episodes(run):
    from uqh.rundir.reader import RunDir

    return RunDir.open(run).episodes()


def judgments(served):
    from uqh.rundir.judgments import JudgeDir

    return JudgeDir.open(served / "judges").judgments()


def test_two_runs_pooled_duplicates_dropped_and_labels_name_the_run(tmp_path):
    runs = [write_run_dir(tmp_path / f"r{k}", [make_episode("a#0", "clean", [0.9], outcome=1),
                                               make_episode("b#0", "clean", [0.2], outcome=0)]) for k in range(2)]
    config = build_judge_config(open_runs(runs), "openai/j", None, DecodingConfig(logprobs=False))
    out = tmp_path / "j"
    with JudgmentStore.open_or_create(out, config) as store:
        for k, b_score in ((0, 0), (1, 2)):
            store.append(_judgment("a#0", GF, 0, 3, [], 1, run=k))
            store.append(_judgment("b#0", GF, 0, b_score, [1], 1, run=k))
    first = (out / "judgments.jsonl").read_text().splitlines()[0]
    with open(out / "judgments.jsonl", "a") as f:  # a second line for a finished key (an outside writer)
        f.write(first.replace('"score":3', '"score":0') + "\n")
    a = analyse_judgments(out, n_bootstrap=0)
    assert a.counts.duplicate_lines == 1 and a.counts.judgments == 4  # the first line of the key is kept
    gf = next(r for r in a.failure_prediction if r.predictor == "GF")
    assert (gf.n, gf.n_failures) == (4, 2) and gf.auroc.value == 1.0  # failures 0 and 2/3 below successes 1, 1
    labels = tmp_path / "labels.csv"
    labels.write_text("episode_id,metric,score\nb#0,GF,2\n")
    with pytest.raises(UserError, match="several judged runs; add a run column"):
        analyse_judgments(out, labels_file=labels, n_bootstrap=0)
    labels.write_text("episode_id,metric,score,run\nb#0,GF,2,r1\n")
    (row, pooled) = analyse_judgments(out, labels_file=labels, n_bootstrap=0).human
    assert (row.metric, row.n_pairs, row.exact) == ("GF", 1, 1.0) and pooled.metric == "all"
