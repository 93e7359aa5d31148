"""This machine: one event loop in this process, or ``--workers N`` processes (:mod:`uqh.harness.backends.workers`)."""
from __future__ import annotations

import asyncio
from typing import Any

from uqh.harness.backends.backend import BackendResult, BatchHooks, SpecSource
from uqh.harness.backends.context import RunContext, gc_tuned
from uqh.harness.backends.event_loop import run_in_process
from uqh.harness.backends.workers import run_workers
from uqh.rundir.schema import RunConfig


class LocalBackend:
    """This machine: one event loop in this process, or ``workers`` processes (:mod:`uqh.harness.backends.workers`),
    each worker with at least one of the ``--concurrency`` slots."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        self.workers = max(1, int(workers))

    @property
    def in_process(self) -> bool:
        return self.workers == 1

    def check(self, config: RunConfig) -> None:
        """Every config runs on this machine."""

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, ctx: RunContext, specs: SpecSource, domain: Any, hooks: BatchHooks) -> BackendResult:
        """``specs``: a list, or (one process only) a source to pull them from, as consensus sampling does."""
        result = BackendResult()
        workers = min(self.workers, max(1, ctx.concurrency))
        if callable(specs) or workers == 1 or len(specs) == 1:
            with gc_tuned():
                asyncio.run(run_in_process(ctx, specs, domain, hooks, result.endpoint_calls))
            return result
        ran = run_workers(ctx, specs, workers, hooks.write, hooks.error, hooks.unfinished_calls)
        result.worker_cpu_s, result.stopped, result.endpoint_calls = ran.worker_cpu_s, ran.stopped, ran.endpoint_calls
        return result
