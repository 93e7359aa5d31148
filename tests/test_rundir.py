"""`rundir.RunDir`, the one reader: clear errors, torn-line safety, one de-duplication rule, and run directories
written before the `rundir` package existed still read unchanged."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from uqh.rundir.errors import UserError
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import EPISODES_FILE, MANIFEST_FILE, SIDECAR_FILE

PRE_CHANGE = Path(__file__).resolve().parent / "data" / "pre_rundir_run"


def test_pre_change_run_directory_reads_unchanged(tmp_path, capsys):
    """Written by uqh at commit 8ea5d91 (harness/schema.py era): 8 arithmetic episodes against the fake server."""
    run = RunDir.open(PRE_CHANGE)
    # the hash it carries is the one of its time (endpoints included), still checkable; resume compares the
    # endpoint-free hash of its config
    assert run.manifest.config_hash == run.manifest.config.legacy_config_hash()
    eps = run.episodes()
    assert len(eps) == 8 and run.planned == 8
    assert sorted(e.stop_reason.value for e in eps).count("max_steps") == 3
    rows = list(run.sidecar())
    assert len(rows) == sum(len(s.attempts) for e in eps for s in e.steps) + sum(len(e.failed_step or []) for e in eps)
    from uqh.cli import main

    assert main(["audit", str(PRE_CHANGE), "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["tables"][0]["rows"][0]
    assert (row["Total"], row["Planned"]) == (8, 8)
    assert main(["score", str(PRE_CHANGE), "--bootstrap", "0", "--format", "json", "--censoring", "simple"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["episodes"] == 8 and counts["censored"] == 3


@pytest.mark.parametrize("make,fragment", [
    (lambda p: None, "does not exist"),
    (lambda p: p.write_text("x"), "is a file, not a run directory"),
    (lambda p: p.mkdir(), "no manifest.json"),
    (lambda p: (p.mkdir(), (p / MANIFEST_FILE).write_text("{not json")), "cannot read"),
    (lambda p: (p.mkdir(), (p / MANIFEST_FILE).write_text('{"schema_version": 7}')), "schema_version 7"),
    (lambda p: (p.mkdir(), (p / MANIFEST_FILE).write_text('{"schema_version": 1}')), "not a valid manifest"),
])
def test_open_refuses_with_one_clear_line(tmp_path, make, fragment):
    p = tmp_path / "r"
    make(p)
    with pytest.raises(UserError, match=fragment) as exc:
        RunDir.open(p)
    assert "\n" not in str(exc.value)


def test_torn_tail_ignored_and_duplicates_dropped_by_one_rule(tmp_path):
    run_dir = tmp_path / "r"
    shutil.copytree(PRE_CHANGE, run_dir)
    ep_lines = (run_dir / EPISODES_FILE).read_bytes().splitlines(keepends=True)
    sc_lines = (run_dir / SIDECAR_FILE).read_bytes().splitlines(keepends=True)
    first = json.loads(ep_lines[0])
    changed = dict(first, reward=123.0)  # a later duplicate must never win
    with open(run_dir / EPISODES_FILE, "ab") as f:
        f.write(json.dumps(changed).encode() + b"\n")
        f.write(ep_lines[1][:30])  # torn
    with open(run_dir / SIDECAR_FILE, "ab") as f:
        f.write(sc_lines[0])
        f.write(sc_lines[1][:10])
    run = RunDir.open(run_dir)
    eps = run.episodes()
    assert len(eps) == 8 and run.duplicate_episode_lines == 1
    assert next(e for e in eps if e.episode_id == first["episode_id"]).reward == first["reward"]
    rows = list(run.sidecar())
    assert len(rows) == len(sc_lines) and run.duplicate_sidecar_rows == 1
    assert run.episode_ids_in_file().count(first["episode_id"]) == 2


def test_malformed_line_names_file_and_line(tmp_path):
    run_dir = tmp_path / "r"
    shutil.copytree(PRE_CHANGE, run_dir)
    lines = (run_dir / EPISODES_FILE).read_text().splitlines(keepends=True)
    lines.insert(3, "garbage\n")
    (run_dir / EPISODES_FILE).write_text("".join(lines))
    with pytest.raises(UserError, match=r"episodes.jsonl:4: not a valid Episode record"):
        RunDir.open(run_dir).episodes()


def test_cache_fields_are_additive_and_old_records_rewrite_byte_for_byte():
    """Usage's cached-token counts and QzRecord's stop-rule fields are optional: records written before them read,
    and re-serialise to the same bytes while the new fields are absent."""
    from uqh.rundir.qz_file import QzRecord
    from uqh.rundir.schema import Episode, Usage

    old_lines = (PRE_CHANGE / EPISODES_FILE).read_bytes().splitlines()
    for line in old_lines:
        ep = Episode.model_validate_json(line)
        assert all(a.call.usage.cached_prompt_tokens is None for s in ep.steps for a in s.attempts)
        assert ep.model_dump_json().encode() == line
    u = Usage(prompt_tokens=10, completion_tokens=2, cached_prompt_tokens=8, cache_write_prompt_tokens=0)
    assert Usage.model_validate_json(u.model_dump_json()) == u and u.uncached_prompt_tokens == 2
    assert "cached_prompt_tokens" not in Usage(prompt_tokens=1).model_dump_json()
    old = '{"episode_id":"t#0","q_hat_z":0.25,"n_valid":4,"method":"mc"}'
    assert QzRecord.model_validate_json(old).model_dump_json() == old
    new = QzRecord(episode_id="t#0", q_hat_z=0.0, n_valid=5, method="mc", branches=5, stop_rule="ci:0.3",
                   interval=(0.0, 0.585))
    assert QzRecord.model_validate_json(new.model_dump_json()) == new


def test_a_tampered_manifest_is_refused_on_open_with_one_line(tmp_path, capsys):
    """Issue 33 item 12: a config changed by hand with its hash kept used to go unnoticed."""
    run = tmp_path / "run"
    shutil.copytree(PRE_CHANGE, run)
    RunDir.open(run)  # as written: fine
    data = json.loads((run / "manifest.json").read_text())
    data["config"]["step_budget"] += 1
    (run / "manifest.json").write_text(json.dumps(data))
    from uqh.cli import main

    for argv in (["score", str(run)], ["audit", str(run)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "does not match its config_hash" in err
