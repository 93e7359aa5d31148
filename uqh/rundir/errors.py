"""The exception types the CLI turns into one line on stderr instead of a traceback.

- :class:`UserError`: a mistake a user can cause (bad flags, missing files, wrong run dir, a missing extra: see
  :func:`require_extra`); exit 2, and nothing is written before it is raised.
- :class:`RunDirWriteError`: writing a run directory failed (disk full, read-only file system, I/O error); exit 1
  with a resume hint -- what was written is consistent and a re-run of the same command resumes.
- :class:`OutputWriteError`: writing a command's output files failed half-way (disk full); exit 1, naming the path.

The rule for output locations, the same in every command: a location that is unusable when checked (a run
directory, a file, read-only, not empty, another command writing it) is a UserError, exit 2, before any work; a
fault while writing is an OutputWriteError, exit 1 (:mod:`uqh.rundir.output_dir`).
"""
from __future__ import annotations

import errno
import importlib.util


class UserError(Exception):
    """A problem the user can fix; the message says what to do."""


def require_extra(extra: str, module: str, what: str) -> None:
    """UserError, one line, when ``module`` (the top-level package an extra installs) cannot be imported: ``what``
    needs ``pip install 'uqh[extra]'``. Looks the module up without importing it, so it is cheap and is called
    where a command is checked, before any run directory exists. The one place that names an extra."""
    if importlib.util.find_spec(module) is None:
        raise UserError(f"{what} needs the {extra} extra, which is not installed: pip install 'uqh[{extra}]'")


class RunDirWriteError(Exception):
    """Writing the run directory ``run_dir`` failed with ``cause`` (usually an OSError). Never data, never a
    user mistake: the writer stops; what it wrote before is consistent."""

    def __init__(self, run_dir, cause: BaseException) -> None:
        self.run_dir = run_dir
        self.cause = cause
        if isinstance(cause, OSError) and cause.strerror:
            reason = cause.strerror
        else:
            reason = str(cause) or type(cause).__name__
        super().__init__(f"cannot write the run directory {run_dir}: {reason}")

    @property
    def hint(self) -> str:
        """What to do next, as one phrase."""
        if isinstance(self.cause, OSError) and self.cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return "free disk space, then re-run the same command to resume"
        return "fix the cause, then re-run the same command to resume"


class OutputWriteError(Exception):
    """Writing a command's output files (``report --out``, ``export --to``, ``audit --out``, ``judge --report
    --tables``, ``index --out``, ``certify --export-verification``) failed half-way with
    ``cause`` (disk full, I/O error): an I/O fault, not a user mistake, so exit 1 like a run directory's write
    failure, naming the path. (An output directory that is unusable from the start is a UserError, exit 2.)"""

    def __init__(self, path, cause: BaseException, what: str | None = None) -> None:
        self.path, self.cause = path, cause
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else (str(cause) or type(cause).__name__)
        super().__init__(f"cannot write {what + ' to ' if what else ''}{path}: {reason}")

    @property
    def hint(self) -> str:
        if isinstance(self.cause, OSError) and self.cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return "free disk space, then re-run the same command"
        return "fix the cause (or pick another directory), then re-run the same command"


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one line for a message: its text's first line, cut to ``limit`` characters (its type's
    name when it has no text)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def not_utf8(what: str, exc: UnicodeDecodeError) -> UserError:
    """The one-line error for a file a user gave that is not UTF-8 text (a binary file, another encoding)."""
    return UserError(f"{what} is not a UTF-8 text file (undecodable byte at offset {exc.start}); give a text file")


def read_user_text(path, what: str) -> str:
    """The text of a file a user named (``what``: e.g. ``"--endpoints FILE"``): UserError, one line naming it, for
    a file that cannot be read or is not UTF-8 text."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as exc:
        raise not_utf8(what, exc) from None
    except OSError as exc:
        raise UserError(f"cannot read {what}: {exc.strerror or exc}") from None
