"""SIGINT and SIGTERM stop `uqh run` cleanly: within 2 s, with the summary and the resume hint, no traceback, no
model request after the signal, and no surviving child process (worker processes, their fork server, a local
model server -- here a stub that, like a busy llama.cpp server, ignores SIGTERM).

Every test runs the real CLI in a subprocess (its own session, so a signal to its process group does not reach
pytest) against the fake OpenAI server, which records when each request arrived.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from uqh.rundir.schema import EPISODES_FILE
from run_files import read_episodes, read_sidecar, wait_for_lines
from environment import scaled
from test_runner import solver

REPO = Path(__file__).resolve().parent.parent
FAKE_SERVER = Path(__file__).resolve().parent / "fake_openai_server.py"
#: A request that left the client just before the signal may be stamped after it: the fake server stamps arrivals
#: late on a loaded machine (tests run 1.5 workers per core). Each of a run's 4 slots has at most one request in
#: transit, so at most 4 may arrive after the signal, however late; a run that went on sending would send a dozen
#: or more (0.3 s per call) over its stop.
IN_TRANSIT_MAX = 4
#: The stub local server (one request at a time, its own process) logs arrivals: later than this is a violation.
IN_TRANSIT_S = 0.25
STOP_WITHIN_S = 2.0
CALC = "<think>t</think>\n<action>Calc[1+1]</action>\n<confidence>0.5</confidence>\n<explanation>e</explanation>"


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(d.name))
    return tree


def descendants(pid: int) -> set[int]:
    tree, out, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_gone(pids: set[int], timeout: float = 2.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def send(proc: subprocess.Popen, signum: int, to_group: bool) -> None:
    if to_group:  # as a Ctrl-C in a terminal: every process of the foreground group gets it
        os.killpg(proc.pid, signum)
    else:  # as `kill PID` / a job scheduler's SIGTERM
        proc.send_signal(signum)


def check_stopped(proc, signum: int, sent_at: float, t0: float, children: set[int]) -> tuple[str, str]:
    out, err = proc.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    out, err = out.decode(), err.decode()
    name = signal.Signals(signum).name
    assert elapsed < scaled(STOP_WITHIN_S), f"took {elapsed:.2f} s to stop (load-scaled bound {scaled(STOP_WITHIN_S):.1f} s)"
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    assert "Traceback" not in out + err and "leaked" not in err and "KeyboardInterrupt" not in err, err
    assert "episodes " in out and "model calls" in out  # the summary
    (line,) = err.strip().splitlines()
    assert f"interrupted by {name}" in line and "re-run the same command to resume" in line
    survivors = wait_gone(children)
    assert not survivors, f"child processes survived the run: { {p: cmdline(p) for p in survivors} }"
    return out, err


@pytest.mark.parametrize(
    "signame,workers,to_group",
    [("SIGTERM", 1, False), ("SIGINT", 1, True), ("SIGTERM", 2, False), ("SIGINT", 2, True)],
    ids=["sigterm", "sigint-group", "sigterm-workers", "sigint-group-workers"],
)
def test_stop_signal_summary_no_orphans_no_late_requests(fake_server, tmp_path, signame, workers, to_group):
    signum = getattr(signal, signame)
    out_dir = tmp_path / "run"
    n_tasks = 24
    with fake_server(solver, latency_s=0.3) as srv:
        cmd = [sys.executable, "-m", "uqh.cli", "run", "--domain", "arithmetic", "--model", "openai/fake",
               "--api-base", srv.base_url, "--tasks", str(n_tasks), "--concurrency", "4", "--workers", str(workers),
               "--out", str(out_dir), "--no-progress"]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            wait_for_lines(out_dir / EPISODES_FILE, 2, proc)
            children = descendants(proc.pid)
            if workers > 1:
                assert len(children) >= 3  # fork server + 2 workers (+ resource tracker)
            sent_at, t0 = time.time(), time.monotonic()
            send(proc, signum, to_group)
            out, _ = check_stopped(proc, signum, sent_at, t0, children)
        finally:
            if proc.poll() is None:
                proc.kill()
        late = [round(t - sent_at, 2) for t in srv.request_times if t > sent_at]
        assert len(late) <= IN_TRANSIT_MAX, f"{len(late)} requests arrived after the signal (s after it: {late})"
        finished = len(read_episodes(out_dir))
        assert f"{finished}/{n_tasks} finished" in out and finished < n_tasks
        if signame == "SIGTERM" and workers == 2:  # the directory resumes to exactly the planned episodes
            done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr
            eps = read_episodes(out_dir)
            assert sorted(e.episode_id for e in eps) == [f"arith-{i:04d}#0" for i in range(n_tasks)]
            rows = Counter((r.episode_id, r.t, r.attempt) for r in read_sidecar(out_dir))
            assert rows == Counter((e.episode_id, s.t, a.attempt) for e in eps for s in e.steps for a in s.attempts)


STUB_DRIVER = """
import sys
from pathlib import Path
from uqh.harness.model import llama_server as local_model
from uqh.cli import main

fake, log = sys.argv[1], sys.argv[2]
local_model.find_gguf = lambda model: Path("/dev/null")  # no model file needed: the stub serves the answers
local_model.LocalModelServer.command = lambda self: [
    sys.executable, fake, "--port", str(self.port), "--latency", "0.3", "--request-log", log, "--ignore-sigterm",
    "--text", {text!r},
]
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_stop_signal_stops_the_local_model_server(tmp_path, signame):
    """`--model local:smollm2` with two stub server children that ignore SIGTERM: both are killed, not left
    running."""
    signum = getattr(signal, signame)
    out_dir, log = tmp_path / "run", tmp_path / "requests.log"
    argv = ["run", "--domain", "arithmetic", "--model", "local:smollm2", "--tasks", "10", "--step-budget", "3",
            "--out", str(out_dir), "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(REPO), UQH_LLAMA_SERVERS="2")  # a process per core on 2 cores
    proc = subprocess.Popen(
        [sys.executable, "-c", STUB_DRIVER.format(text=CALC), str(FAKE_SERVER), str(log), *argv], cwd=tmp_path,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        wait_for_lines(out_dir / EPISODES_FILE, 1, proc)
        children = descendants(proc.pid)
        server = [p for p in children if str(FAKE_SERVER) in cmdline(p)]
        assert len(server) == 2 and all(map(alive, server)), {p: cmdline(p) for p in children}
        sent_at, t0 = time.time(), time.monotonic()
        send(proc, signum, to_group=signame == "SIGINT")
        check_stopped(proc, signum, sent_at, t0, children)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not any(map(alive, server))
    arrivals = [float(x) for x in log.read_text().split()]
    assert arrivals and not [t - sent_at for t in arrivals if t > sent_at + scaled(IN_TRANSIT_S)], "requests after the signal"
