"""The one reader of a run directory.

Everything in the project that looks at a run directory -- the writer's repair step, resume, scoring, audit,
reports, continuations -- opens it with :meth:`RunDir.open` and reads through its methods, so every part checks
the same things and counts the same episodes:

- ``open`` refuses, with one clear :class:`~uqh.rundir.errors.UserError`, a path that does not exist, is a file, has
  no ``manifest.json``, has an unreadable manifest or one of an unknown ``schema_version``;
- JSONL files are read torn-line safe: an incomplete last line (a crash mid-write) is never data;
- episodes are de-duplicated by one rule: the **first** line of each ``episode_id`` is kept (the writer never
  appends a second one; a duplicate can only come from outside, e.g. two writers before locking existed), and
  sidecar rows by ``(episode_id, t, attempt)``, first kept; the counts of dropped lines are kept on the object;
- a line that is not a valid record is a UserError naming the file and line number;
- the writer's checks before it appends (torn tails, crash leftovers, sidecar rows missing for finished
  episodes) and the explicit repair's search for bad lines are read here too (:mod:`uqh.rundir.integrity`).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable, Iterator, TypeVar

from pydantic import BaseModel

from uqh.rundir import integrity
from uqh.rundir.errors import UserError, first_line
from uqh.rundir.line_index import LineIndex, episode_head, line_episode_id
from uqh.rundir.schema import (
    CHECKPOINT_DIR,
    EPISODES_FILE,
    LOCK_FILE,
    MANIFEST_FILE,
    OUT_OF_RANGE,
    SCHEMA_VERSION,
    SIDECAR_FILE,
    SKIPPED_FILE,
    SKIPPED_SAMPLES_FILE,
    STOP_FILE,
    USER_SIDECAR_FILE,
    Episode,
    LogprobRow,
    Manifest,
    PartialEpisode,
    SkippedPrefix,
    SkippedSample,
    StopDecision,
    StopReason,
)

M = TypeVar("M", bound=BaseModel)

def checkpoint_path(run_dir: Path, episode_id: str) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / (urllib.parse.quote(episode_id, safe="") + ".json")


def complete_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line without newline) of every newline-terminated, non-blank line of ``path``.

    The last element after the final newline is either empty or a torn line from a crash: never yielded.
    """
    if not path.exists():
        return
    with path.open("rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines[:-1], start=1):
        if raw.strip():
            yield lineno, raw



def _parse(path: Path, lineno: int, raw: bytes, model: type[M], context: dict | None = None) -> M:
    try:
        return model.model_validate_json(raw, context=context)
    except ValueError as exc:  # pydantic ValidationError (JSON errors included) is a ValueError
        raise UserError(
            f"{path}:{lineno}: not a valid {model.__name__} record ({first_line(exc)}); "
            "was it written by this version of uqh?"
        ) from None


def read_jsonl(path: Path, model: type[M], context: dict | None = None) -> Iterator[M]:
    """Records of ``model`` from a JSONL file, torn-line safe; a malformed line is a UserError with its line number.
    ``context``: the validation context (e.g. ``{OUT_OF_RANGE: []}`` collects values read as missing)."""
    path = Path(path)
    for lineno, raw in complete_lines(path):
        yield _parse(path, lineno, raw, model, context)


def read_jsonl_first_per_key(path: Path, model: type[M], key: Callable[[M], Hashable],
                             context: dict | None = None) -> tuple[list[M], int]:
    """:func:`read_jsonl` keeping the first line of each ``key`` (a retried append can repeat a record); also
    returns how many later lines were dropped as repeats."""
    seen: set = set()
    out: list[M] = []
    repeats = 0
    for rec in read_jsonl(path, model, context):
        k = key(rec)
        if k in seen:
            repeats += 1
            continue
        seen.add(k)
        out.append(rec)
    return out, repeats


def _first_rows(path: Path, context: dict | None = None) -> Iterator[tuple[LogprobRow, bool]]:
    """(row, whether an earlier row had its (episode_id, t, attempt)) of a sidecar file, torn-line safe."""
    seen: set[tuple[str, int, int]] = set()
    for row in read_jsonl(path, LogprobRow, context):
        key = (row.episode_id, row.t, row.attempt)
        yield row, key in seen
        seen.add(key)


def read_versioned_json(path: Path, model: type[M], what: str, *, hint: str = "") -> M:
    """A JSON document of ``model`` (a manifest) checked: readable, JSON, ``schema_version`` known, valid.

    ``what`` names it in the one-line UserError (e.g. "manifest"); ``hint`` is added when it has no version."""
    try:
        raw = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {first_line(exc)}") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version is None:
        raise UserError(f"{path} is not a valid {what} (no schema_version){hint}")
    if version != SCHEMA_VERSION:
        raise UserError(f"{path} was written with schema_version {version}; this uqh reads schema_version "
                        f"{SCHEMA_VERSION}")
    try:
        return model.model_validate(raw)
    except ValueError as exc:
        raise UserError(f"{path} is not a valid {what} ({first_line(exc)})") from None


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a run directory's manifest (the one test of "a run was started here")."""
    return (Path(path) / MANIFEST_FILE).is_file()


def manifest_stamp(path: str | Path) -> tuple[int, int, int] | None:
    """(inode, mtime in ns, size) of a run directory's manifest, None when it has none: a reader that keeps a run
    open tells by it, without reading the file, that the manifest was not rewritten since."""
    try:
        st = os.stat(Path(path) / MANIFEST_FILE)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_manifest_file(run_dir: Path) -> Manifest:
    """The manifest of ``run_dir``, checked (exists, JSON, known schema_version, valid); UserError otherwise."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise UserError(f"{run_dir} is not a run directory (it does not exist); pass a directory written by `uqh run`")
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is a file, not a run directory; pass a directory written by `uqh run`")
    path = run_dir / MANIFEST_FILE
    if not path.is_file():
        raise UserError(f"{run_dir} is not a run directory (no {MANIFEST_FILE}); pass a directory written by `uqh run`")
    manifest = read_versioned_json(path, Manifest, "manifest", hint=f"; is {run_dir} a directory written by `uqh run`?")
    # The hash is checked on open: a config edited by hand (hash kept) would otherwise resume or score as if it
    # were what produced the episodes. Manifests written before the endpoints left the hash carry the older one.
    if manifest.config_hash not in (manifest.config.config_hash(), manifest.config.legacy_config_hash()):
        raise UserError(f"{path}: its config does not match its config_hash (changed after the run wrote it); "
                        "restore the file -- the episodes were produced under the recorded config")
    return manifest


@dataclass
class RunDir:
    """A run directory opened for reading. Build it with :meth:`open`; it never writes."""

    path: Path
    manifest: Manifest
    #: Filled by :meth:`episodes` / :meth:`sidecar`: lines dropped by the de-duplication rule.
    duplicate_episode_lines: int = 0
    #: Filled by :meth:`episodes`: ids of episode lines the manifest does not plan (left out, never counted).
    foreign_episode_ids: list[str] = field(default_factory=list)
    #: Filled by :meth:`episodes`: (field, value) of each recorded value outside its range, read as missing.
    out_of_range_values: list[tuple[str, object]] = field(default_factory=list)
    #: Filled by a full pass of :meth:`sidecar`: (field, value) of each token logprob out of range (its call's
    #: tokens read as missing).
    out_of_range_sidecar_values: list[tuple[str, object]] = field(default_factory=list)
    duplicate_sidecar_rows: int = 0
    #: Filled by :meth:`user_sidecar`: user-sidecar lines dropped by the de-duplication rule.
    duplicate_user_sidecar_rows: int = 0
    _episodes: list[Episode] | None = field(default=None, repr=False)
    _indexes: dict[str, LineIndex] = field(default_factory=dict, repr=False)
    #: Whether the episodes file's line index keeps each episode's head (stop reason, outcome, steps, cost): a
    #: reader that only looks episodes up by id saves that work.
    index_heads: bool = True
    #: Held while a line index is looked up or made: threads sharing this reader share its indexes.
    _index_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    #: checkpoint file name -> (its size and mtime when read, what it held): :meth:`live_checkpoints`' cache.
    _checkpoint_cache: dict[str, tuple[tuple[int, int], PartialEpisode]] = field(default_factory=dict, repr=False,
                                                                                  compare=False)

    @classmethod
    def open(cls, path: str | Path) -> "RunDir":
        path = Path(path)
        return cls(path=path, manifest=read_manifest_file(path))

    # ------------------------------------------------------------------ identity

    @property
    def config(self):
        return self.manifest.config

    @property
    def is_continuation(self) -> bool:
        return self.manifest.config.continuation is not None

    @property
    def planned(self) -> int:
        """Episodes the manifest plans (tasks x samples, less the samples sequential sampling skipped; continuation
        runs: replayable prefixes x branches)."""
        cont = self.manifest.config.continuation
        if cont:
            skipped = {s.episode_id for s in self.skipped_prefixes()}
            kept = [p for p in cont.get("prefix_ids", []) if p not in skipped]
            return len(kept) * int(cont.get("branches", 0))
        total = len(self.manifest.config.task_ids) * self.manifest.config.samples_per_task
        return total - len(self.skipped_samples())

    @property
    def has_episodes_file(self) -> bool:
        return (self.path / EPISODES_FILE).is_file()

    # ------------------------------------------------------------------ records

    def episodes(self) -> list[Episode]:
        """Finished episodes in file order, torn-line safe, the first line of each episode_id kept (cached)."""
        if self._episodes is None:
            context: dict = {OUT_OF_RANGE: []}
            episodes, self.duplicate_episode_lines = read_jsonl_first_per_key(
                self.path / EPISODES_FILE, Episode, lambda ep: ep.episode_id, context)
            self.out_of_range_values = context[OUT_OF_RANGE]
            planned = self._is_planned()
            self.foreign_episode_ids = [ep.episode_id for ep in episodes if not planned(ep)]
            self._episodes = [ep for ep in episodes if planned(ep)] if self.foreign_episode_ids else episodes
        return self._episodes

    def _is_planned(self):
        """Whether an episode is one the manifest plans (a task of ``task_ids``, a sample index below
        ``samples_per_task``); continuation runs' branches are checked by their own reader (always True here)."""
        config = self.manifest.config
        if config.continuation is not None:
            return lambda ep: True
        tasks = set(config.task_ids)
        return lambda ep: ep.task_id in tasks and 0 <= ep.sample_index < config.samples_per_task

    def reading_notes(self) -> list[str]:
        """One line per thing a reader left out of the episodes, so no count is silently wrong: lines whose ids the
        manifest does not plan, duplicate lines, values outside their range (read as missing), a torn last line."""
        self.episodes()
        notes = []
        if self.foreign_episode_ids:
            notes.append(f"{self.path}: {len(self.foreign_episode_ids)} episode line(s) whose id the manifest does "
                         f"not plan, e.g. {self.foreign_episode_ids[0]!r}: not counted")
        if self.duplicate_episode_lines:
            notes.append(f"{self.path}: {self.duplicate_episode_lines} duplicate episode line(s): the first of each "
                         "id counted")
        if self.out_of_range_values:
            fields = Counter(name for name, _ in self.out_of_range_values)
            name, value = self.out_of_range_values[0]
            notes.append(f"{self.path}: {len(self.out_of_range_values)} recorded value(s) outside their range read as "
                         f"missing ({', '.join(f'{k} {n}x' for k, n in sorted(fields.items()))}; e.g. {name} "
                         f"{value!r}): the scores leave them out")
        path = self.path / EPISODES_FILE
        torn = path.stat().st_size - integrity.complete_length(path) if path.is_file() else 0
        if torn:
            notes.append(f"{self.path}: {EPISODES_FILE} ends with a torn line ({torn} bytes, an interrupted write): "
                         "not read; `uqh repair` or the next `uqh run` removes it")
        return notes

    def censored_episodes(self) -> list[Episode]:
        """The administratively censored (``max_steps``) episodes that are not branches, in canonical order
        (:meth:`uqh.rundir.schema.RunConfig.episode_sort_key`): the prefixes ``uqh continue`` can continue."""
        return sorted(
            (ep for ep in self.episodes() if ep.stop_reason == StopReason.max_steps and ep.source_episode_id is None),
            key=self.manifest.config.episode_sort_key(),
        )

    def sidecar(self) -> Iterator[LogprobRow]:
        """Sidecar rows in file order, torn-line safe, the first row of each (episode_id, t, attempt) kept."""
        self.duplicate_sidecar_rows = 0
        context: dict = {OUT_OF_RANGE: []}
        for row, repeat in _first_rows(self.path / SIDECAR_FILE, context):
            if repeat:
                self.duplicate_sidecar_rows += 1
            else:
                yield row
        self.out_of_range_sidecar_values = context[OUT_OF_RANGE]  # once the whole file was read

    @property
    def has_user_sidecar(self) -> bool:
        """Whether the run recorded the simulated user's tokens (``uqh run --user-logprobs``: the config says so and
        ``user_logprobs.jsonl`` exists)."""
        return self.manifest.config.user_logprobs is not None and (self.path / USER_SIDECAR_FILE).is_file()

    def user_sidecar(self) -> Iterator[LogprobRow]:
        """The simulated user's rows (``user_logprobs.jsonl``; none without one), read as :meth:`sidecar` reads the
        agent's: torn-line safe, the first row of each (episode_id, t, attempt) kept, rows of episodes without an
        episode line (a crash before the episode was written) left out."""
        self.duplicate_user_sidecar_rows = 0
        finished = {ep.episode_id for ep in self.episodes()}
        for row, repeat in _first_rows(self.path / USER_SIDECAR_FILE):
            if repeat:
                self.duplicate_user_sidecar_rows += 1
            elif row.episode_id in finished:
                yield row

    # ------------------------------------------------------------------ one episode at a time (uqh view)

    def line_index(self, name: str) -> LineIndex:
        """The :class:`~uqh.rundir.line_index.LineIndex` of ``episodes.jsonl``, ``logprobs.jsonl`` or
        ``user_logprobs.jsonl``: built on the first call, cached on this object, and refreshed (only the appended
        bytes read) on every call."""
        if name not in (EPISODES_FILE, SIDECAR_FILE, USER_SIDECAR_FILE):
            raise ValueError(f"no line index for {name!r}")
        with self._index_lock:
            index = self._indexes.get(name)
            if index is None:
                index = self._indexes[name] = LineIndex(
                    self.path / name, head=episode_head if (name == EPISODES_FILE and self.index_heads) else None)
        index.refresh()
        return index

    def episode_index(self) -> LineIndex:
        """The index of ``episodes.jsonl``; its ``heads`` hold each finished episode's
        :class:`~uqh.rundir.line_index.EpisodeHead` (stop reason, outcome, steps, cost) without a record parse."""
        return self.line_index(EPISODES_FILE)

    def is_being_written(self) -> bool:
        """Whether a writer on this host holds the directory now: the pid its lock file records is alive. Reads
        the lock file only (never takes the lock, so a writer starting now is never refused); a writer on another
        host, or a pid reused after a crash, is not told apart."""
        try:
            info = json.loads((self.path / LOCK_FILE).read_text() or "{}")
            pid = int(info["pid"]) if isinstance(info, dict) and info.get("host") == socket.gethostname() else 0
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def sidecar_index(self) -> LineIndex:
        return self.line_index(SIDECAR_FILE)

    def episode(self, episode_id: str, *, refresh: bool = True) -> Episode | None:
        """The finished episode ``episode_id`` (its first line, as :meth:`episodes` keeps), read at its indexed
        offset; None when it has not finished. ``refresh=False`` uses the index as it is (a caller walking many
        ids refreshes once)."""
        index = self.episode_index() if refresh else self._indexes.get(EPISODES_FILE) or self.episode_index()
        lines = index.read_lines(episode_id)
        if not lines:
            return None
        lineno, raw = lines[0]
        return _parse(index.path, lineno, raw, Episode)

    def episode_sidecar_rows(self, episode_id: str) -> list[LogprobRow]:
        """The sidecar rows of ``episode_id`` in file order, the first of each (t, attempt) kept, read through the
        sidecar index (never a scan of the whole sidecar)."""
        return self._episode_rows(self.sidecar_index(), episode_id)

    def episode_user_sidecar_rows(self, episode_id: str) -> list[LogprobRow]:
        """The simulated user's rows of ``episode_id`` (:meth:`episode_sidecar_rows` of ``user_logprobs.jsonl``);
        none when the run did not record the user's tokens."""
        if not self.has_user_sidecar:
            return []
        return self._episode_rows(self.line_index(USER_SIDECAR_FILE), episode_id)

    @staticmethod
    def _episode_rows(index: LineIndex, episode_id: str) -> list[LogprobRow]:
        seen: set[tuple[int, int]] = set()
        out = []
        for lineno, raw in index.read_lines(episode_id):
            row = _parse(index.path, lineno, raw, LogprobRow)
            if (row.t, row.attempt) not in seen:
                seen.add((row.t, row.attempt))
                out.append(row)
        return out

    def last_accepted_row(self, episode_id: str, t: int) -> LogprobRow | None:
        """The accepted sidecar row of step ``t`` of ``episode_id`` (the first one in file order, as
        :meth:`episode_sidecar_rows` keeps), parsing only rows of that step, from the episode's last row back."""
        index = self.sidecar_index()
        found = None
        for lineno, raw in reversed(index.read_lines(episode_id)):
            if f'"t":{t},'.encode() not in raw[: 2 * len(episode_id) + 80]:  # key order: t after episode_id
                continue
            row = _parse(index.path, lineno, raw, LogprobRow)
            if row.t == t and row.accepted:
                found = row
        return found

    def episode_ids_in_file(self) -> list[str]:
        """Every complete episode line's id in file order, duplicates included (fast: no record parsing)."""
        path = self.path / EPISODES_FILE
        ids = []
        for lineno, raw in complete_lines(path):
            try:
                ids.append(line_episode_id(raw))
            except (ValueError, KeyError, TypeError) as exc:
                raise UserError(f"{path}:{lineno}: not a valid Episode record ({first_line(exc)})") from None
        return ids

    def checkpoints(self) -> tuple[dict[str, PartialEpisode], list[str]]:
        """In-flight episodes by id, and a note per checkpoint file that could not be read (never fatal: a
        checkpoint only saves work)."""
        out: dict[str, PartialEpisode] = {}
        notes: list[str] = []
        d = self.path / CHECKPOINT_DIR
        if not d.is_dir():
            return out, notes
        for p in sorted(d.glob("*.json")):
            try:
                partial = PartialEpisode.model_validate_json(p.read_bytes())
            except (OSError, ValueError) as exc:
                notes.append(f"ignored unreadable checkpoint {p.name}: {first_line(exc)}")
                continue
            out[partial.episode_id] = partial
        return out, notes

    def live_checkpoints(self) -> tuple[dict[str, PartialEpisode], list[str]]:
        """:meth:`checkpoints` for a reader that polls a running run: a checkpoint file is parsed again only when its
        size or mtime changed since the last call on this object, and one that vanished between listing and reading
        (its episode just finished) is left out without a note."""
        out: dict[str, PartialEpisode] = {}
        notes: list[str] = []
        d = self.path / CHECKPOINT_DIR
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
        except (FileNotFoundError, NotADirectoryError):
            names = []
        cache: dict[str, tuple[tuple[int, int], PartialEpisode]] = {}
        for name in names:
            try:
                st = os.stat(d / name)
                stamp = (st.st_size, st.st_mtime_ns)
                known = self._checkpoint_cache.get(name)
                partial = known[1] if known and known[0] == stamp else PartialEpisode.model_validate_json(
                    (d / name).read_bytes())
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                notes.append(f"ignored unreadable checkpoint {name}: {first_line(exc)}")
                continue
            cache[name] = (stamp, partial)
            out[partial.episode_id] = partial
        self._checkpoint_cache = cache
        return out, notes

    def skipped_prefixes(self) -> list[SkippedPrefix]:
        """A continuation run's prefixes that failed the replay check (empty for other runs)."""
        return list(read_jsonl(self.path / SKIPPED_FILE, SkippedPrefix))

    def skipped_samples(self) -> list[SkippedSample]:
        """The planned samples sequential sampling did not draw (``uqh run --stop-on-consensus``; empty for other
        runs), the first line of each episode_id kept."""
        seen: dict[str, SkippedSample] = {}
        for rec in read_jsonl(self.path / SKIPPED_SAMPLES_FILE, SkippedSample):
            seen.setdefault(rec.episode_id, rec)
        return list(seen.values())

    def stop_decisions(self) -> dict[str, StopDecision]:
        """A sequential continuation run's per-prefix stop decisions by episode id (empty for a fixed design or
        another run)."""
        return {d.episode_id: d for d in read_jsonl(self.path / STOP_FILE, StopDecision)}

    # ------------------------------------------------------------------ integrity (the writer, uqh repair)

    def complete_length(self, name: str) -> int:
        """Bytes of ``name`` up to and including its last newline (the rest is a torn line)."""
        return integrity.complete_length(self.path / name)

    def scan_for_writer(self) -> integrity.WriterScan:
        """What the writer must know before it appends (:func:`uqh.rundir.integrity.scan_for_writer`); UserError,
        naming file and line, when a line is not a record."""
        return integrity.scan_for_writer(self.path)

    def episodes_missing_sidecar_rows(self) -> dict[str, int]:
        """Finished episode id -> how many of its own model calls have no sidecar row (a sidecar cut from
        outside: such episodes' logprob predictors are missing)."""
        return integrity.scan_for_writer(self.path, strict=False).missing_rows

    def invalid_lines(self, name: str) -> list[integrity.BadLine]:
        """Complete lines of ``name`` (episodes or sidecar file) that are not valid records."""
        return integrity.invalid_lines(self.path, name)

    def partition(self, name: str, bad: list[integrity.BadLine]) -> tuple[bytes, bytes]:
        """(the bytes of ``name`` without the ``bad`` lines, the bad lines' bytes)."""
        return integrity.partition(self.path, name, bad)

    def valid_episode_ids(self, invalid: set[int] = frozenset()) -> set[str]:
        """Ids of the complete episode lines, those numbered in ``invalid`` left out."""
        return integrity.episode_ids(self.path, invalid)

    def stray_sidecar_rows(self, finished: set[str], skip: set[int] = frozenset(),
                           name: str = SIDECAR_FILE) -> list[integrity.BadLine]:
        """Lines of the sidecar ``name`` (not numbered in ``skip``) of episodes not in ``finished``."""
        return integrity.stray_sidecar_rows(self.path, finished, skip, name)
