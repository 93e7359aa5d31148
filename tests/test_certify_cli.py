"""`uqh certify` end to end: `uqh run --samples 5` against the fake server with scripted agents (arithmetic and
StrategyQA), then the certificate in every format, human verification round trip, and bad input."""
from __future__ import annotations

import csv
import io
import json
import math

import pytest

from certify_agents import ARITH_PLAN, DESIGN, arithmetic_agent, strategyqa_agent
from uqh.cli import main
from uqh.scoring.certify.certificate import split_calibration

#: rank score per task of the arithmetic design: c >= 3 right answers of 5 -> the mode (1); 1-2 -> second (2);
#: none -> never sampled (inf). arith-0006's samples: 2 wrong, 3 without an answer.
SCORES = [1, 1, 1, 1, 2, 2, math.inf, 1]


@pytest.fixture(scope="module")
def arith_run(tmp_path_factory):
    import os

    from fake_openai_server import FakeOpenAIServer

    out = tmp_path_factory.mktemp("certify") / "arith"
    old = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = "sk-test-not-a-secret"
    try:
        with FakeOpenAIServer(arithmetic_agent(ARITH_PLAN)) as srv:
            rc = main(["run", "--domain", "arithmetic", "--tasks", "8", "--samples", "5", "--model", "openai/fake",
                       "--api-base", srv.base_url, "--out", str(out), "--no-progress", "--step-budget", "3"])
    finally:
        if old is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = old
    assert rc == 0
    return out


def certify(capsys, *argv):
    try:
        rc = main(["certify", *map(str, argv)])
    except SystemExit as exc:  # a value its argparse type refuses
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def certify_json(capsys, *argv):
    rc, out, err = certify(capsys, *argv, "--format", "json")
    assert rc == 0, err
    return json.loads(out)


def test_reliability_level_without_a_test_split(arith_run, capsys):
    res = certify_json(capsys, arith_run, "--cal-frac", "1.0", "--alpha", "0.3", "--bootstrap", "0")
    c = res["counts"]
    assert (c["items"], c["samples"], c["samples_min"], c["samples_max"]) == (8, 40, 5, 5)
    assert c["no_answer_samples"] == 3 and c["unsolvable_items"] == 1 and c["canonicalised_now"] == 0
    assert c["mixed_classes"] == 0
    assert res["n_cal"] == 8 and res["n_test"] == 0 and res["stability"] is None
    assert res["reliability_level"] == pytest.approx(5 / 9) and res["reliability_count"] == 5
    assert res["main"]["k"] == 7 and res["main"]["threshold"] == 2 and res["main"]["coverage"] is None
    sweep = {r["alpha"]: r["threshold"] for r in res["alpha_sweep"]}
    assert sweep == {0.01: "inf", 0.05: "inf", 0.1: "inf", 0.15: "inf", 0.2: "inf", 0.25: 2, 0.3: 2}
    assert res["mode_accuracy"]["successes"] == 5 and res["single_sample_accuracy"]["successes"] == 7
    assert res["sample_accuracy"]["value"] == pytest.approx(sum(DESIGN) / 40)
    assert any("no test split" in n for n in res["notes"])


