"""`uqh audit`: Table 6 counts and the Fig. 2B selection diagnostic on hand-written fixture run directories."""
from __future__ import annotations

import csv
import io

import pytest

from uqh.cli import main
from uqh.rundir.errors import UserError
from uqh.reports.termination_tables import audit, load_runs, selection_diagnostic_table, termination_audit
from report_fixtures import tau2_like, webshop_like


@pytest.fixture
def runs(tmp_path):
    return webshop_like(tmp_path / "ws"), tau2_like(tmp_path / "t2a"), tau2_like(tmp_path / "t2b")


def test_table6_counts_by_hand(runs):
    ws, t2a, t2b = runs
    table = termination_audit(load_runs([ws, t2a, t2b]))
    assert [r["Run"] for r in table.rows] == ["ws (webshop)", "t2a (tau2-airline)", "t2b (tau2-airline)", "all Tau2-Bench runs (2)"]
    w = table.rows[0]
    # webshop fixture: a,b,c,h clean (a,c successes); d,e,f max_steps; g parse_error
    assert (w["Step budget"], w["Total"], w["Clean Y"], w["max_steps"], w["parse_error"], w["Other"]) == (4, 8, 4, 3, 1, 0)
    assert w["Uncensored n"] == 4 and w["ȳ (uncensored)"] == 0.5
    assert w["Working n"] == 7 and w["Admin-censoring rate"] == pytest.approx(3 / 7)
    assert w["Other breakdown"] == ""
    t = table.rows[1]
    assert (t["Total"], t["Clean Y"], t["max_steps"], t["parse_error"], t["Other"]) == (6, 4, 0, 0, 2)
    assert t["Other breakdown"] == "1 tool_error, 1 env_terminated"
    pooled = table.rows[3]
    assert (pooled["Total"], pooled["Clean Y"], pooled["Other"], pooled["Planned"]) == (12, 8, 4, 12)
    assert pooled["Other breakdown"] == "2 tool_error, 2 env_terminated"
    # every column present in the CSV, in order, one line per row
    rows = list(csv.reader(io.StringIO(table.to_csv())))
    assert rows[0] == table.columns and len(rows) == 5
    assert rows[1][table.columns.index("Admin-censoring rate")] == repr(3 / 7)


def test_unfinished_episodes_are_counted_against_the_manifest(tmp_path):
    ws = webshop_like(tmp_path / "ws")
    lines = (ws / "episodes.jsonl").read_text().splitlines(keepends=True)
    (ws / "episodes.jsonl").write_text("".join(lines[:5]) + lines[5][:40])  # two lost, one torn line
    row = termination_audit(load_runs([ws])).rows[0]
    assert row["Total"] == 5 and row["Planned"] == 8 and row["Unfinished"] == 3


def test_selection_diagnostic_means_by_hand(runs):
    ws = runs[0]
    table = selection_diagnostic_table(load_runs([ws]), n_boot=200)
    done, cens, diff = table.rows
    assert done["Subset"] == "completed" and done["n"] == 4
    assert done["Mean observed steps"] == pytest.approx((2 + 1 + 3 + 2) / 4)
    # per-trajectory means: a .85, b .6, c 2.6/3, h .4 (its missing first confidence is skipped, not imputed)
    assert done["Mean verbal confidence"] == pytest.approx((0.85 + 0.6 + 2.6 / 3 + 0.4) / 4)
    assert cens["n"] == 3 and cens["Mean observed steps"] == 4.0
    assert cens["Mean verbal confidence"] == pytest.approx((0.35 + 0.7 + 0.2) / 3)
    assert cens["Steps CI low"] == cens["Steps CI high"] == 4.0  # no spread, degenerate interval
    assert done["Confidence CI low"] <= done["Mean verbal confidence"] <= done["Confidence CI high"]
    assert diff["Mean observed steps"] == pytest.approx(2.0)
    assert diff["Mean verbal confidence"] == pytest.approx(cens["Mean verbal confidence"] - done["Mean verbal confidence"])


def test_trajectory_without_any_confidence_is_counted_not_imputed(tmp_path):
    from uqh.rundir.schema import StopReason
    from report_fixtures import Ep, write_run

    d = write_run(tmp_path / "r", "webshop", 3, [
        Ep("a", StopReason.clean, [None, None], outcome=1),
        Ep("b", StopReason.clean, [0.2], outcome=0),
    ])
    done = selection_diagnostic_table(load_runs([d]), n_boot=50).rows[0]
    assert done["n"] == 2 and done["n without confidence"] == 1
    assert done["Mean verbal confidence"] == pytest.approx(0.2)


