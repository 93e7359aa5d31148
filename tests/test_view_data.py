"""The viewer's data (uqh.reports.view.runs), without a browser: per-step values equal scoring's run streams, the run
list row equals counts made from the parsed records, judge scores and q_hat_Z found in judge and continuation
directories land on the trajectories they are about, and the catalog finds every kind of directory recursively."""
from __future__ import annotations

import math

import numpy as np
import pytest

from report_fixtures import Ep, tau2_like, user_token_p, webshop_like, write_run
from uqh.reports.view.run_discovery import Found, check_given, find_directories
from uqh.reports.view.runs import ViewedRun, attach_judgments, attach_qz
from uqh.rundir.errors import UserError
from uqh.rundir.judgments import JUDGE_MANIFEST_FILE, JUDGMENTS_FILE, JudgeConfig, JudgedRun, JudgeManifest, Judgment
from uqh.rundir.qz_file import QzRecord, write_qz_file
from uqh.rundir.reader import RunDir
from uqh.harness.store.writer import RunStore
from uqh.rundir.schema import (CHECKPOINT_DIR, EPISODES_FILE, MANIFEST_FILE, QZ_FILE, SIDECAR_FILE, DecodingConfig,
                               Manifest, PartialEpisode, StopReason)
from uqh.scoring.streams import load_run


@pytest.fixture
def ws(tmp_path):
    return webshop_like(tmp_path / "runs" / "ws")


def test_trajectory_values_equal_the_scored_run_streams(ws):
    run = ViewedRun.open("0", ws)
    data = load_run(ws)
    for i, eid in enumerate(data.episode_ids):
        got = run.trajectory(eid)["ep"]["values"]
        a, b = int(data.offsets[i]), int(data.offsets[i + 1])
        for name in ("verbal", "token_prob", "token_entropy", "action_prob", "action_entropy"):
            want = [None if not math.isfinite(v) else v for v in data.streams[name][a:b]]
            assert got[name] == pytest.approx(want, abs=1e-12), (eid, name)
        assert got["base_rate"] == [0.5] * (b - a)


def test_the_simulated_users_tokens_follow_the_agent_step_they_answer(tmp_path, ws):
    run = ViewedRun.open("0", tau2_like(tmp_path / "t2", user_tokens=True))
    tokens = run.trajectory("2#0")["tokens"]  # 3 steps: the opening, then each step and the user's reply to it
    assert [(r["role"], r["t"]) for r in tokens] == [("user", 0), ("agent", 1), ("user", 1), ("agent", 2),
                                                     ("user", 2), ("agent", 3), ("user", 3)]
    for r in tokens:
        if r["role"] == "user":
            assert [tok["s"] for tok in r["tokens"]] == ["user0", "user1", "user2"] and r["action"] is None
            assert [tok["p"] for tok in r["tokens"]] == pytest.approx([user_token_p(r["t"])] * 3)
        else:
            assert r["tokens"][0]["s"] == "tok0" and r["action"] == [1, 3]
    agent_only = ViewedRun.open("1", ws).trajectory("a#0")["tokens"]  # no user sidecar: the agent's rows alone
    assert [(r["role"], r["t"]) for r in agent_only] == [("agent", 1), ("agent", 2)]


def test_the_run_list_row_equals_counts_from_the_records(ws):
    run = ViewedRun.open("0", ws)
    row = run.overview()
    episodes = RunDir.open(ws).episodes()
    stops = {}
    for ep in episodes:
        stops[ep.stop_reason.value] = stops.get(ep.stop_reason.value, 0) + 1
    labels = [ep.outcome for ep in episodes if ep.stop_reason == StopReason.clean]
    assert row["stops"] == stops and row["done"] == len(episodes) == row["planned"]
    assert row["base_rate"] == pytest.approx(float(np.mean(labels))) and row["state"] == "finished"
    summaries = run.trajectories(0)["items"]
    assert [s["id"] for s in summaries] == [e.episode_id for e in episodes]
    assert summaries[0]["last"]["verbal"] == 0.8 and summaries[-1]["last"]["token_prob"] == pytest.approx(0.45)


