"""The run directory on disk: the only writer of manifest, episodes, sidecar and checkpoints.

One writer
- The store holds the directory's writer lock (:mod:`uqh.harness.store.lock`: ``flock`` on ``writer.lock``) from before
  its first write until it is closed; a second writer is refused with one line naming the holder.

Crash safety
- ``episodes.jsonl``, ``logprobs.jsonl`` and (runs with ``--user-logprobs``) ``user_logprobs.jsonl`` are
  append-only. A finished episode is written as its sidecar rows first, then its user-sidecar rows, then its episode
  line; each append is ``write`` (all bytes, unbuffered) + ``os.fsync``. An episode is therefore finished iff its
  episode line is complete. The user sidecar is repaired on open as the agent's is (torn tail, rows of an
  unfinished episode at the end); it has no "missing rows" check (an episode's user turns are not in its record).
- On open for writing, both files are first checked without touching them (:meth:`rundir.RunDir.scan_for_writer`):
  a line that is not a record is a UserError naming file and line (``uqh repair`` moves such lines aside). Then a
  torn last line (crash mid-write) is truncated away, and sidecar rows at the end that belong to no finished
  episode (crash between the two appends) are removed, so a resumed episode never has duplicated rows. Both
  repairs are recorded in :attr:`RunStore.notes`, as are finished episodes whose sidecar rows are missing (a
  sidecar cut from outside: their logprob predictors will be missing).
- ``manifest.json`` and checkpoints are written atomically (temp file + ``os.replace``).
- Checkpoints (``checkpoints/<episode_id>.json``) hold an in-flight episode after its last completed step, with
  the sidecar rows of its calls so far; they are deleted once the episode is written.

Write failures (disk full, read-only file system, I/O errors) raise :class:`uqh.rundir.errors.RunDirWriteError`. A
failed append is cut back to where it started (``ftruncate`` needs no free space) and the store refuses further
appends, so the files stay a valid run that resumes once the cause is fixed; a directory this store created but
could not give a manifest is removed again.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

from uqh.harness.store import lock as run_lock
from uqh.rundir.atomic import atomic_write_text, check_creatable
from uqh.rundir.errors import RunDirWriteError, UserError
from uqh.rundir.output_dir import enclosing_run_dir
from uqh.rundir.reader import RunDir, checkpoint_path
from uqh.rundir.schema import (
    ENDPOINT_FIELDS,
    EPISODES_FILE,
    LOCK_FILE,
    MANIFEST_FILE,
    SIDECAR_FILE,
    SKIPPED_SAMPLES_FILE,
    USER_SIDECAR_FILE,
    Episode,
    ExecutionSettings,
    LogprobRow,
    Manifest,
    PartialEpisode,
    RunConfig,
    SkippedSample,
    config_differences,
)

log = logging.getLogger(__name__)

__all__ = ["RunStore", "CheckpointEncoder", "SidecarBytes", "check_out_dir", "check_resumable",
           "write_checkpoint_json", "atomic_write_text", "checkpoint_path"]


class SidecarBytes(NamedTuple):
    """A finished episode's serialized rows for both sidecars (newline-terminated JSON lines)."""

    agent: bytes
    user: bytes = b""


def check_out_dir(run_dir: Path) -> None:
    """Raise UserError unless ``run_dir`` can hold a run (new, empty, or an existing run that no other process is
    writing), and not inside another run directory (only that run's writer adds files there). Writes nothing."""
    run_dir = Path(run_dir)
    inside = enclosing_run_dir(run_dir.parent)
    if inside is not None:
        raise UserError(f"--out {run_dir} is inside the run directory {inside}; choose a directory outside it")
    if run_dir.exists():
        if not run_dir.is_dir():
            raise UserError(f"--out {run_dir} exists and is not a directory; choose a new directory")
        if not os.access(run_dir, os.R_OK | os.W_OK | os.X_OK):
            raise UserError(f"--out {run_dir} is not readable and writable; choose another directory")
        run_lock.check_not_held(run_dir)
        if not (run_dir / MANIFEST_FILE).exists() and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
            raise UserError(
                f"--out {run_dir} is a non-empty directory that is not a run directory; choose a new directory"
            )
        if (run_dir / MANIFEST_FILE).exists():
            for name in (EPISODES_FILE, SIDECAR_FILE, USER_SIDECAR_FILE):
                p = run_dir / name
                if p.exists() and not os.access(p, os.R_OK | os.W_OK):
                    raise UserError(f"{p} is not readable and writable; fix its permissions or use a new --out")
        return
    check_creatable(run_dir)