def test_cli_writes_csv_and_markdown(runs, tmp_path, capsys):
    out = tmp_path / "audit"
    assert main(["audit", str(runs[0]), str(runs[1]), "--out", str(out), "--bootstrap", "50"]) == 0
    printed = capsys.readouterr().out
    assert "Termination audit (Table 6)" in printed and max(len(line) for line in printed.splitlines()) <= 120
    assert sorted(p.name for p in out.iterdir()) == [
        "selection_diagnostic.csv", "selection_diagnostic.md", "termination_audit.csv", "termination_audit.md"]
    assert "| ws (webshop)       | WebShop    |             4 |       8 |" in (out / "termination_audit.md").read_text()


@pytest.mark.parametrize("fmt", ["md", "json", "csv"])
def test_cli_formats(runs, capsys, fmt):
    import json

    assert main(["audit", str(runs[0]), "--bootstrap", "50", "--format", fmt]) == 0
    printed = capsys.readouterr().out
    if fmt == "md":
        assert "### Termination audit (Table 6)" in printed and "| ws (webshop) |" in printed
    elif fmt == "json":
        tables = {t["name"]: t for t in json.loads(printed)["tables"]}
        row = tables["termination_audit"]["rows"][0]
        assert (row["Run"], row["Total"], row["max_steps"]) == ("ws (webshop)", 8, 3)
    else:
        rows = list(csv.DictReader(io.StringIO(printed)))
        assert {r["table"] for r in rows} == {"termination_audit", "selection_diagnostic"}
        assert next(r for r in rows if r["table"] == "termination_audit")["Total"] == "8"


def test_cli_user_errors(tmp_path, runs, capsys):
    assert main(["audit", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqh audit: error:") and "not a run directory" in err and "Traceback" not in err
    assert main(["audit", str(runs[0]), str(runs[0])]) == 2
    assert "given twice" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{}")
    assert main(["audit", str(tmp_path / "bad")]) == 2
    assert "not a valid manifest" in capsys.readouterr().err
    with pytest.raises(UserError):
        audit([])


def test_runs_with_the_same_directory_name_get_distinct_labels(tmp_path):
    a = webshop_like(tmp_path / "x" / "run")
    b = tau2_like(tmp_path / "y" / "run")
    labels = [r.label for r in load_runs([a, b])]
    assert labels == ["x/run (webshop)", "y/run (tau2-airline)"]
    assert [r.label for r in load_runs([a])] == ["run (webshop)"]


def test_markdown_number_formatting():
    from uqh.reports.tables import Table, fmt

    assert [fmt(-0.00929), fmt(-0.6931), fmt(0.0), fmt(None), fmt(float("nan")), fmt(2290), fmt(True)] == [
        "-0.00929", "-0.693", "0.000", "—", "—", "2,290", "yes"]
    t = Table("t", "T", ["a|b", "c"], [{"a|b": "x|y", "c": 1.0}])
    assert "| a\\|b   |     c |" in t.to_markdown() and "| x\\|y   | 1.000 |" in t.to_markdown()  # pipes escaped
    assert t.to_csv() == "a|b,c\nx|y,1.0\n"


def test_audit_and_score_count_a_duplicated_episode_line_once(tmp_path, capsys):
    """Two writers (before the run-directory lock) could append the same episode twice: every reader keeps the
    first line of an id, so `uqh audit` and `uqh score` count the same episodes."""
    import json

    ws = webshop_like(tmp_path / "ws")
    lines = (ws / "episodes.jsonl").read_text().splitlines(keepends=True)
    with open(ws / "episodes.jsonl", "a") as f:
        f.write(lines[0])
        f.write(lines[3])  # a max_steps one
    row = termination_audit(load_runs([ws])).rows[0]
    assert (row["Total"], row["Clean Y"], row["max_steps"], row["Unfinished"]) == (8, 4, 3, 0)
    assert main(["score", str(ws), "--bootstrap", "0", "--format", "json", "--censoring", "simple"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert (counts["episodes"], counts["complete"], counts["censored"]) == (8, 4, 3)
