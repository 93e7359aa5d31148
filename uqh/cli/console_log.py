"""How log records reach the terminal: tidy one-line notices in a normal run, details with ``uqh -v``.

Normal run: our packages' warnings (and errors) as ``uqh run: note: <message>``; other libraries only at ERROR
(bm25s sets its own logger to DEBUG, and litellm and asyncio talk a lot: none of that reaches a normal run).

``-v``: everything our packages log -- the local model server starting and stopping, the endpoint a client talks
to, each retry with its reason, slow calls, checkpoints ignored -- as ``HH:MM:SS name: message``, plus other
libraries' warnings. The handler writes to whatever ``sys.stderr`` is at the time (a rich progress bar redirects
it to print above the bar; pytest's capsys replaces it).

litellm, wherever it is first imported (a model check, pricing, a transport, tau2), installs its own handler that
prints records below WARNING -- whole prompts at DEBUG -- on **stdout**, and with ``LITELLM_LOG`` set it changes
the root logger's level. :func:`configure` hooks litellm's logging module: right after it is imported, its
handlers are removed and its records go through ours (stderr) at the level ``LITELLM_LOG`` names (default
WARNING); :func:`check_litellm_log` refuses a ``LITELLM_LOG`` that is not a level before litellm could raise on it.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import time

from uqh.rundir.errors import UserError
from uqh.rundir.secrets import redact

#: Loggers whose records are ours: every module of the uqh package, and the CLI's own "uqh".
OUR_PACKAGES = ("uqh",)


def is_ours(name: str) -> bool:
    return name.split(".", 1)[0] in OUR_PACKAGES


class _Threshold(logging.Filter):
    """Per record: ours from ``ours`` up, everybody else's from ``others`` up (a logger's own level -- bm25s sets
    DEBUG on its logger -- does not get past this)."""

    def __init__(self, ours: int, others: int) -> None:
        super().__init__()
        self.ours, self.others = ours, others

    def filter(self, record: logging.LogRecord) -> bool:
        if is_ours(record.name):
            return record.levelno >= self.ours
        if self.ours < logging.WARNING and record.name.startswith("LiteLLM"):
            # with -v, litellm's records pass at the level its logger was given (LITELLM_LOG, default WARNING)
            return record.levelno >= logging.getLogger(record.name).getEffectiveLevel()
        return record.levelno >= self.others


class NoticeFormatter(logging.Formatter):
    """``PROG: note: message`` (warnings), ``PROG: error: message`` (errors); first line only, traceback dropped."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        kind = "error" if record.levelno >= logging.ERROR else "note"
        text = record.getMessage().strip().splitlines()[0] if record.getMessage().strip() else record.name
        where = "" if is_ours(record.name) else f"{record.name.split('.', 1)[0]}: "
        return f"{self.prog}: {kind}: {where}{text}"


class VerboseFormatter(logging.Formatter):
    """``12:03:04.512 uqh.harness.model.llama_server: message`` (``WARNING``/``ERROR`` named; tracebacks kept)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        level = "" if record.levelno < logging.WARNING else f"{record.levelname} "
        text = f"{stamp} {level}{record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class StderrHandler(logging.Handler):
    """Writes each record to the current ``sys.stderr`` (looked up per record, never cached)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(redact(self.format(record)) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never break a run
            self.handleError(record)


#: litellm's loggers (each gets litellm's own stdout handler when litellm is imported) and its logging module.
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")
LITELLM_LOGGING_MODULE = "litellm._logging"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def check_litellm_log(environ=None) -> None:
    """UserError for a ``LITELLM_LOG`` that is not a log level (litellm raises AttributeError on import for it); a
    set-but-empty one is removed (it means "not set"), a valid one normalised (``" debug"`` -> ``DEBUG``)."""
    env = os.environ if environ is None else environ
    value = env.get("LITELLM_LOG")
    if value is None:
        return
    if not value.strip():
        del env["LITELLM_LOG"]
    elif value.strip().upper() not in LOG_LEVELS:
        raise UserError(f"LITELLM_LOG={value!r} is not a log level; set it to one of {', '.join(LOG_LEVELS)}, "
                        "or unset it")
    else:
        env["LITELLM_LOG"] = value.strip().upper()


def route_litellm_records() -> None:
    """litellm's records through our handler only, at ``LITELLM_LOG``'s level (default WARNING); the root level
    we set is restored (litellm sets it from ``LITELLM_LOG``)."""
    chosen = os.environ.get("LITELLM_LOG", "").strip().upper()
    for name in LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        for h in list(logger.handlers):
            logger.removeHandler(h)
        logger.setLevel(chosen if chosen in LOG_LEVELS else logging.WARNING)
        logger.propagate = True
    logging.getLogger().setLevel(_root_level)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``callback`` right after module ``name`` is executed, whoever imports it (litellm is imported lazily
    in several places; its logging must be routed before its first record)."""

    def __init__(self, name: str, callback) -> None:
        self.name, self.callback, self._loader = name, callback, None

    def find_spec(self, fullname, path, target=None):  # noqa: D102 - importlib's hook
        if fullname != self.name or self._loader is not None:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):  # noqa: D102
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: D102
        try:
            self._loader.exec_module(module)
        finally:
            self._loader = None
        self.callback()


_root_level = logging.WARNING


def hook_litellm_logging() -> None:
    """Route litellm's logging through ours now if it is imported, else right after its import (once)."""
    if LITELLM_LOGGING_MODULE in sys.modules:
        route_litellm_records()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(LITELLM_LOGGING_MODULE, route_litellm_records))


def configure(verbose: bool = False, prog: str = "uqh") -> logging.Handler:
    """Install the one console handler on the root logger (replacing one installed before); return it. litellm's
    records go through it too (:func:`hook_litellm_logging`)."""
    global _root_level
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, StderrHandler):
            root.removeHandler(h)
    handler = StderrHandler()
    if verbose:
        handler.addFilter(_Threshold(logging.DEBUG, logging.WARNING))
        handler.setFormatter(VerboseFormatter())
        root.setLevel(logging.DEBUG)
    else:
        handler.addFilter(_Threshold(logging.WARNING, logging.ERROR))
        handler.setFormatter(NoticeFormatter(prog))
        root.setLevel(logging.WARNING)
    _root_level = root.level
    root.addHandler(handler)
    hook_litellm_logging()
    return handler
