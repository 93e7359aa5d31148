"""End to end (issue 29): arithmetic on the fake OpenAI server with censored prefixes, `uqh continue --sample`,
then `uqh report --continuations`: the "Censored prefixes: exact vs simple" section's CSVs equal the scoring API's
numbers, the identity holds to 1e-12, the population is stated, and the page shows every new section in Chromium.
"""
from __future__ import annotations

import csv
import importlib.util

import pytest

from environment import unavailable

from uqh.cli import main as uqh
from uqh.harness.runner import run_batch
from uqh.rundir.reader import RunDir
from uqh.scoring.pipeline import ScoreOptions
from uqh.scoring.qz.prefixes import censored_prefix_audit, retained_prefixes
from uqh.scoring.registry import row_label
from uqh.scoring.streams import load_run
from uqh.harness.config.settings import BatchSettings
from test_continuation import CALC, FINISH, Responder, _answer, make_config

TASKS = [f"arith-{i:04d}" for i in range(30)]
B, MIN_VALID = 40, 2


class MixedSource(Responder):
    """Source mode: an episode's first call decides by its seed -- finish right, finish wrong, or keep calculating
    until the budget (censored) -- with a confidence that varies with the seed; branch mode as Responder."""

    def __call__(self, req: dict) -> str:
        if self.mode != "source":
            return super().__call__(req)
        seed = req["seed"]
        conf = 0.1 + (seed % 9) / 10
        if any(m["role"] == "assistant" for m in req["messages"]) or seed % 4 >= 2:
            return CALC.format(c=conf)
        answer = _answer(req["messages"][1]["content"])
        return FINISH.format(a=answer if seed % 4 == 0 else answer + 1).replace("0.9", f"{conf:.2f}")


