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
