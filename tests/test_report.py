"""`uqh report`: every artefact is written, and its numbers are the scoring package's numbers."""
from __future__ import annotations

import csv
import io
import math
import re

import numpy as np
import pytest

from uqh.cli import main
from uqh.rundir.errors import UserError
from uqh.rundir.schema import StopReason
from report_fixtures import Ep, tau2_like, webshop_like, write_run
from uqh.reports.report.write_report import ReportOptions, build_report

B, SEED = 60, 3


def _csv(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def _num(s):
    return None if s == "" else float(s)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    ws, t2 = webshop_like(base / "ws"), tau2_like(base / "t2")
    res = build_report([ws, t2], base / "out", ReportOptions(n_bootstrap=B, seed=SEED, max_traces=5))
    return ws, t2, res


def test_every_artefact_is_written(report):
    _, _, res = report
    names = {p.name for p in res.out_dir.iterdir()}
    tables = ["termination_audit", "selection_diagnostic", "transparency__ws", "transparency__t2", "auq_scalar", "artificial_censoring",
              "platt_diagnostics", "calibration_invariance", "fixed_rank", "sensitivity", "censored_shift",
              "parse_error_sensitivity", "censored_exact", "sign_regime", "base_rate_margin", "prefix_qz_distribution",
              "prefix_exact_primary", "prefix_plugin_bias", "prefix_exact_predictors", "prefix_unresolved_sensitivity",
              "learned_calibrators", "htc_weights", "sensitivity__log", "sensitivity__brier", "sensitivity__beta_2_4"]
    figures = ["calibration_invariance__ws", "calibration_invariance__t2", "censored_shift__ws", "selection_diagnostic"]
    expected = {f"{t}.{ext}" for t in tables for ext in ("csv", "md")} | {f"{f}.{ext}" for f in figures for ext in ("png", "svg")}
    expected |= {"scores_long__ws.csv", "scores_long__t2.csv", "report.html", "report.md", "report.json"}
    assert expected == names
    assert {p.name for p in res.files} == names
    for f in figures:
        assert (res.out_dir / f"{f}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (res.out_dir / f"{f}.svg").read_text()
    page = res.html.read_text()
    for t in tables:  # every table is on the page (the prefix tables with --continuations; the sensitivity table
        # split by score family, Tables 11-12), every figure inlined
        assert (f'data-table="{t}"' in page) is not (t.startswith("prefix_") or t == "sensitivity")
    for f in figures:
        assert f'data-figure="{f}"' in page
    # self-contained: nothing is fetched (namespace URIs in xmlns attributes are names, not requests)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|url\(\s*["']?https?:|@import|<link rel="stylesheet""", page)
    assert "<metadata>" not in page


def _score(run_dir, **kw):
    from uqh.scoring.pipeline import ScoreOptions, score_run
    from uqh.scoring.streams import load_run

    return score_run(load_run(run_dir), ScoreOptions(n_bootstrap=B, seed=SEED, **kw))


def test_transparency_and_long_csv_equal_scoring_output(report):
    from uqh.scoring.long_records import csv_records

    ws, _, res = report
    expected = _score(ws, censoring="exclude", fixed_rank=True)
    rows = _csv(res.out_dir / "transparency__ws.csv")
    scored = [r for r in expected.rows if r.n_used]  # a predictor without values is left out (and named)
    assert [r["Predictor"] for r in rows] == [r.display_label + (f" — {r.note}" if r.note else "") for r in scored]
    # nine predictors (p_true, observation_surprise included) x raw/Platt + the truth + base rate; saup raw/Platt, htc
    assert len(expected.rows) == 23
    for got, exp in zip(rows, scored):
        assert int(got["n"]) == exp.n_used and int(got["skipped (missing)"]) == exp.n_skipped_missing
        for col, key in (("AUROC↑", ("auroc",)), ("AURC↓", ("aurc",)), ("T-ECE↓", ("t_ece",)), ("TPS_log↑", ("tps", "log")),
                         ("TPS_Brier↑", ("tps", "brier")), ("TPS_β(2,4)↑", ("tps", "beta(2,4)"))):
            assert _num(got[col]) == exp.value(*key)  # exact: repr round-trips floats
    # verbal confidence: one trajectory (h) has a missing step and is skipped, counted
    assert rows[0]["Predictor"] == "Verbal confidence (raw)" and rows[0]["n"] == "3" and rows[0]["skipped (missing)"] == "1"
    long_rows = _csv(res.out_dir / "scores_long__ws.csv")
    recs = csv_records(expected)
    assert len(long_rows) == len(recs)
    for got, exp in zip(long_rows, recs):
        assert got["metric"] == exp["metric"] and got["score"] == exp["score"] and got["predictor"] == exp["predictor"]
        for k in ("value", "ci_low", "ci_high", "se"):
            assert _num(got[k]) == exp[k]


def test_base_rate_row_closed_form(report):
    _, _, res = report
    base = [r for r in _csv(res.out_dir / "transparency__t2.csv") if r["Predictor"] == "Base-rate constant"][0]
    ybar = 0.5  # tau2 fixture: 2 successes of 4 clean
    assert _num(base["TPS_log↑"]) == pytest.approx(ybar * math.log(ybar) + (1 - ybar) * math.log(1 - ybar))
    assert _num(base["TPS_Brier↑"]) == pytest.approx(-ybar * (1 - ybar))
    assert _num(base["T-ECE↓"]) == pytest.approx(0.0)


def test_calibration_invariance_equals_scoring_delta_over_se(report):
    ws, _, res = report
    expected = _score(ws, censoring="exclude", fixed_rank=True)
    platt, raw = expected.row("verbal", "platt"), expected.row("verbal", "raw")
    rows = [r for r in _csv(res.out_dir / "calibration_invariance.csv") if r["Run"] == "ws (webshop)"]
    assert [r["Metric"] for r in rows] == ["AUROC↑", "AUPRC↑", "AURC↓", "T-ECE↓", "TPS_log↑"]
    tps = rows[-1]
    assert _num(tps["Raw"]) == raw.value("tps", "log")
    assert _num(tps["Raw CI low"]) == raw.estimate("tps", "log").ci_low
    assert _num(tps["Δ (Platt − raw)"]) == platt.get("tps", "log").vs_raw.delta
    assert _num(tps["Δ/SE"]) == platt.get("tps", "log").vs_raw.delta_over_se


def test_censored_shift_sensitivity_and_parse_errors_equal_scoring(report):
    ws, t2, res = report
    simple = _score(ws, censoring="simple", auq=False)
    verbal_platt = simple.row("verbal", "platt")
    shift = [r for r in _csv(res.out_dir / "censored_shift.csv")]
    assert {r["Run"] for r in shift} == {"ws (webshop)"}  # t2 has no max_steps trajectory
    row = next(r for r in shift if r["Predictor"] == "Verbal confidence (Platt)" and r["Score"] == "log")
    d = verbal_platt.estimate("delta_practice", "log")
    assert _num(row["Δ_practice"]) == d.value and [_num(row["Δ CI low"]), _num(row["Δ CI high"])] == [d.ci_low, d.ci_high]
    assert _num(row["Δ/SE"]) == pytest.approx(d.value / d.se)
    assert _num(row["TPS complete-only"]) == verbal_platt.value("tps_complete_only", "log")
    assert int(row["n complete"]) == 3 and int(row["n censored"]) == 3  # h skipped (missing confidence)
    assert _num(row["Censoring rate"]) == pytest.approx(0.5)
    # Δ_practice is the difference of the two reported means
    assert _num(row["Δ_practice"]) == pytest.approx(_num(row["TPS cen-ext"]) - _num(row["TPS complete-only"]))

    sens = _csv(res.out_dir / "sensitivity.csv")
    assert {(r["Weight schedule"]) for r in sens} == {"linear-front", "uniform", "exponential-front", "linear-back"}
    assert {r["Score"] for r in sens} == {"log", "brier", "beta(2,4)"}
    uni = _score(ws, censoring="simple", auq=False, weights="uniform")
    exp = uni.row("token_prob", "raw")
    got = next(r for r in sens if r["Run"] == "ws (webshop)" and r["Weight schedule"] == "uniform"
               and r["Predictor"] == "Completion token probability (raw)" and r["Score"] == "brier")
    assert _num(got["Δ_practice"]) == exp.value("delta_practice", "brier")
    t2_rows = [r for r in sens if r["Run"] == "t2 (tau2-airline)"]
    assert t2_rows and all(r["Censoring"] == "exclude" and r["Δ_practice"] == "" for r in t2_rows)

    parse = _csv(res.out_dir / "parse_error_sensitivity.csv")
    assert {r["Run"] for r in parse} == {"ws (webshop)"}  # only ws has a parse error
    alt = _score(ws, censoring="simple", auq=False, include_parse_errors=True)
    p_exp = alt.row("verbal", "raw")
    p_got = next(r for r in parse if r["Predictor"] == "Verbal confidence (raw)" and r["Score"] == "log")
    assert _num(p_got["TPS incl. parse errors"]) == p_exp.value("tps", "log")
    assert int(p_got["n with parse errors"]) == int(p_got["n working"]) + 1
    assert int(p_got["parse errors as censored"]) == 1


def test_auq_fixed_rank_and_json(report):
    ws, _, res = report
    expected = _score(ws, censoring="exclude", fixed_rank=True)
    auq = [r for r in _csv(res.out_dir / "auq_scalar.csv") if r["Run"] == "ws (webshop)"]
    # predictors x raw/Platt x (last, avg, min), and saup raw/Platt and htc x (last, avg, min)
    assert len(auq) == len(expected.auq) == 5 * 2 * 3 + 3 * 3
    assert _num(auq[0]["AUROC↑"]) == expected.auq[0].value("auroc")
    fixed = [r for r in _csv(res.out_dir / "fixed_rank.csv") if r["Run"] == "ws (webshop)" and r["Predictor"] == "Verbal confidence"]
    exp_fixed = [r for r in expected.fixed_rank if r.predictor == "verbal"]
    assert [r["Transform"] for r in fixed] == [r.transform for r in exp_fixed]
    assert len({r["AUROC↑"] for r in fixed}) == 1  # rank metrics fixed by construction
    for got, exp in zip(fixed, exp_fixed):
        assert _num(got["TPS_log↑"]) == exp.value("tps", "log")
    from uqh.reports.scoring_calls import ReportData

    dumped = ReportData.model_validate_json((res.out_dir / "report.json").read_text())
    assert [r.slug for r in dumped.runs] == ["ws", "t2"]
    assert dumped.runs[0].main == expected  # report.json is the typed results' dump


def test_label_convention_is_shown_in_tables_markdown_and_json(report):
    """Censored tables name what the base rate and Platt were trained on: ΔY over the working sample for ws (it
    has max_steps), Y of the complete trajectories for t2 (none)."""
    from uqh.reports.scoring_calls import ReportData
    from uqh.scoring.labels import LABEL_CONVENTIONS

    _, _, res = report
    shift = _csv(res.out_dir / "censored_shift.csv")
    assert shift and {r["Labels"] for r in shift} == {"delta_y"}
    sens = _csv(res.out_dir / "sensitivity.csv")
    assert {r["Labels"] for r in sens if r["Run"] == "ws (webshop)"} == {"delta_y"}
    assert {r["Labels"] for r in sens if r["Run"] == "t2 (tau2-airline)"} == {"complete"}
    assert {r["Labels"] for r in _csv(res.out_dir / "parse_error_sensitivity.csv")} == {"delta_y"}
    assert {r["label_convention"] for r in _csv(res.out_dir / "scores_long__ws.csv")} == {"complete"}  # exclude
    md = (res.out_dir / "report.md").read_text()
    for c in LABEL_CONVENTIONS.values():
        assert f"{c.name} = {c.description}" in md
    cell = re.compile(r"\| delta_y +\|")  # a table cell (tabulate pads columns)
    assert cell.search(md) and cell.search((res.out_dir / "censored_shift.md").read_text())
    assert "delta_y" in res.html.read_text()
    dumped = ReportData.model_validate_json((res.out_dir / "report.json").read_text())
    ws = dumped.runs[0]
    assert ws.by_weights["linear-front"].settings.label_convention == "delta_y"
    assert ws.by_weights["linear-front"].settings.labels == "working"
    assert ws.main.settings.label_convention == "complete"


def test_sign_regime_and_base_rate_margin_equal_scoring(report):
    """Tables 13 and 14 in the report are the scoring package's rows for the same inputs (issue 29)."""
    from uqh.scoring.regimes import margin_over_base_rate, mean_forecasts, sign_regime
    from uqh.scoring.streams import load_run
    from uqh.scoring.weights import WEIGHT_SCHEMES

    ws, _, res = report
    by_weights = {s: _score(ws, censoring="simple", auq=False, weights=s) for s in WEIGHT_SCHEMES}
    exp_regime = sign_regime(by_weights, mean_forecasts(load_run(ws), by_weights["linear-front"]))
    regime = _csv(res.out_dir / "sign_regime.csv")
    assert {r["Run"] for r in regime} == {"ws (webshop)"}  # t2 has no max_steps trajectory
    assert len(regime) == len(exp_regime) > 0
    for got, exp in zip(regime, exp_regime):
        assert _num(got["F̄"]) == exp.mean_forecast
        assert {s: got[s] or None for s in WEIGHT_SCHEMES} == exp.signs
        assert (int(got["Δ > 0 cells"]), int(got["Δ < 0 cells"])) == (exp.n_positive, exp.n_negative)
    margin = _csv(res.out_dir / "base_rate_margin.csv")
    exp_margin = margin_over_base_rate(by_weights, "log")
    assert len(margin) == len(exp_margin) > 0
    for got, exp in zip(margin, exp_margin):
        assert (got["Weight schedule"], got["Score"]) == (exp.weights, "log")
        assert _num(got["TPS_comp − TPS_base"]) == exp.margin_complete_only
        assert _num(got["TPS_cen-ext − TPS_base"]) == exp.margin_censored
        assert _num(got["Shrinkage % (− = toward 0)"]) == exp.shrinkage_percent
        assert got["Rank change?"] == ("Yes" if exp.rank_flip else "No")
    page = res.html.read_text()
    assert 'id="sign-regime"' in page and 'id="base-rate-margin"' in page


def test_runs_without_censoring_or_parse_errors_say_so(tmp_path):
    d = tau2_like(tmp_path / "t2")
    res = build_report([d], tmp_path / "out", ReportOptions(n_bootstrap=20))
    page = res.html.read_text()
    assert "No run has administratively censored (max_steps) trajectories" in page
    assert "No run has parse-error trajectories" in page
    assert not (tmp_path / "out" / "censored_shift__t2.png").exists()
    assert _csv(tmp_path / "out" / "censored_shift.csv") == []
    assert _csv(tmp_path / "out" / "sign_regime.csv") == [] and _csv(tmp_path / "out" / "base_rate_margin.csv") == []
    # without --continuations / --judgments / --certify their sections say how to get them (issue 29)
    assert _csv(tmp_path / "out" / "prefix_exact_predictors.csv") == []
    for flag in ("Give --continuations CONT_DIR", "Give --judgments DIR", "Give --certify FILE"):
        assert flag in page
    assert not (tmp_path / "out" / "judge_scores.csv").exists()


def test_pool_adds_a_pooled_dataset(tmp_path):
    a, b = tau2_like(tmp_path / "a"), tau2_like(tmp_path / "b")
    res = build_report([a, b], tmp_path / "out", ReportOptions(n_bootstrap=20, pool=True))
    rows = _csv(res.out_dir / "transparency__pooled-Tau2-Bench.csv")
    assert rows[0]["n"] == "8"
    calib = {r["Run"] for r in _csv(res.out_dir / "calibration_invariance.csv")}
    assert calib == {"a (tau2-airline)", "b (tau2-airline)", "pooled Tau2-Bench (a + b)"}
    assert res.html.read_text().count('"label":"pooled') == 0  # not in the trace explorer


def test_user_errors_write_nothing(tmp_path, capsys):
    empty = write_run(tmp_path / "empty", "webshop", 3, [])
    assert main(["report", str(empty), "--out", str(tmp_path / "o1")]) == 2
    assert "no finished episodes" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists()
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "o2")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("x")
    d = webshop_like(tmp_path / "ws")
    assert main(["report", str(d), "--out", str(f)]) == 2
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # refused by the flag's type (uqh/cli/arg_types.py)
        main(["report", str(d), "--out", str(tmp_path / "o3"), "--bootstrap", "0"])
    assert exited.value.code == 2 and "argument --bootstrap: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(UserError):
        build_report([], tmp_path / "o4")


def test_cli_writes_report(tmp_path, capsys):
    d = write_run(tmp_path / "r", "strategyqa", 3, [
        Ep("q1", StopReason.clean, [0.9, 0.8], outcome=1, token_p=[0.9, 0.8]),
        Ep("q2", StopReason.clean, [0.6], outcome=0, token_p=[0.5]),
        Ep("q3", StopReason.clean, [0.7, 0.2], outcome=0, token_p=[0.7, 0.4]),
        Ep("q4", StopReason.clean, [0.95], outcome=1, token_p=[0.97]),
    ])
    assert main(["report", str(d), "--out", str(tmp_path / "out"), "--bootstrap", "30"]) == 0
    assert "report.html" in capsys.readouterr().out
    assert (tmp_path / "out" / "transparency__r.csv").exists()


def test_length_stratified_censoring_by_hand():
    from uqh.scoring.artificial import length_stratified_censoring

    lengths = np.array([1, 1, 2, 2, 2, 2, 5, 5])
    z, cens = length_stratified_censoring(lengths, 0.5, seed=1)
    assert not cens[:2].any()  # one-step trajectories have no proper prefix
    assert cens[2:6].sum() == 2 and cens[6:].sum() == 1  # round(0.5 * 4), round(0.5 * 2)
    assert np.all(z[cens] >= 1) and np.all(z[cens] < lengths[cens]) and np.all(z[~cens] == lengths[~cens])
    z2, cens2 = length_stratified_censoring(lengths, 0.5, seed=1)
    assert np.array_equal(z, z2) and np.array_equal(cens, cens2)


def test_artificial_censoring_table_decomposes_exactly(report):
    _, _, res = report
    rows = _csv(res.out_dir / "artificial_censoring.csv")
    assert {r["Rate r"] for r in rows} == {"0.25", "0.5", "0.75"}
    assert len([r for r in rows if r["Run"] == "t2 (tau2-airline)"]) == 3 * 3 * 4
    for r in rows:
        assert _num(r["Max abs decomposition error"]) < 1e-12
        assert _num(r["Δ_mean"]) == pytest.approx(_num(r["Mean prefix-swap"]) + _num(r["Mean tail-omission"]), abs=1e-12)
    # tau2 fixture, 4 complete trajectories, 2 of each label: Δ_mean is the average of the two label means
    for r in (r for r in rows if r["Run"] == "t2 (tau2-airline)"):
        assert _num(r["Δ_mean"]) == pytest.approx((_num(r["Δ_Y=0"]) + _num(r["Δ_Y=1"])) / 2, abs=1e-12)


def test_rerun_into_the_same_directory_drops_stale_per_run_files(tmp_path):
    a, b = tau2_like(tmp_path / "a"), tau2_like(tmp_path / "b")
    out = tmp_path / "out"
    build_report([a, b], out, ReportOptions(n_bootstrap=10))
    (out / "notes.txt").write_text("mine")
    build_report([a], out, ReportOptions(n_bootstrap=10))
    assert not (out / "transparency__b.csv").exists() and (out / "transparency__a.csv").exists()
    assert (out / "notes.txt").read_text() == "mine"  # files that are not ours are left alone


def test_browser_fails_loudly_when_chromium_does_not_start():
    pytest.importorskip("playwright")
    from uqh.reports.report.browser import browser

    with pytest.raises(RuntimeError, match="Chromium at /bin/false did not start"):
        with browser("/bin/false"):
            pass


def _write_qz(path, q):
    from uqh.rundir.qz_file import QzRecord, write_qz_file

    write_qz_file(path, [QzRecord(episode_id=e, q_hat_z=v, n_valid=4, method="mc") for e, v in q.items()])
    return path


def test_exact_censored_score_with_q_z(tmp_path, capsys):
    ws = webshop_like(tmp_path / "ws")
    # q_hat_z = 0 for every censored prefix: the exact score IS the simple one (Eq. 4 with q_Z = 0 is Eq. 5)
    q0 = _write_qz(tmp_path / "q0.jsonl", {"d#0": 0.0, "e#0": 0.0, "f#0": 0.0})
    res = build_report([ws], tmp_path / "o0", ReportOptions(n_bootstrap=20, q_z_files=(q0,)))
    rows = _csv(res.out_dir / "censored_exact.csv")
    assert rows and all(abs(_num(r["Exact − simple"])) < 1e-12 for r in rows if r["Exact − simple"])
    # other q: the numbers are scoring's exact censored score
    q = {"d#0": 0.2, "e#0": 0.9, "f#0": 0.0}
    qf = _write_qz(tmp_path / "q.jsonl", q)
    assert main(["report", str(ws), "--out", str(tmp_path / "o1"), "--bootstrap", "20", "--q-z", str(qf)]) == 0
    rows = _csv(tmp_path / "o1" / "censored_exact.csv")
    from uqh.scoring.pipeline import ScoreOptions, score_run
    from uqh.scoring.streams import load_run

    exp = score_run(load_run(ws), ScoreOptions(censoring="exact", q_z=q, auq=False, n_bootstrap=20, seed=0))
    e = exp.row("verbal", "raw")
    g = next(r for r in rows if r["Predictor"] == "Verbal confidence (raw)" and r["Score"] == "log")
    assert _num(g["TPS cen-exact"]) == e.value("tps", "log") and int(g["n censored"]) == 3
    assert _num(g["Exact − simple"]) > 0  # e's confident prefix gains its success branch
    # a q_Z file that misses a censored episode: not scored, and the page says which run and how many
    qm = _write_qz(tmp_path / "qm.jsonl", {"d#0": 0.5})
    res = build_report([ws], tmp_path / "o2", ReportOptions(n_bootstrap=20, q_z_files=(qm,)))
    assert _csv(res.out_dir / "censored_exact.csv") == []
    assert "ws (webshop): 2 censored episode(s) without q_hat_z" in res.html.read_text()


def test_a_report_that_fails_half_way_leaves_the_directory_as_it_was(tmp_path, monkeypatch):
    """Issue 33 item 13: the report is written into a staging folder and moved into place only when whole."""
    import uqh.reports.report.write_report as build

    d = tau2_like(tmp_path / "t2")
    out = tmp_path / "out"
    first = build_report([d], out, ReportOptions(n_bootstrap=10))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    (out / "notes.txt").write_text("mine")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(build, "figure_selection", disk_full)  # fails after the tables were written
    from uqh.rundir.errors import OutputWriteError

    with pytest.raises(OutputWriteError, match=f"cannot write {out}: No space left on device"):
        build_report([d], out, ReportOptions(n_bootstrap=10, seed=1))
    assert main(["report", str(d), "--out", str(out), "--bootstrap", "10", "--seed", "1"]) == 1  # an I/O fault

    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "notes.txt"}
    assert after == before and first.html.is_file()
    assert (out / "notes.txt").read_text() == "mine"
    assert not list(out.glob(build.STAGING_PREFIX + "*"))  # no staging folder left behind


