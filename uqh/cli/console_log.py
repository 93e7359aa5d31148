"""How log records reach the terminal: tidy one-line notices in a normal run, details with ``uqh -v``.

Normal run: our packages' warnings (and errors) as ``uqh run: note: <message>``; other libraries only at ERROR
(bm25s sets its own logger to DEBUG, and litellm and asyncio talk a lot: none of that reaches a normal run).

``-v``: everything our packages log -- the local model server starting and stopping, the endpoint a client talks
to, each retry with its reason, slow calls, checkpoints ignored -- as ``HH:MM:SS name: message``, plus other
libraries' warnings. The handler writes to whatever ``sys.stderr`` is at the time (a rich progress bar redirects
it to print above the bar; pytest's capsys replaces it).
"""
from __future__ import annotations

import logging
import sys
import time

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


def configure(verbose: bool = False, prog: str = "uqh") -> logging.Handler:
    """Install the one console handler on the root logger (replacing one installed before); return it."""
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
    root.addHandler(handler)
    return handler
