"""The one renderer (uqh/reports/render.py): the same --format table|md|json|csv on every command that prints results."""
from __future__ import annotations

import argparse
import csv
import importlib
import io
import json

import pytest

from uqh.cli import COMMANDS
from uqh.reports.render import FORMATS, Output, emit
from uqh.reports.tables import Table

TABLES = [
    Table("first", "First table", ["Run", "Predictor", "n", "AUROC↑"],
          [{"Run": "r1", "Predictor": "verbal\nraw", "n": 12, "AUROC↑": "0.812\n0.70–0.91"},
           {"Run": "r2", "Predictor": "verbal\nraw", "n": 3, "AUROC↑": None}], caption="a caption", group="Run"),
    Table("second", "Second table", ["Run", "Total"], [{"Run": "r1", "Total": 0.5}]),
]
OUT = Output(tables=TABLES, json_text='{"ok": true}', header=["header line"], notes=["something to know"],
             prog="uqh x")


@pytest.mark.parametrize("command", ["score", "audit", "certify", "continue", "judge"])
def test_every_result_command_offers_the_four_formats(command):
    module = importlib.import_module(COMMANDS[command][0])
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    action = next(a for a in p._actions if "--format" in a.option_strings)
    assert tuple(action.choices) == FORMATS == ("table", "md", "json", "csv") and action.default == "table"


def _emit(fmt):
    out, err = io.StringIO(), io.StringIO()
    emit(OUT, fmt, out=out, err=err)
    return out.getvalue(), err.getvalue()


def test_table_format_sections_by_group_and_fits_120_columns():
    out, err = _emit("table")
    assert err == "uqh x: note: something to know\n" and max(len(line) for line in out.splitlines()) <= 120
    lines = out.splitlines()
    assert lines[0] == "header line"
    r1, r2 = lines.index("r1"), lines.index("r2")  # one heading per group, the header row only once
    assert r1 < r2 and out.count("Predictor") == 1
    value = next(i for i, line in enumerate(lines) if "0.812" in line)
    assert "0.70–0.91" in lines[value + 1] and lines[value].rstrip().endswith("0.812")  # numbers right-aligned


def test_markdown_flattens_the_two_line_cells():
    out, err = _emit("md")
    assert err == ""  # the notes are in the document
    assert "### First table" in out and "| verbal raw " in out and "0.812 0.70–0.91" in out
    assert "- note: something to know" in out and "    header line" in out


def test_json_is_the_typed_result_alone_and_notes_go_to_stderr():
    out, err = _emit("json")
    assert json.loads(out) == {"ok": True} and err == "uqh x: note: something to know\n"


def test_csv_stacks_the_tables_under_the_union_of_their_columns():
    out, err = _emit("csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["table", "Run", "Predictor", "n", "AUROC↑", "Total"]
    assert [r["table"] for r in rows] == ["first", "first", "second"]
    assert rows[1]["AUROC↑"] == "" and rows[2]["Total"] == "0.5" and rows[0]["n"] == "12"
    assert err == "uqh x: note: something to know\n"


def test_a_table_wider_than_the_terminal_is_shown_transposed():
    wide = Table("wide", "A wide table", [f"column number {i}" for i in range(12)],
                 [{f"column number {i}": f"value {i} of row {r}" for i in range(12)} for r in range(2)])
    out = io.StringIO()
    emit(Output(tables=[wide], json_text="{}"), "table", out=out, err=io.StringIO())
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 120 and "…" not in text  # nothing cut
    line = next(ln for ln in text.splitlines() if ln.startswith("column number 11 "))
    assert "value 11 of row 0" in line and "value 11 of row 1" in line  # a line per field, a column per row
