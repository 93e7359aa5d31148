"""The worker side of the Ray backend: one :class:`EpisodeActor` per CPU of the cluster.

An actor is made once with the batch's :class:`uqh.harness.runner.RunContext`, the domain (unpickled from the object
store, where the driver put it once: its tasks, catalog or index come with it) and the driver's provider
environment; it builds its own model client and runs episodes as the driver asks, up to the whole concurrency at
once, each through :func:`uqh.harness.runner.run_specs` exactly as the local backend runs it. It writes nothing: a
finished episode goes back to the driver serialized, checkpoints wait in memory until the driver collects them
(:meth:`EpisodeActor.take_checkpoints`), and an infrastructure failure hands back the episode's last checkpoint so
that the driver can keep it. Ray is not imported here: the driver wraps the class with ``ray.remote``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import resource
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqh.harness.backends.context import BatchStopped, RunContext, StopCause, gc_tuned
from uqh.harness.backends.event_loop import endpoint_counts, run_specs, serialize
from uqh.harness.progress import CALL_TOTAL_FIELDS, CallTotals, TotallingClient

__all__ = ["EpisodeActor", "EpisodeOutcome", "code_digest"]

#: What an actor must run exactly as the driver does: the write path's packages and the prompts.
_CODE_DIRS = ("rundir", "domains", "harness", "prompts")


def code_digest(root: Path | None = None) -> str:
    """sha256 of uqh's write-path sources and prompts (file names and bytes): equal on the driver and every actor
    iff they run the same code."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for top in _CODE_DIRS:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class EpisodeOutcome:
    """How one attempt at an episode ended on an actor (``kind``: ``done``, ``error`` or ``stopped``)."""

    kind: str
    episode_id: str
    attempt: int
    #: done: the serialized episode (as :func:`uqh.harness.runner.serialize` makes it).
    line: bytes = b""
    rows: Any = b""  # bytes, or SidecarBytes when the episode has user-sidecar rows (uqh.harness.store.writer)
    summary: Any = None
    #: error: the infrastructure failure, its retries, and the episode's last checkpoint not yet collected.
    message: str = ""
    retries: int = 0
    checkpoint: str | None = None
    #: stopped: why the actor stopped the batch (an endpoint that cannot be reached).
    cause: StopCause | None = None


class EpisodeActor:
    """Runs episodes of one batch on a Ray worker (module docstring). Methods are coroutines: Ray runs them on
    the actor's event loop, many at once."""

    def __init__(self, ctx: RunContext, domain: Any, environ: dict[str, str], digest: str) -> None:
        os.environ.update(environ)  # the driver's provider keys and endpoints (uqh/harness/backends/ray_backend.py)
        import uqh  # noqa: F401 - sets LITELLM_LOCAL_MODEL_COST_MAP before litellm may be imported
        from uqh.harness.config.build import build_client

        mine = code_digest()
        if mine != digest:
            raise RuntimeError(
                f"this Ray worker ({socket.gethostname()}) imports uqh from {Path(__file__).resolve().parents[2]}, "
                "whose code differs from the driver's; install the same uqh on every node")
        gc_tuned().__enter__()  # for the actor's life, as the local backend does for a batch's
        self.ctx = ctx
        self.domain = domain
        domain.prepare_runtime(ctx.domain_runtime())
        client = build_client(ctx.config, ctx.agent_model, ctx.client)
        #: Every call this actor made, and those of the episodes it handed back finished: the difference is what
        #: the driver must count as made but never written (failed episodes, and those in flight at a stop).
        self._made, self._handed = CallTotals(), CallTotals()
        self.client = TotallingClient(client, self._made)
        self._one = dataclasses.replace(ctx, concurrency=1)
        self._lock = threading.Lock()  # checkpoints arrive from run_specs' I/O threads
        self._checkpoints: dict[str, tuple[int, str]] = {}

    async def ready(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "pid": os.getpid()}

    async def run(self, spec: Any, attempt: int) -> EpisodeOutcome:
        """Run one episode (attempt ``attempt`` of it) to its end; never raises for the episode's own failures."""
        eid = spec.episode_id
        finished: list[tuple] = []
        failed: list[tuple[str, int]] = []

        def keep_checkpoint(episode_id: str, data: str) -> None:
            with self._lock:
                self._checkpoints[episode_id] = (attempt, data)

        def on_error(_spec, message: str, retries: int = 0) -> None:
            failed.append((message, retries))

        try:
            await run_specs(self._one, [spec], domain=self.domain, client=self.client, persist=serialize,
                            on_done=finished.append, on_error=on_error, checkpoint_sink=keep_checkpoint)
        except BatchStopped as exc:
            return EpisodeOutcome("stopped", eid, attempt, cause=exc.cause)
        finally:
            with self._lock:
                pending = self._checkpoints.pop(eid, None)
        if finished:
            _, line, rows, summary = finished[0]
            for f in CALL_TOTAL_FIELDS:
                setattr(self._handed, f, getattr(self._handed, f) + getattr(summary, f))
            return EpisodeOutcome("done", eid, attempt, line=line, rows=rows, summary=summary)
        message, retries = failed[0] if failed else ("the episode ended without a result", 0)
        return EpisodeOutcome("error", eid, attempt, message=message, retries=retries,
                              checkpoint=pending[1] if pending and pending[0] == attempt else None)

    async def take_checkpoints(self) -> tuple[list[tuple[str, int, str]], CallTotals]:
        """The newest checkpoint of each running episode made since the last call: (episode id, attempt, JSON);
        and the calls made so far that no finished episode accounts for (:meth:`unaccounted_calls`)."""
        with self._lock:
            items, self._checkpoints = self._checkpoints, {}
        return [(eid, attempt, data) for eid, (attempt, data) in items.items()], self.unaccounted_calls()

    def unaccounted_calls(self) -> CallTotals:
        """The calls this actor made that no episode it handed back accounts for (failed or unfinished ones)."""
        return self._made.minus(self._handed)

    async def stats(self) -> tuple[float, list, CallTotals]:
        """CPU seconds of this worker process so far, its client's per-endpoint counts, and the unaccounted calls."""
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime, endpoint_counts(self.client), self.unaccounted_calls()
