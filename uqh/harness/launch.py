"""A run from its :class:`uqh.harness.config.settings.RunSettings`: what ``uqh run`` does and :func:`uqh.run` is.

:func:`prepare` checks everything and writes nothing (the dry run stops there): the backend, the preset, the
RunConfig (:func:`uqh.harness.config.build.resolve_config`: model strings, keys, the run directory, the resume
check). :func:`execute` runs the prepared batch (:func:`uqh.harness.runner.run_batch`) with the settings' batch
part, unchanged. :func:`run` is both.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from uqh.harness.backends import make_backend
from uqh.harness.backends.backend import Backend
from uqh.harness.config.build import resolve_config, run_dir_of
from uqh.harness.config.presets import Preset, get_preset
from uqh.harness.config.settings import RunSettings
from uqh.harness.runner import BatchSummary, default_concurrency, run_batch
from uqh.rundir.errors import UserError
from uqh.rundir.schema import RunConfig

__all__ = ["PreparedRun", "RunResult", "execute", "prepare", "run"]


@dataclass(frozen=True)
class PreparedRun:
    """A run checked and ready, nothing written yet: its settings, preset, config, directory and backend."""

    settings: RunSettings
    preset: Preset | None
    config: RunConfig
    out: Path
    backend: Backend

    @property
    def concurrency(self) -> int:
        """Episodes in flight: the settings', else the model's default."""
        return self.settings.batch.concurrency or default_concurrency(self.config.model)

    @property
    def requested_tasks(self) -> int | None:
        """The tasks asked for (``tasks``, else the preset's unless ids were given), to compare with those found."""
        run = self.settings.run
        if run.tasks is not None:
            return run.tasks
        return self.preset.n_tasks if self.preset is not None and run.task_ids is None else None


@dataclass(frozen=True)
class RunResult:
    """What :func:`run` returns: the run directory, its config and config hash (a resume of the same settings
    finds the same), and the batch's summary (counts, stop reasons, calls, why it stopped early)."""

    run_dir: Path
    config: RunConfig
    config_hash: str
    summary: BatchSummary

    @property
    def ok(self) -> bool:
        """Every planned episode is in the run directory."""
        return self.summary.ok and self.summary.stopped is None


def settings_of(settings: RunSettings | dict[str, Any]) -> RunSettings:
    """``settings`` as :class:`RunSettings` (a dict is validated; a wrong field is one UserError line)."""
    if isinstance(settings, RunSettings):
        return settings
    try:
        return RunSettings.model_validate(settings)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        raise UserError(f"run settings: {where}: {err['msg']}") from None


def prepare(settings: RunSettings) -> PreparedRun:
    """Check everything a run needs before anything is written (UserError, one line): the backend, the preset,
    the config and its run directory."""
    batch = settings.batch
    backend = make_backend(batch.backend, workers=batch.workers, ray_address=batch.ray_address)
    preset = get_preset(settings.preset) if settings.preset else None
    config = resolve_config(preset, settings.run)
    backend.check(config)
    return PreparedRun(settings, preset, config, run_dir_of(preset, settings.run), backend)


def execute(prepared: PreparedRun, *, client_factory: Callable[[str, str | None], Any] | None = None) -> RunResult:
    """Run (or resume) a prepared run into its directory. ``client_factory`` replaces the model client (tests)."""
    with prepared.backend:
        summary = run_batch(prepared.config, prepared.out, prepared.settings.batch, backend=prepared.backend,
                            client_factory=client_factory)
    return RunResult(prepared.out, prepared.config, prepared.config.config_hash(), summary)


def run(settings: RunSettings | dict[str, Any], *,
        client_factory: Callable[[str, str | None], Any] | None = None) -> RunResult:
    """Run a batch exactly as ``uqh run`` does with the same settings (the same run directory, config hash and
    manifest), and return its :class:`RunResult`. Re-running the same settings resumes."""
    return execute(prepare(settings_of(settings)), client_factory=client_factory)
