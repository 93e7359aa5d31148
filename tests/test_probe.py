"""`uqh probe --probe p_true` over a recorded urn run, against the fake server with scripted logprobs: P(True) as
computed by hand, missing values with their reason, resume after kill -9 without duplicates, the probed run
byte-identical, and `uqh score --probes` scoring the values as the p_true predictor."""
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from uqh.cli import main
from uqh.harness.probes.probe_runner import p_true_from_tokens
from uqh.rundir.schema import TokenLogprob, TopLogprob
from run_files import read_episodes

# The answer token "Yes" with these top alternatives: P(True) = (0.6 + 0.1) / (0.6 + 0.1 + 0.2 + 0.05)
SCRIPT = {"Yes": [("Yes", math.log(0.6)), ("No", math.log(0.2)), (" yes", math.log(0.1)), ("no", math.log(0.05)),
                  ("Maybe", math.log(0.03))]}
EXPECTED = 0.7 / 0.95


def agent_text(action: str, conf: str) -> str:
    return f"<think>t</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n<explanation>e</explanation>"


@pytest.fixture(scope="module")
def urn_run(tmp_path_factory):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path_factory.mktemp("probe") / "run"
    with FakeOpenAIServer(lambda body: agent_text("Draw[]", "0.6")) as srv:
        assert main(["run", "--domain", "urn", "-D", "n_draws=3", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--tasks", "4", "--max-tokens", "64", "--out", str(out), "--no-progress"]) == 0
    return out


def digest(run: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.iterdir()) if p.is_file()}


def probe_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "probes.jsonl").read_text().splitlines()]


def test_p_true_by_hand_from_tokens():
    def tok(text, lp, alts):
        return TokenLogprob(token=text, logprob=lp, top_logprobs=[TopLogprob(token=t, logprob=l) for t, l in alts])

    value, logs, reason = p_true_from_tokens([tok(" ", 0.0, []), tok("Yes", math.log(0.6), SCRIPT["Yes"])])
    assert reason is None and value == pytest.approx(EXPECTED, abs=1e-12)
    assert logs["yes"] == pytest.approx(math.log(0.7)) and logs["no"] == pytest.approx(math.log(0.25))
    # only one option among the alternatives: the other's mass is 0 and its log is null (visible in the record)
    value, logs, _ = p_true_from_tokens([tok("no", math.log(0.9), [("no", math.log(0.9)), ("the", -3.0)])])
    assert value == 0.0 and logs["yes"] is None
    assert p_true_from_tokens(None)[2] == "the provider returned no logprobs"
    assert "neither yes nor no" in p_true_from_tokens([tok("Maybe", -0.1, [("Maybe", -0.1)])])[2]


def test_p_true_values_equal_the_hand_computed_probability(urn_run, tmp_path, capsys):
    from fake_openai_server import FakeOpenAIServer

    before = digest(urn_run)
    out = tmp_path / "pt"
    with FakeOpenAIServer("Yes", scripted_logprobs=SCRIPT) as srv:
        assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--out", str(out), "--no-progress"]) == 0
        requests = srv.requests
    eps = read_episodes(urn_run)
    lines = probe_lines(out)
    assert len(lines) == sum(e.n_steps for e in eps) == len(requests)
    assert all(v["value"] == pytest.approx(EXPECTED, abs=1e-12) and v["missing_reason"] is None for v in lines)
    assert digest(urn_run) == before  # the probed run is only read
    # the prompt: the agent's conversation up to its reply at step t, without step t's observation, then the question
    ep = next(e for e in eps if e.n_steps >= 2)
    req = next(r for r in requests if r["messages"][1]["content"] == ep.task_prompt and len(r["messages"]) == 6)
    roles = [m["role"] for m in req["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert req["messages"][3]["content"].endswith(ep.steps[0].observation)
    assert ep.steps[1].observation not in json.dumps(req["messages"])
    assert "will the task eventually be completed successfully" in req["messages"][-1]["content"]
    assert req["logprobs"] is True and req["top_logprobs"] == 10 and req["temperature"] == 0.0
    manifest = json.loads((out / "probe_manifest.json").read_text())
    assert len(manifest["config"]["prompt_sha256"]) == 64
    # scored: the p_true predictor's stream is the probe values; the cost is noted
    capsys.readouterr()
    assert main(["score", str(urn_run), "--probes", str(out), "--format", "json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    rows = {(r["predictor"], r["calibration"]): r for r in json.loads(captured.out)["rows"]}
    assert rows[("p_true", "raw")]["n_used"] == len(eps)
    tps_log = next(m for m in rows[("p_true", "raw")]["metrics"] if m["metric"] == "tps" and m["score"] == "log")
    assert tps_log["estimate"]["value"] is not None
    assert f"probe p_true by openai/fake: {len(lines)} calls" in captured.err
    capsys.readouterr()
    assert main(["score", str(urn_run), "--bootstrap", "0"]) == 0  # without --probes: missing, noted
    assert "p_true" in capsys.readouterr().err


def test_a_server_without_logprobs_gives_missing_values_with_the_reason(urn_run, tmp_path):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "nolp"
    with FakeOpenAIServer("Yes", logprobs=False) as srv:
        assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--out", str(out), "--no-progress"]) == 0
    lines = probe_lines(out)
    assert lines and all(v["value"] is None and v["missing_reason"] == "the provider returned no logprobs"
                         for v in lines)


def test_user_mistakes_are_one_line_and_write_nothing(urn_run, tmp_path, capsys):
    from fake_openai_server import FakeOpenAIServer

    inside = urn_run / "probes"
    assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                 "http://127.0.0.1:9/v1", "--out", str(inside)]) == 2
    err = capsys.readouterr().err
    assert "inside the probed run" in err and len(err.strip().splitlines()) == 1 and not inside.exists()
    out = tmp_path / "pt"
    with FakeOpenAIServer("Yes", scripted_logprobs=SCRIPT) as srv:
        assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--out", str(out), "--limit", "1", "--no-progress"]) == 0
    before = digest(out)
    capsys.readouterr()
    assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                 "http://127.0.0.1:9/v1", "--out", str(out), "--top-logprobs", "5"]) == 2
    err = capsys.readouterr().err
    assert "different probe config (differs in: decoding.top_logprobs)" in err and digest(out) == before
    assert main(["score", str(urn_run), "--probes", str(tmp_path / "nothing")]) == 2
    assert "is not a probe directory" in capsys.readouterr().err


