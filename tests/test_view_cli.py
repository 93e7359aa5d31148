"""`uqh view` as a command: the URL printed (127.0.0.1 by default), Ctrl-C stops it cleanly, nothing is written into
the run directories it serves; bad input is one line and exit 2 (a port in use or out of range); runs made or
deleted while it serves are listed or leave (watched and polled); a run with a bad line among good ones names the
line on its own page and still serves its other episodes."""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from report_fixtures import tau2_like, webshop_like
from uqh.reports.view.follow import watchfiles_installed
from uqh.rundir.schema import EPISODES_FILE
from view_server import serving


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def view(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uqh.cli", "view", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_prints_its_local_url_serves_writes_nothing_and_stops_on_ctrl_c(tmp_path):
    webshop_like(tmp_path / "runs" / "ws")
    before = files_of(tmp_path / "runs")
    proc = subprocess.Popen([sys.executable, "-m", "uqh.cli", "view", str(tmp_path / "runs"), "--port", "0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("uqh view: 1 run directory at http://127.0.0.1:") and "Ctrl-C" in line
        url = line.split(" at ")[1].split()[0]
        assert get(url + "api/run/0/trajectories?since=0")[0] == 200
        status, text = get(url + "api/run/0/trajectory?id=a%230")
        assert status == 200 and json.loads(text)["ep"]["id"] == "a#0"
        assert get(url + "api/run/0/trajectory?id=zz%230")[0] == 404
        assert get(url + "api/run/9/trajectories")[0] == 404
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stderr.read() and "Traceback" not in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert files_of(tmp_path / "runs") == before  # nothing written into the run directory


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    webshop_like(tmp_path / "ws")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        done = view(str(tmp_path / "ws"), "--port", str(port), cwd=tmp_path)
    finally:
        taken.close()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and done.stdout == "" and len(lines) == 1
    assert lines[0] == f"uqh view: error: port {port} on 127.0.0.1 is in use; pass another --port (or --port 0 for a free one)"


def test_a_bad_port_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    done = view(str(tmp_path / "empty"), "--port", "70000", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip() == "uqh view: error: --port 70000 is not a TCP port (0..65535)"


def wait_until(condition, what: str, timeout: float = 60.0):
    """Poll ``condition()`` until it returns a true value (returned), or fail naming ``what`` after ``timeout``
    seconds (generous: the machine may be loaded; the check is on the condition, never on the time taken)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def listed_paths(url: str) -> set[str]:
    status, text = get(url + "api/runs")
    assert status == 200
    return {r["path"] for r in json.loads(text)["runs"]}


@pytest.mark.parametrize("follow", ["watch", "poll"])
def test_a_run_made_after_the_viewer_started_is_listed_and_a_deleted_one_leaves(tmp_path, follow):
    """Live discovery, both ways (watchfiles, and scanning every 2 s), from a folder that held no run at start-up
    (served, not refused: runs may come later)."""
    if follow == "watch" and not watchfiles_installed():
        pytest.skip("watchfiles (the `view` extra) is not installed")
    (tmp_path / "runs").mkdir()
    with serving(tmp_path / "runs", follow=follow) as srv:
        assert listed_paths(srv.url) == set()
        new = webshop_like(tmp_path / "runs" / "later" / "ws").resolve()
        wait_until(lambda: str(new) in listed_paths(srv.url), "the new run in /api/runs")
        assert srv.viewer.follow_method == follow
        key = next(k for k, r in srv.viewer.runs.items() if r.path == new)
        assert get(srv.url + f"api/run/{key}/trajectory?id=a%230")[0] == 200
        other = webshop_like(tmp_path / "runs" / "ws2").resolve()
        wait_until(lambda: str(other) in listed_paths(srv.url), "the second run in /api/runs")
        shutil.rmtree(new.parent)
        wait_until(lambda: str(new) not in listed_paths(srv.url), "the deleted run to leave /api/runs")
        assert listed_paths(srv.url) == {str(other)}
        assert get(srv.url + f"api/run/{key}/trajectories?since=0")[0] == 404  # its key is not reused
        assert srv.viewer.next_key == 2


def test_a_run_started_after_uqh_view_is_listed(tmp_path, fake_server):
    """The issue's check, end to end: `uqh view runs/`, then `uqh run ... --out runs/demo`: /api/runs lists it."""
    from test_runner import solver

    webshop_like(tmp_path / "runs" / "ws")
    viewer = subprocess.Popen([sys.executable, "-m", "uqh.cli", "view", str(tmp_path / "runs"), "--port", "0"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = viewer.stdout.readline().split(" at ")[1].split()[0]
        with fake_server(solver, latency_s=0.05) as srv:
            demo = tmp_path / "runs" / "demo"
            done = subprocess.run([sys.executable, "-m", "uqh.cli", "run", "--domain", "arithmetic", "--model",
                                   "openai/fake", "--api-base", srv.base_url, "--tasks", "2", "--out", str(demo),
                                   "--no-progress"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
        wait_until(lambda: str(demo.resolve()) in listed_paths(url), "the new run in /api/runs")
        row = next(r for r in json.loads(get(url + "api/runs")[1])["runs"] if r["path"] == str(demo.resolve()))
        assert row["done"] == 2 and row["state"] == "finished"
    finally:
        viewer.send_signal(signal.SIGINT)
        assert viewer.wait(timeout=30) == 0


def test_a_bad_line_in_one_run_is_named_on_its_page_and_the_others_still_serve(tmp_path):
    webshop_like(tmp_path / "good")
    bad = webshop_like(tmp_path / "bad")
    lines = (bad / EPISODES_FILE).read_bytes().split(b"\n")
    lines.insert(3, b'{"schema_version":1,"episode_id":"x#0","task_id":3,"stop_reason":"clean","outcome":1,"n_steps":0}')
    (bad / EPISODES_FILE).write_bytes(b"\n".join(lines) + b'{"schema_version":1,"episode_id":"torn')  # a torn tail
    with serving(tmp_path) as srv:
        keys = {r.path.name: k for k, r in srv.viewer.runs.items()}
        status, runs = get(srv.url + "api/runs")
        assert status == 200 and [r["done"] for r in json.loads(runs)["runs"]] == [9, 8]  # the torn line not counted
        status, text = get(srv.url + f"api/run/{keys['bad']}/trajectories?since=0")
        assert status == 200
        out = json.loads(text)
        assert [it["id"] for it in out["items"]] == ["a#0", "b#0", "c#0", "d#0", "e#0", "f#0", "g#0", "h#0"]
        assert out["read"] == out["done"] == 9
        assert len(out["notes"]) == 1 and out["notes"][0].startswith(
            f"{bad / EPISODES_FILE}:4: not a valid Episode record")
        assert get(srv.url + f"api/run/{keys['good']}/trajectories?since=0")[0] == 200
        assert get(srv.url + f"api/run/{keys['bad']}/trajectory?id=a%230")[0] == 200  # its good episodes still open
        status, text = get(srv.url + f"api/run/{keys['bad']}/trajectory?id=x%230")
        assert status == 422 and text.startswith(f"{bad / EPISODES_FILE}:4: not a valid Episode record")


def test_an_unreadable_directory_is_one_line_and_exit_2(tmp_path):
    """Checked as the user who runs uqh: as root (CI's user) the command runs without the capabilities that let
    root ignore file permissions (tests/test_write_faults.py's helper)."""
    import os

    from test_write_faults import _without_dac_override
    from environment import unavailable

    run = webshop_like(tmp_path / "runs" / "ws")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o000)
    try:
        try:
            done = subprocess.run([sys.executable, "-m", "uqh.cli", "view", str(locked)], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=60, preexec_fn=_without_dac_override(),
                                  env=dict(os.environ))
        except subprocess.SubprocessError as exc:
            unavailable(f"cannot run a command subject to file permissions here: {exc}")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0] == f"uqh view: error: {locked} cannot be read (permission denied)"
    finally:
        locked.chmod(0o755)
    assert run.is_dir()


@pytest.mark.parametrize("follow", ["watch", "poll"])
def test_a_given_folder_deleted_and_made_again_is_followed_again(tmp_path, follow):
    """A watch on a deleted folder sees nothing more: the viewer polls until the folder is back, then watches it
    again (the runs made in it listed either way)."""
    if follow == "watch" and not watchfiles_installed():
        pytest.skip("watchfiles (the `view` extra) is not installed")
    first = webshop_like(tmp_path / "runs" / "ws").resolve()
    with serving(tmp_path / "runs", follow=follow) as srv:
        wait_until(lambda: srv.viewer.follow_method == follow, "the viewer to follow its folder")
        shutil.rmtree(tmp_path / "runs")
        wait_until(lambda: listed_paths(srv.url) == set(), "the deleted folder's run to leave")
        again = webshop_like(tmp_path / "runs" / "ws2").resolve()
        wait_until(lambda: listed_paths(srv.url) == {str(again)}, "the run in the folder made again")
        wait_until(lambda: srv.viewer.follow_method == follow, "the folder to be watched again")
        later = webshop_like(tmp_path / "runs" / "ws3").resolve()
        wait_until(lambda: str(later) in listed_paths(srv.url), "a run made after that")
        assert str(first) not in listed_paths(srv.url)


def test_a_run_deleted_and_started_afresh_at_the_same_path_is_another_run(tmp_path):
    """Polled (the slower way: the deletion and the new run fall between two scans), the new directory at the same
    path gets a new key and its own episodes, not the old run's summaries."""
    run = webshop_like(tmp_path / "runs" / "ws")
    with serving(tmp_path / "runs", follow="poll") as srv:
        assert len(json.loads(get(srv.url + "api/run/0/trajectories?since=0")[1])["items"]) == 8
        shutil.rmtree(run)
        tau2_like(run)  # the same path, another run (6 episodes)
        wait_until(lambda: "1" in srv.viewer.runs, "the new run to be listed")
        assert list(srv.viewer.runs) == ["1"]
        out = json.loads(get(srv.url + "api/run/1/trajectories?since=0")[1])
        assert [it["id"] for it in out["items"]] == ["1#0", "2#0", "3#0", "4#0", "5#0", "6#0"]
