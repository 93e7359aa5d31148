"""`uqh run` end to end: summary, resume after kill -9, bad input (one line, exit 2, nothing written), smoke."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from uqh.cli import main
from uqh.rundir.schema import EPISODES_FILE, SIDECAR_FILE
from run_files import read_episodes, read_manifest, read_sidecar, wait_for_lines
from environment import scaled
from test_runner import solver

REPO = Path(__file__).resolve().parent.parent


def uqh(*argv: str) -> int:
    """``uqh run ARGV``'s exit code (a flag refused by its type exits from argparse, with code 2)."""
    try:
        return main(["run", *argv])
    except SystemExit as exc:
        return exc.code


def test_run_against_fake_server_prints_summary(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(solver) as srv:
        code = uqh("--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url, "--tasks", "3",
                   "--samples", "2", "--max-tokens", "64", "--out", str(out), "--no-progress")
        assert srv.requests[0]["max_tokens"] == 64 and srv.requests[0]["temperature"] == 0.2
    assert code == 0
    text = capsys.readouterr().out
    assert "6/6 finished" in text and "clean=6" in text and "cost n/a" in text and str(out) in text
    m = read_manifest(out)
    assert m.config.task_ids == ["arith-0000", "arith-0001", "arith-0002"] and m.config.samples_per_task == 2
    assert m.config.step_budget == 6  # the domain's default
    assert m.config.domain_options == {}
    assert len(read_episodes(out)) == 6


def test_config_change_refused_one_line(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(solver) as srv:
        args = ["--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url, "--tasks", "1",
                "--out", str(out), "--no-progress"]
        assert uqh(*args) == 0
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
        capsys.readouterr()
        assert uqh(*args, "--temperature", "0.7") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("uqh run: error: ")
    assert "differs in: decoding.temperature" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--domain", "nope", "--tasks", "1"], "unknown domain 'nope'"),
        (["--domain", "arithmetic", "--tasks", "1", "--model", "nosuchprovider/xyz"], "unknown model string"),
        (["--domain", "arithmetic", "--tasks", "1", "--model", "local:gpt5"], "unknown local model"),
        (["--domain", "arithmetic", "--tasks", "1", "--model", "openai/gpt-4o-mini"], "OPENAI_API_KEY"),
        (["--domain", "arithmetic", "--task-ids", "arith-0001,zzz", "--model", "openai/x", "--api-base",
          "http://127.0.0.1:9/v1"], "unknown task ids for arithmetic: zzz"),
        (["--domain", "arithmetic", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1"], "--tasks N"),
        (["--domain", "arithmetic", "--tasks", "0", "--model", "openai/x", "--api-base", "http://x/v1"], "argument --tasks: must be >= 1, got 0"),
        (["--preset", "no-such-preset"], "unknown preset"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(argv, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "run"
    assert uqh(*argv, "--out", str(out), "--no-progress") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("uqh run: error: ") and fragment in err, err
    assert not out.exists()


def test_unwritable_out_dir(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert uqh("--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", "http://x/v1",
               "--out", str(tmp_path / "afile" / "run")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create --out" in err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("x")
    assert uqh("--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", "http://x/v1",
               "--out", str(tmp_path / "busy")) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["thesis.tex"]


def test_dry_run_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert uqh("--domain", "arithmetic", "--tasks", "4", "--model", "openai/x", "--api-base", "http://x/v1",
               "--step-budget", "3", "--out", str(out), "--dry-run") == 0
    text = capsys.readouterr().out
    assert "4 x 1 sample(s) = 4 episodes" in text and "step budget   3" in text and "nothing was written" in text
    assert not out.exists()


def _multiprocessing_pids(tag: str) -> set[int]:
    """Processes started by multiprocessing (fork servers and their worker children) of the command run with
    ``UQH_TEST_TAG=tag`` in its environment: other tests' processes, running beside this one under pytest-xdist,
    are never counted (nor killed)."""
    marker = f"UQH_TEST_TAG={tag}".encode()
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"multiprocessing" in (d / "cmdline").read_bytes() and marker in (d / "environ").read_bytes().split(b"\0"):
                    pids.add(int(d.name))
            except OSError:
                continue
    return pids


@pytest.mark.parametrize("delay_s", [0.0, 0.3, 1.0])
def test_workers_exit_when_the_parent_is_killed_during_their_start_up(fake_server, tmp_path, delay_s):
    """A parent killed while its workers are still starting (before their event loops run) leaves nothing running:
    the fault campaign found workers of such a kill still alive 40 minutes later."""
    tag = uuid.uuid4().hex
    with fake_server(solver, latency_s=0.5) as srv:
        cmd = [sys.executable, "-m", "uqh.cli", "run", "--domain", "arithmetic", "--model", "openai/fake",
               "--api-base", srv.base_url, "--tasks", "40", "--concurrency", "3", "--out", str(tmp_path / "run"),
               "--no-progress", "--workers", "2"]
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO), UQH_TEST_TAG=tag),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while len(_multiprocessing_pids(tag)) < 2 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)  # the fork server and a first worker exist
            started = _multiprocessing_pids(tag)
            time.sleep(delay_s)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL and len(started) >= 2
        deadline = time.monotonic() + 15
        while _multiprocessing_pids(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _multiprocessing_pids(tag)
        for pid in left:  # never leave them to the rest of the suite
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"still running 15 s after the parent's kill -9: {sorted(left)}"


@pytest.mark.parametrize("workers", [1, 2])
def test_resume_after_kill_9(fake_server, tmp_path, workers):
    out = tmp_path / "run"
    n_tasks = 12
    tag = uuid.uuid4().hex
    with fake_server(solver, latency_s=0.25) as srv:
        cmd = [sys.executable, "-m", "uqh.cli", "run", "--domain", "arithmetic", "--model", "openai/fake",
               "--api-base", srv.base_url, "--tasks", str(n_tasks), "--concurrency", "3", "--out", str(out),
               "--no-progress", "--workers", str(workers)]
        env = dict(os.environ, PYTHONPATH=str(REPO), UQH_TEST_TAG=tag)
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for_lines(out / EPISODES_FILE, 3, proc)
            started = _multiprocessing_pids(tag)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert len(started) >= (3 if workers == 2 else 0)  # fork server + 2 workers were running
        # Workers (and their fork server) notice the parent's death and exit: nothing runs on unsupervised.
        deadline = time.monotonic() + 15
        while _multiprocessing_pids(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _multiprocessing_pids(tag)
        killed_at = len(read_episodes(out))
        assert killed_at < n_tasks  # it really died mid-run
        requests_before = len(srv.requests)
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        resumed_requests = len(srv.requests) - requests_before
    assert done.returncode == 0, done.stderr
    assert f"{n_tasks}/{n_tasks} finished" in done.stdout
    planned = [f"arith-{i:04d}#0" for i in range(n_tasks)]
    for name in (EPISODES_FILE, SIDECAR_FILE):
        data = (out / name).read_bytes()
        assert data.endswith(b"\n")
        for line in data.splitlines():
            json.loads(line)  # no torn lines
    ids = [e.episode_id for e in read_episodes(out)]
    assert sorted(ids) == planned and len(ids) == len(set(ids))  # exactly the planned episodes, no duplicates
    # sidecar consistent with the episodes: one row per attempt, no duplicates, no orphans
    rows = Counter((r.episode_id, r.t, r.attempt) for r in read_sidecar(out))
    expected = Counter((e.episode_id, s.t, a.attempt) for e in read_episodes(out) for s in e.steps for a in s.attempts)
    assert rows == expected
    # finished episodes were not re-run (in-flight ones continue from checkpoints: at most 2 calls each)
    assert resumed_requests <= 2 * (n_tasks - killed_at)
    assert not list((out / "checkpoints").glob("*.json"))


@pytest.mark.smoke
def test_smoke_local_smollm2(tmp_path):
    out = tmp_path / "tmp"
    code = main(["run", "--domain", "arithmetic", "--model", "local:smollm2", "--tasks", "1", "--step-budget", "2",
                 "--max-tokens", "48", "--out", str(out), "--no-progress"])
    assert code == 0
    (ep,) = read_episodes(out)
    assert ep.stop_reason.value in {"clean", "max_steps", "parse_error"}
    rows = list(read_sidecar(out))
    assert rows and all(r.tokens for r in rows)  # real logprobs from llama.cpp
    attempts = [a for s in ep.steps for a in s.attempts] + list(ep.failed_step or [])
    assert len(rows) == len(attempts)
    for row, att in zip(rows, attempts):
        assert "".join(t.token for t in row.tokens) == att.raw_text or row.action_token_range is None


def test_local_model_default_max_tokens(tmp_path, capsys):
    out = tmp_path / "run"
    assert uqh("--domain", "arithmetic", "--tasks", "1", "--model", "local:smollm2", "--out", str(out), "--dry-run") == 0
    assert "max_tokens=256" in capsys.readouterr().out  # local models decode with the grammar by default
    assert uqh("--domain", "arithmetic", "--tasks", "1", "--model", "local:smollm2", "--no-grammar", "--out", str(out),
               "--dry-run") == 0
    assert "max_tokens=160" in capsys.readouterr().out
    assert uqh("--domain", "arithmetic", "--tasks", "1", "--model", "local:smollm2", "--max-tokens", "48",
               "--out", str(out), "--dry-run") == 0
    assert "max_tokens=48" in capsys.readouterr().out
    assert not out.exists()


def test_domain_options_only_when_set_and_grammar_forwarded(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    assert uqh("--domain", "hotpotqa", "--tasks", "1", "--model", "openai/x", "--api-base", "http://x/v1",
               "--top-k", "3", "--retrieval", "bm25", "--out", str(out), "--dry-run") == 0
    assert "options       retrieval=bm25, top_k=3" in capsys.readouterr().out
    # a domain refuses options it does not have (arithmetic has none but the split), naming the ones it has
    assert uqh("--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", "http://x/v1",
               "--top-k", "3", "--out", str(out), "--dry-run") == 2
    assert capsys.readouterr().err == "uqh run: error: unknown arithmetic option(s) top_k; known: split\n"
    with fake_server(solver) as srv:
        assert uqh("--domain", "arithmetic", "--task-ids", "arith-0007", "--model", "openai/fake", "--api-base",
                   srv.base_url, "--grammar", "--seed", "7", "--top-logprobs", "3", "--out", str(out),
                   "--no-progress") == 0
        body = srv.requests[0]
    assert "<think>" in body["grammar"] and body["top_logprobs"] == 3
    from uqh.harness.episode.loop import derive_seed

    assert body["seed"] == derive_seed(7, "arith-0007#0")
    m = read_manifest(out)
    assert m.config.decoding.grammar is True and m.config.task_ids == ["arith-0007"] and m.config.domain_options == {}


def test_preset_dry_run_prints_the_preset_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)  # a plan needs no key
    assert uqh("--preset", "paper-hotpotqa", "--model", "openai/mine", "--tasks", "10", "--out",
               str(tmp_path / "r"), "--dry-run") == 0
    text = capsys.readouterr().out
    assert "preset paper-hotpotqa" in text and "model           openai/mine" in text
    assert "dry run: no model was called." in text and not (tmp_path / "r").exists()


def test_infra_error_exits_1_and_rerun_resumes(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(solver, faults=["400"]) as srv:  # non-retryable: the first call fails at once
        args = ["--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url, "--tasks", "2",
                "--concurrency", "1", "--out", str(out), "--no-progress"]
        assert uqh(*args) == 1
        captured = capsys.readouterr()
        assert "1/2 finished" in captured.out
        assert "infra errors   1 this run, not written (re-run to resume): model call failed" in captured.out
        assert "1 episodes not finished (model call failed" in captured.err
        assert "re-run the same command to resume" in captured.err
        assert uqh(*args) == 0
    again = capsys.readouterr().out
    assert "2/2 finished (1 this run, 1 before)" in again
    # the whole run's stop reasons, and this invocation's
    assert "stop reasons   clean=2 (this run: clean=1)\n" in again and "infra errors" not in again


def test_resume_progress_counts_the_whole_run_and_prints_before_the_first_episode(fake_server, tmp_path, capsys,
                                                                                 monkeypatch):
    import uqh.harness.progress as progress

    monkeypatch.setattr(progress, "clock_text", lambda: "09:00:00")
    out = tmp_path / "run"
    with fake_server(solver) as srv:
        args = ["--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url, "--tasks", "2",
                "--concurrency", "1", "--out", str(out)]
        assert uqh(*args, "--no-progress") == 0
        capsys.readouterr()
        # a partial run: the last episode cut away (its sidecar rows become an orphan tail, repaired on open)
        lines = (out / "episodes.jsonl").read_bytes().splitlines(keepends=True)
        (out / "episodes.jsonl").write_bytes(lines[0])
        assert uqh(*args) == 0  # progress on: pytest's stderr is not a terminal, so plain lines
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert err[0] == f"uqh run: note: {out}: logprobs.jsonl: removed 2 rows of an episode that was not finished"
    assert err[1] == "09:00:00 uqh run: 1 episodes to run (2 planned, 1 finished before)"  # before any episode ends
    assert err[-1].startswith("09:00:00 uqh run [2/2] clean=2 | ") and "| ETA 0s |" in err[-1]
    assert "stop reasons   clean=2 (this run: clean=1)" in captured.out
    assert sorted(e.episode_id for e in read_episodes(out)) == ["arith-0000#0", "arith-0001#0"]


# ------------------------------------------------------------------------------------- reliability (issue 16)


def _fake_args(base_url: str, out: Path, n_tasks: int = 1, *extra: str) -> list[str]:
    return ["--domain", "arithmetic", "--model", "openai/fake", "--api-base", base_url, "--tasks", str(n_tasks),
            "--out", str(out), "--no-progress", *extra]


def test_timeout_flag_honoured_and_recorded_outside_the_config_hash(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(solver, faults=["timeout"] * 4, timeout_sleep_s=30.0) as srv:  # the server hangs 30 s
        t0 = time.monotonic()
        assert uqh(*_fake_args(srv.base_url, out, 1, "--timeout", "0.5", "--max-retries", "0")) == 1
        assert time.monotonic() - t0 < scaled(10.0)
        err = capsys.readouterr().err
        assert "no answer within 0.5 s (--timeout)" in err and "after 1 attempts (0 retries)" in err
        m = read_manifest(out)
        assert (m.execution.timeout_s, m.execution.max_retries) == (0.5, 0)
        srv.faults.clear()
        assert uqh(*_fake_args(srv.base_url, out, 1, "--timeout", "20", "--max-retries", "2")) == 0  # same run
    assert "1/1 finished" in capsys.readouterr().out
    m2 = read_manifest(out)
    assert m2.config_hash == m.config_hash and (m2.execution.timeout_s, m2.execution.max_retries) == (20.0, 2)


@pytest.mark.parametrize("flags,fragment", [(["--timeout", "0"], "argument --timeout: must be > 0 seconds, got 0"),
                                            (["--max-retries", "-1"], "argument --max-retries: must be >= 0, got -1")])
def test_timeout_and_retry_flags_validated(tmp_path, capsys, flags, fragment):
    assert uqh(*_fake_args("http://127.0.0.1:9/v1", tmp_path / "run", 1, *flags)) == 2
    assert fragment in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("base,reason", [("http://nohost.invalid/v1", "DNS lookup failed"),
                                         ("http://127.0.0.1:{port}/v1", "connection refused")])
@pytest.mark.parametrize("workers", [1, 2])
def test_unreachable_endpoint_fails_fast_with_one_line(tmp_path, capsys, base, reason, workers):
    from test_model_client import _closed_port

    base = base.format(port=_closed_port())
    t0 = time.monotonic()
    assert uqh(*_fake_args(base, tmp_path / "run", 6, "--workers", str(workers))) == 1
    assert time.monotonic() - t0 < scaled(15.0)  # no retries with backoff (they took 67-77 s)
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line == (f"uqh run: openai/fake: cannot reach {base}: {reason}" + line.split(reason, 1)[1])
    assert "6 episodes not finished" in line and "--api-base" in line and "ssl" not in line.lower()
    assert "Traceback" not in captured.out + captured.err


@pytest.mark.parametrize("flag", ["--api-base", "--user-api-base"])
def test_credentials_in_an_endpoint_url_are_refused_and_never_echoed(tmp_path, capsys, flag):
    out = tmp_path / "run"
    url = "http://alice:s3cr3t-pw@127.0.0.1:9/v1"
    extra = ["--api-base", "http://127.0.0.1:9/v1", "--user-model", "openai/u"] if flag == "--user-api-base" else []
    for dry in ([], ["--dry-run"]):
        argv = ["--domain", "arithmetic", "--model", "openai/x", "--tasks", "1", "--out", str(out), *extra, flag, url,
                *dry]
        assert uqh(*argv) == 2
        captured = capsys.readouterr()
        assert "s3cr3t" not in captured.out + captured.err and "alice" not in captured.err
        (line,) = captured.err.strip().splitlines()
        assert f"{flag} http://***@127.0.0.1:9/v1 contains credentials" in line
    assert not out.exists()


@pytest.mark.parametrize("url", ["not a url", "127.0.0.1:8000/v1", "ftp://host/v1", "http://", "http://h:port/v1"])
def test_invalid_api_base_writes_nothing_exit_2(tmp_path, capsys, url):
    out = tmp_path / "run"
    assert uqh("--domain", "arithmetic", "--model", "openai/x", "--tasks", "1", "--api-base", url, "--out",
               str(out)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "is not an http(s) URL" in line
    assert not out.exists()


def test_continue_refuses_credentials_in_its_api_base(tmp_path, capsys):
    from uqh.harness.continuation import run_continuations
    from uqh.rundir.errors import UserError

    with pytest.raises(UserError, match=r"\*\*\*@h/v1 contains credentials"):
        run_continuations(tmp_path / "src", tmp_path / "cont", branches=1, api_base="https://k:v@h/v1")
    assert not (tmp_path / "cont").exists()


def test_dotenv_in_the_working_directory_is_read(tmp_path):
    """`./.env` is read (not only one next to the package); the environment still wins over it."""
    (tmp_path / ".env").write_text("OPENROUTER_API_KEY=sk-or-from-dotenv\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "uqh.cli", "run", "--domain", "arithmetic", "--tasks", "1", "--out", "r",
           "--dry-run"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "model         openrouter/google/gemma-4-31b-it" in done.stdout  # the default once a key is configured
    (tmp_path / ".env").unlink()
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert "model         local:smollm2" in done.stdout
    (tmp_path / ".env").write_text("OPENROUTER_API_KEY=\n")
    done = subprocess.run(cmd, cwd=tmp_path, env={**env, "OPENROUTER_API_KEY": "sk-or-env"}, capture_output=True,
                          text=True, timeout=600)
    assert "model         openrouter/google/gemma-4-31b-it" in done.stdout  # the environment's key, not .env's blank


def test_more_tasks_than_the_split_has_is_said_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert uqh("--domain", "arithmetic", "--tasks", "5000", "--model", "openai/x", "--api-base", "http://x/v1",
               "--out", str(out), "--dry-run") == 0
    text = capsys.readouterr().out
    assert "note          5,000 tasks asked for, but arithmetic has 1,000: planning all 1,000" in text
    assert "1000 x 1 sample(s) = 1000 episodes" in text
    assert uqh("--domain", "arithmetic", "--tasks", "999", "--model", "openai/x", "--api-base", "http://x/v1",
               "--out", str(out), "--dry-run") == 0
    assert "note" not in capsys.readouterr().out


def test_summary_accounting_retries_null_content_and_no_fake_zero_cost(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(solver, faults=["null_content", "429"]) as srv:  # 429: Retry-After 0, one retry
        assert uqh(*_fake_args(srv.base_url, out, 1)) == 0
        first = capsys.readouterr().out
        assert uqh(*_fake_args(srv.base_url, out, 1)) == 0  # a resume of a finished run makes no call
    again = capsys.readouterr().out
    # null content is the provider's fault (issue 33 item 7): retried, never an empty text the agent must repair;
    # the call says so, and the summary counts it
    (ep,) = read_episodes(out)
    attempts = [a for s in ep.steps for a in s.attempts] + (ep.failed_step or [])
    assert len(attempts) == 2 and not any(a.error for a in attempts) and ep.stop_reason.value == "clean"
    assert attempts[0].call.content_null and attempts[0].call.retries == 2 and attempts[0].raw_text != ""
    assert "model calls    2 (0 without logprobs, 1 with null content); 2 retries;" in first
    assert "cost n/a (unpriced model)" in first
    assert "model calls    0 (0 without logprobs); 0 retries;" in again and "cost n/a (no calls)" in again
    assert "$0.0000" not in again


def test_score_says_why_there_is_nothing_to_score(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server("no tags at all") as srv:  # every episode ends parse_error
        assert uqh(*_fake_args(srv.base_url, out, 2)) == 0
    capsys.readouterr()
    assert main(["score", str(out), "--bootstrap", "0"]) == 0
    err = capsys.readouterr().err
    assert f"uqh score: note: {out}: no complete episode to score: 2 episodes (parse_error=2)" in err


def test_a_finished_run_ends_with_a_next_hint_whose_commands_work(fake_server, tmp_path, capsys, monkeypatch):
    import shlex

    monkeypatch.chdir(tmp_path)
    with fake_server(solver) as srv:
        assert uqh("--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url, "--tasks", "3",
                   "--out", "runs/my demo", "--no-progress") == 0
    hint = capsys.readouterr().out.strip().splitlines()[-1]
    assert hint.startswith("next           uqh score ")
    commands = [c.strip() for c in re.split(r"\(then: |; |\)$", hint.split(None, 1)[1]) if c.strip()]
    assert len(commands) >= 2 and all(c.startswith("uqh ") for c in commands)
    for command in commands:
        argv = shlex.split(command)[1:]
        if argv[0] in ("score", "report"):
            argv += ["--bootstrap", "20"]  # as printed, only fewer resamples (speed)
        assert main(argv) == 0, command
    assert (tmp_path / "runs" / "my demo-report" / "report.html").is_file()
    assert (tmp_path / "runs" / "my demo-export" / "steps.parquet").is_file()


@pytest.mark.parametrize("command,flag", [
    (["run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1"],
     "--temperature"),
    (["run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1"],
     "--timeout"),
    (["run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1",
      "--samples", "3"], "--stop-on-consensus"),
])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_refused_before_anything_is_written(command, flag, value, tmp_path, capsys):
    # float() accepts them; a nan temperature used to be run, recorded as null, and then no command could read
    # the run directory
    from uqh.cli import main

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        main([*command, f"{flag}={value}", "--out", str(out), "--no-progress"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a finite number, got '{value}'" in err.splitlines()[-1]
    assert not out.exists()


def test_build_layer_refuses_a_nan_temperature_from_the_python_api(tmp_path):
    import math

    from uqh.harness.config.build import DecodingOverrides, RunOverrides, draft
    from uqh.rundir.errors import UserError

    overrides = RunOverrides(domain="arithmetic", tasks=1, model="openai/x", api_base="http://127.0.0.1:9/v1",
                             decoding=DecodingOverrides(temperature=math.nan), out=tmp_path / "r")
    with pytest.raises(UserError, match="--temperature must be a finite number"):
        draft(None, overrides)