@pytest.mark.parametrize("seed", [0, 3])
def test_test_split_coverage_matches_the_hand_computation(arith_run, capsys, seed):
    res = certify_json(capsys, arith_run, "--cal-frac", "0.5", "--alpha", "0.4", "--seed", seed, "--resplits", "25",
                       "--bootstrap", "200")
    cal = split_calibration(8, 0.5, seed)
    cal_s = sorted(s for s, c in zip(SCORES, cal) if c)
    test_s = [s for s, c in zip(SCORES, cal) if not c]
    k = math.ceil(5 * 0.6)  # n_cal = 4
    m_star = cal_s[k - 1]
    assert res["n_cal"] == 4 and res["main"]["k"] == k
    assert res["main"]["threshold"] == ("inf" if math.isinf(m_star) else m_star)
    assert res["reliability_level"] == pytest.approx(sum(s <= 1 for s in cal_s) / 5)
    covered = sum(math.isfinite(s) and s <= m_star for s in test_s)
    assert res["main"]["coverage"]["successes"] == covered and res["main"]["coverage"]["n"] == 4
    solvable = [s for s in test_s if math.isfinite(s)]
    assert res["main"]["conditional_coverage"]["n"] == len(solvable)
    # every task has at most 2 sampled classes (a right and one wrong answer, or wrong and no answer)
    sizes = [min(m_star, 1 if c in (0, 5) else 2) for c, is_cal in zip(DESIGN, cal) if not is_cal]
    assert res["main"]["set_size"]["value"] == pytest.approx(sum(sizes) / 4)
    assert res["mode_accuracy"]["n"] == 4 and res["mode_accuracy"]["successes"] == sum(s == 1 for s in test_s)
    lo, hi = res["main"]["coverage"]["ci_low"], res["main"]["coverage"]["ci_high"]
    assert lo <= res["main"]["coverage"]["value"] <= hi
    st = res["stability"]
    assert st["resplits"] == 25 and sum(st["threshold_counts"].values()) == 25 and st["n_cal"] == 4
    seq = {s["rule"]: s for s in res["sequential"]}
    assert set(seq) == {"hoeffding", "anytime"}
    assert seq["hoeffding"]["samples_used"] == seq["hoeffding"]["samples_recorded"] == 40  # 5 samples: no stop
    assert seq["anytime"]["savings"] == 0.0  # at delta = 0.05 even unanimity needs 8 samples


def test_sequential_replay_reports_samples_and_savings(arith_run, capsys):
    # at delta = 0.5 (threshold 4): E_3 = 15/4 = 3.75 < 4 <= E_4 = 31/5 = 6.2 -> a task whose first 4 samples
    # agree stops at 4 of 5: the plans R R R R R (3 tasks) and R R R R W (1 task); R R R W W has E_4 = 26/20 < 4
    res = certify_json(capsys, arith_run, "--cal-frac", "1.0", "--stop-delta", "0.5", "--bootstrap", "0")
    seq = {s["rule"]: s for s in res["sequential"]}
    stopped = sum(acts[:4] in (["R"] * 4, ["W"] * 4) for acts in ARITH_PLAN.values())
    assert stopped == 4
    assert seq["anytime"]["items_stopped"] == stopped and seq["anytime"]["samples_used"] == 40 - stopped
    assert seq["anytime"]["savings"] == pytest.approx(stopped / 40)
    assert seq["hoeffding"]["items_stopped"] == 0
    assert seq["anytime"]["reliability_level"] == pytest.approx(5 / 9)  # the modes did not change


def test_formats_agree(arith_run, capsys):
    args = (arith_run, "--cal-frac", "0.5", "--alpha", "0.3", "--resplits", "10", "--bootstrap", "100")
    res = certify_json(capsys, *args)
    rc, out, _ = certify(capsys, *args, "--format", "csv")
    assert rc == 0
    recs = list(csv.DictReader(io.StringIO(out)))
    rel = next(r for r in recs if r["table"] == "summary" and r["metric"] == "reliability_level")
    assert float(rel["value"]) == res["reliability_level"]
    cov = next(r for r in recs if r["table"] == "main" and r["metric"] == "coverage")
    assert float(cov["value"]) == res["main"]["coverage"]["value"] and int(cov["n"]) == res["main"]["coverage"]["n"]
    assert sum(r["table"] == "alpha_sweep" and r["metric"] == "threshold" for r in recs) == 7
    rc, md, _ = certify(capsys, *args, "--format", "md")
    assert rc == 0 and "### Reliability certificate" in md and "### α sweep" in md and "### Split stability" in md
    assert "### Sequential stopping" in md and f"{res['reliability_level']:.3f}" in md
    rc, table, _ = certify(capsys, *args)
    assert rc == 0 and "Reliability certificate" in table and "α sweep" in table and "arithmetic" in table


def test_runs_recorded_without_canonical_answers_are_canonicalised_now(arith_run, tmp_path, capsys):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(arith_run, old)
    lines = (old / "episodes.jsonl").read_text().splitlines()
    stripped = []
    for ln in lines:
        ep = json.loads(ln)
        ep["info"].pop("canonical_answer")
        stripped.append(json.dumps(ep))
    (old / "episodes.jsonl").write_text("\n".join(stripped) + "\n")
    a = certify_json(capsys, arith_run, "--cal-frac", "1.0", "--bootstrap", "0")
    b = certify_json(capsys, old, "--cal-frac", "1.0", "--bootstrap", "0")
    assert b["counts"]["canonicalised_now"] == 40
    assert b["reliability_level"] == a["reliability_level"] and b["alpha_sweep"] == a["alpha_sweep"]


