"""One writer per run directory: a second `uqh run` is refused with one line naming the holder, before it writes
anything; the lock dies with its holder (kill -9 included) and is never held by worker processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from uqh.harness.store import lock as run_lock
from uqh.cli import main
from uqh.rundir.errors import UserError
from uqh.rundir.schema import EPISODES_FILE, LOCK_FILE, SIDECAR_FILE
from run_files import read_episodes, read_sidecar
from test_runner import solver
from run_files import wait_for_lines

REPO = Path(__file__).resolve().parent.parent

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from uqh.harness.store import lock as run_lock
    with run_lock.hold(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(60)
""")


def hold_in_subprocess(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout.readline().strip() == b"held"
    return proc


def test_lock_names_its_holder_and_dies_with_it(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = hold_in_subprocess(run_dir)
    try:
        assert run_lock.is_held(run_dir)
        info = json.loads((run_dir / LOCK_FILE).read_text())
        assert info["pid"] == holder.pid and info["host"] and info["started_at"] and info["command"]
        with pytest.raises(UserError) as exc:
            with run_lock.hold(run_dir):
                pass
        msg = str(exc.value)
        assert f"pid {holder.pid}" in msg and "one writer per run directory" in msg and "\n" not in msg
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup code runs: the kernel releases the lock
        holder.wait()
    assert not run_lock.is_held(run_dir)
    with run_lock.hold(run_dir):  # a stale lock file never blocks
        with run_lock.hold(run_dir):  # re-entrant within one process
            assert not run_lock.is_held(run_dir)  # (is_held is about *other* processes)
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_lock_masks_url_credentials_in_the_recorded_command(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/x/uqh/cli/__main__.py", "run", "--api-base", "http://u:secret@h/v1"])
    with run_lock.hold(tmp_path):
        text = (tmp_path / LOCK_FILE).read_text()
    assert "secret" not in text and json.loads(text)["command"] == "uqh run --api-base http://***@h/v1"


def _run_cmd(base_url: str, out: Path, n_tasks: int, workers: int = 1) -> list[str]:
    return [sys.executable, "-m", "uqh.cli", "run", "--domain", "arithmetic", "--model", "openai/fake",
            "--api-base", base_url, "--tasks", str(n_tasks), "--concurrency", "3", "--workers", str(workers),
            "--out", str(out), "--no-progress"]


@pytest.mark.parametrize("delay_s", [0.0, 0.5])
def test_two_concurrent_runs_on_one_directory(fake_server, tmp_path, delay_s):
    """The issue's reproduction (two `uqh run`, 0.5 s apart) and a simultaneous start: exactly one writes."""
    out, n_tasks = tmp_path / "run", 8
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with fake_server(solver, latency_s=0.1) as srv:
        cmd = _run_cmd(srv.base_url, out, n_tasks)
        first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay_s)
        second = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        results = [(p, *(x.decode() for x in p.communicate(timeout=600))) for p in (first, second)]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, err) for p, _, err in results]
    (winner, w_out, _), = [r for r in results if r[0].returncode == 0]
    (loser, l_out, l_err), = [r for r in results if r[0].returncode == 2]
    assert f"{n_tasks}/{n_tasks} finished ({n_tasks} this run, 0 before)" in w_out
    assert l_out == "" and "Traceback" not in l_err
    (line,) = l_err.strip().splitlines()
    assert line.startswith("uqh run: error: ") and f"pid {winner.pid}" in line and "uqh run --domain arithmetic" in line
    ids = [e.episode_id for e in read_episodes(out)]
    assert sorted(ids) == [f"arith-{i:04d}#0" for i in range(n_tasks)]  # no duplicates
    rows = [(r.episode_id, r.t, r.attempt) for r in read_sidecar(out)]
    assert len(rows) == len(set(rows)) == 2 * n_tasks


def test_refused_writer_writes_nothing(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(solver) as srv:
        args = ["run", "--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url, "--tasks", "2",
                "--out", str(out), "--no-progress"]
        assert main(args) == 0
        (out / EPISODES_FILE).write_bytes((out / EPISODES_FILE).read_bytes() + b'{"torn')  # a repair would cut it
        holder = hold_in_subprocess(out)
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
        try:
            capsys.readouterr()
            assert main(args) == 2
            assert main([*args[:-1], "--dry-run"]) == 2  # even the plan says the directory is busy
        finally:
            holder.kill()
            holder.wait()
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and f"is being written by pid {holder.pid}" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # torn tail untouched: nothing was written


def test_worker_processes_do_not_hold_the_lock(fake_server, tmp_path):
    """kill -9 of the parent releases the lock at once, even before its workers have noticed and exited."""
    out = tmp_path / "run"
    with fake_server(solver, latency_s=0.2) as srv:
        proc = subprocess.Popen(_run_cmd(srv.base_url, out, 12, workers=2), cwd=tmp_path,
                                env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            wait_for_lines(out / EPISODES_FILE, 2, proc)
            assert run_lock.is_held(out)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert not run_lock.is_held(out)
        os.killpg(proc.pid, signal.SIGKILL)  # tidy: the workers' own exit is tested in test_cli_run


def test_sidecar_rows_of_unfinished_episode_before_the_tail_refused(tmp_path):
    """Rows of an episode without an episode line, followed by rows of finished ones, are not a crash tail."""
    from test_store import create, make_episode, make_rows

    with create(tmp_path) as store:
        store.append_episode(make_episode("a#0"), make_rows("a#0", 1))
    run = tmp_path / "run"
    stray = b"".join(r.model_dump_json().encode() + b"\n" for r in make_rows("x#0", 1))
    with open(run / SIDECAR_FILE, "ab") as f:
        f.write(stray)
    with create(tmp_path) as store:  # at the end it is a crash leftover: removed
        store.append_episode(make_episode("b#0"), make_rows("b#0", 1))
    data = (run / SIDECAR_FILE).read_bytes()
    lines = data.splitlines(keepends=True)
    (run / SIDECAR_FILE).write_bytes(lines[0] + stray + b"".join(lines[1:]))
    before = (run / SIDECAR_FILE).read_bytes()
    with pytest.raises(UserError, match=r"logprobs.jsonl:2: a row of episode 'x#0'.*uqh repair"):
        create(tmp_path)
    assert (run / SIDECAR_FILE).read_bytes() == before
    assert not run_lock.is_held(run)  # the refused open released its lock