def judge_dir(path, judged, scores: dict[tuple[str, str], list[int]]):
    path.mkdir(parents=True)
    config = JudgeConfig(runs=[JudgedRun(path=str(judged), config_hash="x", domain="webshop", model="openai/fake")],
                         judge_model="openai/judge", decoding=DecodingConfig(), prompts_sha256={}, trace_format=1,
                         package_version="0")
    manifest = JudgeManifest(config=config, config_hash=config.config_hash(), created_at="2026-01-01T00:00:00Z")
    (path / JUDGE_MANIFEST_FILE).write_text(manifest.model_dump_json())
    lines = []
    for (eid, metric), values in scores.items():
        for k, v in enumerate(values):
            lines.append(Judgment(run=0, episode_id=eid, metric=metric, repeat=k, score=v, n_steps=2, cited_steps=[1],
                                  attempts=[]).model_dump_json())
    (path / JUDGMENTS_FILE).write_text("".join(line + "\n" for line in lines))


def continuation_of(path, base):
    cont = write_run(path, "webshop", 8, [Ep("d", StopReason.clean, [0.5], outcome=1, sample_index=0)])
    manifest = Manifest.model_validate_json((cont / MANIFEST_FILE).read_text())
    base_hash = RunDir.open(base).manifest.config_hash
    config = manifest.config.model_copy(update={"continuation": {
        "source_config_hash": base_hash, "source_run_dir": str(base), "prefix_ids": ["d#0"], "branches": 1}})
    (cont / MANIFEST_FILE).write_text(manifest.model_copy(update={"config": config, "config_hash": config.config_hash()}).model_dump_json())
    write_qz_file(cont / QZ_FILE, [QzRecord(episode_id="d#0", q_hat_z=0.25, n_valid=4, method="mc")])
    return cont


def test_judge_scores_and_q_hat_z_land_on_their_trajectories(ws, tmp_path):
    cont = continuation_of(tmp_path / "runs" / "ws-cont", ws)
    judge_dir(tmp_path / "runs" / "judged", ws, {("a#0", "GF"): [3, 2], ("a#0", "LC"): [1], ("b#0", "GF"): [0]})
    found = find_directories([tmp_path / "runs"])
    assert found.runs == [ws.resolve(), cont.resolve()] and found.judges == [(tmp_path / "runs" / "judged").resolve()]
    runs = [ViewedRun.open(str(i), p) for i, p in enumerate(found.runs)]
    attach_qz(runs)
    assert attach_judgments(runs, found.judges) == []
    base = runs[0]
    assert base.trajectory("a#0")["judged"] == {"GF": 2.5, "LC": 1.0}
    assert base.trajectory("d#0")["q_hat_z"] == 0.25 and base.trajectory("a#0")["q_hat_z"] is None
    assert runs[1].overview()["kind"] == "continuation"
    summaries = {s["id"]: s for s in base.trajectories(0)["items"]}
    assert summaries["b#0"]["judged"] == {"GF": 0.0} and summaries["d#0"]["q_hat_z"] == 0.25


def test_an_unreadable_judge_directory_is_a_note(ws, tmp_path):
    bad = tmp_path / "runs" / "judged"
    bad.mkdir()
    (bad / JUDGE_MANIFEST_FILE).write_text("{}")
    runs = [ViewedRun.open("0", ws)]
    notes = attach_judgments(runs, [bad])
    assert len(notes) == 1 and notes[0].startswith(f"judge directory {bad}:")


def test_the_catalog_refuses_a_missing_path_and_finds_nothing_in_an_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    assert find_directories([tmp_path / "empty"]) == Found([], [], [])  # served and watched: runs may come later
    check_given([tmp_path / "empty"])
    with pytest.raises(UserError, match="does not exist"):
        check_given([tmp_path / "nope"])
    assert find_directories([tmp_path / "nope"]) == Found([], [], [])  # deleted while served: nothing, no error


def test_trajectory_requests_read_through_one_cached_index(ws):
    run = ViewedRun.open("0", ws)
    for eid in ("a#0", "h#0", "a#0"):
        assert run.trajectory(eid)["ep"]["id"] == eid
    index = run.reader.sidecar_index()
    assert index.builds == 1 and index.refresh() == 0  # built once, nothing re-read while the file did not grow
    assert run.trajectory("nope#0") is None


