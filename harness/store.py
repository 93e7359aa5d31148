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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from rundir.atomic import atomic_write_text
from rundir.errors import UserError
from rundir.reader import RunDir, checkpoint_path
from rundir.schema import (
    EPISODES_FILE,
    MANIFEST_FILE,
    SIDECAR_FILE,
    Episode,
    LogprobRow,
    Manifest,
    PartialEpisode,
    RunConfig,
    config_differences,
)

log = logging.getLogger(__name__)

__all__ = ["RunStore", "CheckpointEncoder", "check_out_dir", "check_resumable", "write_checkpoint_json",
           "atomic_write_text", "checkpoint_path"]


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


def check_resumable(run_dir: Path, config: RunConfig) -> Manifest:
    """Raise UserError (writing nothing) unless ``run_dir`` holds a run with exactly this config."""
    manifest = RunDir.open(run_dir).manifest
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
        reader = RunDir.open(run_dir)
        store = cls(reader.path, reader.manifest)
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
        reader = RunDir(self.run_dir, self.manifest)
        for name in (EPISODES_FILE, SIDECAR_FILE):
            cut = _truncate(self.run_dir / name, reader.complete_length(name))
            if cut:
                self._note(f"{name}: removed a torn last line ({cut} bytes) left by an interrupted write")
        ids = reader.episode_ids_in_file()
        self.finished_ids = set(ids)
        if len(ids) != len(self.finished_ids):
            self._note(
                f"{EPISODES_FILE}: {len(ids) - len(self.finished_ids)} duplicate episode lines "
                "(readers keep the first of each id)"
            )
        keep, removed = reader.orphan_sidecar_tail(self.finished_ids)
        if removed:
            _truncate(self.run_dir / SIDECAR_FILE, keep)
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
        saved, notes = RunDir(self.run_dir, self.manifest).checkpoints()
        for note in notes:
            self._note(note)
        out: dict[str, PartialEpisode] = {}
        for eid, partial in saved.items():
            if eid in self.finished_ids:
                self.delete_checkpoint(eid)
                continue
            out[eid] = partial
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


def _truncate(path: Path, keep: int) -> int:
    """Truncate ``path`` to ``keep`` bytes (fsynced); return the number of bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if keep >= size:
        return 0
    with path.open("rb+") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep
