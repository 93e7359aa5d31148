"""The run directory on disk: the only writer of manifest, episodes, sidecar and checkpoints.

Crash safety
- ``episodes.jsonl`` and ``logprobs.jsonl`` are append-only. A finished episode is written as its sidecar rows
  first, then its episode line; each append is one ``write`` + ``flush`` + ``os.fsync``. An episode is therefore
  finished iff its episode line is complete.
- On open for writing, a torn last line (crash mid-write) is truncated away, and sidecar rows at the end of the
  sidecar that belong to no finished episode (crash between the two appends) are removed, so a resumed episode
  never has duplicated rows. Both repairs are recorded in :attr:`RunStore.notes` and logged.
- ``manifest.json`` and checkpoints are written atomically (temp file + ``os.replace``).
- Checkpoints (``checkpoints/<episode_id>.json``) hold an in-flight episode after its last completed step, with
  the sidecar rows of its calls so far; they are deleted once the episode is written.
"""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from harness.errors import UserError
from harness.loop import PartialEpisode
from harness.schema import (
    CHECKPOINT_DIR,
    EPISODES_FILE,
    MANIFEST_FILE,
    SCHEMA_VERSION,
    SIDECAR_FILE,
    Episode,
    LogprobRow,
    Manifest,
    RunConfig,
)

log = logging.getLogger(__name__)

_ID_PREFIX = re.compile(rb'^\{"schema_version":\d+,"episode_id":("(?:[^"\\]|\\.)*")')


def atomic_write_text(path: Path, text: str, *, fsync: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory + ``os.replace``)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def line_episode_id(line: bytes) -> str:
    """The ``episode_id`` of one JSONL line of an Episode or LogprobRow (fast path on the fixed key order)."""
    m = _ID_PREFIX.match(line)
    if m:
        return json.loads(m.group(1))
    return json.loads(line)["episode_id"]


def config_differences(old: RunConfig, new: RunConfig) -> list[str]:
    """Dotted names of the config fields that differ (nested one level into dicts)."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    diffs = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs.extend(f"{key}.{k}" for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k))
        else:
            diffs.append(key)
    return diffs


def check_out_dir(run_dir: Path) -> None:
    """Raise UserError unless ``run_dir`` can hold a run (new, empty, or an existing run). Writes nothing."""
    run_dir = Path(run_dir)
    if run_dir.exists():
        if not run_dir.is_dir():
            raise UserError(f"--out {run_dir} exists and is not a directory; choose a new directory")
        if not os.access(run_dir, os.R_OK | os.W_OK | os.X_OK):
            raise UserError(f"--out {run_dir} is not readable and writable; choose another directory")
        if not (run_dir / MANIFEST_FILE).exists() and any(run_dir.iterdir()):
            raise UserError(
                f"--out {run_dir} is a non-empty directory that is not a run directory; choose a new directory"
            )
        if (run_dir / MANIFEST_FILE).exists():
            for name in (EPISODES_FILE, SIDECAR_FILE):
                p = run_dir / name
                if p.exists() and not os.access(p, os.R_OK | os.W_OK):
                    raise UserError(f"{p} is not readable and writable; fix its permissions or use a new --out")
        return
    ancestor = run_dir.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"cannot create --out {run_dir}: {ancestor} is not writable; choose another directory")


def _read_manifest_checked(run_dir: Path) -> Manifest:
    path = Path(run_dir) / MANIFEST_FILE
    if not path.exists():
        raise UserError(f"{run_dir} is not a run directory (no {MANIFEST_FILE})")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {str(exc).splitlines()[0]}; use a new --out directory") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != SCHEMA_VERSION:
        raise UserError(
            f"{run_dir} was written with schema_version {version}, this harness writes {SCHEMA_VERSION}; "
            "use a new --out directory"
        )
    try:
        return Manifest.model_validate(raw)
    except ValueError as exc:
        raise UserError(f"{path} is not a valid manifest ({str(exc).splitlines()[0]}); use a new --out") from None


def check_resumable(run_dir: Path, config: RunConfig) -> Manifest:
    """Raise UserError (writing nothing) unless ``run_dir`` holds a run with exactly this config."""
    manifest = _read_manifest_checked(run_dir)
    if manifest.config_hash != config.config_hash():
        diffs = config_differences(manifest.config, config) or ["(hash only)"]
        raise UserError(
            f"{run_dir} holds a run with a different config (differs in: {', '.join(diffs)}); "
            "re-run with the original settings to resume, or use a new --out directory"
        )
    return manifest


class RunStore:
    """A run directory opened for writing (single writer)."""

    def __init__(self, run_dir: Path, manifest: Manifest, *, notes: list[str] | None = None):
        self.run_dir = Path(run_dir)
        self.manifest = manifest
        self.notes: list[str] = list(notes or [])
        self.finished_ids: set[str] = set()
        self._episodes_f = None
        self._sidecar_f = None

    # ------------------------------------------------------------------ open / create

    @classmethod
    def open_or_create(
        cls, run_dir: Path, config: RunConfig, *, system_prompt: str, info: dict[str, Any] | None = None
    ) -> "RunStore":
        """Create a new run directory, or open an existing one for resume (the config hash must match)."""
        run_dir = Path(run_dir)
        check_out_dir(run_dir)
        if (run_dir / MANIFEST_FILE).exists():
            check_resumable(run_dir, config)
            return cls.open(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        manifest = Manifest(
            config=config,
            config_hash=config.config_hash(),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            system_prompt=system_prompt,
            info=dict(info or {}),
        )
        atomic_write_text(run_dir / MANIFEST_FILE, manifest.model_dump_json(indent=2) + "\n")
        store = cls(run_dir, manifest)
        store._open_files()
        return store

    @classmethod
    def open(cls, run_dir: Path) -> "RunStore":
        """Open an existing run directory for appending: repair torn lines and orphaned sidecar rows."""
        run_dir = Path(run_dir)
        manifest = _read_manifest_checked(run_dir)
        store = cls(run_dir, manifest)
        store._repair()
        store._open_files()
        return store

    def _open_files(self) -> None:
        self._episodes_f = open(self.run_dir / EPISODES_FILE, "ab")
        self._sidecar_f = open(self.run_dir / SIDECAR_FILE, "ab")

    def _note(self, msg: str) -> None:
        self.notes.append(msg)
        log.warning("%s: %s", self.run_dir, msg)

    def _repair(self) -> None:
        for name in (EPISODES_FILE, SIDECAR_FILE):
            cut = _truncate_torn_tail(self.run_dir / name)
            if cut:
                self._note(f"{name}: removed a torn last line ({cut} bytes) left by an interrupted write")
        ids: list[str] = []
        path = self.run_dir / EPISODES_FILE
        if path.exists():
            with path.open("rb") as f:
                for line in f:
                    if line.strip():
                        ids.append(line_episode_id(line))
        self.finished_ids = set(ids)
        if len(ids) != len(self.finished_ids):
            self._note(
                f"{EPISODES_FILE}: {len(ids) - len(self.finished_ids)} duplicate episode lines "
                "(readers keep the first of each id)"
            )
        removed = _truncate_orphan_sidecar_tail(self.run_dir / SIDECAR_FILE, self.finished_ids)
        if removed:
            self._note(f"{SIDECAR_FILE}: removed {removed} rows of an episode that was not finished")

    # ------------------------------------------------------------------ writing

    def append_episode(self, episode: Episode, sidecar: Iterable[LogprobRow]) -> None:
        """Write one finished episode: sidecar rows first, then the episode line (each append fsynced)."""
        rows = b"".join(r.model_dump_json().encode() + b"\n" for r in sidecar)
        self.append_serialized(episode.episode_id, episode.model_dump_json().encode() + b"\n", rows)

    def append_serialized(self, episode_id: str, episode_line: bytes, sidecar_bytes: bytes) -> None:
        """As :meth:`append_episode` for already serialized records (newline-terminated JSON lines)."""
        if episode_id in self.finished_ids:
            raise ValueError(f"episode {episode_id} is already in {EPISODES_FILE}")
        if sidecar_bytes:
            _append(self._sidecar_f, sidecar_bytes)
        _append(self._episodes_f, episode_line)
        self.finished_ids.add(episode_id)
        self.delete_checkpoint(episode_id)

    def update_manifest_info(self, **info: Any) -> None:
        self.manifest.info.update(info)
        atomic_write_text(self.run_dir / MANIFEST_FILE, self.manifest.model_dump_json(indent=2) + "\n")

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_path(self, episode_id: str) -> Path:
        return checkpoint_path(self.run_dir, episode_id)

    def write_checkpoint(self, partial: PartialEpisode) -> None:
        write_checkpoint(self.run_dir, partial)

    def delete_checkpoint(self, episode_id: str) -> None:
        try:
            os.unlink(self.checkpoint_path(episode_id))
        except FileNotFoundError:
            pass

    def load_checkpoints(self) -> dict[str, PartialEpisode]:
        """In-flight episodes by id (unreadable checkpoints are noted and ignored; finished ones deleted)."""
        out: dict[str, PartialEpisode] = {}
        d = self.run_dir / CHECKPOINT_DIR
        if not d.is_dir():
            return out
        for p in sorted(d.glob("*.json")):
            try:
                partial = PartialEpisode.model_validate_json(p.read_bytes())
            except (OSError, ValueError) as exc:
                self._note(f"ignored unreadable checkpoint {p.name}: {str(exc).splitlines()[0]}")
                continue
            if partial.episode_id in self.finished_ids:
                p.unlink(missing_ok=True)
                continue
            out[partial.episode_id] = partial
        return out

    def close(self) -> None:
        for f in (self._episodes_f, self._sidecar_f):
            if f is not None:
                f.close()
        self._episodes_f = self._sidecar_f = None

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def checkpoint_path(run_dir: Path, episode_id: str) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / (urllib.parse.quote(episode_id, safe="") + ".json")


class CheckpointEncoder:
    """Serializes successive checkpoints of in-flight episodes without re-serializing earlier steps.

    Steps and sidecar rows only ever grow, so each is dumped once and the checkpoint JSON is assembled from the
    cached pieces (the sidecar rows with their top-k logprobs dominate the size).
    """

    _HEAD = tuple(f for f in PartialEpisode.model_fields if f not in ("steps", "sidecar"))

    def __init__(self) -> None:
        self._cache: dict[str, tuple[list[str], list[str]]] = {}

    def dumps(self, partial: PartialEpisode) -> str:
        steps_j, rows_j = self._cache.setdefault(partial.episode_id, ([], []))
        if len(steps_j) > len(partial.steps) or len(rows_j) > len(partial.sidecar):  # not a continuation: reset
            steps_j.clear()
            rows_j.clear()
        steps_j.extend(st.model_dump_json() for st in partial.steps[len(steps_j) :])
        rows_j.extend(r.model_dump_json() for r in partial.sidecar[len(rows_j) :])
        head = json.dumps({k: getattr(partial, k) for k in self._HEAD}, separators=(",", ":"))
        return f'{head[:-1]},"steps":[{",".join(steps_j)}],"sidecar":[{",".join(rows_j)}]}}'

    def cached_rows(self, episode_id: str) -> list[str]:
        """The JSON of the sidecar rows serialized so far for this episode (in order)."""
        entry = self._cache.get(episode_id)
        return list(entry[1]) if entry else []

    def forget(self, episode_id: str) -> None:
        self._cache.pop(episode_id, None)


def write_checkpoint(run_dir: Path, partial: PartialEpisode) -> None:
    """Atomic (temp + replace) but not fsynced: it must survive a killed process, not a power cut."""
    write_checkpoint_json(run_dir, partial.episode_id, partial.model_dump_json())


def write_checkpoint_json(run_dir: Path, episode_id: str, data: str) -> None:
    path = checkpoint_path(run_dir, episode_id)
    try:
        atomic_write_text(path, data, fsync=False)
    except FileNotFoundError:
        path.parent.mkdir(exist_ok=True)
        atomic_write_text(path, data, fsync=False)


def _append(f, data: bytes) -> None:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _truncate_torn_tail(path: Path) -> int:
    """Truncate a file to its last newline; return the number of bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as f:
        pos = size
        block = 1 << 16
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        else:
            keep = 0
        if keep < size:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        return size - keep