def _csv(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def _num(s):
    return None if s == "" else float(s)


@pytest.fixture(scope="module")
def reported(tmp_path_factory, fake_server_module):
    base = tmp_path_factory.mktemp("prefixes")
    responder = MixedSource()
    srv = fake_server_module(responder)
    src = base / "source"
    assert run_batch(make_config("arithmetic", TASKS, srv.base_url, step_budget=2), src, settings=BatchSettings(progress=False)).ok
    assert RunDir.open(src).censored_episodes()  # the run has censored prefixes to continue
    responder.mode = "branch"
    cont = base / "cont"
    assert uqh(["continue", str(src), "--sample", "6", "--seed", "5", "--branches", "10", "--extra-steps", "2",
                "--out", str(cont), "--no-progress", "--min-valid", str(MIN_VALID), "--bootstrap", "10"]) == 0
    out = base / "report"
    assert uqh(["report", str(src), "--out", str(out), "--bootstrap", str(B), "--continuations", str(cont),
                "--min-valid", str(MIN_VALID), "--max-traces", "5"]) == 0
    return src, cont, out


@pytest.fixture(scope="module")
def fake_server_module():
    from fake_openai_server import FakeOpenAIServer

    servers = []

    def make(responder):
        s = FakeOpenAIServer(responder).__enter__()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def test_csv_values_equal_the_scoring_api(reported):
    src, cont, out = reported
    prefixes, counts, _ = retained_prefixes(RunDir.open(cont), min_valid=MIN_VALID, seed=0)
    audit = censored_prefix_audit(load_run(src), prefixes, counts, str(cont),
                                  predictors=ScoreOptions().predictor_names(), n_boot=B, seed=0)
    assert counts.sampled == 6 and counts.selection["seed"] == 5 and counts.retained >= 1
    rows = _csv(out / "prefix_exact_predictors.csv")
    scored = [r for r in audit.rows if r.n > 0]  # streams without a value on any retained prefix are left out
    absent = {row_label(r.predictor, r.calibration) for r in audit.rows if r.n == 0}
    assert absent and len(rows) == len(scored) < len(audit.rows)
    assert all(int(r["n"]) > 0 for r in rows + _csv(out / "prefix_unresolved_sensitivity.csv"))
    page = (out / "report.html").read_text()
    note = next(line for line in page.splitlines() if "left out of the predictor tables" in line)
    assert all(label in note for label in absent)  # ... and named in one line
    for got, exp in zip(rows, scored):
        assert (got["Predictor"], got["Weight schedule"]) == (row_label(exp.predictor, exp.calibration), exp.weights)
        assert int(got["n"]) == exp.n
        assert _num(got["Simple"]) == exp.simple.mean and _num(got["Exact-MC"]) == exp.exact.mean
        assert _num(got["Δ exact − simple"]) == exp.difference.mean
        assert _num(got["Δ CI low"]) == exp.difference.ci_low
        if exp.n:
            assert _num(got["Identity max error"]) <= 1e-12 and _num(got["Eq. 17 max error"]) <= 1e-12
    assert rows[0]["Predictor"] == "Verbal confidence (Platt)" and rows[0]["Weight schedule"] == "linear-front"
    assert int(rows[0]["n"]) == counts.retained  # the primary row is over every retained prefix
    dist = _csv(out / "prefix_qz_distribution.csv")
    assert len(dist) == 1 and int(dist[0]["Retained"]) == counts.retained and int(dist[0]["Sampled"]) == 6
    assert _num(dist[0]["Mean q̂_Z"]) == audit.distribution.mean
    primary = _csv(out / "prefix_exact_primary.csv")
    assert [r["Quantity"] for r in primary[:3]] == ["TPS cen,simple", "TPS cen,exact-MC", "Δ exact − simple"]
    assert _num(primary[2]["Value"]) == audit.rows[0].difference.mean
    sens = _csv(out / "prefix_unresolved_sensitivity.csv")
    assert _num(sens[0]["Δ unresolved as failures"]) == audit.rows[0].unresolved_as_failure.mean
    bias = _csv(out / "prefix_plugin_bias.csv")
    assert len(bias) == 1 and int(bias[0]["n"]) == (audit.plugin_bias.n if audit.plugin_bias else 0)
    page = (out / "report.html").read_text()
    assert f"{counts.retained} retained" in page and "6 sampled (random sample of 6 (seed 5" in page


def test_a_partial_continuation_is_labelled_with_its_branch_counts(reported, fake_server, tmp_path):
    """Issue 43: a continuation that stopped part-way (here: model failures on some branches) is reported as
    "k of N branches: partial", with a note, not as a finished one."""
    src, _, _ = reported
    responder = MixedSource()
    responder.mode = "branch"
    cont, out = tmp_path / "partial", tmp_path / "report"
    with fake_server(responder, faults=["400"] * 3) as srv:
        rc = uqh(["continue", str(src), "--sample", "2", "--seed", "5", "--branches", "4", "--extra-steps", "2",
                  "--concurrency", "1", "--api-base", srv.base_url, "--out", str(cont), "--no-progress",
                  "--max-retries", "0"])
    written = len(RunDir.open(cont).episodes())
    assert rc == 0 and 0 < written < 8  # 3 branches failed: the continuation did not finish (it says so)
    assert uqh(["report", str(src), "--out", str(out), "--bootstrap", "5", "--continuations", str(cont),
                "--min-valid", "1", "--max-traces", "0"]) == 0
    [dist] = _csv(out / "prefix_qz_distribution.csv")
    assert dist["Branches"] == f"{written} of 8 branches"
    assert dist["Continued"].endswith(f"({written} of 8 branches: partial)")
    page = (out / "report.html").read_text()
    assert f"PARTIAL: the continuation has {written} of 8 branches" in page


def test_no_retained_prefix_says_so_instead_of_asking_for_continuations(reported, tmp_path):
    """Issue 43: with --continuations given and 0 prefixes retained, the empty tables say why, never "Give
    --continuations"."""
    src, cont, _ = reported
    out = tmp_path / "report"
    assert uqh(["report", str(src), "--out", str(out), "--bootstrap", "5", "--continuations", str(cont),
                "--min-valid", "50", "--max-traces", "0"]) == 0
    page = (out / "report.html").read_text()
    section = page[page.index('<section id="censored-prefixes">'):]
    section = section[:section.index("</section>")]
    assert "Give --continuations" not in section
    assert "No retained prefix to score" in section and "0 of 6 retained (&gt;= 50 resolved branches needed" in section
    for name in ("prefix_exact_primary", "prefix_exact_predictors", "prefix_unresolved_sensitivity"):
        assert _csv(out / f"{name}.csv") == []  # no n = 0 rows
    assert section.count("No retained prefix to score") >= 3  # each empty table says why
    [dist] = _csv(out / "prefix_qz_distribution.csv")
    assert dist["Retained"] == "0" and dist["Branches"] == "60 of 60 branches"


def test_continuations_user_errors_write_nothing(reported, tmp_path, capsys):
    src, cont, _ = reported
    other = tmp_path / "other"
    cases = [([str(cont), "--continuations", str(cont)], "not among the report's runs"),  # source not given
             ([str(src), "--continuations", str(src)], "is not a continuation run"),
             ([str(src), "--continuations", str(tmp_path / "nope")], "is not a run directory"),
             ([str(src), "--continuations", str(cont), "--min-valid", "0"], "--min-valid must be at least 1")]
    for args, msg in cases:
        rc = uqh(["report", *args, "--out", str(other), "--bootstrap", "5"])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err, (args, err)
        assert not other.exists()


@pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright not installed")
def test_page_shows_every_new_section_in_chromium(reported):
    from uqh.reports.report.browser import browser, find_chromium, open_report

    chromium = find_chromium()
    if chromium is None:
        unavailable("chromium not installed")
    _, _, out = reported
    with browser(chromium) as b:
        page, errors = open_report(b, out / "report.html", url_hash="censored-prefixes")
        assert page.evaluate("document.querySelector('#censored-prefixes details').open") is True
        names = page.eval_on_selector_all("#censored-prefixes [data-table]", "ts => ts.map(t => t.dataset.table)")
        assert names == ["prefix_qz_distribution", "prefix_exact_primary", "prefix_plugin_bias",
                         "prefix_exact_predictors", "prefix_unresolved_sensitivity"]
        assert page.locator("#censored-prefixes [data-table='prefix_exact_predictors'] tbody tr").count() > 0
        for section in ("sign-regime", "base-rate-margin"):
            assert page.locator(f"section#{section}").count() == 1
        assert errors == []
