"""``uqh doctor``: what this installation has -- the local model's GGUF and ``llama-server`` (and its tokens/s), the
packaged data, the extras, the API keys (by name: a key's value is never read into a report) -- and whether the
offline first job (``uqh run --model local:smollm2`` on packaged data) can run.

Looks only; writes nothing, and starts nothing but a short-lived ``llama-server`` when the speed is measured.
"""
from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import os
import re
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from uqh.domains.locations import SOURCE_ROOT, is_source_checkout
from uqh.harness.model.llama_build import server_version
from uqh.harness.model.llama_server import (
    LOCAL_DEFAULT,
    LocalModelServer,
    find_gguf,
    find_llama_server,
)
from uqh.harness.model.local_files import SETUP_HINT
from uqh.rundir.errors import UserError

#: The extras a user may lack, in the order shown.
EXTRAS = ("local", "tau2", "ray", "view", "dev")
#: API keys always listed (set or not); any other set ``*_API_KEY`` variable is listed too.
KNOWN_KEYS = ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "HF_TOKEN")
#: Tokens generated for the speed line: enough to dominate the request's fixed cost, a few seconds on one core.
SPEED_TOKENS = 64
SPEED_PROMPT = "Write a short paragraph about rivers."


@dataclass(frozen=True)
class FoundFile:
    path: Path | None
    detail: str  # the size or version when found, else why not (one line, with the fix)
    works: bool = True  # False: found but broken (a binary that does not run)


@dataclass(frozen=True)
class Speed:
    tokens_per_s: float
    tokens: int
    threads: int


@dataclass(frozen=True)
class Extra:
    name: str
    installed: bool | None  # None: this uqh does not declare the extra
    missing: tuple[str, ...] = ()  # its distributions that are not installed

    @property
    def pip_command(self) -> str:
        return f"pip install 'uqh[{self.name}]'"


@dataclass
class Diagnosis:
    model: str
    gguf: FoundFile
    server: FoundFile
    speed: Speed | str | None  # None: not measured; str: why it could not be
    data: list[tuple[str, int]]  # packaged data files (path under uqh/domains, bytes)
    extras: list[Extra]
    keys: list[tuple[str, bool]]  # (variable name, set); never the value
    problems: list[str] = field(default_factory=list)  # what stops the offline first job, each with its fix

    @property
    def ready(self) -> bool:
        return not self.problems


def find_model_file(model: str) -> FoundFile:
    try:
        path = find_gguf(model)
    except UserError as exc:
        return FoundFile(None, str(exc))
    return FoundFile(path, f"{path.stat().st_size / 1e6:.1f} MB")


def find_server_binary() -> FoundFile:
    try:
        path = find_llama_server()
    except UserError as exc:
        return FoundFile(None, str(exc))
    version = server_version(path)
    if version is None:
        return FoundFile(path, f"does not run (`{path.name} --version` failed); {SETUP_HINT}", works=False)
    return FoundFile(path, version)


