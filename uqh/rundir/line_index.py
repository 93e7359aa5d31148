"""An index of a JSONL run file by ``episode_id``: where each episode's lines are, kept up to date as the file grows.

Built for readers that look at one episode at a time while a run may still be writing (``uqh view``): instead of
scanning ``logprobs.jsonl`` per request, :class:`LineIndex` reads the file once, remembers for each episode id the
byte spans of its lines, and on :meth:`LineIndex.refresh` reads only the bytes appended since. Lines are not parsed
into records here (only their ``episode_id``, by the fixed key order), so building the index of a 200,000-row sidecar
costs one sequential read.

What it tolerates, and how it reports it (never an exception for something a running writer or a crash leaves):

- a torn last line (a writer mid-append, or a crash) is not indexed until its newline arrives;
- a file that became **shorter** than what was indexed (truncated or rewritten from outside, e.g. ``uqh repair``) is
  re-indexed from the start, and the event is kept in :attr:`LineIndex.notes`;
- a complete line whose ``episode_id`` cannot be read is skipped and listed in :attr:`LineIndex.bad_lines` (line
  number and reason); the record readers (:meth:`uqh.rundir.reader.RunDir.episodes`) still refuse it.
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

from uqh.rundir.errors import first_line

_ID_PREFIX = re.compile(rb'\{"schema_version":\d+,"episode_id":("(?:[^"\\]|\\.)*")')


def line_episode_id(line: bytes) -> str:
    """The ``episode_id`` of one JSONL line of an Episode or LogprobRow (fast path on the fixed key order)."""
    m = _ID_PREFIX.match(line)
    if m:
        return json.loads(m.group(1))
    return json.loads(line)["episode_id"]

#: Bytes read per chunk while indexing (one chunk holds many lines; a line may span chunks).
CHUNK_BYTES = 1 << 22


_HEAD = re.compile(rb'"stop_reason":"([a-z_]+)","outcome":(null|-?\d+)')
_N_STEPS = re.compile(rb'"n_steps":(\d+)')
_COST = re.compile(rb'"cost_usd":(-?[0-9.eE+-]+)')


@dataclass(frozen=True)
class EpisodeHead:
    """What a run list needs of one finished episode, read from its line without validating the record: stop
    reason, outcome, steps and the summed ``cost_usd`` of every call recorded in it (None: no priced call).

    Keys are matched as JSON keys (a quote before and after), so text inside strings (escaped quotes) never
    matches; the top-level ``stop_reason``/``outcome``/``n_steps`` come before any nested dict in the writer's key
    order, and the first match is taken."""

    stop_reason: str
    outcome: int | None
    n_steps: int
    cost_usd: float | None


def episode_head(line: bytes) -> EpisodeHead:
    """The :class:`EpisodeHead` of one episode line (ValueError when it has none)."""
    head, n = _HEAD.search(line), _N_STEPS.search(line)
    if head is None or n is None:
        raise ValueError("no stop_reason/outcome/n_steps keys")
    costs = [float(c) for c in _COST.findall(line)]
    outcome = None if head.group(2) == b"null" else int(head.group(2))
    return EpisodeHead(head.group(1).decode(), outcome, int(n.group(1)), sum(costs) if costs else None)


class Span(NamedTuple):
    """Where one line is: its 1-based line number, byte offset of its first byte and its length without the
    newline (a tuple: an index of 200,000 sidecar rows makes as many)."""

    lineno: int
    offset: int
    length: int


@dataclass
class LineIndex:
    """episode_id -> spans of its lines in file order, for one JSONL file; see the module docstring."""

    path: Path
    #: Bytes indexed so far: the file up to and including its last newline when last refreshed.
    indexed_bytes: int = 0
    #: Complete lines seen so far (blank ones included): the line number of the next line is ``lines + 1``.
    lines: int = 0
    spans: dict[str, list[Span]] = field(default_factory=dict)
    #: Episode ids in the order of their first line.
    order: list[str] = field(default_factory=list)
    #: (1-based line number, reason) of complete lines whose episode_id could not be read.
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    #: What happened to the file that a reader should know (a truncation and re-index), oldest first.
    notes: list[str] = field(default_factory=list)
    #: How many times the file was read from its start (1 after the first build; more after truncations).
    builds: int = 0
    #: Optional: a function of a line whose value is kept in :attr:`heads` for each id's first line (the episodes
    #: file keeps :func:`episode_head`); a line it refuses is listed in :attr:`bad_lines`.
    head: Callable[[bytes], Any] | None = None
    heads: dict[str, Any] = field(default_factory=dict)
    #: Bytes read from the file so far, by indexing and by :meth:`read_lines` (what a reader of one episode costs).
    bytes_read: int = 0
    #: Held while indexing or reading: readers in several threads share one index.
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def refresh(self) -> int:
        """Index what was appended since the last call; returns how many new complete lines were indexed."""
        with self.lock:
            try:
                size = os.stat(self.path).st_size
            except FileNotFoundError:
                size = 0
            if size < self.indexed_bytes:
                self.notes.append(f"{self.path.name} shrank from {self.indexed_bytes} to {size} bytes (truncated or "
                                  "rewritten from outside); re-indexed from the start")
                self._reset()
            if self.indexed_bytes == 0 and size > 0:
                self.builds += 1
            if size == self.indexed_bytes:
                return 0
            return self._index_from(self.indexed_bytes, size)

    def _reset(self) -> None:
        self.indexed_bytes, self.lines = 0, 0
        self.spans, self.order, self.bad_lines, self.heads = {}, [], [], {}

    def _index_from(self, start: int, size: int) -> int:
        """Index the complete lines in bytes [start, size): chunks of :data:`CHUNK_BYTES` read, each line's id
        matched in place (no copy of the line, no JSON parse of a plain id; a line of the same episode as the one
        before reuses its id)."""
        new = 0
        with open(self.path, "rb") as f:
            f.seek(start)
            pos, carry = start, b""
            while pos < size:
                chunk = f.read(min(CHUNK_BYTES, size - pos))
                if not chunk:
                    break  # the file shrank while we read: the next refresh sees it
                pos += len(chunk)
                self.bytes_read += len(chunk)
                data = carry + chunk
                base = pos - len(data)
                end = data.rfind(b"\n") + 1
                new += self._index_lines(data, base, end)
                if end:
                    self.indexed_bytes = base + end
                carry = data[end:]
        return new

    def _index_lines(self, data: bytes, base: int, end: int) -> int:
        """Index the lines of ``data[:end]`` (newline-terminated), ``data`` starting at file offset ``base``."""
        new, i = 0, 0
        last_raw, last_id = None, None
        while i < end:
            j = data.index(b"\n", i)
            self.lines += 1
            m = _ID_PREFIX.match(data, i, j)
            if m is None and not data[i:j].strip():
                i = j + 1
                continue
            new += 1
            try:
                raw_id = m.group(1) if m else None
                if raw_id is not None and raw_id == last_raw:
                    eid = last_id
                elif raw_id is not None and b"\\" not in raw_id:
                    eid = raw_id[1:-1].decode("utf-8")
                else:
                    eid = line_episode_id(data[i:j])
                if not isinstance(eid, str):
                    raise TypeError("episode_id is not a string")
                head = self.head(data[i:j]) if (self.head and eid not in self.spans) else None
            except (ValueError, KeyError, TypeError) as exc:
                self.bad_lines.append((self.lines, first_line(exc)))
            else:
                last_raw, last_id = raw_id, eid
                spans = self.spans.get(eid)
                if spans is None:
                    spans = self.spans[eid] = []
                    self.order.append(eid)
                    if self.head:
                        self.heads[eid] = head
                spans.append(Span(self.lines, base + i, j - i))
            i = j + 1
        return new

    def read_lines(self, episode_id: str) -> list[tuple[int, bytes]]:
        """(line number, line without newline) of ``episode_id``'s lines, read at their indexed offsets; [] for an
        unknown id.

        Call :meth:`refresh` first. A line that no longer starts where it was indexed (the file was rewritten in
        place without shrinking) makes the index rebuild once and read again."""
        with self.lock:
            spans = self.spans.get(episode_id, [])
            if not spans:
                return []
            out = self._read(episode_id, spans)
            if out is None:
                self.notes.append(f"{self.path.name} changed under its index; re-indexed from the start")
                self._reset()
                self.refresh()
                out = self._read(episode_id, self.spans.get(episode_id, [])) or []
            return out

    def _read(self, episode_id: str, spans: list[Span]) -> list[tuple[int, bytes]] | None:
        """The lines at ``spans``, or None when one of them is no longer a whole line of ``episode_id``."""
        out = []
        with open(self.path, "rb") as f:
            for s in spans:
                f.seek(s.offset)
                raw = f.read(s.length + 1)
                self.bytes_read += len(raw)
                if raw[-1:] != b"\n" or not self._belongs(raw[:-1], episode_id):
                    return None
                out.append((s.lineno, raw[:-1]))
        return out

    @staticmethod
    def _belongs(raw: bytes, episode_id: str) -> bool:
        try:
            return line_episode_id(raw) == episode_id
        except (ValueError, KeyError, TypeError):
            return False
