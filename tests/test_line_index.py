"""The per-episode line index of run files (uqh.rundir.line_index, RunDir.episode / episode_sidecar_rows): built
once, refreshed by reading only what was appended, a torn tail never indexed, a truncation reported and re-indexed,
a bad line listed rather than fatal, and the rows it returns equal to the full sidecar read's."""
from __future__ import annotations

import pytest

from report_fixtures import webshop_like
from uqh.rundir.errors import UserError
from uqh.rundir.line_index import LineIndex
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import EPISODES_FILE, SIDECAR_FILE


@pytest.fixture
def run(tmp_path):
    return RunDir.open(webshop_like(tmp_path / "ws"))


def test_rows_through_the_index_equal_the_full_sidecar_read(run):
    every = list(run.sidecar())
    for eid in run.episode_index().order:
        assert run.episode_sidecar_rows(eid) == [r for r in every if r.episode_id == eid]
        assert run.episode(eid) == next(e for e in run.episodes() if e.episode_id == eid)
    assert run.episode("nope#0") is None and run.episode_sidecar_rows("nope#0") == []
    assert run.sidecar_index().order == ["a#0", "b#0", "c#0", "d#0", "e#0", "f#0", "g#0", "h#0"]


def test_built_once_then_only_the_appended_bytes_are_read(run):
    side = run.path / SIDECAR_FILE
    index = run.sidecar_index()
    assert index.builds == 1 and index.indexed_bytes == side.stat().st_size
    first_rows = run.episode_sidecar_rows("a#0")
    extra = first_rows[0].model_copy(update={"episode_id": "z#0"}).model_dump_json().encode()
    with side.open("ab") as f:
        f.write(extra + b"\n" + extra[:30])  # one new row and a torn tail (a writer mid-append)
    assert index.refresh() == 1  # the new complete row only
    assert index.builds == 1 and index.indexed_bytes == side.stat().st_size - 30
    assert [r.t for r in run.episode_sidecar_rows("z#0")] == [1]
    with side.open("ab") as f:
        f.write(extra[30:] + b"\n")  # the torn line completes: a repeat of (z#0, 1, 0), the first kept
    assert run.sidecar_index().refresh() == 0 and len(run.sidecar_index().spans_of("z#0")) == 2
    assert len(run.episode_sidecar_rows("z#0")) == 1
    assert run.sidecar_index().notes == [] and run.sidecar_index().bad_lines == []


