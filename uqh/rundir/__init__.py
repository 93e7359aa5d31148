"""The run directory: its schema, the user-error type, and its one reader.

This package imports nothing else of the project; every other package depends on it (see docs/architecture.md):

- :mod:`uqh.rundir.schema`  -- pydantic records (``Manifest``, ``Episode``, ``LogprobRow``, ``PartialEpisode``...);
- :mod:`uqh.rundir.errors`  -- :class:`UserError`, the one exception type for mistakes a user can fix;
- :mod:`uqh.rundir.reader`  -- :class:`RunDir`, the only reader of ``manifest.json``, ``episodes.jsonl``,
  ``logprobs.jsonl``, ``checkpoints/``, ``skipped_prefixes.jsonl`` and ``skipped_samples.jsonl``;
- :mod:`uqh.rundir.qz_file` -- the q_Z file of a continuation run (reader and writer);
- :mod:`uqh.rundir.atomic`  -- atomic file replacement for every writer.

The writer of a run directory (``uqh.harness.store.writer.RunStore``) lives in the harness: only the harness runs episodes.
"""
from __future__ import annotations

import importlib

# Lazy re-exports: `uqh --help` imports uqh.rundir.errors, which must not pull in pydantic.
_EXPORTS = {
    "UserError": "uqh.rundir.errors",
    "RunDir": "uqh.rundir.reader",
    "checkpoint_path": "uqh.rundir.reader",
    "read_jsonl": "uqh.rundir.reader",
    "QzRecord": "uqh.rundir.qz_file",
    "read_qz_file": "uqh.rundir.qz_file",
    "qz_for_runs": "uqh.rundir.qz_file",
    "qz_source": "uqh.rundir.qz_file",
    "write_qz_file": "uqh.rundir.qz_file",
    "atomic_write_text": "uqh.rundir.atomic",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rundir' has no attribute {name!r}")


def __dir__():
    return __all__