def test_timeout_bounds_each_probe_call(urn_run, tmp_path, capsys):
    """`--timeout 0.5`: the call that hangs for 5 s fails after 0.5 s and is retried; a bad value is one line."""
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "pt"
    with pytest.raises(SystemExit) as exited:  # refused by the flag's type, as in every command
        main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
              "http://127.0.0.1:9/v1", "--out", str(out), "--timeout", "-1"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and not out.exists()
    assert "argument --timeout: must be > 0 seconds, got -1" in err
    with FakeOpenAIServer("Yes", scripted_logprobs=SCRIPT, faults=["timeout"], timeout_sleep_s=5.0) as srv:
        assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--out", str(out), "--limit", "1", "--concurrency", "1", "--timeout", "0.5",
                     "--no-progress"]) == 0
    values = probe_lines(out)
    assert values and all(v["value"] is not None for v in values)
    assert sorted(v["call"]["retries"] for v in values) == [0] * (len(values) - 1) + [1]
    assert max(v["call"]["latency_s"] for v in values) < 5.0


def test_kill_9_and_resume_leave_no_duplicate_and_the_run_untouched(urn_run, tmp_path):
    from fake_openai_server import FakeOpenAIServer

    before = digest(urn_run)
    out = tmp_path / "killed"
    n_planned = sum(e.n_steps for e in read_episodes(urn_run))
    cmd = [sys.executable, "-m", "uqh.cli", "probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake",
           "--out", str(out), "--concurrency", "1", "--no-progress"]
    with FakeOpenAIServer("Yes", scripted_logprobs=SCRIPT, latency_s=0.15) as srv:
        proc = subprocess.Popen(cmd + ["--api-base", srv.base_url], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={**os.environ, "OPENAI_API_KEY": "sk-fake"})
        deadline = time.time() + 60
        while time.time() < deadline:
            f = out / "probes.jsonl"
            if f.exists() and f.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        partial = (out / "probes.jsonl").read_bytes().count(b"\n")
        assert 2 <= partial < n_planned
        with open(out / "probes.jsonl", "ab") as f:  # a torn last line, as a crash mid-write leaves
            f.write(b'{"schema_version": 1, "run": 0, "epi')
        done = subprocess.run(cmd + ["--api-base", srv.base_url], capture_output=True, text=True,
                              env={**os.environ, "OPENAI_API_KEY": "sk-fake"})
    assert done.returncode == 0, done.stderr
    assert "removed a torn last line" in done.stdout
    lines = probe_lines(out)
    keys = [(v["run"], v["episode_id"], v["t"], v["probe"]) for v in lines]
    assert len(keys) == len(set(keys)) == n_planned
    assert f"{n_planned - partial} this run, {partial} before" in done.stdout
    assert digest(urn_run) == before


def test_export_with_probes_fills_the_p_true_column(urn_run, tmp_path):
    import pandas as pd
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "pt"
    with FakeOpenAIServer("Yes", scripted_logprobs=SCRIPT) as srv:
        assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--out", str(out), "--limit", "2", "--no-progress"]) == 0
    assert main(["export", str(urn_run), "--to", str(tmp_path / "x"), "--format", "csv", "--bootstrap", "0",
                 "--probes", str(out)]) == 0
    steps = pd.read_csv(tmp_path / "x" / "steps.csv")
    probed = steps["p_true"].notna()
    assert probed.sum() == len(probe_lines(out)) and 0 < probed.sum() < len(steps)  # --limit 2: the rest missing
    assert (steps.loc[probed, "p_true"] - EXPECTED).abs().max() < 1e-12
    assert steps["truth"].notna().all()  # the urn records q_t on every step


def test_report_with_probes_has_a_p_true_row(urn_run, tmp_path):
    import csv
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "pt"
    with FakeOpenAIServer("Yes", scripted_logprobs=SCRIPT) as srv:
        assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--out", str(out), "--no-progress"]) == 0
    rep = tmp_path / "rep"
    assert main(["report", str(urn_run), "--out", str(rep), "--bootstrap", "5", "--probes", str(out)]) == 0
    rows = {r["Predictor"]: r for r in csv.DictReader(open(next(rep.rglob("transparency__*.csv"))))}
    assert int(rows["Reflexive P(True) (probe) (raw)"]["n"]) == len(read_episodes(urn_run))
