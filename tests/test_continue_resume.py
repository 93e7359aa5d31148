"""`uqh continue` resumed: with a larger --branches (the finished branches kept, the result that of a fresh run
with the larger M, under both stop rules), a smaller one refused, the no-retained hint that says so, and the
counts an interrupted sequential run reports -- through the CLI, the real runner and the fake server."""
from __future__ import annotations

import signal
import threading
import time

import pytest

from uqh.cli import main as uqh
from uqh.harness.runner import run_batch
from uqh.harness.config.settings import BatchSettings
from run_files import read_episodes, read_manifest
from test_continuation import Responder, make_config, tree_digest
from test_qz_sequential import TASKS as SIX_TASKS
from test_qz_sequential import PrefixResponder, decisions_file, strip


def _source(tmp_path, fake_server, responder, tasks):
    """A source run whose episodes all stop on max_steps; the server then answers in ``branch`` mode."""
    srv = fake_server(responder).__enter__()
    src = tmp_path / "src"
    assert run_batch(make_config("arithmetic", tasks, srv.base_url, step_budget=2), src, settings=BatchSettings(progress=False)).ok
    responder.mode = "branch"
    srv.requests.clear()
    return src, srv, responder


@pytest.fixture
def three(tmp_path, fake_server):
    """Three prefixes; a branch's fate is a function of its seed (tests/test_continuation.py::Responder)."""
    return _source(tmp_path, fake_server, Responder(), [f"arith-{i:04d}" for i in range(3)])


@pytest.fixture
def six(tmp_path, fake_server):
    """Six prefixes; the prefix decides its policy (tests/test_qz_sequential.py::PrefixResponder)."""
    return _source(tmp_path, fake_server, PrefixResponder(), SIX_TASKS)


def continue_argv(src, out, branches: int, *extra: str) -> list[str]:
    return ["continue", str(src), "--out", str(out), "--branches", str(branches), "--extra-steps", "1",
            "--min-valid", "1", "--bootstrap", "20", "--no-progress", *extra]


def own_calls(ep) -> int:
    """Model calls a branch made (its copied prefix steps made none)."""
    return sum(len(st.attempts) for st in ep.steps[ep.prefix_steps:]) + len(ep.failed_step or [])


# ------------------------------------------------------------------------------------------ a larger --branches


def test_larger_branches_keeps_the_finished_ones_and_equals_a_fresh_run(three, tmp_path, capsys):
    src, srv, _ = three
    out, fresh = tmp_path / "cont", tmp_path / "fresh"
    assert uqh(continue_argv(src, out, 2)) == 0
    before = (out / "episodes.jsonl").read_bytes()
    srv.requests.clear()
    capsys.readouterr()

    assert uqh(continue_argv(src, out, 3)) == 0
    printed = capsys.readouterr().out
    assert f"--branches 3: {out} had 2 per prefix; its finished branches are kept" in printed
    assert "3 prefixes selected, 0 skipped (not replayable), 9 branches written" in printed
    assert (out / "episodes.jsonl").read_bytes().startswith(before)  # branches 0-1 untouched, not run again
    new = [ep for ep in read_episodes(out) if ep.branch_index == 2]
    assert len(new) == 3 and len(read_episodes(out)) == 9
    assert len(srv.requests) == sum(own_calls(ep) for ep in new)  # only the new branches' calls
    assert {ep.seed for ep in new} <= {r["seed"] for r in srv.requests}

    assert uqh(continue_argv(src, fresh, 3)) == 0
    assert (out / "qz.jsonl").read_text() == (fresh / "qz.jsonl").read_text()
    grown, made = read_manifest(out), read_manifest(fresh)
    assert grown.config.continuation["branches"] == 3 and grown.config_hash == made.config_hash
    assert grown.info["branches_grown_from"] == [2] and "branches_grown_from" not in made.info
    by_id = {ep.episode_id: strip(ep) for ep in read_episodes(fresh)}
    assert {ep.episode_id: strip(ep) for ep in read_episodes(out)} == by_id