def measure_speed(gguf: Path, binary: Path, *, tokens: int = SPEED_TOKENS) -> Speed:
    """Generation speed of one request of ``tokens`` tokens (greedy, end of text ignored) on a fresh one-slot
    server with the runs' thread count: llama-server's own timing of the generated tokens (prompt excluded)."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": SPEED_PROMPT}], "max_tokens": tokens,
            "temperature": 0, "seed": 42, "ignore_eos": True}
    with LocalModelServer(gguf, parallel=1, binary=binary) as server:
        request = urllib.request.Request(server.base_url + "/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.loads(response.read())
        elapsed = time.monotonic() - started
        threads = server.threads
    generated = int((answer.get("usage") or {}).get("completion_tokens") or 0)
    timings = answer.get("timings") or {}
    rate = timings.get("predicted_per_second") or (generated / elapsed if elapsed > 0 else 0.0)
    return Speed(float(rate), int(timings.get("predicted_n") or generated), threads)


def packaged_data(base: Path | None = None) -> list[tuple[str, int]]:
    """Every file in a ``data`` folder of :mod:`uqh.domains` (the demo data shipped as package data; ``base``:
    another folder laid out the same way), with its size; the package is found through importlib.resources, so an
    installed wheel is read where it is."""
    base = Path(str(importlib.resources.files("uqh.domains"))) if base is None else base
    found = []
    for folder in sorted(p for p in base.rglob("data") if p.is_dir() and "__pycache__" not in p.parts):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                found.append((path.relative_to(base).as_posix(), path.stat().st_size))
    return sorted(set(found))  # a data/ folder inside another is walked twice


def _extra_of(requirement: str) -> tuple[str, str | None]:
    """(distribution name, extra or None) of one ``Requires-Dist`` line."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
    return (name.group(0) if name else requirement), (extra.group(1) if extra else None)


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def declared_extras() -> dict[str, list[str]]:
    """extra -> its distributions: from a source checkout's pyproject.toml (an editable install's metadata is
    that of the day it was installed), else from the installed uqh's metadata."""
    pyproject = SOURCE_ROOT / "pyproject.toml"
    if is_source_checkout():
        with pyproject.open("rb") as f:
            table = tomllib.load(f).get("project", {}).get("optional-dependencies", {})
        return {extra: [_extra_of(req)[0] for req in reqs] for extra, reqs in table.items()}
    try:
        requirements = importlib.metadata.requires("uqh") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    by_extra: dict[str, list[str]] = {}
    for line in requirements:
        name, extra = _extra_of(line)
        if extra is not None:
            by_extra.setdefault(extra, []).append(name)
    return by_extra


def extras(names: tuple[str, ...] = EXTRAS) -> list[Extra]:
    """Each extra's state: which of the distributions it declares (:func:`declared_extras`) are installed."""
    by_extra = declared_extras()
    report = []
    for extra in names:
        if extra not in by_extra:
            report.append(Extra(extra, None))
            continue
        missing = tuple(d for d in by_extra[extra] if d != "uqh" and not _installed(d))
        report.append(Extra(extra, not missing, missing))
    return report


def api_keys(environ: Mapping[str, str] | None = None) -> list[tuple[str, bool]]:
    """(name, set) of the known API key variables and of any other ``*_API_KEY`` that is set; names only."""
    env = os.environ if environ is None else environ
    names = list(KNOWN_KEYS) + sorted(n for n in env if n.endswith("_API_KEY") and n not in KNOWN_KEYS
                                      and env[n].strip())
    return [(name, bool(env.get(name, "").strip())) for name in names]


def diagnose(*, speed: bool = True, model: str = LOCAL_DEFAULT, environ: Mapping[str, str] | None = None
             ) -> Diagnosis:
    """Everything ``uqh doctor`` shows. ``problems`` lists what stops the offline first job (the local model's
    files, a binary that does not run or serve, no packaged data), each with its fix; missing extras and keys are
    reported, not problems (a user who only scores runs needs neither)."""
    gguf, server = find_model_file(model), find_server_binary()
    problems = []
    if gguf.path is None:
        problems.append(f"no model file: {gguf.detail}")
    if server.path is None:
        problems.append(f"no llama-server: {server.detail}")
    elif not server.works:
        problems.append(f"llama-server {server.path} {server.detail}")
    measured: Speed | str | None = None
    if speed and gguf.path is not None and server.path is not None and not problems:
        try:
            measured = measure_speed(gguf.path, server.path)
        except (UserError, OSError, ValueError) as exc:
            measured = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            problems.append(f"llama-server did not generate: {measured}")
    data = packaged_data()
    if not data:
        problems.append("no packaged data under uqh/domains/*/data (a broken install: reinstall uqh)")
    return Diagnosis(model, gguf, server, measured, data, extras(), api_keys(environ), problems)