def test_a_truncated_sidecar_is_reported_and_reindexed_not_crashed_on(run):
    side = run.path / SIDECAR_FILE
    assert run.episode_sidecar_rows("h#0")
    data = side.read_bytes()
    side.write_bytes(data[: len(data) // 2])  # cut in the middle of a line, from outside
    rows = run.episode_sidecar_rows("h#0")  # h is the last episode: its rows are gone
    index = run.sidecar_index()
    assert rows == [] and index.builds == 2
    assert len(index.notes) == 1 and "shrank" in index.notes[0] and "re-indexed" in index.notes[0]
    assert index.indexed_bytes == data[: len(data) // 2].rfind(b"\n") + 1  # the torn half-line is not indexed
    assert run.episode_sidecar_rows("a#0")  # the rows before the cut are still read


def test_a_file_rewritten_in_place_is_reindexed(run):
    eps = run.path / EPISODES_FILE
    assert run.episode("b#0").episode_id == "b#0"
    lines = eps.read_bytes().split(b"\n")
    lines[0], lines[1] = lines[1], lines[0]  # same size, other offsets (b's line moves to where a's was)
    eps.write_bytes(b"\n".join(lines))
    assert run.episode("a#0").episode_id == "a#0"
    assert run.episode("b#0").episode_id == "b#0"
    assert ["changed under its index" in n for n in run.episode_index().notes] == [True]


def test_a_line_without_an_episode_id_is_listed_and_a_bad_record_names_its_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"schema_version":1,"episode_id":"a#0","t":1}\nnot json\n\n{"episode_id":"b#0"}\n')
    index = LineIndex(path)
    assert index.refresh() == 3 and index.order == ["a#0", "b#0"]
    assert [n for n, _ in index.bad_lines] == [2]
    assert index.read_lines("b#0") == [(4, b'{"episode_id":"b#0"}')]


def test_a_malformed_episode_line_is_a_user_error_with_its_line_number(run):
    eps = run.path / EPISODES_FILE
    with eps.open("ab") as f:
        f.write(b'{"schema_version":1,"episode_id":"bad#0","task_id":3,"stop_reason":"clean","outcome":1,"n_steps":0}\n')
        f.write(b'{"schema_version":1,"episode_id":"nohead#0"}\n')
    with pytest.raises(UserError, match=r"episodes.jsonl:9: not a valid Episode"):
        run.episode("bad#0")
    assert run.episode("nohead#0") is None  # no head: not indexed, listed as a bad line
    assert [n for n, _ in run.episode_index().bad_lines] == [10]


def test_a_missing_file_is_an_empty_index(tmp_path):
    index = LineIndex(tmp_path / "absent.jsonl")
    assert index.refresh() == 0 and index.order == [] and index.builds == 0


def test_episode_heads_match_the_parsed_records(run):
    heads = run.episode_index().heads
    for ep in run.episodes():
        h = heads[ep.episode_id]
        assert (h.stop_reason, h.outcome, h.n_steps) == (ep.stop_reason.value, ep.outcome, ep.n_steps)
        assert h.cost_usd is None  # no call of the fixture is priced


def test_episode_head_reads_keys_not_text_and_sums_costs():
    from uqh.rundir.line_index import episode_head

    line = (b'{"schema_version":1,"episode_id":"x#0","task_id":"x","sample_index":0,"stop_reason":"max_steps",'
            b'"outcome":null,"reward_info":{},"n_steps":3,"task_prompt":"say \\"stop_reason\\":\\"clean\\" '
            b'\\"cost_usd\\":99","steps":[{"call":{"cost_usd":0.25}},{"call":{"cost_usd":1e-3}}]}')
    h = episode_head(line)
    assert (h.stop_reason, h.outcome, h.n_steps) == ("max_steps", None, 3)
    assert h.cost_usd == pytest.approx(0.251)
    with pytest.raises(ValueError):
        episode_head(b'{"episode_id":"x#0"}')


def test_is_being_written_reads_the_lock_file_only(run):
    import json
    import os
    import socket

    from uqh.rundir.schema import LOCK_FILE

    assert run.is_being_written() is False  # no lock file
    (run.path / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    assert run.is_being_written() is True
    (run.path / LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 7, "host": socket.gethostname()}))
    assert run.is_being_written() is False  # a dead pid: the writer is gone


def test_last_accepted_row_parses_only_that_step_and_equals_the_full_read(run):
    every = list(run.sidecar())
    for eid in run.sidecar_index().order:
        last_t = max(r.t for r in every if r.episode_id == eid)
        expected = next(r for r in every if r.episode_id == eid and r.t == last_t and r.accepted)
        assert run.last_accepted_row(eid, last_t) == expected
    assert run.last_accepted_row("a#0", 9) is None and run.last_accepted_row("zz#0", 1) is None


def reference_index(data: bytes) -> tuple[dict[str, list[tuple[int, int, int]]], list[str], list[int]]:
    """The index made the plain way, one line at a time: (spans by id, ids in order, numbers of bad lines)."""
    from uqh.rundir.line_index import line_episode_id

    spans: dict[str, list[tuple[int, int, int]]] = {}
    order, bad, offset = [], [], 0
    for lineno, raw in enumerate(data[: data.rfind(b"\n") + 1].split(b"\n")[:-1], start=1):
        if raw.strip():
            try:
                eid = line_episode_id(raw)
                if not isinstance(eid, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                bad.append(lineno)
            else:
                if eid not in spans:
                    spans[eid] = []
                    order.append(eid)
                spans[eid].append((lineno, offset, len(raw)))
        offset += len(raw) + 1
    return spans, order, bad


def test_the_bulk_index_equals_the_line_by_line_one_on_every_kind_of_line(tmp_path, monkeypatch):
    """Runs of one episode's rows are indexed in bulk (numpy); every line the bulk path cannot take (short, blank,
    another key order, an escaped or non-ASCII id, not JSON, an id that is not a string) goes one at a time; chunks
    of a few hundred bytes cut lines anywhere, and the file grows between refreshes, ending on a torn line."""
    import random

    from uqh.rundir import line_index

    pad = "x" * 150
    lines = []
    rng = random.Random(7)
    for k in range(300):
        eid = rng.choice(["a#0", "b#0", "c#1", 'q\\"uote#0', "é#0", "a#0@b1"])
        kind = rng.random()
        if kind < 0.7:
            lines.append('{"schema_version":1,"episode_id":"%s","t":%d,"pad":"%s"}' % (eid, k, pad))
        elif kind < 0.75:
            lines.append('{"schema_version":1,"episode_id":"%s","t":%d}' % (eid, k))  # short
        elif kind < 0.8:
            lines.append("   ")
        elif kind < 0.85:
            lines.append('{"episode_id":"%s","schema_version":1,"pad":"%s"}' % (eid, pad))  # another key order
        elif kind < 0.9:
            lines.append("not json " + pad)
        elif kind < 0.95:
            lines.append('{"schema_version":1,"episode_id":7,"pad":"%s"}' % pad)
        else:
            lines.append('{"schema_version":1,"episode_id":"%s%s","t":1}' % ("long" * 40, k % 3))  # id > window
    data = ("\n".join(lines) + "\n" + '{"schema_version":1,"episode_id":"torn').encode()
    path = tmp_path / "x.jsonl"
    monkeypatch.setattr(line_index, "CHUNK_BYTES", 333)
    index = LineIndex(path)
    for cut in (len(data) // 3, 2 * len(data) // 3, len(data)):
        path.write_bytes(data[:cut])
        index.refresh()
        spans, order, bad = reference_index(data[:cut])
        assert {e: index.spans_of(e) for e in index.order} == spans and index.order == order and [n for n, _ in index.bad_lines] == bad
    assert index.builds == 1 and index.indexed_bytes == data.rfind(b"\n") + 1


def test_an_episode_line_without_a_head_is_a_bad_line_in_bulk_as_one_at_a_time(tmp_path):
    """The episodes file's index keeps each id's head; a line in the writer's form whose head cannot be read is
    listed as a bad line (its id not indexed), as the line-by-line path does for the lines it takes."""
    from uqh.rundir.line_index import episode_head

    pad = "y" * 120
    good = '{"schema_version":1,"episode_id":"%s","task_id":"t","sample_index":0,"stop_reason":"clean",' \
           '"outcome":1,"reward":null,"reward_info":{},"n_steps":2,"pad":"%s"}'
    headless = '{"schema_version":1,"episode_id":"%s","pad":"%s"}'
    lines = [good % ("a#0", pad), headless % ("b#0", pad), headless % ("b#0", pad), good % ("b#0", pad),
             headless % ("c#0", "z")]  # the last one short: taken line by line
    path = tmp_path / "episodes.jsonl"
    path.write_text("\n".join(lines) + "\n")
    index = LineIndex(path, head=episode_head)
    assert index.refresh() == 5
    assert index.order == ["a#0", "b#0"] and [n for n, _ in index.bad_lines] == [2, 3, 5]
    assert index.spans_of("b#0") == [(4, path.read_bytes().index(b'{"schema_version":1,"episode_id":"b#0","task'),
                                      len(lines[3]))]
    assert index.heads["b#0"].stop_reason == "clean" and index.heads["a#0"].n_steps == 2
