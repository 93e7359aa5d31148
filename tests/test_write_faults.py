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


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


INSIDE_A_RUN = [
    (["report", "{src}", "--out", "{run}/rep", "--bootstrap", "1"], "--out {run}/rep is inside the run directory"),
    (["export", "{src}", "--to", "{run}/exp"], "--to {run}/exp is inside the run directory"),
    (["audit", "{src}", "--out", "{run}/aud", "--bootstrap", "1"], "--out {run}/aud is inside the run directory"),
    (["export", "{src}", "--to", "{run}/a/b"], "--to {run}/a/b is inside the run directory"),
    (["index", "--corpus", "{corpus}", "--out", "{run}/idx"], "--out {run}/idx is inside the run directory"),
    (["certify", "{src}", "--alpha", "0.1", "--export-verification", "{run}/v.csv"], "is inside the run directory"),
    (["probe", "{other}", "--probe", "p_true", "--model", "openai/p", "--api-base", "http://127.0.0.1:9/v1", "--out",
      "{run}/p"], "--out {run}/p is inside the run directory"),
]


@pytest.mark.parametrize("argv,fragment", INSIDE_A_RUN, ids=[" ".join(a[:1] + a[-2:-1]) for a, _ in INSIDE_A_RUN])
def test_no_command_writes_inside_a_run_directory(argv, fragment, tmp_path, capsys):
    """`report --out RUN/rep` and `export --to RUN/exp` wrote inside the run directory (judge, probe and continue
    refused): now every command refuses a path inside one, in one line, and the run is unchanged."""
    run = tmp_path / "run"
    shutil.copytree(PRE_CHANGE, run)
    (tmp_path / "corpus.jsonl").write_text('{"title": "t", "text": "a paragraph"}\n')
    subst = {"{src}": str(run), "{run}": str(run), "{corpus}": str(tmp_path / "corpus.jsonl"),
             "{other}": str(PRE_CHANGE)}  # a probe of another run, into this one
    argv = [_subst(a, subst) for a in argv]
    before = _tree(run)
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert _subst(fragment, subst) in line, line
    assert _tree(run) == before


def _subst(text: str, subst: dict[str, str]) -> str:
    for key, value in subst.items():
        text = text.replace(key, value)
    return text