def check_resumable(run_dir: Path, config: RunConfig) -> Manifest:
    """Raise UserError (writing nothing) unless ``run_dir`` holds a run with exactly this config."""
    manifest = RunDir.open(run_dir).manifest
    if manifest.config.config_hash() != config.config_hash():  # endpoints are not compared: they may move
        diffs = config_differences(manifest.config, config, ignore=ENDPOINT_FIELDS) or ["(hash only)"]
        raise UserError(
            f"{run_dir} holds a run with a different config (differs in: {', '.join(diffs)}); "
            "re-run with the original settings to resume, or use a new --out directory"
        )
    return manifest


class RunStore:
    """A run directory opened for writing (the single writer: it holds the directory's lock until closed)."""

    def __init__(self, run_dir: Path, manifest: Manifest, *, notes: list[str] | None = None):
        self.run_dir = Path(run_dir)
        self.manifest = manifest
        self.notes: list[str] = list(notes or [])
        self.finished_ids: set[str] = set()
        #: Stop reason of each episode finished before this session (for the whole-run summary).
        self.finished_stop_reasons: dict[str, str] = {}
        #: Finished episodes whose own calls lack sidecar rows (id -> rows missing), found on open.
        self.missing_sidecar_rows: dict[str, int] = {}
        self._fds: dict[str, int] = {}
        self._lock: contextlib.ExitStack | None = None
        self._failed: RunDirWriteError | None = None

    # ------------------------------------------------------------------ open / create

    @classmethod
    def open_or_create(
        cls, run_dir: Path, config: RunConfig, *, system_prompt: str, info: dict[str, Any] | None = None,
        execution: ExecutionSettings | None = None,
    ) -> "RunStore":
        """Create a new run directory, or open an existing one for resume (the config hash must match).

        ``execution``: the settings of this session that are not part of the config, recorded in a new manifest
        (a resume records its own with :meth:`record_execution` once it has episodes to run)."""
        run_dir = Path(run_dir)
        check_out_dir(run_dir)
        if (run_dir / MANIFEST_FILE).exists():
            check_resumable(run_dir, config)
            return cls.open(run_dir)
        created = _missing_dirs(run_dir)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirWriteError(run_dir, exc) from None
        try:
            lock = _take_lock(run_dir)
        except RunDirWriteError:  # e.g. a full disk: not even the lock file's few bytes fit
            _remove_created(run_dir, created)
            raise
        try:
            if (run_dir / MANIFEST_FILE).exists():  # another writer made it between our check and our lock
                lock.close()
                return cls.open_or_create(run_dir, config, system_prompt=system_prompt, info=info,
                                          execution=execution)
            manifest = Manifest(
                config=config,
                config_hash=config.config_hash(),
                created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                system_prompt=system_prompt,
                info=dict(info or {}),
                execution=execution,
            )
            try:
                atomic_write_text(run_dir / MANIFEST_FILE, manifest.model_dump_json(indent=2) + "\n")
            except OSError as exc:
                _remove_created(run_dir, created)
                raise RunDirWriteError(run_dir, exc) from None
            store = cls(run_dir, manifest)
            store._lock = lock
            store._open_files()
        except BaseException:
            lock.close()
            raise
        return store

    @classmethod
    def open(cls, run_dir: Path) -> "RunStore":
        """Open an existing run directory for appending: take the lock, check the files (UserError, nothing
        touched, for a line that is not a record), then repair torn lines and orphaned sidecar rows."""
        reader = RunDir.open(run_dir)
        lock = _take_lock(reader.path)
        try:
            store = cls(reader.path, RunDir.open(reader.path).manifest)  # re-read under the lock
            store._lock = lock
            store._repair()
            store._open_files()
        except BaseException:
            lock.close()
            raise
        return store

    def _open_files(self) -> None:
        names = [EPISODES_FILE, SIDECAR_FILE]
        if self.manifest.config.user_logprobs is not None:  # only such runs have the file (scoring tells by it)
            names.append(USER_SIDECAR_FILE)
        try:
            for name in names:
                self._fds[name] = os.open(self.run_dir / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                          0o644)
        except OSError as exc:
            self._close_files()
            raise RunDirWriteError(self.run_dir, exc) from None

    def _note(self, msg: str) -> None:
        self.notes.append(msg)
        log.warning("%s: %s", self.run_dir, msg)

    def _repair(self) -> None:
        scan = RunDir(self.run_dir, self.manifest).scan_for_writer()  # raises before anything is touched
        try:
            for name in (EPISODES_FILE, SIDECAR_FILE, USER_SIDECAR_FILE):
                cut = truncate_to(self.run_dir / name, scan.complete_length[name])
                if cut:
                    self._note(f"{name}: removed a torn last line ({cut} bytes) left by an interrupted write")
            for name, offset, rows in ((SIDECAR_FILE, scan.orphan_tail_offset, scan.orphan_tail_rows),
                                       (USER_SIDECAR_FILE, scan.user_orphan_tail_offset, scan.user_orphan_tail_rows)):
                if rows:
                    truncate_to(self.run_dir / name, offset)
                    self._note(f"{name}: removed {rows} rows of an episode that was not finished")
        except OSError as exc:
            raise RunDirWriteError(self.run_dir, exc) from None
        ids = scan.episode_ids
        self.finished_ids = set(ids)
        self.finished_stop_reasons = dict(scan.stop_reasons)
        if len(ids) != len(self.finished_ids):
            self._note(
                f"{EPISODES_FILE}: {len(ids) - len(self.finished_ids)} duplicate episode lines "
                "(readers keep the first of each id)"
            )
        self.missing_sidecar_rows = dict(scan.missing_rows)
        if scan.missing_rows:
            n_rows = sum(scan.missing_rows.values())
            self._note(
                f"{SIDECAR_FILE}: {len(scan.missing_rows)} finished episodes miss {n_rows} sidecar rows (was the "
                "file cut outside uqh?); their logprob predictors are missing when scored"
            )

    # ------------------------------------------------------------------ writing

    def append_episode(self, episode: Episode, sidecar: Iterable[LogprobRow],
                       user_sidecar: Iterable[LogprobRow] = ()) -> None:
        """Write one finished episode: sidecar rows first, then user-sidecar rows, then the episode line (each
        append fsynced)."""
        rows = SidecarBytes(b"".join(r.model_dump_json().encode() + b"\n" for r in sidecar),
                            b"".join(r.model_dump_json().encode() + b"\n" for r in user_sidecar))
        self.append_serialized(episode.episode_id, episode.model_dump_json().encode() + b"\n", rows)

    def append_serialized(self, episode_id: str, episode_line: bytes, sidecar_bytes: bytes | SidecarBytes) -> None:
        """As :meth:`append_episode` for already serialized records (newline-terminated JSON lines); plain bytes
        are the agent sidecar's rows only.

        On a write failure both files are cut back to where this append started and RunDirWriteError is
        raised; every later append raises it again (the run must stop: nothing more can be written safely)."""
        if episode_id in self.finished_ids:
            raise ValueError(f"episode {episode_id} is already in {EPISODES_FILE}")
        if self._failed is not None:
            raise self._failed
        rows = sidecar_bytes if isinstance(sidecar_bytes, SidecarBytes) else SidecarBytes(sidecar_bytes)
        if rows.user and USER_SIDECAR_FILE not in self._fds:
            raise ValueError(f"user-sidecar rows for {episode_id}, but the run does not record the user's logprobs")
        ep_fd, sc_fd = self._fds[EPISODES_FILE], self._fds[SIDECAR_FILE]
        user_fd = self._fds.get(USER_SIDECAR_FILE)
        sizes = {fd: os.fstat(fd).st_size for fd in (ep_fd, sc_fd, user_fd) if fd is not None}
        try:
            if rows.agent:
                append_fsync(sc_fd, rows.agent)
            if rows.user:
                append_fsync(user_fd, rows.user)
            append_fsync(ep_fd, episode_line)
        except OSError as exc:
            for fd, size in sizes.items():
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
            self._failed = RunDirWriteError(self.run_dir, exc)
            raise self._failed from None
        self.finished_ids.add(episode_id)
        self.delete_checkpoint(episode_id)

    def record_execution(self, execution: ExecutionSettings) -> None:
        """Record this session (timeout, retries, endpoints; outside the config hash) in the manifest: as the
        latest and appended to ``sessions``. The config and its hash stay as created: the hash names the run
        (continuations, judgments and q_Z files refer to it), and the config's endpoints are the first session's."""
        manifest = self.manifest
        manifest.execution = execution
        manifest.sessions = [*manifest.sessions, execution]
        self._write_manifest()

    def update_manifest_info(self, **info: Any) -> None:
        self.manifest.info.update(info)
        self._write_manifest()

    def replace_config(self, config: RunConfig, **info: Any) -> None:
        """Record ``config`` (and its hash) as the run's from now on, with ``info``: for a change the caller has
        checked keeps every written episode valid (a continuation grown to more branches)."""
        self.manifest.config, self.manifest.config_hash = config, config.config_hash()
        self.update_manifest_info(**info)

    def _write_manifest(self) -> None:
        try:
            atomic_write_text(self.run_dir / MANIFEST_FILE, self.manifest.model_dump_json(indent=2) + "\n")
        except OSError as exc:
            raise RunDirWriteError(self.run_dir, exc) from None

    # ------------------------------------------------------------------ checkpoints

    def write_skipped_samples(self, records: Sequence[SkippedSample], *, rewrite: bool) -> None:
        """Consensus sampling's decisions: ``rewrite`` replaces ``skipped_samples.jsonl`` with ``records``
        (atomically; nothing when there is no file and no record), else they are appended and fsynced. A failure
        raises :class:`RunDirWriteError` (the batch stops with the resume hint)."""
        path = self.run_dir / SKIPPED_SAMPLES_FILE
        try:
            if rewrite:
                if path.exists() or records:
                    atomic_write_text(path, "".join(r.model_dump_json() + "\n" for r in records))
                return
            data = "".join(r.model_dump_json() + "\n" for r in records).encode()
            if data:
                with open(path, "ab") as f:
                    append_fsync(f.fileno(), data)
        except OSError as exc:
            raise RunDirWriteError(self.run_dir, exc) from None

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

    def _close_files(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)  # unbuffered: nothing is left to flush, so closing cannot fail on a full disk

    def close(self) -> None:
        self._close_files()
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _missing_dirs(run_dir: Path) -> list[Path]:
    """``run_dir`` and those of its ancestors that do not exist yet (deepest first)."""
    out = []
    p = Path(run_dir)
    while not p.exists():
        out.append(p)
        p = p.parent
    return out


