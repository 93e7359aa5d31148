"""The run store: manifest and hash check, crash-safe appends, torn-line and orphan-row repair, checkpoints."""
from __future__ import annotations

import json
import os
import stat

import pytest

from uqh.rundir.errors import UserError
from uqh.rundir.schema import PartialEpisode
from uqh.rundir.schema import (
    EPISODES_FILE,
    MANIFEST_FILE,
    SIDECAR_FILE,
    CallRecord,
    Episode,
    LogprobRow,
    RunConfig,
    StopReason,
    TokenLogprob,
    config_differences,
)
from uqh.harness.store.writer import RunStore, check_out_dir
from uqh.rundir.reader import RunDir, line_episode_id
from run_files import read_episodes, read_manifest, read_sidecar


def make_config(**kw) -> RunConfig:
    base = dict(domain="arithmetic", task_ids=["arith-0000", "arith-0001", "a", "a/x", "b"], model="openai/fake", step_budget=4,
                prompt_sha256="0" * 64, package_version="0.1.0")
    base.update(kw)
    return RunConfig(**base)


def make_episode(eid: str) -> Episode:
    return Episode(episode_id=eid, task_id=eid.split("#")[0], stop_reason=StopReason.max_steps, n_steps=0,
                   step_budget=4, task_prompt="q", steps=[])


def make_rows(eid: str, n: int) -> list[LogprobRow]:
    return [LogprobRow(episode_id=eid, t=i + 1, attempt=0, accepted=True,
                       tokens=[TokenLogprob(token="a", logprob=-0.5)]) for i in range(n)]


def create(tmp_path, **kw) -> RunStore:
    return RunStore.open_or_create(tmp_path / "run", make_config(**kw), system_prompt="SYS", info={"x": 1})


def test_create_writes_manifest_with_hash(tmp_path):
    with create(tmp_path) as store:
        pass
    m = read_manifest(tmp_path / "run")
    assert m.config_hash == make_config().config_hash() and m.system_prompt == "SYS" and m.info == {"x": 1}
    assert not list((tmp_path / "run").glob(".*.tmp"))  # atomic write left no temp file


def test_append_and_resume_skips_finished(tmp_path):
    with create(tmp_path) as store:
        store.append_episode(make_episode("a#0"), make_rows("a#0", 2))
        store.append_episode(make_episode("b#0"), make_rows("b#0", 1))
        with pytest.raises(ValueError):
            store.append_episode(make_episode("a#0"), [])
    with create(tmp_path) as store:
        assert store.finished_ids == {"a#0", "b#0"} and store.notes == []
    assert [e.episode_id for e in read_episodes(tmp_path / "run")] == ["a#0", "b#0"]
    assert [(r.episode_id, r.t) for r in read_sidecar(tmp_path / "run")] == [("a#0", 1), ("a#0", 2), ("b#0", 1)]


def test_config_hash_mismatch_refused_with_field_names(tmp_path):
    create(tmp_path).close()
    before = (tmp_path / "run" / MANIFEST_FILE).read_bytes()
    other = make_config(step_budget=9, decoding={"temperature": 0.7})
    with pytest.raises(UserError) as exc:
        RunStore.open_or_create(tmp_path / "run", other, system_prompt="SYS")
    msg = str(exc.value)
    assert "differs in: decoding.temperature, step_budget" in msg and "new --out" in msg
    assert "\n" not in msg
    assert (tmp_path / "run" / MANIFEST_FILE).read_bytes() == before
    assert config_differences(make_config(), other) == ["decoding.temperature", "step_budget"]


def test_schema_version_mismatch_refused(tmp_path):
    create(tmp_path).close()
    p = tmp_path / "run" / MANIFEST_FILE
    raw = json.loads(p.read_text())
    raw["schema_version"] = 99
    p.write_text(json.dumps(raw))
    with pytest.raises(UserError, match="schema_version 99"):
        RunStore.open_or_create(tmp_path / "run", make_config(), system_prompt="SYS")


def test_torn_lines_repaired_on_open(tmp_path):
    with create(tmp_path) as store:
        store.append_episode(make_episode("a#0"), make_rows("a#0", 1))
    run = tmp_path / "run"
    with open(run / EPISODES_FILE, "ab") as f:
        f.write(b'{"schema_version":1,"episode_id":"b#0","task')  # crash mid-line
    with open(run / SIDECAR_FILE, "ab") as f:
        f.write(b'{"schema_version":1,"episode_id":"b#0","t":1,"att')
    with create(tmp_path) as store:
        assert store.finished_ids == {"a#0"}
        assert any("torn last line" in n and EPISODES_FILE in n for n in store.notes)
        assert any("torn last line" in n and SIDECAR_FILE in n for n in store.notes)
        store.append_episode(make_episode("b#0"), make_rows("b#0", 1))
    for name in (EPISODES_FILE, SIDECAR_FILE):
        data = (run / name).read_bytes()
        assert data.endswith(b"\n")
        for line in data.splitlines():
            json.loads(line)  # every line is complete JSON
    assert [e.episode_id for e in read_episodes(run)] == ["a#0", "b#0"]


