"""Where a batch's episodes run: this machine (in this process, or ``--workers N`` processes) or a Ray cluster.

:func:`uqh.harness.runner.run_batch` owns the run directory and hands the episodes still to run to a backend together
with :class:`uqh.harness.backends.backend.BatchHooks`, the driver's side of the batch: whichever backend runs the episodes, the driver is the
only writer of the run directory (the same :class:`uqh.harness.store.writer.RunStore`, files, crash safety and resume), so a
resumed run may switch backends. A backend returns a :class:`uqh.harness.backends.backend.BackendResult`.

- :class:`uqh.harness.backends.local.LocalBackend`: one event loop in this process, or the worker processes of :mod:`uqh.harness.backends.workers`.
- :class:`uqh.harness.backends.ray_backend.RayBackend` (``uqh run --backend ray``): per-CPU actors on a Ray cluster;
  Ray is imported only when it is used.
"""
from __future__ import annotations

from uqh.harness.backends.backend import Backend
from uqh.harness.backends.local import LocalBackend
from uqh.rundir.errors import UserError

__all__ = ["BACKENDS", "make_backend"]

#: The names ``uqh run --backend`` accepts.
BACKENDS = ("local", "ray")


def make_backend(name: str, *, workers: int | None = None, ray_address: str | None = None) -> Backend:
    """The backend of ``--backend NAME``. ``workers``: local worker processes (default 1), or with Ray the number
    of actors (default: one per CPU of the cluster)."""
    if name == "local":
        if ray_address is not None:
            raise UserError("--ray-address needs --backend ray")
        return LocalBackend(workers or 1)
    if name == "ray":
        from uqh.harness.backends.ray_backend import RayBackend

        return RayBackend(address=ray_address, actors=workers)
    raise UserError(f"unknown --backend {name!r}; use one of {', '.join(BACKENDS)}")
