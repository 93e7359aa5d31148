"""Integrity reads of a run directory's JSONL files: what the writer must know before it appends, and where the
lines are that are not records. Reading only; :class:`uqh.rundir.reader.RunDir` exposes these as methods.

- :func:`scan_for_writer` -- one pass over ``episodes.jsonl``, ``logprobs.jsonl`` and, where a run has one, the
  user sidecar ``user_logprobs.jsonl`` (lines parsed as JSON, not validated into records, so a resume stays fast):
  the complete length of each file (a torn tail after it), the finished episode ids, the sidecar rows at the end
  that belong to no finished episode (a crash between the appends), and the finished episodes whose own calls have
  no sidecar row (a sidecar cut from outside; not checked for the user sidecar, whose rows the episode record does
  not list). Any line
  that is not a record, and any sidecar row of an unfinished episode before that tail, is a UserError naming the
  file and line, which says how to repair it -- before anything is touched.
- :func:`invalid_lines` -- every complete line of a file that does not validate as its record type (the explicit
  repair, ``uqh repair``, moves them aside), and :func:`stray_sidecar_rows` -- sidecar rows of episodes that are
  not finished.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from uqh.rundir.errors import UserError, first_line
from uqh.rundir.schema import EPISODES_FILE, SIDECAR_FILE, USER_SIDECAR_FILE, Episode, LogprobRow

#: The JSONL files of LogprobRow records: the agent's sidecar and the simulated user's.
SIDECAR_FILES = (SIDECAR_FILE, USER_SIDECAR_FILE)

_ROW_KEY = re.compile(rb'^\{"schema_version":\d+,"episode_id":("(?:[^"\\]|\\.)*"),"t":(\d+),"attempt":(\d+),')

RowKey = tuple[str, int, int]


@dataclass(frozen=True)
class BadLine:
    """One complete line of a JSONL file that cannot stay where it is."""

    name: str  # file name inside the run directory
    lineno: int  # 1-based
    offset: int  # byte offset of the line's first byte
    length: int  # bytes, newline included
    reason: str


@dataclass
class WriterScan:
    """What the writer's open step needs to know about the JSONL files (see :func:`scan_for_writer`)."""

    #: Bytes of each file up to and including its last newline (the rest is a torn line).
    complete_length: dict[str, int]
    #: Every complete episode line's id, in file order, duplicates included.
    episode_ids: list[str]
    #: Byte offset from which the sidecar's last rows belong to no finished episode, and how many rows that is.
    orphan_tail_offset: int
    orphan_tail_rows: int
    #: Finished episode id -> how many of its own model calls have no sidecar row.
    missing_rows: dict[str, int] = field(default_factory=dict)
    #: Finished episode id -> its stop reason (the first line of an id, as readers keep it).
    stop_reasons: dict[str, str] = field(default_factory=dict)
    #: As ``orphan_tail_offset`` / ``orphan_tail_rows``, for the user sidecar (0, 0 without one).
    user_orphan_tail_offset: int = 0
    user_orphan_tail_rows: int = 0


def _repair_hint(run_dir: Path) -> str:
    return (f"nothing was changed; `uqh repair {run_dir}` moves such lines to a .quarantine file next to it "
            "(their episodes then run again on resume)")



def _lines(path: Path, limit: int) -> Iterator[tuple[int, int, bytes]]:
    """(1-based line number, offset, line without newline) of the first ``limit`` bytes (whole lines)."""
    if limit <= 0:
        return
    offset = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if offset + len(raw) > limit:
                return
            yield lineno, offset, raw[:-1] if raw.endswith(b"\n") else raw
            offset += len(raw)


