"""Issue 43, an honest report: figures leave out empty rows and panels and say why, every legend names what is
drawn, nothing is left out silently; Table 1 shows the reference-forecast mapping; Tables 11-12 come one score
family per table with a filter box; a run with synthetic WebShop goals is labelled so. Asserted on the figure
functions' typed results and on the written CSV/HTML, not on pixels."""
from __future__ import annotations

import csv
import json

import pytest

from report_fixtures import tau2_like, webshop_like
from uqh.reports.report.figures import figure_calibration_invariance, figure_censored_shift, figure_selection
from uqh.reports.report.write_report import ReportOptions, build_report
from uqh.reports.tables import Table

SHIFT_COLS = ["Run", "Predictor", "Score", "TPS complete-only", "TPS cen-ext", "Δ_practice", "Δ CI low", "Δ CI high"]


def _shift_row(predictor, comp, cen, delta=None, run="r"):
    return {"Run": run, "Predictor": predictor, "Score": "log", "TPS complete-only": comp, "TPS cen-ext": cen,
            "Δ_practice": delta, "Δ CI low": None if delta is None else delta - 0.1,
            "Δ CI high": None if delta is None else delta + 0.1}


def test_fig_2a_leaves_out_empty_rows_and_the_empty_delta_panel_and_says_why(tmp_path):
    rows = [_shift_row("Verbal (raw)", -0.5, -0.4), _shift_row("Verbal (Platt)", -0.45, None),
            *[_shift_row(f"Absent {i}", None, None) for i in range(3)]]
    res = figure_censored_shift(Table("censored_shift", "t", SHIFT_COLS, rows), "r", tmp_path, "fig")
    assert res.drawn and (tmp_path / "fig.svg").exists()
    assert res.rows == ["Verbal (raw)", "Verbal (Platt)"]
    assert res.panels == ["TPS_log"]  # no finite Δ: no Δ panel
    assert res.legend == ["complete-only", "censored extension"]
    assert any("leaves out 3 predictor rows" in n and "Absent 0, Absent 1, Absent 2" in n for n in res.notes)
    assert any("no Δ_practice panel" in n for n in res.notes)
    rows[0]["Δ_practice"], rows[0]["Δ CI low"], rows[0]["Δ CI high"] = 0.1, 0.0, 0.2
    res = figure_censored_shift(Table("censored_shift", "t", SHIFT_COLS, rows), "r", tmp_path, "fig")
    assert res.panels == ["TPS_log", "Δ_practice"] and not any("Δ_practice panel" in n for n in res.notes)


def test_fig_2a_legend_lists_a_series_drawn_only_on_a_later_row(tmp_path):
    rows = [_shift_row("A", -0.5, None), _shift_row("B", None, -0.3)]
    res = figure_censored_shift(Table("censored_shift", "t", SHIFT_COLS, rows), "r", tmp_path, "fig")
    assert res.legend == ["complete-only", "censored extension"]


SELECT_COLS = ["Run", "Subset", "n", "Mean observed steps", "Steps CI low", "Steps CI high", "Mean verbal confidence",
               "Confidence CI low", "Confidence CI high"]


def _select_row(run, subset, n, steps, conf):
    return {"Run": run, "Subset": subset, "n": n, "Mean observed steps": steps, "Steps CI low": steps,
            "Steps CI high": steps, "Mean verbal confidence": conf, "Confidence CI low": conf,
            "Confidence CI high": conf}


def test_fig_2b_legend_names_completed_when_the_first_run_has_none(tmp_path):
    rows = [_select_row("first", "completed", 0, None, None), _select_row("first", "admin-censored", 4, 5.0, 0.6),
            _select_row("second", "completed", 3, 2.0, 0.8), _select_row("second", "admin-censored", 2, 5.0, 0.7),
            _select_row("third", "completed", 5, 2.5, 0.9), _select_row("third", "admin-censored", 0, None, None)]
    res = figure_selection(Table("selection_diagnostic", "t", SELECT_COLS, rows), tmp_path)
    assert res.drawn and res.rows == ["first", "second"]
    assert sorted(res.legend) == ["admin-censored", "completed"]
    assert res.notes == ["Fig. 2B leaves out third: no admin-censored (max_steps) trajectory to compare with."]