def test_human_verification_round_trip(arith_run, tmp_path, capsys):
    from uqh.domains.arithmetic import make_question

    sheet = tmp_path / "verify.csv"
    rc, out, err = certify(capsys, arith_run, "--cal-frac", "1.0", "--seed", "2", "--export-verification", sheet)
    assert rc == 0 and out == "" and "wrote 8 calibration items" in err
    rows = list(csv.DictReader(sheet.open()))
    assert [r["task_id"] for r in rows] == list(ARITH_PLAN) and all(r["acceptable"] == "" for r in rows)
    six = next(r for r in rows if r["task_id"] == "arith-0006")
    assert six["top_answer"] == "(no answer)" and six["votes"] == "3/5" and six["question"].startswith("Question:")
    assert six["other_answers"] == f"{make_question('arith-0006')[1] + 1} (2)"
    zero = next(r for r in rows if r["task_id"] == "arith-0000")
    assert zero["example_action"] == f"Finish[{make_question('arith-0000')[1]}]"
    # a careful human: marks exactly the right answers -> the gold certificate
    for r in rows:
        r["acceptable"] = "yes" if r["top_answer"] == str(make_question(r["task_id"])[1]) else "no"
    marked = tmp_path / "marked.csv"
    with marked.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    res = certify_json(capsys, arith_run, "--verified", marked, "--seed", "2", "--bootstrap", "0")
    assert res["settings"]["acceptability"] == "verified" and res["n_cal"] == 8 and res["n_test"] == 0
    assert res["reliability_level"] == pytest.approx(5 / 9)
    # a lenient human accepts every top answer: the certificate follows the marks
    for r in rows:
        r["acceptable"] = "1"
    with marked.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert certify_json(capsys, arith_run, "--verified", marked, "--seed", "2")["reliability_level"] == pytest.approx(8 / 9)
    # marks for half the tasks: those are the calibration split, the rest is tested against the benchmark
    with marked.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows[:4])
    res = certify_json(capsys, arith_run, "--verified", marked, "--seed", "2", "--alpha", "0.2", "--resplits", "0")
    assert res["n_cal"] == 4 and res["n_test"] == 4 and res["main"]["coverage"]["n"] == 4


def _bad(tmp_path, rows, fieldnames=("task_id", "top_answer", "acceptable")):
    p = tmp_path / "bad.csv"
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fieldnames))
        w.writeheader()
        w.writerows(rows)
    return p


@pytest.mark.parametrize("case,fragment", [
    ("unknown task", "task 'nope' is not in the run"),
    ("twice", "is marked twice"),
    ("no mark", "acceptable must be 1 or 0"),
    ("changed", "use the run and --seed the file was exported with"),
    ("columns", "lacks the column(s) acceptable"),
    ("empty", "marks no task"),
])
def test_bad_verification_file_one_line_exit_2(arith_run, tmp_path, capsys, case, fragment):
    from uqh.domains.arithmetic import make_question

    right = str(make_question("arith-0000")[1])
    rows = {
        "unknown task": [{"task_id": "nope", "top_answer": "1", "acceptable": "1"}],
        "twice": [{"task_id": "arith-0000", "top_answer": right, "acceptable": "1"}] * 2,
        "no mark": [{"task_id": "arith-0000", "top_answer": right, "acceptable": ""}],
        "changed": [{"task_id": "arith-0000", "top_answer": "12345", "acceptable": "1"}],
        "columns": [{"task_id": "arith-0000", "top_answer": right}],
        "empty": [],
    }[case]
    fields = ("task_id", "top_answer") if case == "columns" else ("task_id", "top_answer", "acceptable")
    rc, out, err = certify(capsys, arith_run, "--verified", _bad(tmp_path, rows, fields))
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("uqh certify: error: ") and fragment in err


