"""`uqh score` end to end on fixture run directories: table / json / csv, censoring, q_Z file, bad input."""
import csv
import io
import json
import math

import numpy as np
import pytest

from uqh.cli import main
from uqh.rundir.qz_file import QzRecord, read_qz_file, write_qz_file
from uqh.scoring.streams import load_run
from uqh.scoring.weights import trajectory_weights
from scoring_fixtures import synthetic_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return synthetic_run(tmp_path_factory.mktemp("score") / "run", n=40, censored=6, parse_errors=3)


def est(row, metric, score=None):
    """The estimate of one metric of a JSON result row (metrics are a list named by registry name + score)."""
    return next(m for m in row["metrics"] if m["metric"] == metric and m["score"] == score)["estimate"]


def uqh(capsys, *argv):
    code = main(["score", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_table2_shape(run_dir, capsys):
    code, out, err = uqh(capsys, run_dir, "--json", "--bootstrap", "50")
    assert code == 0, err
    res = json.loads(out)
    rows = res["rows"]
    labels = [(r["predictor"], r["calibration"]) for r in rows]
    for p in ("verbal", "token_prob", "token_entropy", "action_prob", "action_entropy", "sc_mode_freq", "sc_agreement"):
        assert (p, "raw") in labels and (p, "platt") in labels
    assert ("truth", "raw") in labels and ("truth", "platt") not in labels  # a reference: never recalibrated
    # p_true, observation_surprise (probes) raw and Platt, missing here; saup raw and Platt, htc (one row)
    assert labels[-1] == ("base_rate", "raw") and len(rows) == 23
    # the synthetic run records no canonical answers: the self-consistency rows are missing, never imputed
    sc = next(r for r in rows if r["predictor"] == "sc_agreement" and r["calibration"] == "raw")
    assert sc["n_used"] == 0 and sc["n_skipped_missing"] == 40
    assert res["counts"]["complete"] == 40 and res["counts"]["excluded_max_steps"] == 6
    assert res["counts"]["excluded_parse_error"] == 3
    base = rows[-1]
    ybar = base["ybar"]
    assert est(base, "tps", "log")["value"] == pytest.approx(ybar * math.log(ybar) + (1 - ybar) * math.log(1 - ybar),
                                                             abs=1e-12)
    assert est(base, "tps", "brier")["value"] == pytest.approx(-ybar * (1 - ybar), abs=1e-12)
    assert est(base, "t_ece")["value"] == pytest.approx(0.0, abs=1e-12) and est(base, "auroc")["value"] == 0.5
    verbal_platt = rows[1]
    assert verbal_platt["calibration"] == "platt"
    e = est(verbal_platt, "tps", "log")
    assert e["ci_low"] <= e["value"] <= e["ci_high"] and e["se"] > 0
    tps_log = next(m for m in verbal_platt["metrics"] if m["metric"] == "tps" and m["score"] == "log")
    assert tps_log["vs_raw"]["delta"] == pytest.approx(e["value"] - est(rows[0], "tps", "log")["value"], abs=1e-12)
    assert all(m["vs_raw"] is None for m in rows[0]["metrics"])  # raw rows are the reference
    cal = {d["predictor"]: d for d in res["calibration"]}
    assert cal["verbal"]["split_a"]["b"] > 0  # informative synthetic confidences
    assert "base_rate" not in cal  # not calibratable
    assert {r["aggregator"] for r in res["auq"]} == {"last", "avg", "min"}
    assert all(m["metric"] != "tps" for r in res["auq"] for m in r["metrics"])


def test_json_is_reproducible_with_seed(run_dir, capsys):
    a = uqh(capsys, run_dir, "--json", "--bootstrap", "30", "--seed", "3", "--predictor", "verbal")[1]
    b = uqh(capsys, run_dir, "--json", "--bootstrap", "30", "--seed", "3", "--predictor", "verbal")[1]
    assert a == b


def test_table_output(run_dir, capsys):
    code, out, _ = uqh(capsys, run_dir, "--bootstrap", "20", "--fixed-rank", "--predictor", "verbal,base_rate")
    assert code == 0
    for text in ("verbal", "Platt", "base_rate", "AUROC↑", "TPS_log↑", "TPS_β(2,4)↑", "×10³", "Raw → Platt",
                 "Φ_last", "Fixed-rank", "affine 0.4+0.2x", "excluded: max_steps=6, parse_error=3"):
        assert text in out, text
    assert max(len(line) for line in out.splitlines()) <= 120


def test_one_table_for_several_runs_with_cis_under_the_values(run_dir, capsys, tmp_path):
    other = synthetic_run(tmp_path / "r2", n=20, seed=5)
    code, out, _ = uqh(capsys, run_dir, other, "--bootstrap", "50", "--predictor", "verbal", "--score", "log")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 120
    assert out.count("Per-step predictors") == 1 and out.count("AUROC↑") == 3  # predictors, raw → Platt, AUQ
    assert f"{run_dir} · " in out and f"{other} · " in out  # one section per run
    code, js, _ = uqh(capsys, run_dir, other, "--json", "--bootstrap", "50", "--predictor", "verbal", "--score", "log")
    first = json.loads(js)[0]["rows"][0]
    e = est(first, "tps", "log")
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("verbal") and f"{e['value']:.3f}" in line)
    assert f"{e['ci_low']:.2f}–{e['ci_high']:.2f}" in lines[at + 1]  # the CI on the line under the value


def test_markdown_and_csv_formats_of_the_same_results(run_dir, capsys):
    code, md, _ = uqh(capsys, run_dir, "--format", "md", "--bootstrap", "20", "--predictor", "verbal")
    assert code == 0 and "### Per-step predictors" in md and "|:--" in md and "AUROC↑" in md
    code, csv_text, _ = uqh(capsys, run_dir, "--format", "csv", "--bootstrap", "20", "--predictor", "verbal")
    recs = list(csv.DictReader(io.StringIO(csv_text)))
    assert {r["table"] for r in recs} == {"predictors", "auq"} and all(r["run_dir"] == str(run_dir) for r in recs)


def test_one_note_per_reason_and_run(tmp_path, capsys):
    only_failures = synthetic_run(tmp_path / "few", n=3, seed=1)
    code, out, err = uqh(capsys, only_failures, "--bootstrap", "0")
    notes = [line for line in err.splitlines() if line.startswith("uqh score: note: ")]
    assert code == 0 and notes and len(notes) == len(set(notes))
    assert all(line.count(str(only_failures)) == 1 for line in notes)


def test_predictors_without_any_value_leave_the_table_with_one_note(run_dir, capsys):
    code, out, err = uqh(capsys, run_dir, "--bootstrap", "0")
    assert code == 0 and "sc_mode_freq" not in out and "sc_agreement" not in out  # one sample per task: no values
    # nor does a run of a domain that does not know q_t have the truth
    assert err.count("sc_mode_freq, sc_agreement, p_true, observation_surprise, truth: no value on any trajectory") == 1
    code, js, _ = uqh(capsys, run_dir, "--bootstrap", "0", "--json")
    assert {r["predictor"] for r in json.loads(js)["rows"]} >= {"sc_mode_freq", "sc_agreement"}  # still in the data


def test_paired_comparison_from_the_command_line(run_dir, capsys, tmp_path):
    other = synthetic_run(tmp_path / "r2", n=40, censored=6, parse_errors=3, seed=9)
    code, js, err = uqh(capsys, run_dir, other, "--paired", "--json", "--bootstrap", "50", "--predictor", "verbal",
                        "--score", "log")
    assert code == 0, err
    res = json.loads(js)
    (cmp,) = res["paired"]
    assert cmp["run_a"] == str(run_dir) and cmp["run_b"] == str(other) and cmp["shared_tasks"] == 49
    row = next(r for r in cmp["rows"] if r["calibration"] == "raw")
    m = next(m for m in row["metrics"] if m["metric"] == "tps")
    assert m["delta"]["delta"] == pytest.approx(m["b"]["value"] - m["a"]["value"])
    assert m["delta"]["ci_low"] <= m["delta"]["delta"] <= m["delta"]["ci_high"]
    code, out, _ = uqh(capsys, run_dir, other, "--paired", "--bootstrap", "50", "--predictor", "verbal")
    flat = " ".join(out.split())  # long paths wrap at 120 columns
    assert "Paired comparison" in flat and f"{other} − {run_dir} on 49 shared tasks" in flat
    code, _, err = uqh(capsys, run_dir, "--paired")
    assert code == 2 and "at least two RUN_DIRs" in err


def test_pooling_runs_with_different_configs_warns(run_dir, capsys, tmp_path):
    other = synthetic_run(tmp_path / "r2", n=20, seed=5, step_budget=9)
    code, _, err = uqh(capsys, run_dir, other, "--pooled", "--bootstrap", "0", "--predictor", "verbal")
    assert code == 0 and "uqh score: warning: --pooled mixes runs whose configs differ in step_budget" in err
    same = synthetic_run(tmp_path / "r3", n=20, seed=6)
    code, _, err = uqh(capsys, run_dir, same, "--pooled", "--bootstrap", "0", "--predictor", "verbal")
    assert code == 0 and "warning" not in err


def test_csv_output(run_dir, capsys):
    code, out, _ = uqh(capsys, run_dir, "--format", "csv", "--bootstrap", "0", "--predictor", "verbal",
                       "--calibration", "none", "--score", "log", "--no-auq")
    assert code == 0
    recs = list(csv.DictReader(io.StringIO(out)))
    assert [(r["metric"], r["score"]) for r in recs] == [
        ("auroc", ""), ("auprc", ""), ("aurc", ""), ("t_ece", ""), ("t_brier", ""), ("auarc", ""),
        ("pearson_failure", ""), ("spearman_failure", ""), ("kendall_failure", ""), ("tps", "log")]
    assert all(r["calibration"] == "raw" and r["predictor"] == "verbal" and r["ci_low"] == "" for r in recs)


def test_censoring_simple_and_exact_eq17(run_dir, capsys, tmp_path):
    code, out, _ = uqh(capsys, run_dir, "--json", "--bootstrap", "0", "--predictor", "verbal", "--calibration", "none",
                       "--censoring", "simple", "--score", "log")
    simple = json.loads(out)["rows"][0]
    assert simple["n_censored"] == 6 and simple["n_complete"] == 40
    simple_tps = est(simple, "tps", "log")["value"]
    assert est(simple, "delta_practice", "log")["value"] == pytest.approx(
        simple_tps - est(simple, "tps_complete_only", "log")["value"])
    run = load_run(run_dir)
    cens = [e for e, s in zip(run.episode_ids, run.stop_reason) if s == "max_steps"]
    q = {e: (k + 1) / 10 for k, e in enumerate(cens)}
    qz = tmp_path / "qz.jsonl"
    write_qz_file(qz, [QzRecord(episode_id=e, q_hat_z=v, n_valid=10, method="mc") for e, v in q.items()])
    code, out, err = uqh(capsys, run_dir, "--json", "--bootstrap", "0", "--predictor", "verbal", "--calibration",
                         "none", "--censoring", "exact", "--q-z", qz, "--score", "log")
    assert code == 0, err
    exact = est(json.loads(out)["rows"][0], "tps", "log")["value"]
    # a q_Z file covering only some censored episodes: error by default, or exclude them and count
    partial = tmp_path / "partial.jsonl"
    write_qz_file(partial, [QzRecord(episode_id=cens[0], q_hat_z=0.5, n_valid=10, method="mc")])
    assert uqh(capsys, run_dir, "--censoring", "exact", "--q-z", partial, "--bootstrap", "0")[0] == 2
    code, out, _ = uqh(capsys, run_dir, "--json", "--bootstrap", "0", "--predictor", "verbal", "--censoring", "exact",
                       "--q-z", partial, "--missing-qz", "exclude")
    res = json.loads(out)
    assert code == 0 and res["counts"]["excluded_no_qz"] == 5 and res["rows"][0]["n_censored"] == 1
    # Eq. 17: mean(exact) - mean(simple) = (1/n) Σ_censored q Σ_t w_t logit F_t
    corr = 0.0
    for i, e in enumerate(run.episode_ids):
        if e in q:
            a, b = run.offsets[i], run.offsets[i + 1]
            f = np.clip(run.streams["verbal"][a:b], 1e-6, 1 - 1e-6)
            w = trajectory_weights(np.array([0, b - a]), "linear-front")
            corr += q[e] * np.sum(w * np.log(f / (1 - f)))
    assert exact - simple_tps == pytest.approx(corr / 46, abs=1e-12)


def test_labels_flag(run_dir, capsys):
    """--labels working (default) trains the base rate on ΔY over the working sample; --labels complete on the
    complete trajectories' Y; the convention is in the JSON settings, the CSV records and the table header."""
    run = load_run(run_dir)
    complete = run.stop_reason == "clean"
    n_cens = int((run.stop_reason == "max_steps").sum())
    y_sum, n_c = float(np.nansum(run.outcome[complete])), int(complete.sum())
    for labels, convention, base in (("working", "delta_y", y_sum / (n_c + n_cens)),
                                     ("complete", "complete", y_sum / n_c)):
        code, out, err = uqh(capsys, run_dir, "--json", "--bootstrap", "0", "--predictor", "base_rate",
                             "--censoring", "simple", "--labels", labels, "--score", "log")
        assert code == 0, err
        res = json.loads(out)
        assert (res["settings"]["labels"], res["settings"]["label_convention"]) == (labels, convention)
        row = res["rows"][0]
        assert row["label_mean"] == pytest.approx(base) and row["ybar"] == pytest.approx(y_sum / n_c)
        assert est(row, "tps", "log")["value"] == pytest.approx(
            (y_sum * math.log(base) + (n_c + n_cens - y_sum) * math.log(1 - base)) / (n_c + n_cens))
    code, out, _ = uqh(capsys, run_dir, "--format", "csv", "--bootstrap", "0", "--predictor", "verbal",
                       "--censoring", "simple", "--labels", "complete")
    assert {r["label_convention"] for r in csv.DictReader(io.StringIO(out))} == {"complete"}
    code, out, _ = uqh(capsys, run_dir, "--bootstrap", "0", "--predictor", "verbal", "--censoring", "simple")
    assert "labels=delta_y" in out.splitlines()[0]
    with pytest.raises(SystemExit) as exc:  # argparse's choices check
        uqh(capsys, run_dir, "--labels", "vibes")
    assert exc.value.code == 2 and "invalid choice: 'vibes'" in capsys.readouterr().err


def test_multiple_run_dirs_and_pooled(run_dir, capsys, tmp_path):
    other = synthetic_run(tmp_path / "r2", n=20, seed=5)
    code, out, _ = uqh(capsys, run_dir, other, "--json", "--bootstrap", "0", "--predictor", "verbal", "--pooled")
    res = json.loads(out)
    assert len(res) == 3 and res[2]["counts"]["complete"] == 60


def test_parse_error_sensitivity_flag(run_dir, capsys):
    _, out, _ = uqh(capsys, run_dir, "--json", "--bootstrap", "0", "--predictor", "verbal", "--censoring", "simple",
                    "--include-parse-errors")
    res = json.loads(out)
    assert res["counts"]["parse_errors_included_as_censored"] == 3 and res["rows"][0]["n_censored"] == 9


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["{missing}"], "does not exist"),
        (["{empty}"], "not a run directory"),
        (["{afile}"], "is a file, not a run directory"),
        (["{run}", "--predictor", "vibes"], "unknown predictor"),
        (["{run}", "--score", "spherical"], "unknown score"),
        (["{run}", "--weights", "quadratic"], "unknown weights"),
        (["{run}", "--censoring", "exact"], "needs --q-z"),
        (["{run}", "--censoring", "exact", "--q-z", "{missing}"], "does not exist"),
        (["{run}", "--censoring", "exact", "--q-z", "{partial_qz}"], "no q_hat_z for"),
        (["{run}", "--censoring", "exact", "--q-z", "{bad_qz}"], "not a q_Z record"),
        (["{run}", "--include-parse-errors"], "include-parse-errors"),
        (["{run}", "--q-z", "{partial_qz}"], "only used with --censoring exact"),
    ],
)
def test_bad_input_is_one_line(argv, msg, run_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir(exist_ok=True)
    partial = tmp_path / "partial.jsonl"
    partial.write_text(json.dumps({"episode_id": "nope#0", "q_hat_z": 0.5, "n_valid": 3, "method": "mc"}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"episode_id": "x#0", "q_hat_z": 1.5, "n_valid": 3, "method": "mc"}) + "\n")
    (tmp_path / "afile").write_text("x")
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "run": run_dir, "partial_qz": partial,
             "bad_qz": bad, "afile": tmp_path / "afile"}
    code, out, err = uqh(capsys, *[a.format(**paths) for a in argv])
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("uqh score: error: ") and msg in err


def test_qz_file_roundtrip_and_duplicates(tmp_path):
    p = tmp_path / "q.jsonl"
    write_qz_file(p, [QzRecord(episode_id="a#0", q_hat_z=0.3, n_valid=7, method="hybrid")])
    assert read_qz_file(p)["a#0"].q_hat_z == 0.3
    p.write_text(p.read_text() * 2)
    from uqh.rundir.errors import UserError

    with pytest.raises(UserError, match="duplicate"):
        read_qz_file(p)
