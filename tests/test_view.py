"""`uqh view` in headless Chromium through Playwright: the run list (a bad run shown in its row among good ones),
a run's trajectory list filtered to failed ones and sorted, one trajectory's chart series, transcript and token
heatmap (the top-5 alternatives on hover equal the sidecar's), the Platt stream equal to scoring's, and the run list
and run page following a `uqh run` that is writing, without a reload.

Without Chromium or Playwright the tests are skipped, or fail under CI (tests/environment.py). Set
UQH_SCREENSHOT_DIR to keep the three pages' screenshots (docs/view.md shows them: UQH_SCREENSHOT_DIR=docs/view).
"""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from environment import unavailable
from report_fixtures import tau2_like, user_token_p, webshop_like
from run_files import wait_for_lines
from test_runner import solver
from uqh.reports.report.browser import browser, find_chromium, watch_errors
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import EPISODES_FILE, MANIFEST_FILE
from view_server import serving

CHROMIUM = find_chromium()
PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
if CHROMIUM is None or not PLAYWRIGHT:
    unavailable("chromium or playwright is not installed (scripts/setup.sh installs both)", allow_module_level=True)

SHOTS = os.environ.get("UQH_SCREENSHOT_DIR")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("view")
    webshop_like(d / "ws")
    tau2_like(d / "nested" / "t2", user_tokens=True)
    (d / "broken").mkdir()
    (d / "broken" / MANIFEST_FILE).write_text("{not json")
    return d


@pytest.fixture(scope="module")
def server(runs):
    with serving(runs) as srv:
        yield srv


@pytest.fixture(scope="module")
def chromium():
    with browser(CHROMIUM) as b:
        yield b


def open_page(chromium, url: str, *, width: int = 1280, height: int = 900):
    page = chromium.new_page(viewport={"width": width, "height": height})
    errors = watch_errors(page)
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=20_000)
    return page, errors


def key_of(server, name: str) -> str:
    return next(k for k, r in server.viewer.runs.items() if r.path.name == name)


def rows(page, selector: str) -> list[list[str]]:
    return page.eval_on_selector_all(selector, "trs => trs.map(tr => Array.from(tr.cells).map(td => td.textContent))")


