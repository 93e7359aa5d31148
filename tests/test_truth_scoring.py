"""`uqh score` on an oracle-domain run (urn, real harness, fake server): the `truth` predictor is q_t as recorded,
and every stream's distance from it (mean |F−q|, TPS gap) equals a hand computation from the episodes."""
import json
import math

import numpy as np
import pytest

from uqh.cli import main
from uqh.domains.urn import success_probability, task_parameters
from run_files import read_episodes


def text(action: str, conf: str) -> str:
    return f"<think>t</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n<explanation>e</explanation>"


def responder(body: dict) -> str:
    """Draw every ball, stating 0.3 then 0.7 alternately; on tasks whose prompt has '2 white', stop at step 2."""
    msgs = body["messages"]
    n_assist = sum(m["role"] == "assistant" for m in msgs)
    stop = "2 white" in msgs[1]["content"] and n_assist == 1
    return text("Stop[]" if stop else "Draw[]", "0.3" if n_assist % 2 == 0 else "0.7")


@pytest.fixture(scope="module")
def urn_run(tmp_path_factory):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path_factory.mktemp("urn") / "run"
    with FakeOpenAIServer(responder) as srv:
        code = main(["run", "--domain", "urn", "--model", "openai/fake", "--api-base", srv.base_url,
                     "--tasks", "12", "--max-tokens", "64", "--out", str(out), "--no-progress"])
    assert code == 0
    return out


def _rows(res: dict) -> dict:
    return {(r["predictor"], r["calibration"]): {(m["metric"], m["score"]): m["estimate"]["value"]
                                                  for m in r["metrics"]} for r in res["rows"]}


def test_episodes_record_q_t_and_the_truth_predictor_reads_it(urn_run, capsys):
    eps = read_episodes(urn_run)
    assert len(eps) == 12 and all(e.stop_reason.value == "clean" for e in eps)
    assert any(e.n_steps == 2 for e in eps) and any(e.n_steps == 5 for e in eps)
    for e in eps:
        a, b, k = task_parameters(e.task_id, 5)
        red = 0
        for s in e.steps:
            assert s.info["q_t"] == success_probability(a, b, 5, k, red, s.t - 1 - red)
            red += s.observation.startswith(f"Draw {s.t} of 5: red")
    capsys.readouterr()
    assert main(["score", str(urn_run), "--format", "json", "--bootstrap", "0", "--calibration", "none",
                 "--score", "log", "--score", "brier"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = _rows(res)
    truth, verbal = rows[("truth", "raw")], rows[("verbal", "raw")]
    assert truth[("tps_gap", "log")] == 0 and truth[("truth_mae", None)] == 0

    def w(T):  # linear-front weights
        return np.array([2 * (T - t + 1) / (T * (T + 1)) for t in range(1, T + 1)])

    gaps, maes = [], []
    for e in eps:
        q = np.array([s.info["q_t"] for s in e.steps])
        f = np.array([s.verbal_confidence for s in e.steps])
        y = e.outcome
        log_score = lambda p: np.log(np.where(y == 1, np.clip(p, 1e-6, 1 - 1e-6), 1 - np.clip(p, 1e-6, 1 - 1e-6)))  # noqa: E731
        gaps.append(float((w(len(q)) * (log_score(q) - log_score(f))).sum()))
        maes.append(float(np.abs(f - q).mean()))
    assert verbal[("tps_gap", "log")] == pytest.approx(np.mean(gaps), rel=1e-9)
    assert verbal[("truth_mae", None)] == pytest.approx(np.mean(maes), rel=1e-9)
    assert verbal[("tps", "log")] + verbal[("tps_gap", "log")] == pytest.approx(truth[("tps", "log")], rel=1e-9)


def test_the_table_shows_the_distance_from_the_truth(urn_run, capsys):
    capsys.readouterr()
    assert main(["score", str(urn_run), "--bootstrap", "50", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "Distance from the truthful q_t" in out and "mean \\|F−q\\|" in out and "TPS gap log" in out
    capsys.readouterr()
    assert main(["score", str(urn_run), "--bootstrap", "0", "--format", "csv"]) == 0
    csv_text = capsys.readouterr().out
    assert ",truth,raw,,tps_gap,log," in csv_text and ",verbal,raw,,truth_mae,," in csv_text


def test_a_run_without_q_t_has_no_truth_and_no_distance(tmp_path, capsys):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "arith"
    with FakeOpenAIServer(lambda body: text("Finish[1]", "0.4")) as srv:
        assert main(["run", "--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url,
                     "--tasks", "3", "--max-tokens", "64", "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["score", str(out), "--bootstrap", "0", "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = _rows(res)
    assert all(("tps_gap", "log") not in m and ("truth_mae", None) not in m for m in rows.values())
    truth_row = next(r for r in res["rows"] if r["predictor"] == "truth")
    assert truth_row["n_used"] == 0 and truth_row["n_skipped_missing"] == 3  # missing, never imputed
    capsys.readouterr()
    assert main(["score", str(out), "--bootstrap", "0"]) == 0
    assert "Distance from the truthful" not in capsys.readouterr().out