def test_smaller_branches_or_another_change_is_refused_and_writes_nothing(three, tmp_path, capsys):
    src, srv, _ = three
    out = tmp_path / "cont"
    assert uqh(continue_argv(src, out, 3)) == 0
    srv.requests.clear()
    capsys.readouterr()
    before = tree_digest(out)

    assert uqh(continue_argv(src, out, 2)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"uqh continue: error: {out} holds a continuation with --branches 3; it cannot be resumed "
                          "with fewer (2)") and "--branches 3 or more" in err
    # a larger M with anything else changed: the fields that differ are named, M not among them
    argv = continue_argv(src, out, 4)
    argv[argv.index("--extra-steps") + 1] = "2"
    assert uqh(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "differs in: continuation.extra_steps, step_budget)" in err
    assert tree_digest(out) == before and srv.requests == []


def test_no_retained_hint_names_a_command_that_is_accepted(three, tmp_path, capsys):
    src, srv, responder = three
    responder.mode = "source"  # every branch keeps calculating: unresolved, so no prefix is retained
    out = tmp_path / "cont"
    assert uqh(continue_argv(src, out, 2)) == 0
    printed = capsys.readouterr().out
    assert ("no prefix retained: none of the 3 continued prefixes has 1 valid resolved branches (--min-valid 1)"
            in printed)
    assert "(the same command with a --branches larger than 2 keeps the finished ones)." in printed
    assert "lower --min-valid" not in printed  # it is at its minimum already

    rc = uqh(["continue", str(src), "--out", str(out), "--qz-only", "--min-valid", "2", "--bootstrap", "20"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert ("(`uqh continue` without --qz-only with a --branches larger than 2 keeps the finished ones) or lower "
            "--min-valid." in printed)

    n = len(srv.requests)
    assert uqh(continue_argv(src, out, 3)) == 0  # what the hint says: accepted, only the new branches run
    assert len(read_episodes(out)) == 9 and len(srv.requests) - n == 3


def test_larger_maximum_of_a_sequential_rule_takes_the_decisions_of_a_fresh_run(six, tmp_path, capsys):
    """ci:0.3 at M = 6: prefixes 0-2 stop at the half-width after 5 branches (below M), the others at M. At M = 8
    the first keep their decision and branches, the others get the rounds 7 and 8 -- as a fresh M = 8 run."""
    src, srv, _ = six
    out, fresh = tmp_path / "cont", tmp_path / "fresh"
    rule = ("--stop-rule", "ci:0.3", "--concurrency", "4")
    assert uqh(continue_argv(src, out, 6, *rule)) == 0
    at_six = {d["episode_id"]: d for d in decisions_file(out)}
    assert [at_six[f"{t}#0"]["stopped_by"] for t in SIX_TASKS] == ["half_width"] * 3 + ["max_branches"] * 3
    n_six, calls = len(read_episodes(out)), srv.n_requests
    capsys.readouterr()

    assert uqh(continue_argv(src, out, 8, *rule)) == 0
    assert "--branches 8: " in capsys.readouterr().out
    assert srv.n_requests - calls == len(read_episodes(out)) - n_six  # one call per new branch, none per old one
    assert uqh(continue_argv(src, fresh, 8, *rule)) == 0
    assert decisions_file(out) == decisions_file(fresh)
    assert [d["stopped_by"] for d in decisions_file(out)][:3] == ["half_width"] * 3
    assert ({ep.episode_id: strip(ep) for ep in read_episodes(out)}
            == {ep.episode_id: strip(ep) for ep in read_episodes(fresh)})
    assert (out / "qz.jsonl").read_text() == (fresh / "qz.jsonl").read_text()
    cont = read_manifest(out).config.continuation
    assert cont["branches"] == 8 and cont["rounds"] == [1, 5, 6, 7, 8]
    assert read_manifest(out).config_hash == read_manifest(fresh).config_hash


# ------------------------------------------------------------------------------------------ interrupted counts


class InterruptAt:
    """A responder whose ``n``-th request sends SIGINT to the main thread (a Ctrl-C while that call is in
    flight) and is answered only after the run had time to stop."""

    def __init__(self, inner, n: int):
        self.inner, self.n, self.seen = inner, n, 0

    def __call__(self, req: dict) -> str:
        self.seen += 1
        if self.seen == self.n:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(0.5)
        return self.inner(req)


@pytest.mark.parametrize("rule, at, planned", [
    ("ci:0.3", 3, 6 * 1),  # in round 1: one branch per prefix planned
    ("ci:0.3", 9, 6 * 5),  # in round 2: five
    ("fixed", 9, 6 * 6),
])
def test_interrupted_continuation_reports_written_and_unfinished_branches(six, tmp_path, capsys, rule, at, planned):
    src, srv, responder = six
    srv.responder = InterruptAt(responder, at)
    out = tmp_path / "cont"
    argv = continue_argv(src, out, 6, "--stop-rule", rule, "--concurrency", "1")
    assert uqh(argv) == 130
    captured = capsys.readouterr()
    written = len(read_episodes(out))
    assert 0 < written < planned
    assert f"6 prefixes selected, 0 skipped (not replayable), {written} branches written" in captured.out
    assert (f"uqh continue: interrupted by SIGINT; {planned - written} branches not finished; re-run the same "
            "command to resume" in captured.err)

    srv.responder = responder
    assert uqh(argv) == 0  # resumes to the end
    assert "branches not finished" not in capsys.readouterr().err
