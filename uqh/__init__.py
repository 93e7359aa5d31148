"""uqh: agent rollouts with runtime uncertainty capture, scored by trajectory proper scoring rules.

Packages, in the order of the data flow: :mod:`uqh.rundir` (the run directory's contract and only reader) <-
:mod:`uqh.domains` (benchmarks) <- :mod:`uqh.harness` (the write path); :mod:`uqh.rundir` <- :mod:`uqh.scoring`
(pure numpy, typed results) <- :mod:`uqh.reports` (tables, figures, HTML); :mod:`uqh.cli` composes them.

The Python API is the command line's, loaded on first use (``import uqh`` stays light)::

    import uqh
    result = uqh.run(uqh.RunSettings(run=uqh.RunOverrides(domain="arithmetic", tasks=3, model="openai/m",
                                                          api_base="http://127.0.0.1:8000/v1", out="runs/a")))
    run = uqh.load(result.run_dir)       # manifest + episodes, steps, tokens as DataFrames
    scores = uqh.score(run)              # what `uqh score runs/a --format json` prints
"""
import importlib
import os

# litellm must not try the network for its cost map at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"

#: The public names, and the module each comes from (imported when the name is first used).
API = {
    "run": "uqh.harness.launch",
    "RunResult": "uqh.harness.launch",
    "RunSettings": "uqh.harness.config.settings",
    "RunOverrides": "uqh.harness.config.settings",
    "DecodingOverrides": "uqh.harness.config.settings",
    "BatchSettings": "uqh.harness.config.settings",
    "ClientSettings": "uqh.harness.config.settings",
    "load": "uqh.scoring.loaded_run",
    "LoadedRun": "uqh.scoring.loaded_run",
    "score": "uqh.scoring.loaded_run",
    "ScoreOptions": "uqh.scoring.pipeline",
}

__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name not in API:
        raise AttributeError(f"module 'uqh' has no attribute {name!r}")
    value = getattr(importlib.import_module(API[name]), name)
    globals()[name] = value  # once imported, an attribute like any other
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
