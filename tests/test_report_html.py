"""The HTML report in headless Chromium through Playwright: traces first with filters, the trace table, the
collapsible sections, screenshots that are not blank, and no console error.

Without Chromium or Playwright the tests are skipped, or fail under CI (tests/environment.py): scripts/setup.sh
installs Debian's chromium, and playwright comes with the dev extras.
"""
from __future__ import annotations

import importlib.util
import io
import os
from pathlib import Path

import numpy as np
import pytest

from environment import unavailable
from report_fixtures import Ep, tau2_like, webshop_like, write_run
from uqh.reports.report.browser import browser, find_chromium, open_report
from uqh.reports.report.write_report import ReportOptions, build_report
from uqh.rundir.schema import StopReason

CHROMIUM = find_chromium()
PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
if CHROMIUM is None or not PLAYWRIGHT:
    unavailable("chromium or playwright is not installed (scripts/setup.sh installs both)", allow_module_level=True)

#: Set UQH_SCREENSHOT_DIR to keep the screenshots (they go to the test's tmp dir otherwise).
SHOTS = os.environ.get("UQH_SCREENSHOT_DIR")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    res = build_report([webshop_like(d / "ws"), tau2_like(d / "t2")], d / "out", ReportOptions(n_bootstrap=30))
    return res.html


@pytest.fixture(scope="module")
def chromium():
    with browser(CHROMIUM) as b:
        yield b


def _not_blank(png: bytes) -> bool:
    import matplotlib.image as mpimg

    pixels = mpimg.imread(io.BytesIO(png), format="png")
    return png[:8] == b"\x89PNG\r\n\x1a\n" and float(np.std(pixels)) > 0.02


def _rows(page, selector: str) -> list[list[str]]:
    return page.eval_on_selector_all(selector, "trs => trs.map(tr => Array.from(tr.cells).map(td => td.textContent))")


def test_traces_come_first_filter_to_failed_read_the_trace_table_and_screenshot(report, chromium, tmp_path):
    page, errors = open_report(chromium, report, url_hash="traces")
    order = page.eval_on_selector_all("main > section", "ss => ss.map(s => s.id)")
    assert order[:3] == ["traces", "comparison", "audit"] and "sensitivity" in order
    # the analyses below are collapsed (the audit open): the page is a few screens, not ~10,000 px
    assert page.evaluate("document.querySelector('#sensitivity details').open") is False
    assert page.evaluate("document.body.scrollHeight") < 4500
    assert page.inner_text("#trace-count") == "14 of 14 trajectories"

    page.check("#filter-failed")
    assert page.inner_text("#trace-count") == "10 of 14 trajectories"  # 4 clean successes left out
    listed = _rows(page, "#trace-list tbody tr")
    assert len(listed) == 10 and all(row[4] != "1" for row in listed)  # Y = 1 trajectories are gone
    assert {row[3] for row in listed} == {"clean", "max_steps", "parse_error", "tool_error", "env_terminated"}
    page.select_option("#filter-stop", "max_steps")
    listed = _rows(page, "#trace-list tbody tr")
    assert [row[1] for row in listed] == ["d#0", "e#0", "f#0"]

    page.click("#trace-list tbody tr:nth-child(2)")  # e#0: 4 steps, censored
    assert page.get_attribute("#trace-plot", "data-episode") == "e#0"
    assert "#trace=0/e%230" in page.url
    header = page.eval_on_selector_all("#trace-steps thead th", "ths => ths.map(th => th.textContent)")
    assert header[:3] == ["t", "action", "observation"]
    assert header[3:] == ["Verbal confidence", "Completion token probability", "Completion entropy confidence",
                          "Action-span token probability", "Action-span entropy confidence",
                          "SAUP situation-weighted uncertainty exp(−U)", "Verbal confidence (Platt)",
                          "Base rate ȳ = 0.500"]  # one column per predictor with values (no self-consistency here)
    steps = _rows(page, "#trace-steps tbody tr")
    assert [r[0] for r in steps] == ["1", "2", "3", "4"] and steps[0][1] == "Search[q1]"
    assert steps[0][3] == "0.800" and steps[0][-1] == "0.500"
    assert "outcome unobserved" in page.inner_text("#trace-summary")

    shot = Path(SHOTS or tmp_path) / "report_traces.png"
    page.locator("#traces").screenshot(path=str(shot))
    assert _not_blank(shot.read_bytes())
    page.goto(report.resolve().as_uri() + "#traces")  # the page as linked: the traces on the first screen
    page.wait_for_selector("body[data-trace-ready='1']", state="attached")
    assert _not_blank(page.screenshot())
    assert errors == []


