"""`uqh view` as a command: the URL printed (127.0.0.1 by default), Ctrl-C stops it cleanly, nothing is written into
the run directories it serves; bad input is one line and exit 2 (a port in use, a folder without a run), and a run
with a bad line among good ones is a clear message from its own route, not a crash of the server."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from report_fixtures import webshop_like
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


def test_a_folder_without_a_run_and_a_bad_port_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    done = view(str(tmp_path / "empty"), cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "no run directory in" in lines[0]
    done = view(str(tmp_path / "empty"), "--port", "70000", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip() == "uqh view: error: --port 70000 is not a TCP port (0..65535)"


def test_a_bad_line_in_one_run_is_a_message_from_its_route_and_the_others_still_serve(tmp_path):
    webshop_like(tmp_path / "good")
    bad = webshop_like(tmp_path / "bad")
    with (bad / EPISODES_FILE).open("ab") as f:
        f.write(b'{"schema_version":1,"episode_id":"x#0","task_id":3,"stop_reason":"clean","outcome":1,"n_steps":0}\n')
        f.write(b'{"schema_version":1,"episode_id":"torn')  # and a torn tail: never an error
    with serving(tmp_path) as srv:
        keys = {r.path.name: k for k, r in srv.viewer.runs.items()}
        status, runs = get(srv.url + "api/runs")
        assert status == 200 and [r["done"] for r in json.loads(runs)["runs"]] == [9, 8]  # the torn line not counted
        status, text = get(srv.url + f"api/run/{keys['bad']}/trajectories?since=0")
        assert status == 422 and text.startswith(f"{bad / EPISODES_FILE}:9: not a valid Episode record")
        assert get(srv.url + f"api/run/{keys['good']}/trajectories?since=0")[0] == 200
        assert get(srv.url + f"api/run/{keys['bad']}/trajectory?id=a%230")[0] == 200  # its good episodes still open


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