def test_fig_1_says_which_run_it_leaves_out(tmp_path):
    table = Table("calibration_invariance", "t", ["Run", "Metric", "Raw"], [])
    res = figure_calibration_invariance(table, "no-complete", tmp_path, "fig")
    assert not res.drawn and not (tmp_path / "fig.svg").exists()
    assert res.notes and "leaves out no-complete" in res.notes[0] and "no complete trajectory" in res.notes[0]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    base = tmp_path_factory.mktemp("honest")
    ws, t2 = webshop_like(base / "ws"), tau2_like(base / "t2")
    manifest = json.loads((ws / "manifest.json").read_text())  # a WebShop run on synthetic goals, as offline
    manifest["info"]["webshop"] = {"goal_source": "synthetic"}
    (ws / "manifest.json").write_text(json.dumps(manifest))
    return build_report([ws, t2], base / "out", ReportOptions(n_bootstrap=20, seed=1, max_traces=0))


def _csv(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_table_1_shows_what_each_map_sends_0_90_0_95_1_00_to(report):
    data = json.loads((report.out_dir / "report.json").read_text())
    rows = _csv(report.out_dir / "platt_diagnostics.csv")
    diags = [d for run in data["runs"] for d in run["main"]["calibration"]]
    assert len(rows) == len(diags) > 0
    for got, d in zip(rows, diags):
        for half, key in (("A", "split_a"), ("B", "split_b")):
            for ref in ("0.90", "0.95", "1.00"):
                assert float(got[f"{half}: {ref} →"]) == d[key]["reference_map"][ref]


def test_tables_11_12_one_table_per_score_family_with_a_filter_box(report):
    full = _csv(report.out_dir / "sensitivity.csv")
    families = list(dict.fromkeys(r["Score"] for r in full))
    assert len(families) >= 2
    page = report.html.read_text()
    for family in families:
        slug = "".join(c if c.isalnum() else "_" for c in family).strip("_")
        part = _csv(report.out_dir / f"sensitivity__{slug}.csv")
        rows = [r for r in full if r["Score"] == family]
        assert len(part) == sum(r["n"] != "0" for r in rows) and "Score" not in part[0]
        assert all(r["n"] != "0" for r in part)  # predictors the runs do not have are left out ...
        absent = {r["Predictor"] for r in rows if r["n"] == "0"} - {r["Predictor"] for r in part}
        md = (report.out_dir / f"sensitivity__{slug}.md").read_text()
        caption = md[md.index("Left out, n = 0"):]
        assert absent and all(name in caption for name in absent)  # ... and named
        assert f'data-table="sensitivity__{slug}"' in page and f'data-filter="sensitivity__{slug}"' in page
    assert 'data-table="sensitivity"' not in page


def test_synthetic_webshop_goals_are_labelled_in_the_report(report):
    page = report.html.read_text()
    header = page[page.index("<header>"):page.index("</header>")]
    assert header.count("SYNTHETIC WebShop goals") == 1  # the WebShop run only
    assert "ws (webshop)" in header.split("SYNTHETIC")[0].rsplit("<br>", 1)[-1]


def test_transparency_leaves_out_predictors_the_run_does_not_have_and_names_them(report):
    data = json.loads((report.out_dir / "report.json").read_text())
    main = next(r for r in data["runs"] if r["slug"] == "ws")["main"]
    absent = [r["predictor"] for r in main["rows"] if not r["n_used"]]
    assert absent  # the fixture has no self-consistency or probe values
    rows = _csv(report.out_dir / "transparency__ws.csv")
    assert rows and all(int(r["n"]) > 0 for r in rows) and len(rows) == len(main["rows"]) - len(absent)
    caption = (report.out_dir / "transparency__ws.md").read_text().split("Left out, n = 0")[1]
    assert "Self-consistency agreement (raw)" in caption and "Reflexive P(True)" in caption