def test_series_styles_missing_series_hover_and_legend(report, chromium):
    page, errors = open_report(chromium, report, url_hash="trace=0/e%230")
    series = page.eval_on_selector_all("#trace-plot g.series", "gs => gs.map(g => g.getAttribute('data-predictor'))")
    # the self-consistency predictors have no value in this run, the Platt stream none on this censored
    # trajectory: not drawn, and said so
    assert series == ["verbal", "token_prob", "token_entropy", "action_prob", "action_entropy", "saup", "base_rate"]
    assert page.inner_text("#trace-missing") == ("No values (not drawn): Self-consistency mode frequency, "
                                                 "Self-consistency agreement, Reflexive P(True) (probe), "
                                                 "Observation surprise exp(−NLL) (probe), "
                                                 "True q_t (oracle domains), Verbal confidence (Platt).")
    styles = page.eval_on_selector_all(
        "#trace-plot g.series polyline", "ps => ps.map(p => p.getAttribute('stroke') + ' ' + p.getAttribute('stroke-dasharray'))")
    assert len(styles) == len(set(styles)) == 7  # no two series look alike
    page.hover("#trace-plot rect.band >> nth=0")
    tip = page.inner_text("#trace-tooltip")
    assert "action Search[q1]" in tip and "observation observation 1 of e#0 <b>&amp;</b>" in tip
    assert "Verbal confidence: 0.800" in tip and "<confidence> 0.8" in tip
    page.click("#trace-legend .legend-item >> nth=0")
    assert page.evaluate("document.querySelector('#trace-plot g.series').style.display") == "none"
    page.click("#trace-list tbody tr >> nth=0")  # another trajectory: the series stays hidden
    assert page.evaluate("document.querySelector('#trace-plot g.series').style.display") == "none"
    assert errors == []


def test_a_link_to_a_collapsed_section_opens_it(report, chromium):
    page, errors = open_report(chromium, report, url_hash="sensitivity")
    assert page.evaluate("document.querySelector('#sensitivity details').open") is True
    page.click("nav a[href='#fixed-rank']")
    # the page opens it on the hashchange event, after the click returns: wait for it (fails after 5 s)
    page.wait_for_function("document.querySelector('#fixed-rank details').open === true", timeout=5000)
    assert page.locator("table.comparison tr.group").count() == 2  # one heading per run in the comparison
    assert errors == []


def test_hostile_text_is_shown_as_text_and_missing_values_break_the_line(chromium, tmp_path):
    nasty = "</script><script>window.__alerted=1</script><img src=x onerror=\"window.__alerted=2\">"
    d = write_run(tmp_path / "r", "webshop", 3, [
        Ep("x", StopReason.clean, [0.9, None, 0.8], outcome=1, token_p=[0.9, 0.8, 0.7], actions=[nasty, "Click[a]", "Click[b]"]),
        Ep("y", StopReason.clean, [0.3], outcome=0, token_p=[0.4]),
        Ep("z", StopReason.clean, [0.6, 0.7], outcome=1, token_p=[0.5, 0.6]),
    ])
    res = build_report([d], tmp_path / "out", ReportOptions(n_bootstrap=20))
    page, errors = open_report(chromium, res.html, url_hash="trace=0/x%230")
    assert errors == [] and page.evaluate("window.__alerted || 0") == 0
    assert page.inner_text("#trace-steps tbody tr:nth-child(1) td:nth-child(2)") == nasty
    # verbal has a missing middle step: two points, no connecting line; the other series are complete
    dots = page.locator("#trace-plot g.series[data-predictor='verbal'] circle").count()
    lines = page.locator("#trace-plot g.series[data-predictor='verbal'] polyline").count()
    assert (dots, lines) == (2, 0) and page.locator("#trace-plot polyline").count() == 4 + 1 + 1  # 4 token streams + SAUP + base rate
