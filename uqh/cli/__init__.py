"""`uqh`: a thin command line over importable library functions.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``. The parser is
built lazily (as inspect_ai's ``_cli/_lazy_group.py``): every command is listed from the :data:`COMMANDS` table (name,
module, help text), and only the module of the command given is imported, so ``uqh --help`` imports none and
``uqh COMMAND ...`` one. A command module may then import what its options need at module level; only what is slow
to import (litellm, numpy, pandas, tau2, ...) stays inside the functions that use it.

Whatever a command meets, the user gets one line on stderr, never a traceback: a :class:`UserError` exits 2,
a :class:`RunDirWriteError` (or any other OS error) exits 1 with what to do, and SIGINT / SIGTERM
(:mod:`uqh.harness.interrupts`) exit 130 / 143 after the command has stopped its children (``uqh run`` first prints its
summary and the resume hint).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from uqh.cli import console_log
from uqh.harness import interrupts
from uqh.rundir import secrets
from uqh.rundir.errors import OutputWriteError, RunDirWriteError, UserError

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("uqh.cli.run_command", "run episodes of a domain into a run directory (resumable)"),
    "continue": ("uqh.cli.continue_command", "roll out continuation branches from censored prefixes (q_Z)"),
    "score": ("uqh.cli.score_command", "score run directories: TPS, censored extensions, diagnostics; compare runs"),
    "certify": ("uqh.cli.certify_command", "reliability level by self-consistency and conformal calibration"),
    "audit": ("uqh.cli.audit_command", "termination audit and selection diagnostic of run directories"),
    "regenerate": ("uqh.cli.regenerate_command", "the paper's protocol in one go: every preset's run, continuations, "
                   "one report (resumable; --quick: offline in minutes)"),
    "report": ("uqh.cli.report_command", "tables, figures and an HTML report for run directories"),
    "view": ("uqh.cli.view_command", "a local web viewer of run directories: runs, trajectories, token heatmaps (live)"),
    "export": ("uqh.cli.export_command", "episodes, steps, tokens and scores as Parquet/CSV tables for pandas"),
    "judge": ("uqh.cli.judge_command", "Agent GPA LLM judges over recorded traces, and their analysis"),
    "probe": ("uqh.cli.probe_command", "per-step probes (P(True), observation surprise) over recorded traces, into a probe directory"),
    "index": ("uqh.cli.index_command", "build a retrieval index (bm25s on disk, or Elasticsearch)"),
    "schema": ("uqh.cli.schema_command", "print the JSON schema of the run-directory records"),
    "repair": ("uqh.cli.repair_command", "move lines that are not valid records out of a run directory's files"),
    "import": ("uqh.cli.import_command", "turn another harness's results (tau2-bench / agentuq) into a run directory"),
    "list": ("uqh.cli.list_command", "what is installed: domains, agents, predictors, metrics, and where each comes from"),
    "setup": ("uqh.cli.setup_command", "uqh setup local: build llama-server and fetch the GGUF of local:smollm2 into the cache"),
    "doctor": ("uqh.cli.doctor_command", "what is installed: the local model and its tokens/s, packaged data, extras, API keys"),
}


def _load_dotenv() -> None:
    """Secrets come from the environment or a ``.env`` file: ``./.env`` first, else the nearest one above the
    working directory; the environment wins over the file. Never written anywhere: the file's secret-named values
    are registered for redaction even where the environment overrides them."""
    try:
        from dotenv import dotenv_values, find_dotenv, load_dotenv
    except ImportError:  # python-dotenv comes with litellm; without it only the environment is used
        return
    path = find_dotenv(usecwd=True)  # ./.env, then the parents of the working directory (not the package's)
    if path:
        secrets.register_names(dotenv_values(path))
        load_dotenv(path, override=False)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line -- ``uqh run: error: ...; see uqh run --help`` -- and exit 2,
    not a usage dump of up to 16 lines."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def command_of(argv: list[str]) -> str | None:
    """The command named in ``argv``: its first word that is not an option (``uqh -v run ...`` -> ``run``), or None
    when there is none (``uqh``, ``uqh --help``) or it is not a command (argparse then says so)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command listed; only ``command``'s module is imported and its options added."""
    parser = OneLineParser(
        prog="uqh",
        description="Run LLM agents on benchmarks recording every step's verbal confidence and token logprobs, "
        "continue censored trajectories, and score the probability traces (Trajectory Proper Score).",
        epilog="`uqh COMMAND --help` for a command's options; user mistakes exit 2 with one line on stderr.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="details on stderr: local model server start/stop, endpoints, each retry and its reason, "
                             "slow calls (before the command: uqh -v run ...)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    _load_dotenv()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):  # `uqh`, `uqh -v`: a usage mistake, so the help on stderr and exit 2
        parser.print_help(sys.stderr)
        return 2
    name = f"uqh {args.command}"
    console_log.configure(verbose=args.verbose, prog=name)
    try:
        console_log.check_litellm_log()  # before any import of litellm, which raises on a bad level
        with interrupts.stop_signals():
            return int(args._run(args) or 0)
    except UserError as exc:
        print(secrets.redact(f"{name}: error: {exc}"), file=sys.stderr)
        return 2
    except (RunDirWriteError, OutputWriteError) as exc:
        print(secrets.redact(f"{name}: error: {exc}; {exc.hint}"), file=sys.stderr)
        return 1
    except BrokenPipeError:  # `uqh score RUN | head`: the reader has what it wanted; no error, no traceback
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush at exit must not fail on the closed pipe again
        return 0
    except SystemExit as exc:  # rich turns a closed pipe into SystemExit(1) (stdout already sent to devnull)
        if isinstance(exc.__context__, BrokenPipeError):
            return 0
        raise
    except OSError as exc:  # an I/O fault no command anticipated: still one line (the traceback with -v)
        logging.getLogger("uqh").debug("I/O error", exc_info=True)
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"{name}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except interrupts.Interrupted as exc:
        print(f"{name}: interrupted by {interrupts.signal_name(exc.signum)}", file=sys.stderr)
        return interrupts.exit_code(exc.signum)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130