def test_the_pages_share_one_index_and_a_trajectory_reads_only_its_own_lines(ws, monkeypatch):
    """The run list, the trajectory list and a trajectory page index each file once between them; after that, one
    trajectory costs the bytes of its own lines (one seek each), not a read of the files."""
    from uqh.rundir.line_index import LineIndex

    indexed: list[str] = []
    index_from = LineIndex._index_from
    monkeypatch.setattr(LineIndex, "_index_from",
                        lambda self, start, size: indexed.append(self.path.name) or index_from(self, start, size))
    run = ViewedRun.open("0", ws)
    run.trajectory("c#0")
    run.overview()
    run.trajectories(0)
    assert sorted(indexed) == [EPISODES_FILE, SIDECAR_FILE]  # each file read once, by whichever page came first
    episodes, sidecar = run.reader.episode_index(), run.reader.sidecar_index()
    before = episodes.bytes_read, sidecar.bytes_read
    assert run.trajectory("e#0")["ep"]["id"] == "e#0"
    own = lambda index: sum(length + 1 for _, _, length in index.spans_of("e#0"))  # noqa: E731
    assert episodes.bytes_read - before[0] == own(episodes)
    assert sidecar.bytes_read - before[1] == own(sidecar)
    assert own(sidecar) < (ws / SIDECAR_FILE).stat().st_size / 4


def test_a_sidecar_cut_short_is_reported_on_the_trajectory_not_crashed_on(ws):
    from uqh.rundir.schema import SIDECAR_FILE

    run = ViewedRun.open("0", ws)
    assert run.trajectory("h#0")["notes"] == []
    side = ws / SIDECAR_FILE
    data = side.read_bytes()
    side.write_bytes(data[: data.rfind(b"\n", 0, len(data) - 1) + 1 - 40])  # h#0's last rows cut, a torn tail left
    out = run.trajectory("h#0")
    assert any("shrank" in n for n in out["notes"])
    assert any(n.startswith("no accepted sidecar row for step(s) 1, 2") for n in out["notes"])
    assert out["ep"]["values"]["token_prob"] == [None, None] and out["tokens"] == []
    assert out["ep"]["values"]["verbal"] == [None, 0.4]  # the episode's own values are still there


def probe_dir(path, probed, values):
    """A probe directory over the run ``probed`` with P(True) ``values[(episode_id, t)]`` (None: missing)."""
    from uqh.rundir.probes import (PROBE_MANIFEST_FILE, PROBES_FILE, ProbeConfig, ProbeKind, ProbeManifest,
                                   ProbeValue)
    from uqh.rundir.schema import CallRecord

    path.mkdir(parents=True)
    target = RunDir.open(probed)
    config = ProbeConfig(runs=[JudgedRun(path=str(probed), config_hash=target.manifest.config_hash, domain="webshop",
                                         model="openai/fake")],
                         probe=ProbeKind("p_true"), model="openai/p", decoding=DecodingConfig(), prompt_sha256="x",
                         package_version="0")
    manifest = ProbeManifest(config=config, config_hash=config.config_hash(), created_at="2026-01-01T00:00:00Z")
    (path / PROBE_MANIFEST_FILE).write_text(manifest.model_dump_json())
    lines = [ProbeValue(run=0, episode_id=eid, t=t, probe=ProbeKind("p_true"), value=v,
                        missing_reason=None if v is not None else "no logprobs", call=CallRecord(model="openai/p"))
             for (eid, t), v in values.items()]
    (path / PROBES_FILE).write_text("".join(v.model_dump_json() + "\n" for v in lines))


def test_probe_values_are_found_and_drawn_as_their_predictor(ws, tmp_path):
    from uqh.reports.view.runs import attach_probes

    eid = RunDir.open(ws).episodes()[0].episode_id
    n = len(RunDir.open(ws).episodes()[0].steps)
    values = {(eid, t): (0.2 + 0.1 * t if t != n else None) for t in range(1, n + 1)}
    probe_dir(tmp_path / "runs" / "probed", ws, values)
    found = find_directories([tmp_path / "runs"])
    assert found.probes == [(tmp_path / "runs" / "probed").resolve()]
    runs = [ViewedRun.open(str(i), p) for i, p in enumerate(found.runs)]
    assert attach_probes(runs, found.probes) == []
    got = runs[0].trajectory(eid)
    assert got["ep"]["values"]["p_true"] == pytest.approx([values[(eid, t)] for t in range(1, n + 1)])
    assert "p_true" in [p["key"] for p in got["run"]["predictors"]]
    # an unreadable probe directory is a note, never a crash
    (tmp_path / "runs" / "probed" / "probe_manifest.json").write_text("{not json")
    assert attach_probes(runs, found.probes)[0].startswith("probe directory")


