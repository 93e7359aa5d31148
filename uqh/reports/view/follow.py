"""Live discovery for `uqh view`: keep :class:`uqh.reports.view.app.Viewer`'s runs in line with its folders while it
serves, so a run started after the viewer appears and a deleted one leaves within a few seconds.

Two ways, chosen by :func:`follow` (``benchmarks/view_discovery.py`` measures both: idle CPU on a tree of many runs,
and the delay until a new run is listed):

- **watch** (the ``view`` extra's ``watchfiles``: inotify on Linux): the folders are scanned again only when a
  directory appears or disappears or a manifest is written, never for the appends and checkpoints of a run that is
  writing;
- **poll** (without watchfiles, or when watching fails, e.g. the inotify watch limit is reached, and while a folder
  given on the command line is deleted: a watch on it sees nothing more): scanned again every :data:`POLL_SECONDS`.

A scan runs in a worker thread (it walks folders and reads manifests); the server's event loop keeps answering.
"""
from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from uqh.reports.view.app import Viewer
from uqh.rundir.judgments import JUDGE_MANIFEST_FILE
from uqh.rundir.probes import PROBE_MANIFEST_FILE
from uqh.rundir.schema import MANIFEST_FILE

log = logging.getLogger(__name__)

#: Seconds between scans when polling (the issue asks for "within a few seconds"; a scan of 1,000 runs is ~0.1 s).
POLL_SECONDS = 2.0
#: watchfiles: how long a burst of changes is gathered before a scan, at most and after the last change (ms).
DEBOUNCE_MS, STEP_MS = 1600, 50
#: File names whose creation or removal can change what the viewer lists.
MANIFESTS = {MANIFEST_FILE, JUDGE_MANIFEST_FILE, PROBE_MANIFEST_FILE}
#: What :func:`follow` accepts: ``auto`` watches when watchfiles is installed, ``poll`` never watches.
METHODS = ("auto", "watch", "poll")


def watchfiles_installed() -> bool:
    return importlib.util.find_spec("watchfiles") is not None


def changes_listing(viewer: Viewer, change: Any, path: str) -> bool:
    """Whether one file-system event can change the listed directories: a manifest written or removed, a folder
    created (a manifest may already be in it), or a listed directory (or a folder above one) removed. The appends
    and checkpoints of a running run are not."""
    name = os.path.basename(path)
    if name in MANIFESTS:
        return True
    kind = getattr(change, "name", str(change))
    if kind == "added":
        return os.path.isdir(path)
    if kind == "deleted":
        here = Path(path)
        return any(r.path == here or here in r.path.parents for r in list(viewer.runs.values()))
    return False


async def rescan(viewer: Viewer) -> bool:
    try:
        return await asyncio.to_thread(viewer.update)
    except OSError as exc:  # a folder vanished mid-walk: the next scan sees the final state
        log.debug("scan failed: %s", exc)
        return False


async def poll(viewer: Viewer, stop: asyncio.Event, every: float = POLL_SECONDS, until=None) -> None:
    """Scan every ``every`` seconds until ``stop`` is set (or ``until()`` is true after a scan)."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
        except asyncio.TimeoutError:
            await rescan(viewer)
            if until is not None and until():
                return


def root_ids(viewer: Viewer) -> list[tuple[int, int]] | None:
    """(device, inode) of each folder given on the command line; None when one is missing (a watch on it is dead)."""
    try:
        return [(st.st_dev, st.st_ino) for st in (os.stat(p) for p in viewer.paths)]
    except OSError:
        return None


async def watch(viewer: Viewer, stop: asyncio.Event) -> None:
    """Scan when watchfiles reports a change that can alter the listing, until ``stop`` is set or a folder given on
    the command line is deleted or replaced (its watch then sees nothing more: :func:`follow` polls until it is
    back). Errors of watchfiles (OSError, RuntimeError) propagate."""
    from watchfiles import awatch

    roots = root_ids(viewer)
    if roots is None:
        return
    async for changes in awatch(*map(str, viewer.paths),
                                watch_filter=lambda change, path: changes_listing(viewer, change, path),
                                debounce=DEBOUNCE_MS, step=STEP_MS, stop_event=stop,
                                rust_timeout=int(POLL_SECONDS * 1000), yield_on_timeout=True):
        if changes:
            await rescan(viewer)
        if root_ids(viewer) != roots:
            return


async def follow(viewer: Viewer, stop: asyncio.Event, method: str = "auto") -> None:
    """Keep ``viewer`` up to date until ``stop`` is set: by watching (``auto`` when watchfiles is installed, or
    ``watch``) while the given folders exist, else by polling (``poll``, or watchfiles missing or failing; a
    deleted folder is polled for until it is back, then watched again). ``viewer.follow_method`` says which."""
    if method not in METHODS:
        raise ValueError(f"follow method {method!r} is not one of {METHODS}")
    can_watch = method in ("auto", "watch") and watchfiles_installed()
    while not stop.is_set():
        if can_watch and root_ids(viewer) is not None:
            viewer.follow_method = "watch"
            try:
                await watch(viewer, stop)
            except (OSError, RuntimeError) as exc:
                log.warning("uqh view: cannot watch the folders (%s); polling every %.0f s instead", exc,
                            POLL_SECONDS)
                can_watch = False
            await rescan(viewer)
            continue
        viewer.follow_method = "poll"
        await poll(viewer, stop, until=(lambda: root_ids(viewer) is not None) if can_watch else None)
