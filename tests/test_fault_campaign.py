"""benchmarks/fault_campaign.py: its quick mode runs end to end through the CLI, and its verdicts can fail -- a run
directory with a duplicate line, a lost episode, a torn line or changed data, a judge directory with a duplicate
or lost judgment, and a leaked key piece are each reported."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import fault_campaign as fc  # noqa: E402
from fake_server_process import RandomFaults, agent_or_judge  # noqa: E402

from uqh.cli import main  # noqa: E402
from uqh.rundir.judgments import JUDGMENTS_FILE  # noqa: E402
from uqh.rundir.schema import EPISODES_FILE  # noqa: E402


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> Path:
    """A whole run directory of 6 arithmetic episodes by the campaign's scripted agent."""
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path_factory.mktemp("campaign") / "run"
    with FakeOpenAIServer(agent_or_judge) as srv:
        assert main(["run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", srv.base_url,
                     "--tasks", "6", "--step-budget", "3", "--out", str(out), "--no-progress"]) == 0
        assert main(["judge", str(out), "--judge-model", "openai/judge", "--api-base", srv.base_url, "--metrics",
                     "GF,TC", "--out", str(out.parent / "judge"), "--no-progress"]) == 0
    return out


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_quick_campaign_end_to_end(tmp_path):
    # One kill (of a one-process run), to keep this short: workers outliving a killed parent are tested in
    # tests/test_cli_run.py, and the full kill campaign is in benchmarks/results/fault_campaign_kills.md.
    out = tmp_path / "fc.md"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fault_campaign.py"), "--quick", "--kills", "1",
                           "--fault-types", "null_content", "--only", "kills,faults,load,breaker", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.with_suffix(".json").read_text())
    cats = {c["name"].split(":")[0].split(" ")[0]: c for c in result["categories"]}
    assert set(cats) == {"kill", "fault", "load", "circuit"}
    assert [cats[k]["tried"] for k in ("kill", "fault", "load", "circuit")] == [1, 1, 1, 1]
    assert all(c["held"] == c["tried"] and not c["failures"] for c in result["categories"])
    assert cats["circuit"]["numbers"]["requests to stop"] >= 12  # the breaker's threshold, then it stopped
    assert "re-run the same command to resume" in cats["circuit"]["numbers"]["stderr"][0]
    text = out.read_text()
    assert "| kill -9, then the same command | 1 | 1 |" in text and "--fault-types null_content" in text


def test_run_dir_verdict_fails_on_duplicate_lost_torn_and_changed(clean_run, tmp_path):
    expected = fc.expected_episodes(clean_run)
    assert len(expected) == 6 and fc.check_run_dir(clean_run, expected) == []

    bad = tmp_path / "bad"
    shutil.copytree(clean_run, bad)
    lines = _lines(bad / EPISODES_FILE)
    lost = json.loads(lines[-1])["episode_id"]
    twice = json.loads(lines[0])["episode_id"]
    (bad / EPISODES_FILE).write_bytes(b"".join(lines[:-1] + lines[:1]) + b'{"schema_version":1,"episode_id":"ari')
    problems = fc.check_run_dir(bad, expected)
    assert f"episode {twice} written 2 times" in problems
    assert f"episode {lost} lost" in problems
    assert any("torn last line" in p for p in problems)
    assert any("sidecar row(s) of no finished episode" in p for p in problems)  # the lost episode's rows

    changed = tmp_path / "changed"
    shutil.copytree(clean_run, changed)
    lines = _lines(changed / EPISODES_FILE)
    ep = json.loads(lines[1])
    ep["stop_reason"], ep["outcome"] = "parse_error", None  # what a provider fault charged to the agent looks like
    lines[1] = json.dumps(ep).encode() + b"\n"
    (changed / EPISODES_FILE).write_bytes(b"".join(lines))
    assert [p for p in fc.check_run_dir(changed, expected) if "bad data" in p] != []

    foreign = {k: v for k, v in expected.items() if k != twice}  # a record the plan does not have
    assert f"episode {twice} not planned" in fc.check_run_dir(clean_run, foreign)