def test_number_columns_are_right_aligned_in_the_page_and_text_columns_are_not(report):
    """Each column's cells (and its header) carry one class: "num" when every present value is a number (an
    empty "Other breakdown" cell does not make that column numeric; a missing count does not make "Total" text)."""
    import re

    _, _, res = report
    page = res.html.read_text()
    table = page[page.index('data-table="termination_audit"'):]
    table = table[:table.index("</table>")]
    head = re.findall(r'<th class="(\w+)">([^<]*)</th>', table)
    cells = [re.findall(r'<td class="(\w+)"', row) for row in table.split("<tr>")[2:]]
    classes = dict((name, cls) for cls, name in head)
    assert classes["Run"] == classes["Dataset"] == classes["Other breakdown"] == "text"
    assert classes["Total"] == classes["Step budget"] == classes["Admin-censoring rate"] == "num"
    assert len(cells) == 2 and all(row == [cls for cls, _ in head] for row in cells)


def test_the_learned_calibrators_section_shows_htc_and_saup_under_each_censoring(report):
    """HTC and SAUP are scored by TPS next to verbal confidence under every censoring convention the run supports,
    and HTC's weights (two cross-fitted models) are shown largest first."""
    _, _, res = report
    rows = list(csv.DictReader(io.StringIO((res.out_dir / "learned_calibrators.csv").read_text())))
    assert {"exclude", "simple"} <= {r["Censoring"] for r in rows}
    for run in {r["Run"] for r in rows}:
        labels = " ".join(r["Predictor"] for r in rows if r["Run"] == run and r["Censoring"] == "exclude")
        assert "HTC" in labels and "SAUP" in labels and "Verbal confidence" in labels, labels
    weights = list(csv.DictReader(io.StringIO((res.out_dir / "htc_weights.csv").read_text())))
    assert weights and {w["Feature"] for w in weights} >= {"verbal_last", "step_index"}
    for w in weights:
        assert float(w["Mean weight"]) == pytest.approx((float(w["Weight A"]) + float(w["Weight B"])) / 2)
    for run in {w["Run"] for w in weights}:
        means = [abs(float(w["Mean weight"])) for w in weights if w["Run"] == run]
        assert means == sorted(means, reverse=True)
    assert "Learned trajectory calibrators" in (res.out_dir / "report.html").read_text()
