"""`uqh judge` against the fake OpenAI-compatible server scripted as a judge, on a small real arithmetic run:
valid replies, a malformed reply repaired, malformed twice -> missing, failed calls re-queued, resume after
kill -9, the judged run never modified, and every user mistake one line / exit 2 / nothing written."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_files import wait_for_lines

from fake_openai_server import FakeOpenAIServer
from uqh.cli import main
from judge_fixtures import agent, is_repair, judge, judge_reply, judged_metric
from uqh.rundir.judgments import JUDGE_MANIFEST_FILE, JUDGMENTS_FILE, JudgeDir, JudgeMetric, Judgment
from uqh.rundir.reader import RunDir, read_jsonl
from uqh.rundir.schema import EPISODES_FILE

REPO = Path(__file__).resolve().parent.parent
N_TASKS = 8


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("judged") / "run"
    with FakeOpenAIServer(agent) as srv:
        assert main(["run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", srv.base_url,
                     "--tasks", str(N_TASKS), "--step-budget", "3", "--out", str(out), "--no-progress"]) == 0
    return out


def _digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def uqh_judge(capsys, *argv):
    try:
        code = main(["judge", *map(str, argv)])
    except SystemExit as exc:  # a value its argparse type refuses
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _judgments(out: Path) -> list[Judgment]:
    return list(read_jsonl(out / JUDGMENTS_FILE, Judgment))  # every line as written, duplicates included


def test_valid_judgments_recorded_with_calls_and_the_run_untouched(judged_run, tmp_path, capsys):
    before = _digest(judged_run)
    out = tmp_path / "judges"
    with FakeOpenAIServer(judge, usage_cost=0.001) as srv:
        code, text, err = uqh_judge(capsys, judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                                    "--metrics", "GF,TC", "--repeats", "2", "--out", out, "--no-progress")
        requests = list(srv.requests)
    assert code == 0, err
    planned = N_TASKS * 2 * 2
    assert f"{planned}/{planned} made" in text and "scored=32" in text and "cost $0.0320" in text
    assert _digest(judged_run) == before  # the judged run is never modified
    assert sorted(p.name for p in out.iterdir()) == [JUDGE_MANIFEST_FILE, JUDGMENTS_FILE, "writer.lock"]
    js = _judgments(out)
    assert len(js) == planned and len({j.key for j in js}) == planned
    for req in requests:  # each reply is recorded as the judgment of the episode and metric it was asked about
        assert req["seed"] is not None and not req.get("logprobs")
        assert req["max_tokens"] == 1024
    for j in js:
        assert j.score is not None and j.missing_reason is None and j.rationale.endswith("checked every step")
        assert len(j.attempts) == 1 and j.attempts[0].error is None
        call = j.attempts[0].call
        assert call.model == "openai/judge" and call.cost_usd == 0.001 and call.usage.prompt_tokens > 100
        assert j.cited_steps == [j.n_steps]
    # repeats are independent calls with their own seeds; the same key never gets the same seed twice
    seeds = {(j.episode_id, j.metric): set() for j in js}
    for j in js:
        seeds[(j.episode_id, j.metric)].add(j.seed)
    assert all(len(s) == 2 for s in seeds.values())
    # each judgment holds the reply to the request that carried its judge's prompt and its episode's trace
    tasks = {ep.episode_id: ep.task_prompt for ep in RunDir.open(judged_run).episodes()}
    by_seed = {r["seed"]: r for r in requests}
    assert len(by_seed) == planned and len({j.episode_id for j in js}) == N_TASKS
    for j in js:
        req = by_seed[j.seed]
        assert judged_metric(req) == j.metric.value and tasks[j.episode_id] in req["messages"][1]["content"]
        reply = judge_reply(req)
        assert (j.score, j.cited_steps) == (reply["score"], reply["cited_steps"])
    assert {j.score for j in js if j.metric == JudgeMetric.GF} == {0, 3}
    # re-running the same command makes nothing new (the server's new port is not part of the judge config)
    with FakeOpenAIServer(judge) as srv:
        code, text, err = uqh_judge(capsys, judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                                    "--metrics", "GF,TC", "--repeats", "2", "--out", out, "--no-progress")
        assert code == 0 and srv.n_requests == 0 and f"(0 this run, {planned} before)" in text
        # more metrics add to the same directory
        code, text, err = uqh_judge(capsys, judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                                    "--metrics", "GF,TC,LC", "--repeats", "2", "--out", out, "--no-progress")
        assert code == 0 and srv.n_requests == N_TASKS * 2
    assert len(_judgments(out)) == planned + N_TASKS * 2


def _scripted(first_bad: str, second: str | None):
    """A judge whose first reply to every judgment is ``first_bad``; the repair gets ``second`` (or the valid
    reply when None)."""
    def respond(body):
        if is_repair(body):
            return second if second is not None else judge(body)
        return first_bad
    return respond


def test_malformed_reply_is_repaired_once(judged_run, tmp_path, capsys):
    out = tmp_path / "judges"
    with FakeOpenAIServer(_scripted("Score: 3 -- looks fine to me", None)) as srv:
        code, _, err = uqh_judge(capsys, judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                                 "--metrics", "GF", "--out", out, "--no-progress", "--limit", "2")
        requests = list(srv.requests)
    assert code == 0, err
    js = _judgments(out)
    assert len(js) == 2 and len(requests) == 4
    for j in js:
        assert j.score in (0, 3) and len(j.attempts) == 2
        assert j.attempts[0].raw_text == "Score: 3 -- looks fine to me" and "no JSON object" in j.attempts[0].error
        assert j.attempts[1].error is None
    repair = [r for r in requests if is_repair(r)]
    assert len(repair) == 2
    msgs = repair[0]["messages"]
    assert msgs[2] == {"role": "assistant", "content": "Score: 3 -- looks fine to me"}
    assert "could not be used: the reply contains no JSON object" in msgs[3]["content"]
    assert judge_reply(repair[0])["score"] in (0, 3)


def test_malformed_twice_is_recorded_missing_never_guessed(judged_run, tmp_path, capsys):
    out = tmp_path / "judges"
    with FakeOpenAIServer(_scripted('{"score": 5, "rationale": "x"}', '{"score": "three"}')) as srv:
        code, text, err = uqh_judge(capsys, judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                                    "--metrics", "LC", "--out", out, "--no-progress", "--limit", "3")
        assert srv.n_requests == 6  # one repair each, never a third call
    assert code == 0, err
    assert "missing=3" in text
    # the summary says how many have no score and why (issue 33: it used to look like a success)
    assert "missing          3 of 3 judgments have no score; most common reason: the reply did not parse" in text
    # the report's paired table says why it is empty without claiming the runs lack verbal confidence
    code, report, err = uqh_judge(capsys, "--report", "--out", out, "--bootstrap", "20")
    assert code == 0, err
    assert "No judged complete episode has both a judge score and a verbal confidence stream." in report
    assert "No judged complete episode has a verbal confidence stream." not in report
    js = _judgments(out)
    assert len(js) == 3
    for j in js:
        assert j.score is None and j.rationale is None and j.cited_steps == []
        assert j.missing_reason.startswith("the reply did not parse after one repair: score")
        assert [a.error is not None for a in j.attempts] == [True, True]
    # missing judgments are data: a re-run does not ask again
    with FakeOpenAIServer(judge) as srv:
        assert uqh_judge(capsys, judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                         "--metrics", "LC", "--out", out, "--no-progress", "--limit", "3")[0] == 0
        assert srv.n_requests == 0


def test_failed_calls_are_not_written_and_a_rerun_resumes(judged_run, tmp_path, capsys):
    out = tmp_path / "judges"
    args = ["--judge-model", "openai/judge", "--metrics", "GF", "--out", out, "--no-progress", "--limit", "3",
            "--concurrency", "1"]
    with FakeOpenAIServer(judge, faults=["400"]) as srv:  # not retryable: the first judgment's call fails
        code, text, err = uqh_judge(capsys, judged_run, "--api-base", srv.base_url, *args)
        assert code == 1 and "2/3 made" in text
        assert "1 judgments not made (judge call failed" in err and "re-run the same command" in err
        assert len(_judgments(out)) == 2
        code, text, err = uqh_judge(capsys, judged_run, "--api-base", srv.base_url, *args)
    assert code == 0 and "3/3 made (1 this run, 2 before)" in text
    assert len({j.key for j in _judgments(out)}) == 3


def test_changed_config_refused_one_line_nothing_written(judged_run, tmp_path, capsys):
    out = tmp_path / "judges"
    with FakeOpenAIServer(judge) as srv:
        base = [judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url, "--metrics", "GF",
                "--out", out, "--no-progress", "--limit", "1"]
        assert uqh_judge(capsys, *base)[0] == 0
        before = _digest(out)
        code, text, err = uqh_judge(capsys, *base, "--temperature", "0.9")
        assert srv.n_requests == 1
    assert code == 2 and text == "" and err.count("\n") == 1
    assert err.startswith("uqh judge: error: ") and "differs in: decoding.temperature" in err
    assert _digest(out) == before


@pytest.mark.parametrize("argv,fragment,created", [
    (["{run}", "--judge-model", "openai/j", "--api-base", "http://127.0.0.1:9/v1", "--out", "{run}/judges"],
     "is inside the judged run", None),
    (["{run}", "--judge-model", "openai/j", "--api-base", "http://127.0.0.1:9/v1", "--out", "{run}"],
     "is inside the judged run", None),
    (["{run}", "--judge-model", "openai/j", "--api-base", "http://127.0.0.1:9/v1", "--out", "{tmp}/otherrun"],
     "is a run directory", None),
    (["{run}", "--judge-model", "openai/j", "--api-base", "http://127.0.0.1:9/v1", "--metrics", "GF,XY",
      "--out", "{tmp}/j"], "unknown judge metric(s) XY", "j"),
    (["{run}", "--judge-model", "openai/j", "--api-base", "http://x/v1", "--repeats", "0", "--out", "{tmp}/j"],
     "argument --repeats: must be >= 1, got 0", "j"),
    (["{run}", "--judge-model", "openai/j", "--api-base", "http://x/v1", "--timeout", "0", "--out", "{tmp}/j"],
     "argument --timeout: must be > 0 seconds, got 0", "j"),
    (["--judge-model", "openai/j", "--api-base", "http://x/v1", "--out", "{tmp}/j"], "give the run directories", "j"),
    (["{run}", "--out", "{tmp}/j"], "give --judge-model MODEL", "j"),
    (["{tmp}/nope", "--judge-model", "openai/j", "--api-base", "http://x/v1", "--out", "{tmp}/j"],
     "is not a run directory", "j"),
    (["{run}", "{run}", "--judge-model", "openai/j", "--api-base", "http://x/v1", "--out", "{tmp}/j"],
     "given twice", "j"),
    (["{run}", "--judge-model", "nosuchprovider/xyz", "--out", "{tmp}/j"], "unknown model string", "j"),
    (["{run}", "--judge-model", "openai/gpt-4o-mini", "--out", "{tmp}/j"], "OPENAI_API_KEY", "j"),
    (["--report", "--out", "{tmp}/j"], "is not a judge directory", "j"),
    (["{run}", "--judge-model", "openai/j", "--api-base", "http://x/v1", "--out", "{tmp}/j", "--labels", "x.csv"],
     "belong to --report", "j"),
    (["--report", "--out", "{tmp}/j", "--labels", "{tmp}/missing.csv"], "does not exist", "j"),
    (["--report", "--out", "{tmp}/j", "--labels", "{tmp}/bad.csv"], "bad.csv:3: not a label (score", "j"),
])
def test_user_mistakes_one_line_exit_2_nothing_written(judged_run, tmp_path, capsys, monkeypatch, argv, fragment,
                                                         created):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "otherrun").mkdir()
    shutil.copy(judged_run / "manifest.json", tmp_path / "otherrun" / "manifest.json")
    (tmp_path / "bad.csv").write_text("episode_id,metric,score\narith-0000#0,GF,2\narith-0001#0,GF,7\n")
    before_tmp = sorted(p.name for p in tmp_path.iterdir())
    before_run = _digest(judged_run)
    argv = [a.replace("{run}", str(judged_run)).replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = uqh_judge(capsys, *argv)
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith("uqh judge: error: ") and fragment in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before_tmp
    assert _digest(judged_run) == before_run


def test_dry_run_writes_nothing(judged_run, tmp_path, capsys):
    out = tmp_path / "j"
    code, text, _ = uqh_judge(capsys, judged_run, "--judge-model", "openai/j", "--api-base", "http://x/v1",
                              "--repeats", "3", "--out", out, "--dry-run")
    assert code == 0 and not out.exists()
    assert f"{N_TASKS * 7 * 3} planned, 0 already in" in text and "GF,LC,EE,PQ,PA,TS,TC x 3 repeat(s)" in text
    assert "nothing was written" in text


def test_resume_after_kill_9(judged_run, tmp_path):
    out = tmp_path / "judges"
    before_run = _digest(judged_run)
    planned = N_TASKS * 3
    with FakeOpenAIServer(judge, latency_s=0.2) as srv:
        cmd = [sys.executable, "-m", "uqh.cli", "judge", str(judged_run), "--judge-model", "openai/judge",
               "--api-base", srv.base_url, "--metrics", "GF,EE,TC", "--concurrency", "2", "--out", str(out),
               "--no-progress"]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for_lines(out / JUDGMENTS_FILE, 4, proc)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        killed_at = len(_judgments(out))
        assert 4 <= killed_at < planned  # it really died mid-run
        with open(out / JUDGMENTS_FILE, "ab") as f:  # and as if in the middle of a write
            f.write(b'{"schema_version":1,"run":0,"episode_id":"arith-00')
        requests_before = srv.n_requests
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        resumed_requests = srv.n_requests - requests_before
    assert done.returncode == 0, done.stderr
    assert f"{planned}/{planned} made ({planned - killed_at} this run, {killed_at} before)" in done.stdout
    assert "removed a torn last line" in done.stdout
    data = (out / JUDGMENTS_FILE).read_bytes()
    assert data.endswith(b"\n") and all(json.loads(line) for line in data.splitlines())
    keys = [j.key for j in _judgments(out)]
    assert len(keys) == len(set(keys)) == planned  # every planned judgment exactly once
    assert resumed_requests == planned - killed_at  # finished judgments were not asked again
    assert _digest(judged_run) == before_run
    assert len(JudgeDir.open(out).judgments()) == planned


def test_help_has_no_heavy_imports(tmp_path):
    from test_cli_errors import _uqh

    rc, out, err, heavy = _uqh(["judge", "--help"], tmp_path)
    assert rc == 0 and out.startswith("usage: uqh judge") and "--judge-model" in out and heavy == []
    rc, _, err, _ = _uqh([], tmp_path)
    assert "    judge " in err  # `uqh` alone: the help, on stderr (exit 2)


def test_episodes_file_of_the_judged_run_is_read_torn_line_safe(judged_run, tmp_path, capsys):
    """A judged run still being written (a torn last episode line) is judged on its finished episodes only."""
    run = tmp_path / "run"
    shutil.copytree(judged_run, run)
    with open(run / EPISODES_FILE, "ab") as f:
        f.write(b'{"schema_version":1,"episode_id":"arith-9999#0","task')
    with FakeOpenAIServer(judge) as srv:
        code, text, err = uqh_judge(capsys, run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                                    "--metrics", "GF", "--out", tmp_path / "j", "--no-progress")
    assert code == 0, err
    assert f"{N_TASKS}/{N_TASKS} made" in text


def test_a_second_judge_writer_is_refused(judged_run, tmp_path, capsys):
    """One writer per judge directory, as for run directories: while another process holds the writer lock, a
    second `uqh judge` on the same --out is refused with one line naming the holder, and nothing is written."""
    out = tmp_path / "judges"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from uqh.harness.store import lock as run_lock\n"
        "with run_lock.hold(sys.argv[1]):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with FakeOpenAIServer(judge) as srv:
            code, _, err = uqh_judge(capsys, judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                                     "--metrics", "GF", "--out", out, "--no-progress")
            assert srv.requests == []
        assert code == 2 and f"pid {holder.pid}" in err and len(err.strip().splitlines()) == 1
        assert sorted(p.name for p in out.iterdir()) == ["writer.lock"]
    finally:
        holder.kill()
        holder.wait()


def test_a_local_judge_spreads_its_calls_over_one_server_process_per_core(judged_run, tmp_path, capsys, monkeypatch):
    """`--judge-model local:smollm2` starts a server process per core, as `uqh run` does, and the judge's calls
    go to all of them (stub llama-servers: the fake OpenAI server, each logging the requests it answers)."""
    reply = json.dumps({"score": 2, "rationale": "GF: fixed", "cited_steps": []})
    exe = tmp_path / "llama-server"
    exe.write_text(
        "#!/bin/bash\n"
        'while [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done\n'
        f'exec {sys.executable} {REPO / "tests" / "fake_openai_server.py"} --port "$port" --latency 0.05 '
        f'--request-log {tmp_path}/requests.$$ --text \'{reply}\'\n'
    )
    exe.chmod(0o755)
    monkeypatch.setenv("UQH_LLAMA_SERVER", str(exe))
    monkeypatch.setenv("UQH_LLAMA_SERVERS", "2")
    out = tmp_path / "judges"
    code, text, err = uqh_judge(capsys, judged_run, "--judge-model", "local:smollm2", "--metrics", "GF",
                                "--concurrency", "4", "--out", out, "--no-progress")
    assert code == 0, err
    assert f"{N_TASKS}/{N_TASKS} made" in text
    logs = sorted(tmp_path.glob("requests.*"))
    per_process = [len(p.read_text().split()) for p in logs]
    assert len(logs) == 2 and all(per_process) and sum(per_process) == N_TASKS, per_process
    assert all(j.score == 2 for j in _judgments(out))


def test_timeout_bounds_each_judge_call(judged_run, tmp_path, capsys):
    """The first call hangs for 5 s: with `--timeout 0.5` it fails after 0.5 s and its retry is answered (at the
    default 600 s it would have waited the 5 s and counted no retry)."""
    out = tmp_path / "judges"
    with FakeOpenAIServer(judge, faults=["timeout"], timeout_sleep_s=5.0) as srv:
        code, text, err = uqh_judge(capsys, judged_run, "--judge-model", "openai/judge", "--api-base", srv.base_url,
                                    "--metrics", "GF", "--limit", "1", "--timeout", "0.5", "--out", out,
                                    "--no-progress")
    assert code == 0, err
    (j,) = _judgments(out)
    call = j.attempts[0].call
    assert j.score is not None and call.retries == 1 and call.latency_s < 5.0
