"""`uqh report --judgments DIR --certify FILE` (issue 29): the judge analysis and the certificate in the report,
with the same tables as `uqh judge --report` / `uqh certify`, and the trace explorer linking a trajectory to its
judgments (checked in Chromium through Playwright)."""
from __future__ import annotations

import importlib.util

import pytest

from environment import unavailable

from uqh.cli import main as uqh
from uqh.reports.certify_tables import tables as certify_tables
from uqh.reports.judge_tables import judge_tables
from uqh.scoring.certify.certificate import CertifyItem, CertifyOptions, certify_items
from uqh.scoring.judges.analysis import analyse_judgments
from test_judge_analysis import EPISODES, SCORES, judge_dir  # noqa: F401  (fixture)

B = 50


@pytest.fixture(scope="module")
def certificate(tmp_path_factory, judge_dir):  # noqa: F811
    items = [CertifyItem(f"t{i}", ("a", "a", "b") if i % 3 else ("a", "b", "c"), (i % 4 != 0, False, i % 5 == 0))
             for i in range(24)]
    result = certify_items(items, CertifyOptions(resplits=5, n_bootstrap=20), run_dir=str(judge_dir.parent / "run"),
                           domain="arithmetic", model="m")
    path = tmp_path_factory.mktemp("cert") / "cert.json"
    path.write_text(result.model_dump_json(indent=2))
    return path, result


@pytest.fixture(scope="module")
def reported(judge_dir, certificate, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("rep") / "out"
    run = judge_dir.parent / "run"
    assert uqh(["report", str(run), "--out", str(out), "--bootstrap", str(B), "--judgments", str(judge_dir),
                "--certify", str(certificate[0])]) == 0
    return run, out


def test_tables_equal_the_judge_and_certify_commands(reported, judge_dir, certificate):  # noqa: F811
    _, out = reported
    for t in judge_tables(analyse_judgments(judge_dir, n_bootstrap=B, seed=0)):
        assert (out / f"{t.name}.csv").read_text() == t.to_csv()
    for t in certify_tables([certificate[1]]):
        assert (out / f"{t.name}.csv").read_text() == t.to_csv()
    page = (out / "report.html").read_text()
    assert 'id="judges"' in page and 'id="certificate"' in page
    assert 'data-table="judge_scores"' in page and 'data-table="certify_summary"' in page


def test_user_errors_write_nothing(reported, judge_dir, certificate, tmp_path, capsys):  # noqa: F811
    run, _ = reported
    from scoring_fixtures import make_episode, write_run_dir

    other = write_run_dir(tmp_path / "other", [make_episode("x#0", "clean", [0.4], outcome=1),
                                               make_episode("y#0", "clean", [0.6], outcome=0)])
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a certificate"}')
    binary = tmp_path / "binary.json"
    binary.write_bytes(bytes(range(256)))
    foreign = tmp_path / "foreign.json"
    foreign.write_text(certificate[0].read_text().replace(str(run), str(other)))
    out = tmp_path / "never"
    cases = [([str(run), "--judgments", str(tmp_path / "nope")], "is not a judge directory"),
             ([str(other), "--judgments", str(judge_dir)], "none of the report's runs"),
             ([str(run), "--certify", str(bad)], "is not a certificate"),
             ([str(run), "--certify", str(binary)], "is not a UTF-8 text file"),
             ([str(run), "--certify", str(foreign)], f"is the certificate of {other}, not of the report's runs"),
             ([str(run), "--certify", str(tmp_path / "missing.json")], "cannot read --certify")]
    for args, msg in cases:
        rc = uqh(["report", *args, "--out", str(out), "--bootstrap", "5"])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, (args, err)
        assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright not installed")
def test_trace_explorer_shows_a_trajectorys_judgments(reported):
    from uqh.reports.report.browser import browser, find_chromium, open_report

    chromium = find_chromium()
    if chromium is None:
        unavailable("chromium not installed")
    _, out = reported
    with browser(chromium) as b:
        page, errors = open_report(b, out / "report.html", url_hash="trace=0/e2%230")
        rows = page.eval_on_selector_all("#trace-judgments .judgment", "ds => ds.map(d => d.textContent)")
        expected = sorted((m.value, r) for (e, m, r) in SCORES if e == "e2#0")
        assert len(rows) == len(expected) == 4
        assert rows[0].startswith("GF ") and "repeat 0 · 0/3 · cited steps 2, 3" in rows[0]
        assert any("missing (bad)" in r for r in rows)  # LC repeat 1 never parsed: shown as missing
        page.click("#trace-judgments a[href='#judges']")
        page.wait_for_function("document.querySelector('#judges details').open === true", timeout=5000)
        assert page.locator("#judges [data-table='judge_scores'] tbody tr").count() > 0
        page.goto((out / "report.html").resolve().as_uri() + "#trace=0/e5%230")
        page.wait_for_selector("body[data-trace-ready='1']", state="attached")
        assert page.locator("#trace-judgments .judgment").count() == 3  # e5's LC repeat 1 was never made
        assert errors == []


def test_a_certificate_matches_its_run_also_by_a_relative_path(tmp_path):
    from uqh.reports.judged_runs import same_run

    run = tmp_path / "exp" / "run"
    assert same_run(str(run), run) and same_run("exp/run", run) and same_run("./run", run)
    assert not same_run("other/run", run) and not same_run(str(tmp_path / "run"), run) and not same_run("..", run)
