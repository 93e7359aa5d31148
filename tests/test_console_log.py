"""What reaches the terminal: one-line notices in a normal run, details (server, endpoint, retries) with -v."""
from __future__ import annotations

import logging
import re

import pytest

from uqh.cli import console_log
from uqh.cli import main
from test_runner import solver


@pytest.fixture(autouse=True)
def _restore_root_logger():
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


def _emit_mixture() -> None:
    bm25s = logging.getLogger("bm25s")
    old = bm25s.level
    bm25s.setLevel(logging.DEBUG)  # what bm25s does to its own logger on import
    try:
        bm25s.debug("Building index from IDs")
    finally:
        bm25s.setLevel(old)
    logging.getLogger("asyncio").debug("Using selector: EpollSelector")
    logging.getLogger("litellm").warning("some library chatter")
    logging.getLogger("uqh.harness.model.llama_server").info("local model server: starting smollm2")
    logging.getLogger("uqh.domains.qa.qa_base").warning("StrategyQA: using the fallback corpus\nsecond line")


def test_normal_run_prints_our_warnings_as_one_line_notices_and_nothing_else(capsys):
    console_log.configure(verbose=False, prog="uqh run")
    _emit_mixture()
    assert capsys.readouterr().err == "uqh run: note: StrategyQA: using the fallback corpus\n"


def test_verbose_shows_our_details_with_a_timestamp_and_other_libraries_warnings_only(capsys):
    console_log.configure(verbose=True, prog="uqh run")
    _emit_mixture()
    lines = capsys.readouterr().err.splitlines()
    stamp = r"\d\d:\d\d:\d\d\.\d{3} "
    assert re.fullmatch(stamp + r"WARNING litellm: some library chatter", lines[0])
    assert re.fullmatch(stamp + r"uqh\.harness\.model\.llama_server: local model server: starting smollm2", lines[1])
    assert re.fullmatch(stamp + r"WARNING uqh\.domains\.qa\.qa_base: StrategyQA: using the fallback corpus", lines[2])
    assert not any("bm25s" in ln or "selector" in ln for ln in lines)


def test_configure_twice_keeps_one_handler():
    console_log.configure(verbose=True)
    console_log.configure(verbose=False)
    assert sum(isinstance(h, console_log.StderrHandler) for h in logging.getLogger().handlers) == 1


def _run(tmp_path, srv, *extra):
    return ["run", "--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url, "--tasks", "1",
            "--out", str(tmp_path / "run"), "--no-progress", *extra]


def test_uqh_v_run_shows_the_endpoint_and_each_retry_with_its_reason(fake_server, tmp_path, capsys):
    with fake_server(solver, faults=["503"]) as srv:
        assert main(["-v", *_run(tmp_path, srv)]) == 0
    err = capsys.readouterr().err
    assert f"uqh.harness.config.build: agent model openai/fake at {srv.base_url} (" in err
    retry = [ln for ln in err.splitlines() if "transient failure" in ln]
    assert len(retry) == 1 and "503" in retry[0] and "retry 1/6" in retry[0], err


def test_normal_run_has_no_logger_format_lines(fake_server, tmp_path, capsys):
    with fake_server(solver, faults=["503"]) as srv:
        assert main(_run(tmp_path, srv)) == 0
    err = capsys.readouterr().err
    assert not re.search(r"^(DEBUG|INFO|WARNING) ", err, re.M) and "transient failure" not in err, err


# ------------------------------------------------------------------------------------- litellm's logging (issue 42)

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
#: A model string that makes `uqh run --dry-run` import litellm (a provider check), without a key: exit 2.
LITELLM_MODEL = "anthropic/claude-3-haiku-20240307"


def _uqh(tmp_path, *argv, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "LITELLM_LOG"}
    return subprocess.run([sys.executable, "-m", "uqh.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env={**base, "PYTHONPATH": str(REPO), **env})


def _dry_run(tmp_path, *pre, **env) -> subprocess.CompletedProcess:
    return _uqh(tmp_path, *pre, "run", "--domain", "arithmetic", "--tasks", "1", "--model", LITELLM_MODEL,
                "--out", str(tmp_path / "r"), "--dry-run", **env)


def test_uqh_v_prints_nothing_of_litellm_on_stdout(tmp_path):
    """`uqh -v` printed litellm's DEBUG lines on stdout (its own handler): now none anywhere by default, and with
    LITELLM_LOG=DEBUG they go through uqh's handler on stderr."""
    done = _dry_run(tmp_path, "-v")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert "LiteLLM" not in done.stderr and "ANTHROPIC_API_KEY" in done.stderr
    done = _dry_run(tmp_path, "-v", LITELLM_LOG="DEBUG")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert re.search(r"^\d\d:\d\d:\d\d\.\d{3} LiteLLM: ", done.stderr, re.M), done.stderr


@pytest.mark.parametrize("value,expected", [("bogus", "LITELLM_LOG='bogus' is not a log level"),
                                            ("", "needs ANTHROPIC_API_KEY"), (" debug ", "needs ANTHROPIC_API_KEY")])
def test_a_bad_or_empty_litellm_log_is_no_traceback(tmp_path, value, expected):
    done = _dry_run(tmp_path, LITELLM_LOG=value)
    assert "Traceback" not in done.stderr and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert done.returncode == 2 and line.startswith("uqh run: error: ") and expected in line


def test_litellm_log_is_checked_and_normalised(monkeypatch):
    env = {"LITELLM_LOG": ""}
    console_log.check_litellm_log(env)
    assert env == {}
    env = {"LITELLM_LOG": " info"}
    console_log.check_litellm_log(env)
    assert env == {"LITELLM_LOG": "INFO"}
    with pytest.raises(console_log.UserError, match="not a log level"):
        console_log.check_litellm_log({"LITELLM_LOG": "verbose"})


@pytest.mark.parametrize("argv", [[], ["-v"]])
def test_no_command_is_usage_on_stderr_and_exit_2(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: uqh") and "    run " in err