def _reverse_lines(f, size: int, block: int = 1 << 16):
    """Yield (offset, line without newline) from the end of a newline-terminated file backwards."""
    pos = size
    buf = b""  # the bytes [pos, pos + len(buf)) not yet yielded; ends with b"\n"
    while True:
        if not buf:
            if pos == 0:
                return
        i = buf.rfind(b"\n", 0, max(0, len(buf) - 1))
        if i >= 0:
            yield pos + i + 1, buf[i + 1 : -1]
            buf = buf[: i + 1]
            continue
        if pos == 0:
            yield 0, buf[:-1] if buf.endswith(b"\n") else buf
            return
        start = max(0, pos - block)
        f.seek(start)
        buf = f.read(pos - start) + buf
        pos = start


def _truncate_orphan_sidecar_tail(path: Path, finished: set[str]) -> int:
    """Remove trailing sidecar rows whose episode is not finished; return how many rows were removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    removed = 0
    keep = size
    with path.open("rb+") as f:
        for offset, line in _reverse_lines(f, size):
            if not line.strip():
                keep = offset
                continue
            if line_episode_id(line) in finished:
                break
            removed += 1
            keep = offset
        if keep < size:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return removed


def load_episodes(run_dir: Path) -> list[Episode]:
    """Finished episodes, de-duplicated by id (first kept) with a warning if duplicates exist."""
    from harness.schema import read_episodes

    seen: set[str] = set()
    out: list[Episode] = []
    dups = 0
    for ep in read_episodes(Path(run_dir)):
        if ep.episode_id in seen:
            dups += 1
            continue
        seen.add(ep.episode_id)
        out.append(ep)
    if dups:
        log.warning("%s: ignored %d duplicate episode lines", run_dir, dups)
    return out