def shot(page, name: str, tmp_path: Path) -> None:
    target = Path(SHOTS) if SHOTS else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    png = page.screenshot(path=str(target / name), full_page=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_run_list_shows_every_run_and_a_bad_one_in_its_row(server, chromium, tmp_path):
    page, errors = open_page(chromium, server.url)
    listed = {r[0]: r for r in rows(page, "#run-list tbody tr")}
    assert set(listed) == {"ws", "t2", "broken"}  # t2 found below nested/, recursively
    ws = listed["ws"]
    assert ws[1:5] == ["run", "webshop", "openai/fake", "8 / 8"]
    assert ws[5] == "clean 4 · max_steps 3 · parse_error 1" and ws[6] == "0.500" and ws[7] == "—"
    assert ws[8] == "finished"
    assert "cannot read" in listed["broken"][1] and "manifest.json" in listed["broken"][1]
    assert page.get_attribute("#run-list tbody tr:has-text('broken')", "data-state") == "error"
    shot(page, "runs.png", tmp_path)
    assert errors == []


def test_the_heatmap_shows_the_simulated_users_turns_after_the_agent_steps(server, chromium):
    page, errors = open_page(chromium, server.url + f"run/{key_of(server, 't2')}/trajectory?id=4%230")
    blocks = page.eval_on_selector_all(
        ".token-step", "bs => bs.map(b => [b.dataset.role, b.querySelector('.token-head').textContent])")
    assert blocks == [["user", "user, opening turn"], ["agent", "step 1"], ["user", "user, reply to step 1"],
                      ["agent", "step 2"], ["user", "user, reply to step 2"]]
    user = page.locator(".token-step[data-role='user'][data-t='1'] .tok")
    assert user.all_inner_texts() == ["user0", "user1", "user2"]
    assert user.nth(0).get_attribute("class") == "tok"  # a user turn has no action span
    user.nth(0).hover()
    assert page.inner_text("#token-tooltip .chosen") == f'p = {user_token_p(1):.4f} for "user0"'
    assert errors == []


def test_run_page_filters_to_failed_and_sorts_by_a_predictor(server, chromium, tmp_path):
    page, errors = open_page(chromium, server.url + f"run/{key_of(server, 'ws')}")
    assert page.inner_text("#trace-count") == "8 of 8 trajectories"
    page.check("#filter-failed")
    assert page.inner_text("#trace-count") == "6 of 8 trajectories"  # a and c succeeded
    listed = rows(page, "#trajectory-list tbody tr")
    assert {r[0] for r in listed} == {"b#0", "d#0", "e#0", "f#0", "g#0", "h#0"} and all(r[3] != "1" for r in listed)
    page.select_option("#filter-stop", "max_steps")
    assert [r[0] for r in rows(page, "#trajectory-list tbody tr")] == ["d#0", "e#0", "f#0"]
    page.click("#trajectory-list th[data-col='verbal']")  # last verbal confidence, highest first
    assert [r[0] for r in rows(page, "#trajectory-list tbody tr")] == ["e#0", "d#0", "f#0"]  # 0.6, 0.2, 0.2
    page.uncheck("#filter-failed")
    page.select_option("#filter-stop", "")
    page.fill("#filter-text", "task h")
    assert [r[0] for r in rows(page, "#trajectory-list tbody tr")] == ["h#0"]
    page.fill("#filter-text", "")
    shot(page, "run.png", tmp_path)
    assert errors == []


def test_trajectory_chart_transcript_and_token_alternatives(server, chromium, tmp_path):
    key = key_of(server, "ws")
    page, errors = open_page(chromium, server.url + f"run/{key}/trajectory?id=e%230")
    series = page.eval_on_selector_all("#trace-plot g.series", "gs => gs.map(g => g.getAttribute('data-predictor'))")
    assert series == ["verbal", "token_prob", "token_entropy", "action_prob", "action_entropy", "base_rate"]
    ys = page.eval_on_selector_all("#trace-plot g.series[data-predictor='verbal'] circle",
                                   "cs => cs.map(c => parseFloat(c.getAttribute('cy')))")
    assert [round((1 - (y - 14) / 290), 3) for y in ys] == [0.8, 0.8, 0.6, 0.6]  # e#0's verbal confidences
    assert page.inner_text("#task-text") == "Task e"
    assert "stop reason max_steps" in page.inner_text("#trajectory-facts")
    head = page.eval_on_selector_all("#trace-steps thead th", "ths => ths.map(th => th.textContent)")
    assert head[:7] == ["t", "action", "observation", "think", "explanation", "<confidence>", "repairs"]
    steps = rows(page, "#trace-steps tbody tr")
    assert steps[1][:7] == ["2", "Search[q2]", "observation 2 of e#0 <b>&amp;</b>", "step 2", "x", "0.8", "0"]

    sidecar = RunDir.open(server.viewer.runs[key].path).episode_sidecar_rows("e#0")
    row = next(r for r in sidecar if r.t == 3)
    token = page.locator(".token-step[data-t='3'] .tok[data-i='1']")
    assert token.get_attribute("class") == "tok action"  # inside the action span [1, 3)
    token.hover()
    tip = rows(page, "#token-tooltip tr")
    expected = [[f'"{alt.token}"', f"{math.exp(alt.logprob):.4f}"] for alt in row.tokens[1].top_logprobs[:5]]
    assert tip == expected and len(tip) == 5
    assert page.inner_text("#token-tooltip .chosen") == f'p = {math.exp(row.tokens[1].logprob):.4f} for "tok1"'
    assert page.get_attribute(".token-step[data-t='3'] .tok[data-i='0']", "class") == "tok"
    # e#0 is censored: once the Platt map is fitted, the page says why it has no Platt value (and stops polling)
    page.wait_for_function("!document.getElementById('trace-summary').textContent.includes('being fitted')",
                           timeout=20_000)
    assert "no Platt value" in page.inner_text("#trace-summary")
    token.hover()
    shot(page, "trajectory.png", tmp_path)
    assert errors == []


def test_the_platt_stream_arrives_and_equals_scoring(server, chromium):
    from uqh.reports.scoring_calls import PRIMARY_PREDICTOR, PRIMARY_WEIGHTS
    from uqh.scoring.analyses import calibrated_stream
    from uqh.scoring.streams import load_run

    key = key_of(server, "ws")
    page, errors = open_page(chromium, server.url + f"run/{key}/trajectory?id=c%230")
    page.wait_for_selector("#trace-plot g.series[data-predictor='verbal_platt']", timeout=20_000)
    api = page.evaluate(f"fetch('/api/run/{key}/trajectory?id=c%230').then(r => r.json())")
    expected = calibrated_stream(load_run(server.viewer.runs[key].path), PRIMARY_PREDICTOR, PRIMARY_WEIGHTS)
    assert api["ep"]["values"]["verbal_platt"] == pytest.approx(list(expected.by_episode()["c#0"]), abs=1e-12)
    assert errors == []


def test_a_growing_run_is_followed_without_a_reload(fake_server, chromium, tmp_path):
    out = tmp_path / "live" / "run"
    with fake_server(solver, latency_s=0.25) as srv:
        cmd = [sys.executable, "-m", "uqh.cli", "run", "--domain", "arithmetic", "--model", "openai/fake",
               "--api-base", srv.base_url, "--tasks", "40", "--concurrency", "1", "--out", str(out), "--no-progress"]
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for_lines(out / EPISODES_FILE, 1, proc)
            with serving(tmp_path / "live") as viewer:
                page, errors = open_page(chromium, viewer.url)
                page.evaluate("window.__sameDocument = true")
                row = rows(page, "#run-list tbody tr")[0]
                first = int(row[4].split(" / ")[0])
                assert first < 40 and row[8] == "running"
                page.wait_for_function(
                    "n => parseInt(document.querySelector('#run-list tbody tr td:nth-child(5)').textContent) > n",
                    arg=first, timeout=30_000)
                assert page.evaluate("window.__sameDocument") is True  # grown in place, not reloaded
                run_page, run_errors = open_page(chromium, viewer.url + "run/0")
                run_page.evaluate("window.__sameDocument = true")
                shown = len(rows(run_page, "#trajectory-list tbody tr"))
                assert shown < 40, "the run finished before the run page opened: slow the fake server down"
                run_page.wait_for_function(
                    "n => document.querySelectorAll('#trajectory-list tbody tr').length > n", arg=shown, timeout=30_000)
                assert run_page.evaluate("window.__sameDocument") is True
                assert errors == [] and run_errors == []
        finally:
            proc.kill()
            proc.wait()


def test_an_episode_in_progress_is_shown_running_and_its_page_follows_it_to_the_end(chromium, tmp_path):
    """Through the real writer: a checkpoint of h#0 (1 step) is listed as running on the run page; its trajectory
    page draws the step so far (chart and token heatmap), draws the second step when the checkpoint grows, and
    shows the finished episode once its line lands, all without a reload."""
    from test_view_data import cut_last_episode, partial
    from uqh.harness.store.writer import RunStore

    run_dir = webshop_like(tmp_path / "runs" / "ws")
    ep, rows = cut_last_episode(run_dir)
    with RunStore.open(run_dir) as store, serving(tmp_path / "runs") as srv:
        store.write_checkpoint(partial(ep, rows, 1))
        page, errors = open_page(chromium, srv.url + "run/0")
        page.wait_for_selector("#trajectory-list tr[data-episode='h#0'][data-stop='running']", timeout=20_000)
        assert page.inner_text("#trace-count") == "8 of 8 trajectories"
        assert rows_of(page, "h#0")[2:5] == ["running", "—", "1"]

        traj, traj_errors = open_page(chromium, srv.url + "run/0/trajectory?id=h%230")
        traj.evaluate("window.__sameDocument = true")
        assert traj.get_attribute("body", "data-stop") == "running"
        assert points(traj, "token_prob") == 1 and traj.locator(".token-step").count() == 1
        assert "steps so far" in traj.inner_text("#trace-summary")
        store.write_checkpoint(partial(ep, rows, 2))
        traj.wait_for_function("document.querySelectorAll('.token-step').length === 2", timeout=20_000)
        assert points(traj, "token_prob") == 2 and len(rows_of_steps(traj)) == 2
        store.append_episode(ep, rows)
        traj.wait_for_selector("body[data-stop='clean']", timeout=20_000)
        assert "stop reason clean" in traj.inner_text("#trajectory-facts")
        assert traj.evaluate("window.__sameDocument") is True
        page.wait_for_selector("#trajectory-list tr[data-episode='h#0'][data-stop='clean']", timeout=20_000)
        assert errors == [] and traj_errors == []


def rows_of(page, episode_id: str) -> list[str]:
    return page.eval_on_selector(f"#trajectory-list tr[data-episode='{episode_id}']",
                                 "tr => Array.from(tr.cells).map(td => td.textContent)")


def rows_of_steps(page) -> list[list[str]]:
    return rows(page, "#trace-steps tbody tr")


def points(page, predictor: str) -> int:
    return page.locator(f"#trace-plot g.series[data-predictor='{predictor}'] circle").count()


def test_a_corrupt_middle_line_is_named_on_the_runs_own_page(chromium, tmp_path):
    run_dir = webshop_like(tmp_path / "runs" / "ws")
    lines = (run_dir / EPISODES_FILE).read_bytes().split(b"\n")
    lines[3] = lines[3][:200]  # d#0's line cut short in the middle of the file
    (run_dir / EPISODES_FILE).write_bytes(b"\n".join(lines))
    with serving(tmp_path / "runs") as srv:
        page, errors = open_page(chromium, srv.url + "run/0")
        notes = page.locator("#view-notes .note").all_inner_texts()
        assert len(notes) == 1 and notes[0].startswith(f"{run_dir / EPISODES_FILE}:4: not a valid Episode record")
        listed = [r[0] for r in rows(page, "#trajectory-list tbody tr")]
        assert listed == ["a#0", "b#0", "c#0", "e#0", "f#0", "g#0", "h#0"]  # the others are listed
        assert errors == []


def test_the_run_list_gains_a_new_run_and_loses_a_deleted_one_without_a_reload(chromium, tmp_path):
    import shutil

    webshop_like(tmp_path / "runs" / "ws")
    with serving(tmp_path / "runs") as srv:
        page, errors = open_page(chromium, srv.url)
        page.evaluate("window.__sameDocument = true")
        assert [r[0] for r in rows(page, "#run-list tbody tr")] == ["ws"]
        tau2_like(tmp_path / "runs" / "later" / "t2")
        page.wait_for_selector("#run-list tbody tr:has-text('t2')", timeout=30_000)
        shutil.rmtree(tmp_path / "runs" / "ws")
        page.wait_for_function("!document.querySelector('#run-list tbody').textContent.includes('ws')",
                               timeout=30_000)
        assert [r[0] for r in rows(page, "#run-list tbody tr")] == ["t2"]
        assert page.evaluate("window.__sameDocument") is True
        assert errors == []
