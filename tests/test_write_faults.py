"""I/O faults give one line, never a traceback, and leave a run directory that resumes: a full disk (a small tmpfs,
before the run starts and in the middle of it), an unwritable `uqh report --out`, a garbage line in the middle of
episodes.jsonl (refused untouched; `uqh repair` quarantines it), and a sidecar cut from outside (reported)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from uqh.cli import main
from uqh.rundir.schema import EPISODES_FILE, LOCK_FILE, QUARANTINE_SUFFIX, SIDECAR_FILE
from environment import unavailable
from run_files import read_episodes, read_sidecar
from test_runner import solver

REPO = Path(__file__).resolve().parent.parent
PRE_CHANGE = Path(__file__).resolve().parent / "data" / "pre_rundir_run"


def _mount(target: Path, options: str) -> None:
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], check=True, capture_output=True,
                       text=True)
    except FileNotFoundError:
        unavailable("cannot mount a tmpfs here (no mount command); CI runs as root and mounts one")
    except subprocess.CalledProcessError as exc:
        unavailable(f"cannot mount a tmpfs here ({exc.stderr.strip() or exc}); CI runs as root and mounts one")


@pytest.fixture
def tmpfs(tmp_path):
    """A mounter of small tmpfs file systems under tmp_path, unmounted at teardown (skipped where mounting is
    impossible, with the reason)."""
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        target = tmp_path / name
        target.mkdir(exist_ok=True)
        _mount(target, options)
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def _fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` completely; return the filler file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def _run_args(base_url: str, out: Path, n_tasks: int, *extra: str) -> list[str]:
    return ["run", "--domain", "arithmetic", "--model", "openai/fake", "--api-base", base_url, "--tasks", str(n_tasks),
            "--concurrency", "2", "--out", str(out), "--no-progress", *extra]


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _data_files(out: Path) -> dict[str, bytes]:
    """The directory's files except the writer's lock file (every writer, also one that refuses, records itself)."""
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != LOCK_FILE}


def _consistent(out: Path, n_tasks: int) -> None:
    """Exactly the planned episodes, every line whole JSON, one sidecar row per attempt."""
    for name in (EPISODES_FILE, SIDECAR_FILE):
        data = (out / name).read_bytes()
        assert data.endswith(b"\n")
        for line in data.splitlines():
            json.loads(line)
    eps = read_episodes(out)
    assert sorted(e.episode_id for e in eps) == [f"arith-{i:04d}#0" for i in range(n_tasks)]
    rows = Counter((r.episode_id, r.t, r.attempt) for r in read_sidecar(out))
    assert rows == Counter((e.episode_id, s.t, a.attempt) for e in eps for s in e.steps for a in s.attempts)


# ------------------------------------------------------------------------------------- disk full


def test_disk_full_before_the_run_starts(fake_server, tmpfs, capsys):
    disk = tmpfs("disk", "size=256k")
    filler = _fill(disk)
    out = disk / "run"
    with fake_server(solver) as srv:
        assert main(_run_args(srv.base_url, out, 3)) == 1
        line = _one_line(capsys.readouterr().err)
        assert "No space left on device" in line and "free disk space, then re-run the same command" in line
        assert not out.exists()  # nothing left behind: no empty run directory
        filler.unlink()
        assert main(_run_args(srv.base_url, out, 3)) == 0
    assert "3/3 finished" in capsys.readouterr().out
    _consistent(out, 3)


@pytest.mark.parametrize("workers", [1, 2])
def test_disk_full_in_the_middle_of_a_run_then_resume(fake_server, tmpfs, capsys, workers):
    disk = tmpfs("disk", "size=160k")  # room for the manifest and a few episodes (~40 KB of logprobs each)
    out, n_tasks = disk / "run", 12
    with fake_server(solver) as srv:
        args = _run_args(srv.base_url, out, n_tasks, "--workers", str(workers))
        assert main(args) == 1
        captured = capsys.readouterr()
        line = _one_line(captured.err)
        assert "cannot write the run directory" in line and "No space left on device" in line
        assert "episodes not finished" in line and "re-run the same command to resume" in line
        assert "finished" in captured.out  # the summary
        written = len(read_episodes(out))
        assert 0 < written < n_tasks
        for name in (EPISODES_FILE, SIDECAR_FILE):  # the failed append was cut back: no torn line, no orphan row
            assert (out / name).read_bytes().endswith(b"\n")
        assert {r.episode_id for r in read_sidecar(out)} == {e.episode_id for e in read_episodes(out)}
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)  # space freed
        assert main(args) == 0
    assert f"{n_tasks}/{n_tasks} finished ({n_tasks - written} this run, {written} before)" in capsys.readouterr().out
    _consistent(out, n_tasks)


# ------------------------------------------------------------------------------------- uqh report --out


def test_report_out_on_a_read_only_file_system(tmpfs, capsys):
    ro = tmpfs("ro", "ro,size=64k")
    for target, fragment in ((ro, "cannot write --out"), (ro / "report", "cannot create --out")):
        assert main(["report", str(PRE_CHANGE), "--out", str(target), "--bootstrap", "1"]) == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("uqh report: error: ") and fragment in line
    assert list(ro.iterdir()) == []


def test_audit_and_export_check_their_output_directory_before_any_work(tmpfs, capsys):
    ro = tmpfs("ro2", "ro,size=64k")
    for argv, fragment in ((["audit", str(PRE_CHANGE), "--out", str(ro / "audit")], "cannot create --out"),
                           (["export", str(PRE_CHANGE), "--to", str(ro / "export")], "cannot create --to")):
        assert main(argv) == 2
        captured = capsys.readouterr()
        line = _one_line(captured.err)
        assert line.startswith(f"uqh {argv[0]}: error: ") and fragment in line, line
        assert captured.out == ""  # refused before the tables were computed and printed
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize("command,flag", [("report", "--out"), ("audit", "--out"), ("export", "--to")])
def test_outputs_never_go_into_a_run_directory(command, flag, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(PRE_CHANGE, run)
    before = sorted(p.name for p in run.iterdir())
    assert main([command, str(PRE_CHANGE), flag, str(run)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"uqh {command}: error: {flag} {run} is a run directory"), line
    assert sorted(p.name for p in run.iterdir()) == before


def _without_dac_override():
    """A preexec_fn that makes root subject to file permissions (drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
    from the bounding set, so the exec'ed command lacks them); None when not root."""
    if os.geteuid() != 0:
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def drop() -> None:  # pragma: no cover - runs in the child
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")

    return drop


def test_report_out_with_mode_0555(tmp_path):
    """Permissions are checked as the user who runs uqh (as root, CI's user, the command runs without the
    capability that lets root ignore them)."""
    out = tmp_path / "report"
    out.mkdir()
    out.chmod(0o555)
    try:
        proc = subprocess.run([sys.executable, "-m", "uqh.cli", "report", str(PRE_CHANGE), "--out", str(out),
                               "--bootstrap", "1"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                              capture_output=True, text=True, timeout=600, preexec_fn=_without_dac_override())
    except subprocess.SubprocessError as exc:
        unavailable(f"cannot run a command subject to file permissions here: {exc}")
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert line.startswith("uqh report: error: cannot write --out") and "permission denied" in line
    assert list(out.iterdir()) == []


# ------------------------------------------------------------------------------------- garbage lines


def test_garbage_line_refused_untouched_then_explicit_repair(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(solver) as srv:
        args = _run_args(srv.base_url, out, 4)
        assert main(args) == 0
        lines = (out / EPISODES_FILE).read_bytes().splitlines(keepends=True)
        broken_id = json.loads(lines[1])["episode_id"]
        lines[1] = lines[1][: len(lines[1]) // 2] + b"\n"  # a line cut in half in the middle of the file
        (out / EPISODES_FILE).write_bytes(b"".join(lines))
        with open(out / SIDECAR_FILE, "ab") as f:
            f.write(b'{"schema_version":1,"episode_id":"x')  # a torn tail: a repair on open would cut it
        before = _data_files(out)
        capsys.readouterr()

        assert main(args) == 2  # resume refuses, naming file and line, and touches nothing
        line = _one_line(capsys.readouterr().err)
        assert f"{out / EPISODES_FILE}:2: not a valid Episode record" in line and f"uqh repair {out}" in line
        assert _data_files(out) == before

        assert main(["repair", str(out), "--dry-run"]) == 0
        listed = capsys.readouterr().out
        assert f"{EPISODES_FILE}:2: not a valid Episode record" in listed and "would move 3 lines" in listed
        assert _data_files(out) == before

        assert main(["repair", str(out)]) == 0  # the episode line and its two sidecar rows move aside
        assert "moved 3 lines" in capsys.readouterr().out
        assert (out / (EPISODES_FILE + QUARANTINE_SUFFIX)).read_bytes() == lines[1]
        moved_rows = (out / (SIDECAR_FILE + QUARANTINE_SUFFIX)).read_bytes().splitlines()
        assert [json.loads(r)["episode_id"] for r in moved_rows] == [broken_id, broken_id]

        assert main(args) == 0  # the quarantined episode runs again
    assert "4/4 finished (1 this run, 3 before)" in capsys.readouterr().out
    _consistent(out, 4)
    assert main(["repair", str(out)]) == 0
    assert "nothing to repair" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- sidecar cut from outside


def test_truncated_sidecar_reported_on_resume_and_in_score(fake_server, tmp_path, capsys):
    out = tmp_path / "run"
    with fake_server(solver) as srv:
        args = _run_args(srv.base_url, out, 4)
        assert main(args) == 0
        data = (out / SIDECAR_FILE).read_bytes()
        rows = data.splitlines(keepends=True)
        cut = sum(len(r) for r in rows[:5]) + len(rows[5]) // 2  # rows 6.. lost, the 6th torn
        (out / SIDECAR_FILE).write_bytes(data[:cut])
        lost = Counter(json.loads(r)["episode_id"] for r in rows[5:])
        capsys.readouterr()
        assert main(args) == 0
    text = capsys.readouterr().out
    note = f"{len(lost)} finished episodes miss {sum(lost.values())} sidecar rows"
    assert note in text and "torn last line" in text
    assert main(["score", str(out), "--bootstrap", "0"]) == 0
    err = capsys.readouterr().err
    assert f"{out}: {note}" in err and "their logprob predictors are missing" in err


def test_a_full_disk_under_audit_report_and_export_is_exit_1_naming_the_path(tmpfs, capsys):
    """Issue 33 item 13: the three commands that write output files agree on a disk that fills while they write
    (exit 1, an I/O fault, like `uqh run`), and each names the directory; an --out unusable from the start stays a
    user error (exit 2, test above)."""
    for cmd, flag in (("audit", "--out"), ("report", "--out"), ("export", "--to")):
        disk = tmpfs(f"full-{cmd}", "size=64k")
        target = disk / "out"
        target.mkdir()  # usable when checked ...
        _fill(disk)  # ... and full once the command writes
        extra = ["--bootstrap", "1"] if cmd == "report" else []
        code = main([cmd, str(PRE_CHANGE), flag, str(target), *extra])
        line = _one_line(capsys.readouterr().err)
        assert code == 1, (cmd, line)
        assert line.startswith(f"uqh {cmd}: error: cannot write {target}") and "No space left on device" in line
        assert "free disk space" in line
