"""An index of a JSONL run file by ``episode_id``: where each episode's lines are, kept up to date as the file grows.

Built for readers that look at one episode at a time while a run may still be writing (``uqh view``): instead of
scanning ``logprobs.jsonl`` per request, :class:`LineIndex` reads the file once, remembers for each episode id where
its lines are (:data:`Block`: consecutive lines of one episode, read back with one seek), and on
:meth:`LineIndex.refresh` reads only the bytes appended since. Lines are not parsed into records here, only their
``episode_id``: the lines in the writer's form (``{"schema_version":N,"episode_id":"..."``) are found and grouped
with numpy, a chunk at a time (:func:`_line_runs`), so Python works per episode, not per line, and building the
index of a 200,000-row sidecar costs less than scanning it once line by line (``benchmarks/view.py``).

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
from typing import TYPE_CHECKING, Any, Callable

from uqh.rundir.errors import first_line
from uqh.rundir.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    import numpy as np

_ID_PREFIX = re.compile(rb'\{"schema_version":\d+,"episode_id":("(?:[^"\\]|\\.)*")')
#: The writer's key order with an id that has no escape: the id is the group, as it is (the indexing fast path).
_PLAIN_ID = re.compile(rb'\{"schema_version":\d+,"episode_id":"([^"\\]*)"')


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
    costs = [float(c) for c in _COST.findall(line)]  # 5x faster than a bytes.find loop on a 20 kB line
    outcome = None if head.group(2) == b"null" else int(head.group(2))
    outcome = outcome if outcome in (0, 1, None) else None  # as the Episode record reads it (schema.py)
    return EpisodeHead(head.group(1).decode(), outcome, int(n.group(1)), sum(costs) if costs else None)


#: Where one line is: (its 1-based line number, the byte offset of its first byte, its length without the newline).
Span = tuple[int, int, int]
#: Where consecutive lines of one episode are (a sidecar's rows of one episode, as the writer appends them): (the
#: first one's line number, the offset of its first byte, each line's length without the newline). One block is
#: read with one seek; an index of 200,000 sidecar rows holds one block per episode, not 200,000 tuples.
Block = tuple[int, int, tuple[int, ...]]
#: How the writer begins every line (key order: schema_version, then episode_id); a line that begins so and whose
#: id has no escape within :data:`ID_WINDOW` bytes is indexed in bulk, any other line one at a time.
LINE_PREFIX = b'{"schema_version":%d,"episode_id":"' % SCHEMA_VERSION
ID_WINDOW = 64
#: Mean line length (bytes) from which newlines are found by ``bytes.find`` rather than numpy (measured crossover).
LONG_LINE = 1024


@dataclass
class LineIndex:
    """episode_id -> the blocks of its lines in file order, for one JSONL file; see the module docstring."""

    path: Path
    #: Bytes indexed so far: the file up to and including its last newline when last refreshed.
    indexed_bytes: int = 0
    #: Complete lines seen so far (blank ones included): the line number of the next line is ``lines + 1``.
    lines: int = 0
    #: Where each id's lines are (:meth:`spans_of` lists them one by one).
    blocks: dict[str, list[Block]] = field(default_factory=dict)
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
        self.blocks, self.order, self.bad_lines, self.heads = {}, [], [], {}

    def _index_from(self, start: int, size: int) -> int:
        """Index the complete lines in bytes [start, size): read in chunks of :data:`CHUNK_BYTES`, each from the
        start of the first line the one before did not finish (a line is read again rather than copied onto the
        next chunk)."""
        new, want, pos = 0, CHUNK_BYTES, start
        with open(self.path, "rb", buffering=0) as f:
            while pos < size:
                f.seek(pos)
                data = f.read(min(want, size - pos))
                if not data:
                    break  # the file shrank while we read: the next refresh sees it
                self.bytes_read += len(data)
                end = data.rfind(b"\n") + 1
                if not end:
                    if pos + len(data) >= size:
                        break  # a torn last line: indexed once its newline arrives
                    want *= 2  # a line longer than a chunk
                    continue
                new += self._index_lines(data, pos, end)
                pos += end
                self.indexed_bytes, want = pos, CHUNK_BYTES
        return new

    def _index_lines(self, data: bytes, base: int, end: int) -> int:
        """Index the lines of ``data[:end]`` (newline-terminated), ``data`` starting at file offset ``base``: each
        run of consecutive lines of one episode in the writer's form at once (:func:`_line_runs`), other lines
        one at a time (:meth:`_index_line`), as is the first line of a new id when heads are kept."""
        new = 0
        starts, lengths, run_starts, plain = _line_runs(data, end)
        first_lineno = self.lines + 1
        self.lines += len(starts)

        def one_by_one(a: int, b: int) -> int:
            return sum(self._index_line(data[int(starts[k]):int(starts[k] + lengths[k])], first_lineno + k,
                                        base + int(starts[k])) for k in range(a, b))

        for r in range(len(run_starts) - 1):
            a, b = int(run_starts[r]), int(run_starts[r + 1])
            if not plain[a]:
                new += one_by_one(a, b)
                continue
            id_start = int(starts[a]) + len(LINE_PREFIX)
            try:
                eid = data[id_start:data.index(b'"', id_start)].decode("utf-8")
            except UnicodeDecodeError:
                new += one_by_one(a, b)
                continue
            if self.head and eid not in self.blocks:  # its first line gives the head, or is refused
                try:
                    self.heads[eid] = self.head(data[int(starts[a]):int(starts[a] + lengths[a])])
                except (ValueError, KeyError, TypeError) as exc:
                    self.bad_lines.append((first_lineno + a, first_line(exc)))
                    new += 1 + one_by_one(a + 1, b)
                    continue
            self._add(eid, first_lineno + a, base + int(starts[a]), tuple(lengths[a:b].tolist()))
            new += b - a
        return new

    def _add(self, eid: str, lineno: int, offset: int, lengths: tuple[int, ...]) -> None:
        """Lines of ``eid`` found: a new block, or the end of its last block grown when they follow it directly."""
        blocks = self.blocks.get(eid)
        if blocks is None:
            self.blocks[eid] = [(lineno, offset, lengths)]
            self.order.append(eid)
            return
        last_line, last_offset, last_lengths = blocks[-1]
        if last_line + len(last_lengths) == lineno and last_offset + sum(last_lengths) + len(last_lengths) == offset:
            blocks[-1] = (last_line, last_offset, last_lengths + lengths)
        else:
            blocks.append((lineno, offset, lengths))

    def spans_of(self, episode_id: str) -> list[Span]:
        """Each line of ``episode_id`` as a :data:`Span`, in file order."""
        out = []
        for lineno, offset, lengths in self.blocks.get(episode_id, []):
            for k, length in enumerate(lengths):
                out.append((lineno + k, offset, length))
                offset += length + 1
        return out

    def _index_line(self, raw: bytes, lineno: int, offset: int) -> int:
        """Index one line not in the writer's plain form (blank, another key order, an escaped id, not JSON):
        returns 1 when it is not blank."""
        if not raw.strip():
            return 0
        try:
            eid = line_episode_id(raw)
            if not isinstance(eid, str):
                raise TypeError("episode_id is not a string")
            new_id = eid not in self.blocks
            head = self.head(raw) if (self.head and new_id) else None
        except (ValueError, KeyError, TypeError) as exc:
            self.bad_lines.append((lineno, first_line(exc)))
            return 1
        if new_id and self.head:
            self.heads[eid] = head
        self._add(eid, lineno, offset, (len(raw),))
        return 1

    def read_lines(self, episode_id: str) -> list[tuple[int, bytes]]:
        """(line number, line without newline) of ``episode_id``'s lines, read at their indexed offsets; [] for an
        unknown id.

        Call :meth:`refresh` first. A line that no longer starts where it was indexed (the file was rewritten in
        place without shrinking) makes the index rebuild once and read again."""
        with self.lock:
            blocks = self.blocks.get(episode_id, [])
            if not blocks:
                return []
            out = self._read(episode_id, blocks)
            if out is None:
                self.notes.append(f"{self.path.name} changed under its index; re-indexed from the start")
                self._reset()
                self.refresh()
                out = self._read(episode_id, self.blocks.get(episode_id, [])) or []
            return out

    def _read(self, episode_id: str, blocks: list[Block]) -> list[tuple[int, bytes]] | None:
        """The lines of ``blocks`` (one seek and one read each), or None when one of them is no longer a whole line
        of ``episode_id``."""
        out = []
        with open(self.path, "rb") as f:
            for lineno, offset, lengths in blocks:
                f.seek(offset)
                raw = f.read(sum(lengths) + len(lengths))
                self.bytes_read += len(raw)
                at = 0
                for k, length in enumerate(lengths):
                    line = raw[at:at + length]
                    if raw[at + length:at + length + 1] != b"\n" or not self._belongs(line, episode_id):
                        return None
                    out.append((lineno + k, line))
                    at += length + 1
        return out

    @staticmethod
    def _belongs(raw: bytes, episode_id: str) -> bool:
        plain = _PLAIN_ID.match(raw)
        if plain:
            return plain.group(1) == episode_id.encode("utf-8", errors="surrogateescape")
        try:
            return line_episode_id(raw) == episode_id
        except (ValueError, KeyError, TypeError):
            return False


def _newlines(data: bytes, buf: np.ndarray, end: int) -> np.ndarray:
    """Offsets of the newlines in ``data[:end]``: by ``bytes.find`` when lines are long (a sidecar's rows, ~4 kB:
    memchr skips them, 4x faster than comparing every byte), by numpy when they are short."""
    import numpy as np  # here, not at the top: `uqh --help` imports the reader, and must not import numpy

    count = data.count(b"\n", 0, end)
    if count * LONG_LINE > end:
        return np.flatnonzero(buf == 10)
    out, at = [], data.find(b"\n", 0, end)
    while at >= 0:
        out.append(at)
        at = data.find(b"\n", at + 1, end)
    return np.array(out, dtype=np.int64)


def _line_runs(data: bytes, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The lines of ``data[:end]`` (which ends with a newline) found with numpy, not a Python loop per line:
    (start offset of each line, its length, the first line of each run, whether each line is in the writer's
    plain form). A run is a maximal sequence of consecutive plain lines with the same id (a sidecar's rows of one
    episode), or one line not in plain form; ``run starts`` ends with the number of lines."""
    import numpy as np  # see _newlines

    buf = np.frombuffer(data, dtype=np.uint8, count=end)
    newlines = _newlines(data, buf, end)
    starts = np.concatenate(([0], newlines[:-1] + 1))
    lengths = newlines - starts
    n, p = len(starts), len(LINE_PREFIX)
    # a window of each line from its first byte: the prefix, then the id up to its closing quote
    cols = np.minimum(starts[:, None] + np.arange(p + ID_WINDOW), end - 1)
    window = buf[cols]
    plain = (lengths >= p + ID_WINDOW) & np.all(window[:, :p] == np.frombuffer(LINE_PREFIX, np.uint8), axis=1)
    ids = window[:, p:]
    quote = np.argmax(ids == ord('"'), axis=1)
    plain &= ids[np.arange(n), quote] == ord('"')
    before_quote = np.arange(ID_WINDOW) < quote[:, None]
    plain &= ~np.any((ids == ord("\\")) & before_quote, axis=1)
    ids = np.where(before_quote, ids, 0)  # the id's bytes, zero after its quote: equal rows, equal ids
    same = np.zeros(n, dtype=bool)
    if n > 1:
        same[1:] = plain[1:] & plain[:-1] & np.all(ids[1:] == ids[:-1], axis=1)
    run_starts = np.concatenate((np.flatnonzero(~same), [n]))
    return starts, lengths, run_starts, plain