def _remove_created(run_dir: Path, created: list[Path]) -> None:
    """Undo the creation of ``run_dir`` after its manifest could not be written (the lock is still held, so the
    directory holds only the lock file): a failed creation leaves nothing behind. ``rmdir`` only: anything else
    found there is left alone."""
    if not created:
        return
    with contextlib.suppress(OSError):
        os.unlink(run_dir / LOCK_FILE)
    for p in created:  # deepest first
        with contextlib.suppress(OSError):
            p.rmdir()


def _take_lock(run_dir: Path) -> contextlib.ExitStack:
    """The writer lock of ``run_dir`` as an ExitStack (closing it releases the lock). A refusal removes nothing:
    the directory may be the holder's."""
    stack = contextlib.ExitStack()
    stack.enter_context(run_lock.hold(run_dir))
    return stack


class CheckpointEncoder:
    """Serializes successive checkpoints of in-flight episodes without re-serializing earlier steps.

    Steps and sidecar rows only ever grow, so each is dumped once and the checkpoint JSON is assembled from the
    cached pieces (the sidecar rows with their top-k logprobs dominate the size).
    """

    _HEAD = tuple(f for f in PartialEpisode.model_fields if f not in ("steps", "sidecar", "user_sidecar"))

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
        user = ",".join(r.model_dump_json() for r in getattr(partial, "user_sidecar", None) or ())
        return f'{head[:-1]},"steps":[{",".join(steps_j)}],"sidecar":[{",".join(rows_j)}],"user_sidecar":[{user}]}}'

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