def test_export_refuses_a_non_empty_directory_it_did_not_write_but_replaces_its_own(tmp_path, capsys):
    to = tmp_path / "exp"
    to.mkdir()
    (to / "notes.txt").write_text("mine\n")
    assert main(["export", str(PRE_CHANGE), "--to", str(to), "--format", "csv"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"--to {to} is a non-empty directory that holds no earlier output of this command" in line
    assert sorted(p.name for p in to.iterdir()) == ["notes.txt"]
    mine = tmp_path / "mine"
    for _ in range(2):  # its own earlier output is replaced
        assert main(["export", str(PRE_CHANGE), "--to", str(mine), "--format", "csv"]) == 0
    assert sorted(p.name for p in mine.iterdir()) == ["episodes.csv", "scores.csv", "steps.csv"]
    capsys.readouterr()


@pytest.mark.parametrize("command,flag,extra", [("report", "--out", ["--bootstrap", "1"]), ("export", "--to", []),
                                                ("audit", "--out", ["--bootstrap", "1"])])
def test_of_two_commands_writing_one_directory_the_second_is_told_who_writes_it(command, flag, extra, tmp_path,
                                                                                capsys):
    """Of two concurrent `report --out D`, the loser said "cannot write D: No such file or directory" (the winner
    had removed its staging folder): now it is refused at once, naming the other writer, and D is not touched."""
    from uqh.rundir.output_dir import writing

    out = tmp_path / "out"
    with writing(out, flag):  # the other command, writing now
        before = _tree(out)
        assert main([command, str(PRE_CHANGE), flag, str(out), *extra]) == 2
        line = _one_line(capsys.readouterr().err)
        assert f"{flag} {out} is being written by another uqh command (pid {os.getpid()})" in line, line
        assert _tree(out) == before
    assert list(out.iterdir()) == []  # the writer's mark goes with it


def test_of_two_probes_into_one_directory_the_second_is_told_who_writes_it(tmp_path, capsys):
    """The loser of two `probe --out D` was told D "is not a probe directory" (the winner's manifest was not yet in
    place): now it names the process that writes D."""
    out = tmp_path / "probes"
    out.mkdir()
    (out / ".probe_manifest.json.x.tmp").write_text("{")  # the winner's manifest, half-way to its place
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from uqh.harness.store import lock\n"
                               f"with lock.hold({str(out)!r}):\n    print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert holder.stdout.readline().strip() == "held"
        code = main(["probe", str(PRE_CHANGE), "--probe", "p_true", "--model", "openai/p", "--api-base",
                     "http://127.0.0.1:9/v1", "--out", str(out)])
        line = _one_line(capsys.readouterr().err)
        assert code == 2 and f"{out} is being written by pid {holder.pid}" in line, line
    finally:
        holder.communicate("", timeout=60)


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


def test_a_full_disk_leaves_no_empty_file_and_names_the_path_in_every_command(tmpfs, capsys, tmp_path):
    """Issue 42: `index --out FULL/idx` named a flag that does not exist (--index-dir), `certify
    --export-verification` named no path and left a 0-byte file, audit and export left 0-byte files: now each
    exits 1 naming its path (and flag where it has one), and leaves no empty or torn file."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"title": "t{i}", "text": "paragraph number {i} about things"}}\n'
                              for i in range(50)))
    cases = [(["index", "--corpus", str(corpus), "--out", "{t}/idx"], "cannot write the bm25s index (--out) to {t}/idx"),
             (["certify", str(PRE_CHANGE), "--alpha", "0.1", "--export-verification", "{t}/v.csv"],
              "cannot write {t}/v.csv"),
             (["audit", str(PRE_CHANGE), "--out", "{t}/aud", "--bootstrap", "1"], "cannot write {t}/aud"),
             (["export", str(PRE_CHANGE), "--to", "{t}/exp", "--format", "csv"], "cannot write {t}/exp")]
    for k, (argv, fragment) in enumerate(cases):
        disk = tmpfs(f"full{k}", "size=64k")
        _fill(disk)
        argv = [a.replace("{t}", str(disk)) for a in argv]
        code = main(argv)
        line = _one_line(capsys.readouterr().err)
        assert code == 1 and fragment.replace("{t}", str(disk)) in line and "No space left on device" in line, line
        assert "--index-dir" not in line
        assert [str(p) for p in disk.rglob("*") if p.is_file() and p.stat().st_size == 0] == [], argv[0]
        assert [p.name for p in disk.rglob("*.tmp")] == []


def test_an_unusable_output_location_is_exit_2_in_every_command(tmpfs, capsys):
    """`judge --report --tables` on a read-only path exited 1 where the other commands exit 2: a location unusable
    when checked is a user error (exit 2) everywhere; a fault while writing is exit 1 (above)."""
    ro = tmpfs("ro3", "ro,size=64k")
    for argv, fragment in ((["judge", "--report", "--out", str(PRE_CHANGE), "--tables", str(ro / "t")],
                            "cannot create --tables"),
                           (["judge", "--report", "--out", str(PRE_CHANGE), "--tables", str(ro)], "cannot write --tables"),
                           (["index", "--corpus", str(PRE_CHANGE / "manifest.json"), "--out", str(ro / "i")],
                            "cannot create --out"),
                           (["certify", str(PRE_CHANGE), "--alpha", "0.1", "--export-verification", str(ro / "v.csv")],
                            "cannot write --export-verification")):
        assert main(argv) == 2, argv
        line = _one_line(capsys.readouterr().err)
        assert fragment in line, line