def cut_last_episode(run_dir):
    """Remove the last episode's line and its sidecar rows from a run (as if it had not finished yet); return the
    episode and its rows."""
    reader = RunDir.open(run_dir)
    ep = reader.episodes()[-1]
    rows = reader.episode_sidecar_rows(ep.episode_id)
    eps = (run_dir / EPISODES_FILE).read_bytes().splitlines(keepends=True)
    (run_dir / EPISODES_FILE).write_bytes(b"".join(eps[:-1]))
    side = (run_dir / SIDECAR_FILE).read_bytes().splitlines(keepends=True)
    (run_dir / SIDECAR_FILE).write_bytes(b"".join(side[:len(side) - len(rows)]))
    return ep, rows


def partial(ep, rows, steps: int) -> PartialEpisode:
    return PartialEpisode(episode_id=ep.episode_id, task_id=ep.task_id, step_budget=ep.step_budget,
                          task_prompt=ep.task_prompt, steps=ep.steps[:steps], sidecar=rows[:steps])


def test_an_episode_in_progress_is_running_with_its_steps_until_its_line_lands(ws):
    """Through the real writer (RunStore holds the run's lock, writes checkpoints, appends the episode)."""
    ep, rows = cut_last_episode(ws)  # h#0: 2 steps
    with RunStore.open(ws) as store:
        run = ViewedRun.open("0", ws)
        store.write_checkpoint(partial(ep, rows, 1))
        out = run.trajectories(0)
        assert [it["id"] for it in out["items"]] == ["a#0", "b#0", "c#0", "d#0", "e#0", "f#0", "g#0"]
        assert [(r["id"], r["stop"], r["steps"]) for r in out["running"]] == [("h#0", "running", 1)]
        assert out["running"][0]["last"]["token_prob"] == pytest.approx(0.4)
        row = run.overview()
        assert (row["done"], row["in_progress"], row["state"]) == (7, 1, "running")
        page = run.trajectory("h#0")
        assert page["running"] is True and page["ep"]["stop"] == "running" and len(page["ep"]["steps"]) == 1
        assert page["ep"]["values"]["token_prob"] == pytest.approx([0.4])
        assert [t["t"] for t in page["tokens"]] == [1]

        store.write_checkpoint(partial(ep, rows, 2))  # a step more: read again (the file changed)
        page = run.trajectory("h#0")
        assert page["ep"]["values"]["verbal"] == [None, 0.4] and [t["t"] for t in page["tokens"]] == [1, 2]
        assert run.trajectories(7)["running"][0]["steps"] == 2

        store.append_episode(ep, rows)  # finished: the line lands and the checkpoint goes
        out = run.trajectories(7)
        assert [(it["id"], it["stop"]) for it in out["items"]] == [("h#0", "clean")] and out["running"] == []
        page = run.trajectory("h#0")
        assert page["running"] is False and page["ep"]["stop"] == "clean"
        assert run.overview()["in_progress"] == 0


def test_a_checkpoint_left_by_a_stopped_run_is_interrupted_and_a_bad_one_is_a_note(ws):
    from uqh.harness.store.writer import write_checkpoint

    ep, rows = cut_last_episode(ws)
    write_checkpoint(ws, partial(ep, rows, 1))  # no writer holds the run
    (ws / CHECKPOINT_DIR / "zz%230.json").write_text("{not json")
    run = ViewedRun.open("0", ws)
    out = run.trajectories(0)
    assert [(r["id"], r["stop"]) for r in out["running"]] == [("h#0", "interrupted")]
    assert [n for n in out["notes"] if "checkpoint" in n] == [n for n in out["notes"]]
    assert len(out["notes"]) == 1 and out["notes"][0].startswith("ignored unreadable checkpoint zz%230.json")
    page = run.trajectory("h#0")
    assert page["ep"]["stop"] == "interrupted" and any("resumes it" in n for n in page["notes"])


def test_a_resumed_run_keeps_its_key_and_a_run_started_afresh_at_its_path_gets_another(tmp_path):
    import shutil

    from uqh.reports.view.app import Viewer

    run = webshop_like(tmp_path / "runs" / "ws")
    viewer = Viewer([tmp_path / "runs"])
    manifest = RunDir.open(run).manifest
    (run / MANIFEST_FILE).write_text(manifest.model_copy(update={"info": {"session": 2}}).model_dump_json())
    assert viewer.update() is False and list(viewer.runs) == ["0"]  # a resume rewrites the manifest: same run
    shutil.rmtree(run)
    tau2_like(run)  # deleted, and another run started at the same path (the inode may well be reused)
    assert viewer.update() is True and list(viewer.runs) == ["1"]
    assert viewer.runs["1"].reader.config.domain == "tau2-airline"