def append_fsync(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (O_APPEND) and fsync it; OSError on failure."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.fsync(fd)


def truncate_to(path: Path, keep: int) -> int:
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


def write_records_file(run_dir: Path, name: str, records: Sequence[Any]) -> None:
    """Replace the JSONL file ``name`` of a run directory with ``records`` (pydantic models), atomically: the
    prefixes a continuation skipped, a sequential continuation's stop decisions. A failure raises
    :class:`RunDirWriteError`."""
    try:
        atomic_write_text(Path(run_dir) / name, "".join(r.model_dump_json() + "\n" for r in records))
    except OSError as exc:
        raise RunDirWriteError(run_dir, exc) from None


def check_new_dir(run_dir: Path, flag: str = "--out") -> None:
    """Raise UserError unless ``run_dir`` is new (and can be created) or an empty directory: a run written at once
    (:func:`write_imported_run`) never joins or resumes another, nor lies inside one. Writes nothing."""
    run_dir = Path(run_dir)
    inside = enclosing_run_dir(run_dir.parent)
    if inside is not None:
        raise UserError(f"{flag} {run_dir} is inside the run directory {inside}; choose a directory outside it")
    if not run_dir.exists():
        check_creatable(run_dir, flag)
        return
    if not run_dir.is_dir():
        raise UserError(f"{flag} {run_dir} exists and is not a directory; choose a new directory")
    if any(run_dir.iterdir()):
        raise UserError(f"{flag} {run_dir} is not empty; choose a new directory")
    if not os.access(run_dir.parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {flag} {run_dir}: {run_dir.parent} is not writable; choose another directory")


def write_imported_run(
    run_dir: Path, config: RunConfig, *, system_prompt: str, info: dict[str, Any],
    episodes: Sequence[tuple[Episode, Sequence[LogprobRow], Sequence[LogprobRow]]],
) -> None:
    """A whole finished run written at once (``uqh import``): built through a :class:`RunStore` in a hidden
    sibling directory and renamed onto ``run_dir`` (new, or an empty directory) when complete, so a failure on the
    way leaves nothing behind (:class:`RunDirWriteError`) and no reader ever sees half a run.

    ``episodes``: (episode, its sidecar rows, its user-sidecar rows). User rows need ``config.user_logprobs`` set
    (the run then has ``user_logprobs.jsonl``, as a live ``--user-logprobs`` run); ValueError otherwise."""
    import shutil
    import tempfile

    run_dir = Path(run_dir)
    check_new_dir(run_dir)
    created = _missing_dirs(run_dir.parent)
    staging: Path | None = None
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.importing-", dir=run_dir.parent))
        with RunStore.open_or_create(staging, config, system_prompt=system_prompt, info=info) as store:
            for episode, rows, user_rows in episodes:
                store.append_episode(episode, rows, user_rows)
        os.rename(staging, run_dir)  # POSIX rename replaces an empty directory
    except BaseException as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        for p in created:  # deepest first; rmdir only: anything another process put there stays
            with contextlib.suppress(OSError):
                p.rmdir()
        if isinstance(exc, OSError):
            raise RunDirWriteError(run_dir, exc) from None
        raise