def complete_length(path: Path) -> int:
    """Bytes of ``path`` up to and including its last newline (0 when it does not exist)."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    with path.open("rb") as f:
        pos, block = size, 1 << 16
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            i = f.read(pos - start).rfind(b"\n")
            if i >= 0:
                return start + i + 1
            pos = start
    return 0


def _episode_keys(raw: bytes) -> tuple[str, set[RowKey], str]:
    """An episode line's id, the sidecar keys of its own calls and its stop reason; ValueError when it is not an
    episode record."""
    data = json.loads(raw)
    if not isinstance(data, dict) or not isinstance(data.get("episode_id"), str):
        raise ValueError("no episode_id")
    eid = data["episode_id"]
    steps = data.get("steps")
    if not isinstance(steps, list):
        raise ValueError("no steps list")
    keys: set[RowKey] = set()
    for step in steps[int(data.get("prefix_steps") or 0):]:
        for att in step["attempts"]:
            keys.add((eid, int(step["t"]), int(att["attempt"])))
    for att in data.get("failed_step") or ():
        keys.add((eid, len(steps) + 1, int(att["attempt"])))
    return eid, keys, str(data.get("stop_reason"))


def row_key(raw: bytes) -> RowKey:
    """``(episode_id, t, attempt)`` of a sidecar line (fast path on the fixed key order); ValueError otherwise."""
    m = _ROW_KEY.match(raw)
    if m and raw.rstrip().endswith(b"}"):
        return json.loads(m.group(1)), int(m.group(2)), int(m.group(3))
    data = json.loads(raw)
    if not isinstance(data, dict) or not isinstance(data.get("episode_id"), str):
        raise ValueError("no episode_id")
    return data["episode_id"], int(data["t"]), int(data["attempt"])


def scan_for_writer(run_dir: Path, *, strict: bool = True) -> WriterScan:
    """Scan both JSONL files of ``run_dir`` for the writer (see the module docstring). Raises UserError, naming
    file and line, for a line that is not a record and (``strict``) for a sidecar row of an unfinished episode
    before the tail."""
    run_dir = Path(run_dir)
    ep_path, sc_path = run_dir / EPISODES_FILE, run_dir / SIDECAR_FILE
    lengths = {EPISODES_FILE: complete_length(ep_path), SIDECAR_FILE: complete_length(sc_path),
               USER_SIDECAR_FILE: complete_length(run_dir / USER_SIDECAR_FILE)}
    ids: list[str] = []
    expected: dict[str, set[RowKey]] = {}
    stop_reasons: dict[str, str] = {}
    for lineno, _, raw in _lines(ep_path, lengths[EPISODES_FILE]):
        if not raw.strip():
            continue
        try:
            eid, keys, stop_reason = _episode_keys(raw)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"{ep_path}:{lineno}: not a valid Episode record ({first_line(exc)}); "
                            f"{_repair_hint(run_dir)}") from None
        ids.append(eid)
        expected.setdefault(eid, keys)  # readers keep the first line of an id
        stop_reasons.setdefault(eid, stop_reason)
    present, tail_offset, tail_rows = _scan_sidecar(run_dir, SIDECAR_FILE, lengths, expected, strict)
    _, user_tail_offset, user_tail_rows = _scan_sidecar(run_dir, USER_SIDECAR_FILE, lengths, expected, strict)
    missing = {eid: len(keys - present) for eid, keys in expected.items() if keys - present}
    return WriterScan(complete_length=lengths, episode_ids=ids, orphan_tail_offset=tail_offset,
                      orphan_tail_rows=tail_rows, missing_rows=missing, stop_reasons=stop_reasons,
                      user_orphan_tail_offset=user_tail_offset, user_orphan_tail_rows=user_tail_rows)


def _scan_sidecar(run_dir: Path, name: str, lengths: dict[str, int], expected: dict[str, set[RowKey]],
                  strict: bool) -> tuple[set[RowKey], int, int]:
    """One sidecar file's row keys of finished episodes, and where its tail of rows of unfinished episodes starts
    (offset, rows); UserError for a line that is not a record and (``strict``) a stray row before that tail."""
    path = run_dir / name
    present: set[RowKey] = set()
    tail_offset, tail_rows, stray = 0, 0, None
    for lineno, offset, raw in _lines(path, lengths[name]):
        if not raw.strip():
            continue
        try:
            key = row_key(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}:{lineno}: not a valid LogprobRow record ({first_line(exc)}); "
                            f"{_repair_hint(run_dir)}") from None
        if key[0] in expected:
            if stray is not None and strict:  # a row of an unfinished episode with finished ones after it: not a crash tail
                raise UserError(f"{path}:{stray[0]}: a row of episode {stray[1]!r}, which has no episode line; "
                                f"{_repair_hint(run_dir)}")
            present.add(key)
            tail_offset, tail_rows = offset + len(raw) + 1, 0
        else:
            if stray is None:
                stray = (lineno, key[0])
            tail_rows += 1
    if tail_rows == 0:
        tail_offset = lengths[name]
    return present, tail_offset, tail_rows


def invalid_lines(run_dir: Path, name: str) -> list[BadLine]:
    """Every complete line of ``name`` (episodes or sidecar file) that does not validate as its record type."""
    model = {EPISODES_FILE: Episode, SIDECAR_FILE: LogprobRow, USER_SIDECAR_FILE: LogprobRow}[name]
    path = Path(run_dir) / name
    out = []
    for lineno, offset, raw in _lines(path, complete_length(path)):
        if not raw.strip():
            continue
        try:
            model.model_validate_json(raw)
        except ValueError as exc:
            out.append(BadLine(name, lineno, offset, len(raw) + 1, f"not a valid {model.__name__} record "
                                                                   f"({first_line(exc)})"))
    return out


def episode_ids(run_dir: Path, skip: set[int] = frozenset()) -> set[str]:
    """Ids of the complete episode lines not numbered in ``skip`` (the invalid ones, found first)."""
    path = Path(run_dir) / EPISODES_FILE
    out = set()
    for lineno, _, raw in _lines(path, complete_length(path)):
        if lineno not in skip and raw.strip():
            out.add(json.loads(raw)["episode_id"])
    return out


def stray_sidecar_rows(run_dir: Path, finished: set[str], skip: set[int] = frozenset(),
                       name: str = SIDECAR_FILE) -> list[BadLine]:
    """Complete lines of the sidecar ``name`` (not numbered in ``skip``) whose episode is not in ``finished``."""
    path = Path(run_dir) / name
    out = []
    for lineno, offset, raw in _lines(path, complete_length(path)):
        if lineno in skip or not raw.strip():
            continue
        eid = row_key(raw)[0]
        if eid not in finished:
            out.append(BadLine(name, lineno, offset, len(raw) + 1,
                               f"a row of episode {eid!r}, which has no episode line"))
    return out


def partition(run_dir: Path, name: str, bad: list[BadLine]) -> tuple[bytes, bytes]:
    """The bytes of ``name`` without the ``bad`` lines (a torn tail kept as it is), and the bad lines' bytes."""
    data = (Path(run_dir) / name).read_bytes()
    kept, moved, pos = [], [], 0
    for start, end in sorted((b.offset, b.offset + b.length) for b in bad):
        kept.append(data[pos:start])
        moved.append(data[start:end])
        pos = end
    kept.append(data[pos:])
    return b"".join(kept), b"".join(moved)
