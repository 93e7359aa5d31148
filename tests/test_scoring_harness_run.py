"""`uqh score` on a run directory produced by the real harness (`uqh run`, arithmetic domain, fake server)."""
import json
import math
import re

import numpy as np
import pytest

from uqh.cli import main
from run_files import read_episodes, read_sidecar


def text(action: str, conf: str) -> str:
    return f"<think>t</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n<explanation>e</explanation>"


def responder(body: dict) -> str:
    """Per task (by its question): solve it, answer wrongly, or keep calculating until the budget is spent."""
    msgs = body["messages"]
    expr = re.search(r"What is (.*)\?", msgs[1]["content"]).group(1)
    kind = sum(map(ord, expr)) % 3
    n_assist = sum(m["role"] == "assistant" for m in msgs)
    if kind == 2 or n_assist == 0:
        return text(f"Calc[{expr}]", ["0.55", "0.6", "0.3"][kind] if n_assist == 0 else "0.25")
    result = msgs[-1]["content"].split()[-1]
    return text(f"Finish[{result}]" if kind == 0 else "Finish[-123456789]", "0.9" if kind == 0 else "0.8")


def _tps_log(row: dict) -> float:
    return next(m for m in row["metrics"] if m["metric"] == "tps" and m["score"] == "log")["estimate"]["value"]


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path_factory.mktemp("hr") / "run"
    with FakeOpenAIServer(responder) as srv:
        code = main(["run", "--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url,
                     "--tasks", "8", "--step-budget", "3", "--max-tokens", "64", "--out", str(out), "--no-progress"])
    assert code == 0
    return out


def test_score_reads_a_harness_run(harness_run, capsys):
    capsys.readouterr()
    eps = {e.episode_id: e for e in read_episodes(harness_run)}
    stops = [e.stop_reason.value for e in eps.values()]
    assert set(stops) >= {"clean", "max_steps"}
    assert main(["score", str(harness_run), "--json", "--bootstrap", "20", "--censoring", "simple", "--score", "log"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["counts"]["complete"] == stops.count("clean") and res["counts"]["censored"] == stops.count("max_steps")
    rows = {(r["predictor"], r["calibration"]): r for r in res["rows"]}

    # verbal TPS_log^{cen,simple} recomputed by hand from the episodes
    def w(T):
        return [2 * (T - t + 1) / (T * (T + 1)) for t in range(1, T + 1)]

    manual = []
    for e in eps.values():
        if e.stop_reason.value not in ("clean", "max_steps"):
            continue
        f = [min(max(s.verbal_confidence, 1e-6), 1 - 1e-6) for s in e.steps]
        y = e.outcome if e.stop_reason.value == "clean" else 0
        manual.append(sum(wt * (math.log(p) if y == 1 else math.log(1 - p)) for wt, p in zip(w(len(f)), f)))
    assert _tps_log(rows[("verbal", "raw")]) == pytest.approx(np.mean(manual), abs=1e-12)

    # completion-token probability recomputed from the sidecar (accepted attempts)
    side = {(r.episode_id, r.t): r for r in read_sidecar(harness_run) if r.accepted}
    manual_tp = []
    for e in eps.values():
        if e.stop_reason.value not in ("clean", "max_steps"):
            continue
        probs = [np.mean([math.exp(t.logprob) for t in side[(e.episode_id, s.t)].tokens]) for s in e.steps]
        y = e.outcome if e.stop_reason.value == "clean" else 0
        manual_tp.append(sum(wt * (math.log(p) if y == 1 else math.log(1 - p))
                             for wt, p in zip(w(len(probs)), np.clip(probs, 1e-6, 1 - 1e-6))))
    assert _tps_log(rows[("token_prob", "raw")]) == pytest.approx(np.mean(manual_tp), abs=1e-12)
    assert rows[("token_prob", "raw")]["n_skipped_missing"] == 0

    base = rows[("base_rate", "raw")]
    ybar = np.mean([e.outcome for e in eps.values() if e.stop_reason.value == "clean"])
    assert base["ybar"] == pytest.approx(ybar)