def test_judge_dir_verdict_fails_on_duplicate_and_lost(clean_run, tmp_path):
    judge = clean_run.parent / "judge"
    expected = fc.expected_judgments(judge)
    assert len(expected) == 12 and fc.check_judge_dir(judge, expected) == []
    bad = tmp_path / "judge"
    shutil.copytree(judge, bad)
    lines = _lines(bad / JUDGMENTS_FILE)
    (bad / JUDGMENTS_FILE).write_bytes(b"".join(lines[1:] + lines[1:2]))
    problems = fc.check_judge_dir(bad, expected)
    assert "1 judgment(s) written twice" in problems
    assert any(p.startswith("judgment (") and p.endswith(" lost") for p in problems)


def test_leaks_finds_a_piece_of_the_key_anywhere(tmp_path):
    import random

    canary = fc.make_canary(random.Random(1))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "clean.json").write_text('{"api_key": "***"}')
    assert fc.leaks(canary, ["no key here"], [tmp_path]) == []
    (tmp_path / "a" / "log.txt").write_text("rejected Bearer " + canary[12:21])  # 9 characters of its random part
    given = tmp_path / ".env"
    given.write_text(f"OPENAI_API_KEY={canary}\n")
    assert fc.leaks(canary, [f"...{canary[:10]}"], [tmp_path], (given,)) == ["output 0", str(tmp_path / "a" / "log.txt")]


def test_random_faults_play_at_the_rate():
    faults = RandomFaults(["500", "reset"], 0.25, seed=3)
    drawn = [faults.pop(0) if faults else None for _ in range(4000)]
    assert 0.22 < sum(d is not None for d in drawn) / len(drawn) < 0.28
    assert set(drawn) == {None, "500", "reset"}


def test_quick_input_campaign_counts_no_traceback_and_no_wrong_exit_0(tmp_path):
    """A part of the bad-input category (every 25th case of the sweep, the subprocess-only cases, one --workers 2
    run on an unreachable endpoint) through the real CLI: no traceback, no wrong exit 0, no deviation."""
    out = tmp_path / "fc.md"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fault_campaign.py"), "--quick", "--only",
                           "inputs", "--input-every", "25", "--worker-runs", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    (cat,) = json.loads(out.with_suffix(".json").read_text())["categories"]
    assert cat["numbers"]["tracebacks"] == cat["numbers"]["wrong exit 0s"] == cat["numbers"]["other deviations"] == 0
    assert cat["tried"] == cat["held"] >= 20 and cat["failures"] == []


def _done(rc: int, out: str = "", err: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], rc, out, err)


def test_the_input_verdict_names_tracebacks_wrong_exit_0s_and_other_deviations():
    assert fc.classify(_done(2, err="uqh run: error: --tasks must be >= 1\n"), fragment="--tasks") == []
    tb = fc.classify(_done(1, err="Traceback (most recent call last):\n  File x\nValueError: y\n"))
    assert "traceback" in tb and "exit 1, not 2" in tb
    assert fc.classify(_done(0, out="table\n"))[:1] == ["wrong exit 0"]
    assert fc.classify(_done(2, err="uqh x: error: other\n"), fragment="--tasks")[0].startswith("the line does not say")
    assert fc.classify(_done(2, err="usage: uqh\n  many\n"), fragment="usage: uqh", one_line=False) == []


def test_the_secrets_category_passes_the_canary_every_way_a_url_is_taken(tmp_path):
    ways = fc.url_ways("http://127.0.0.1:1/v1", tmp_path / "src", tmp_path)
    assert set(ways) == {"userinfo", "malformed userinfo", "path parameter", "query", "fragment"}
    for shape, commands in ways.items():
        assert {"run --api-base", "run --endpoints", "run --user-api-base", "run --es-url", "run -D es_url=",
                "continue --api-base", "judge --api-base", "probe --api-base", "index --es-url"} == set(commands)
        url = fc.URL_SHAPES[shape]("http://127.0.0.1:1/v1", "sk-CANARYx")
        assert "sk-CANARYx" in url and url != "http://127.0.0.1:1/v1"