@pytest.mark.parametrize("argv,fragment", [
    (["--alpha", "0"], "--alpha must be in (0, 1)"),
    (["--alpha", "1.2"], "--alpha must be in (0, 1)"),
    (["--cal-frac", "0"], "--cal-frac must be in (0, 1]"),
    (["--cal-frac", "0.05"], "leaves an empty calibration or test split"),
    (["--stop-delta", "2"], "--stop-delta must be in (0, 1)"),
    (["--resplits", "-1"], "argument --resplits: must be >= 0, got -1"),
    (["--verified", "x.csv", "--cal-frac", "0.5"], "drop --cal-frac / --cal-ids"),
    (["--cal-ids", "{tmp}/ids.txt"], "1 id(s) not among the run's tasks, e.g. 'arith-9999'"),
    (["--cal-ids", "{tmp}/missing.txt"], "cannot read --cal-ids"),
])
def test_bad_input_one_line_exit_2(arith_run, tmp_path, capsys, argv, fragment):
    (tmp_path / "ids.txt").write_text("arith-0000\n# a comment\narith-9999\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc, out, err = certify(capsys, arith_run, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("uqh certify: error: ") and fragment in err


def test_bad_run_dirs_and_export_targets(arith_run, tmp_path, capsys):
    rc, _, err = certify(capsys, tmp_path / "nothing-here")
    assert rc == 2 and "does not exist" in err
    rc, _, err = certify(capsys, arith_run, arith_run, "--verified", tmp_path / "v.csv")
    assert rc == 2 and "exactly one RUN_DIR" in err
    existing = tmp_path / "marks.csv"
    existing.write_text("keep me")
    rc, _, err = certify(capsys, arith_run, "--export-verification", existing)
    assert rc == 2 and "exists; choose a new file" in err and existing.read_text() == "keep me"
    rc, _, err = certify(capsys, arith_run, "--cal-frac", "0.01", "--export-verification", tmp_path / "new.csv")
    assert rc == 2 and not (tmp_path / "new.csv").exists()  # nothing written on a bad split


def test_cal_ids_file_sets_the_split(arith_run, tmp_path, capsys):
    ids = ["arith-0000", "arith-0004", "arith-0006", "arith-0007"]
    (tmp_path / "cal.txt").write_text("\n".join(ids) + "\n")
    res = certify_json(capsys, arith_run, "--cal-ids", tmp_path / "cal.txt", "--alpha", "0.4", "--resplits", "0")
    # calibration scores 1 2 inf 1: k = ceil(5 * 0.6) = 3 -> M* = 2; reliability 2/5
    assert res["settings"]["cal_frac"] is None and res["settings"]["cal_ids"] == str(tmp_path / "cal.txt")
    assert res["main"]["threshold"] == 2 and res["reliability_level"] == pytest.approx(2 / 5)
    assert res["main"]["coverage"]["successes"] == 4  # tasks 1, 2, 3, 5: each sampled its right answer, M* = 2


def test_multiple_runs_give_one_summary_row_each(arith_run, capsys):
    res = certify_json(capsys, arith_run, arith_run, "--cal-frac", "1.0", "--bootstrap", "0")
    assert isinstance(res, list) and len(res) == 2 and res[0]["reliability_level"] == res[1]["reliability_level"]
    rc, md, _ = certify(capsys, arith_run, arith_run, "--cal-frac", "1.0", "--format", "md", "--bootstrap", "0")
    summary = md.split("### α sweep")[0]
    assert summary.count("| arithmetic |") == 2


def test_score_offers_self_consistency_predictors(arith_run, capsys):
    """Item 5: the mode frequency and the agreement of a task's samples are trajectory-level predictors of the
    scoring tables, computed from the recorded canonical answers."""
    from uqh.scoring.streams import load_run

    data = load_run(arith_run)
    first_step = {str(e): data.offsets[i] for i, e in enumerate(data.episode_ids)}
    agree, mode = data.streams["sc_agreement"], data.streams["sc_mode_freq"]
    # arith-0002: 4 right, 1 wrong; arith-0006: 2 wrong, 3 without an answer (mode of the answers: 2/5)
    assert agree[first_step["arith-0002#0"]] == pytest.approx(0.8) and agree[first_step["arith-0002#4"]] == 0.2
    assert mode[first_step["arith-0002#4"]] == pytest.approx(0.8)
    assert mode[first_step["arith-0006#3"]] == pytest.approx(0.4) and agree[first_step["arith-0006#3"]] == 0.0
    # constant along a trajectory
    i = list(map(str, data.episode_ids)).index("arith-0002#0")
    assert len(set(agree[data.offsets[i]:data.offsets[i + 1]])) == 1
    rc = main(["score", str(arith_run), "--json", "--bootstrap", "50", "--predictor", "sc_agreement,sc_mode_freq"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0
    row = next(r for r in res["rows"] if r["predictor"] == "sc_agreement" and r["calibration"] == "raw")
    assert row["n_used"] == 37 and row["n_skipped_missing"] == 0  # the 37 clean episodes
    auroc = next(m for m in row["metrics"] if m["metric"] == "auroc")["estimate"]["value"]
    assert auroc > 0.7  # agreement separates right from wrong answers here
    assert not any(a["predictor"].startswith("sc_") for a in res["auq"])  # Φ_last = Φ_avg = Φ_min: no AUQ rows


# ------------------------------------------------------------------------------------------ a QA domain


def test_strategyqa_run_and_certify(fake_server, tmp_path, capsys, monkeypatch):
    from uqh.domains.domain_registry import get_domain_class

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
    domain = get_domain_class("strategyqa")({})
    ids = domain.select_task_ids(6, 42)
    gold = {t: domain.task(t).answer for t in ids}
    design = [5, 4, 2, 0, 3, 5]
    plan = {t: ["R"] * c + ["W"] * (5 - c) for t, c in zip(ids, design)}
    plan[ids[5]] = ["R", "R", "R", "N", "N"]  # two episodes without an answer (max_steps)
    out = tmp_path / "sqa"
    with fake_server(strategyqa_agent(plan, gold)) as srv:
        rc = main(["run", "--domain", "strategyqa", "--tasks", "6", "--samples", "5", "--model", "openai/fake",
                   "--api-base", srv.base_url, "--out", str(out), "--no-progress", "--step-budget", "2"])
    assert rc == 0
    capsys.readouterr()
    res = certify_json(capsys, out, "--cal-frac", "1.0", "--alpha", "0.3", "--bootstrap", "0")
    # scores: 1 1 2 inf 1 1 (the last: 3 right, 2 no answer) -> reliability 4/7; k = ceil(7 * 0.7) = 5 -> M* = 2
    assert res["domain"] == "strategyqa" and res["counts"]["items"] == 6 and res["counts"]["no_answer_samples"] == 2
    assert res["reliability_level"] == pytest.approx(4 / 7) and res["main"]["threshold"] == 2
    assert res["counts"]["unsolvable_items"] == 1
    sheet = tmp_path / "v.csv"
    rc, _, _ = certify(capsys, out, "--cal-frac", "1.0", "--export-verification", sheet)
    rows = {r["task_id"]: r for r in csv.DictReader(sheet.open())}
    assert rc == 0 and {r["top_answer"] for r in rows.values()} <= {"yes", "no"}
    assert rows[ids[3]]["top_answer"] == ("no" if gold[ids[3]] else "yes")  # all five wrong
    assert rows[ids[0]]["question"] == f"Question: {domain.task(ids[0]).question}"


def test_cumulative_probability_score(arith_run, capsys):
    """--score cp (Definition 6.3): the cumulative frequency up to the acceptable class. Per task: c >= 3 right of
    5 -> c/5 (the mode's share); 1-2 -> 1.0 (second of two classes); none -> inf. Sorted: 0.6 0.8 1 1 1 1 1 inf."""
    res = certify_json(capsys, arith_run, "--cal-frac", "1.0", "--score", "cp", "--alpha", "0.8", "--bootstrap", "0")
    assert res["settings"]["score"] == "cp"
    assert res["main"]["k"] == 2 and res["main"]["threshold"] == pytest.approx(0.8)
    sweep = {r["alpha"]: r["threshold"] for r in res["alpha_sweep"]}
    assert sweep[0.3] == 1 and sweep[0.2] == "inf"  # k = 7 -> 1.0; k = 8 -> inf
    assert res["reliability_level"] == pytest.approx(5 / 9)  # Definition 2.4 is on the rank score
    res = certify_json(capsys, arith_run, "--cal-frac", "0.5", "--score", "cp", "--alpha", "0.3", "--seed", "1",
                       "--resplits", "5", "--bootstrap", "0")
    assert res["main"]["coverage"]["n"] == 4 and res["stability"]["resplits"] == 5