def test_orphan_sidecar_rows_removed(tmp_path):
    """Crash after the sidecar append but before the episode line: the rows must not be duplicated on resume."""
    with create(tmp_path) as store:
        store.append_episode(make_episode("a#0"), make_rows("a#0", 2))
    run = tmp_path / "run"
    with open(run / SIDECAR_FILE, "ab") as f:
        f.write(b"".join(r.model_dump_json().encode() + b"\n" for r in make_rows("b#0", 3)))
    with create(tmp_path) as store:
        assert "removed 3 rows" in " ".join(store.notes)
        store.append_episode(make_episode("b#0"), make_rows("b#0", 3))
    rows = [(r.episode_id, r.t) for r in read_sidecar(run)]
    assert rows == [("a#0", 1), ("a#0", 2), ("b#0", 1), ("b#0", 2), ("b#0", 3)]


def test_duplicate_episode_lines_deduplicated_on_read(tmp_path, caplog):
    with create(tmp_path) as store:
        store.append_episode(make_episode("a#0"), [])
    run = tmp_path / "run"
    line = (run / EPISODES_FILE).read_bytes()
    with open(run / EPISODES_FILE, "ab") as f:
        f.write(line)
    reader = RunDir.open(run)
    assert [e.episode_id for e in reader.episodes()] == ["a#0"]
    assert reader.duplicate_episode_lines == 1
    with create(tmp_path) as store:
        assert "1 duplicate episode lines" in " ".join(store.notes)


def test_checkpoints_roundtrip_and_deleted_when_written(tmp_path):
    with create(tmp_path) as store:
        partial = PartialEpisode(episode_id="a/x#0", task_id="a/x", step_budget=4, task_prompt="q", steps=[],
                                 sidecar=make_rows("a/x#0", 1))
        store.write_checkpoint(partial)
        path = store.checkpoint_path("a/x#0")
        assert path.exists() and path.parent.name == "checkpoints" and "/" not in path.name
        assert store.load_checkpoints()["a/x#0"] == partial
        (path.parent / "junk.json").write_text("{not json")
        assert list(store.load_checkpoints()) == ["a/x#0"] and "unreadable checkpoint" in store.notes[-1]
        store.append_episode(make_episode("a/x#0"), partial.sidecar)
        assert not path.exists()


def test_out_dir_checks(tmp_path):
    check_out_dir(tmp_path / "new" / "deeper")  # creatable
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        check_out_dir(tmp_path / "file")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="not a run directory"):
        check_out_dir(tmp_path / "full")
    with pytest.raises(UserError, match="cannot create --out"):
        check_out_dir(tmp_path / "file" / "run")  # an ancestor is a file: cannot be created by anyone
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(ro, os.W_OK):  # running as root: permissions are not enforced
            return
        with pytest.raises(UserError, match="not writable|not readable and writable"):
            check_out_dir(ro / "run")
        with pytest.raises(UserError):
            check_out_dir(ro)
    finally:
        ro.chmod(stat.S_IRWXU)


def test_line_episode_id_fast_and_fallback():
    ep = make_episode('we"ird#0')
    assert line_episode_id(ep.model_dump_json().encode()) == 'we"ird#0'
    assert line_episode_id(b'{"episode_id": "x#1", "t": 1}') == "x#1"


def test_checkpoint_encoder_matches_pydantic_and_reuses_pieces():
    from uqh.rundir.schema import Attempt, Step
    from uqh.harness.store.writer import CheckpointEncoder

    def step(t):
        return Step(t=t, think="x", action=f"Calc[{t}]", verbal_confidence=0.5, confidence_raw="0.5", explanation="e",
                    observation=f"Result: {t}", attempts=[Attempt(attempt=0, raw_text="r", call=CallRecord(model="m"))])

    enc = CheckpointEncoder()
    steps, rows = [], []
    for t in (1, 2, 3):
        steps.append(step(t))
        rows.extend(make_rows("e#0", 1))
        partial = PartialEpisode.model_construct(episode_id="e#0", task_id="e", sample_index=0, seed=3, step_budget=5,
                                                 task_prompt='q "quoted"', steps=steps, sidecar=rows, prefix_steps=0,
                                                 source_episode_id=None, branch_index=None, started_at="now")
        text = enc.dumps(partial)
        assert PartialEpisode.model_validate_json(text) == PartialEpisode.model_validate_json(partial.model_dump_json())
    assert len(enc._cache["e#0"][0]) == 3
    enc.forget("e#0")
    assert enc._cache == {}
