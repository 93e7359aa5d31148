"""Issue 33 item 10: nothing miscounted silently -- episode lines the manifest does not plan, a torn last line, a
run given twice, a pool of different models (each proven on a copy of a real recorded run)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from uqh.cli import main
from uqh.rundir.reader import RunDir

PRE_RUN = Path(__file__).resolve().parent / "data" / "pre_rundir_run"


def _copy(tmp_path: Path, name: str = "run") -> Path:
    run = tmp_path / name
    shutil.copytree(PRE_RUN, run)
    return run


def _audit_row(capsys, *runs) -> dict:
    assert main(["audit", *map(str, runs), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    return json.loads(out)["tables"][0]["rows"][0], err


def test_an_episode_the_manifest_does_not_plan_is_not_counted_and_is_said(tmp_path, capsys):
    run = _copy(tmp_path)
    line = (run / "episodes.jsonl").read_text().splitlines()[0]
    foreign = json.loads(line)
    foreign.update(episode_id="nope-9#0", task_id="nope-9")
    with open(run / "episodes.jsonl", "a") as f:
        f.write(json.dumps(foreign) + "\n")
    row, err = _audit_row(capsys, run)
    assert (row["Total"], row["Planned"]) == (8, 8)  # was 9 of 8 ("Unfinished -1")
    assert "1 episode line(s) whose id the manifest does not plan, e.g. 'nope-9#0'" in err
    assert len(RunDir.open(run).episodes()) == 8


def test_a_torn_last_line_is_said_by_score_and_audit(tmp_path, capsys):
    run = _copy(tmp_path)
    with open(run / "episodes.jsonl", "a") as f:
        f.write('{"episode_id": "arith-0000#0", "trunc')
    _, err = _audit_row(capsys, run)
    assert "ends with a torn line (37 bytes" in err
    assert main(["score", str(run), "--bootstrap", "0", "--format", "json", "--censoring", "simple"]) == 0
    out, err = capsys.readouterr()
    assert "ends with a torn line" in out + err


def test_a_run_given_twice_is_one_line_exit_2(tmp_path, capsys):
    run = _copy(tmp_path)
    for argv in (["score", str(run), str(run) + "/", "--pooled"], ["audit", str(run), str(run)],
                 ["export", str(run), str(run), "--to", str(tmp_path / "e")],
                 ["report", str(run), str(run), "--out", str(tmp_path / "r")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "is given twice" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_pool_is_labelled_by_what_it_contains(tmp_path, capsys):
    a, b = _copy(tmp_path, "a"), _copy(tmp_path, "b")
    data = json.loads((b / "manifest.json").read_text())
    data["config"]["model"] = "openai/other"
    from uqh.rundir.schema import RunConfig

    data["config_hash"] = RunConfig.model_validate(data["config"]).config_hash()
    (b / "manifest.json").write_text(json.dumps(data))
    assert main(["score", str(a), str(b), "--pooled", "--bootstrap", "0", "--format", "json",
                 "--censoring", "simple"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    runs = parsed if isinstance(parsed, list) else parsed["runs"]
    assert runs[-1]["model"] == "openai/fake + openai/other"


def test_a_run_being_written_is_not_continued_and_readers_say_it_is_in_progress(tmp_path, capsys):
    """Issue 33 item 9: `continue SRC` while SRC is written continued whatever prefixes existed at that moment."""
    import subprocess
    import sys

    run = _copy(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom uqh.harness.store.lock import hold\n"
         "with hold(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(60)\n", str(run)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["continue", str(run), "--out", str(tmp_path / "c")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "is still being written by pid" in err
        assert not (tmp_path / "c").exists()
        _, err = _audit_row(capsys, run)
        assert "8 of 8 planned episodes, run in progress" in err
    finally:
        holder.kill()
        holder.wait()
    _, err = _audit_row(capsys, run)
    assert "in progress" not in err


def test_score_without_bootstrap_claims_no_confidence_intervals(capsys):
    assert main(["score", str(PRE_RUN), "--bootstrap", "0", "--censoring", "simple"]) == 0
    out = capsys.readouterr().out
    assert "95% percentile CIs" not in out and "no bootstrap: no confidence intervals" in out


def test_a_closed_pipe_is_not_an_error():
    """`uqh score RUN | head -1` used to end with 'error: Broken pipe' and exit 1."""
    import subprocess
    import sys

    # `true` closes the pipe before uqh has started: its first write meets a closed pipe
    command = f"set -o pipefail; {sys.executable} -m uqh.cli score {PRE_RUN} --bootstrap 0 --censoring simple | true"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stderr == ""


def test_a_run_with_no_finished_episode_is_one_line_and_exit_2_for_every_scoring_command(tmp_path, capsys):
    """Issue 33 item 13: `score` used to exit 0 on an empty run while `report` and `certify` exited 2; issue 42: so
    did `audit` and `export`. Every command that reads runs agrees now: one line, exit 2, nothing written."""
    from report_fixtures import write_run
    from uqh.cli import main

    empty = write_run(tmp_path / "empty", "webshop", 8, [])
    for argv in (["score", str(empty)], ["report", str(empty), "--out", str(tmp_path / "r")],
                 ["certify", str(empty)], ["audit", str(empty)], ["export", str(empty), "--to", str(tmp_path / "e")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "has no finished episodes" in err[0], (argv, err)
    assert not (tmp_path / "r").exists() and not (tmp_path / "e").exists()
