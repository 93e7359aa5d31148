"""The one renderer of command output: ``--format table|md|json|csv`` for `uqh score`, `audit`, `continue`,
`certify` and `judge --report`.

A command hands over what it has to show as :class:`Output`: a header (lines about the inputs), its tables
(:class:`uqh.reports.tables.Table`), notes, the typed result as JSON text, and optionally the long-format table that
is its CSV. Then

- ``table``: rich tables on stdout, 120 columns wide (a cell may hold two lines: a value over its 95% CI);
- ``md``: the header, then every table in Markdown (pandas + tabulate), then the notes;
- ``json``: the typed result (``model_dump_json``) and nothing else;
- ``csv``: the long-format table if the command has one, else every table stacked with a leading ``table``
  column (the union of their columns; pandas).

Notes go to stderr as ``PROG: note: ...`` (``table``, ``json``, ``csv``: they never corrupt a machine-readable
stream), and into the document with ``md``. A table wider than the terminal is shown transposed (a line per field,
a column per row) rather than cut.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import TextIO

from uqh.reports.tables import Table, fmt

FORMATS = ("table", "md", "json", "csv")
#: Terminal table width: what a 120-column terminal shows without wrapping.
WIDTH = 120

#: A cell's first line that reads as a number (or a missing one): such columns are right-aligned.
_NUMBER = re.compile(r"^([−+-]?[\d.,]+(e[−+-]?\d+)?%?|—|[−+-]?∞)$")


@dataclass
class Output:
    """What a command shows: see the module docstring."""

    tables: list[Table]
    json_text: str
    header: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    csv_table: Table | None = None
    prog: str = "uqh"  # the notes' prefix on stderr, e.g. "uqh score"


def add_format_argument(p, *, default: str = "table") -> None:
    """``--format table|md|json|csv`` (and ``--json``, ``--markdown`` as aliases)."""
    p.add_argument("--format", choices=FORMATS, default=default,
                   help="output: table (rich, 120 columns), md (Markdown), json (the typed result) or csv "
                        f"(long format); default {default}")
    p.add_argument("--json", action="store_const", const="json", dest="format", help="alias for --format json")
    p.add_argument("--markdown", action="store_const", const="md", dest="format", help="alias for --format md")


def emit(output: Output, fmt_name: str, *, out: TextIO | None = None, err: TextIO | None = None,
         console=None) -> None:
    """Write ``output`` in format ``fmt_name`` to ``out`` (stdout); notes of json/csv to ``err`` (stderr)."""
    out = out or sys.stdout
    err = err or sys.stderr
    if fmt_name == "json":
        out.write(output.json_text.rstrip("\n") + "\n")
    elif fmt_name == "csv":
        out.write(csv_text(output))
    elif fmt_name == "md":
        out.write(markdown_text(output))
        return
    elif fmt_name == "table":
        print_tables(output, console=console, file=out)
    else:  # pragma: no cover - argparse restricts the choices
        raise ValueError(f"unknown format {fmt_name!r}")
    out.flush()
    for n in output.notes:
        err.write(f"{output.prog}: note: {n}\n")


def markdown_text(output: Output) -> str:
    parts = []
    if output.header:
        parts.append("\n".join(f"    {line}" for line in output.header) + "\n")
    parts += [t.to_markdown() for t in output.tables]
    if output.notes:
        parts.append("\n".join(f"- note: {n}" for n in output.notes) + "\n")
    return "\n".join(parts)


def csv_text(output: Output) -> str:
    if output.csv_table is not None:
        return output.csv_table.to_csv()
    return stacked(output.tables).to_csv()


def stacked(tables: list[Table]) -> Table:
    """Every table's rows under the union of their columns, with a leading ``table`` column (the table's name)."""
    columns = ["table"]
    for t in tables:
        columns += [c for c in t.columns if c not in columns]
    rows = [{"table": t.name, **row} for t in tables for row in t.rows]
    return Table("stacked", "all tables", columns, rows)


def tables_json(tables: list[Table]) -> str:
    """The JSON of a command whose result is its tables: ``{"tables": [{name, title, columns, rows, caption}]}``
    (missing values null)."""
    import json
    import math

    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return json.dumps({"tables": [{"name": t.name, "title": t.title, "columns": t.columns,
                                   "rows": [{c: clean(row.get(c)) for c in t.columns} for row in t.rows],
                                   "caption": t.caption} for t in tables]}, indent=2, ensure_ascii=False)


def _is_number_like(text: str) -> bool:
    text = text.strip()
    return not text or bool(_NUMBER.match(text))


def _cell(v) -> str:
    return v if isinstance(v, str) else fmt(v)


def _widths(t: Table) -> dict[str, int]:
    return {c: max(len(line) for text in [c, *(_cell(row.get(c)) for row in t.rows)] for line in text.split("\n"))
            for c in t.columns if c != t.group}


def natural_width(t: Table) -> int:
    """Columns the table needs without cutting a cell (one space between columns)."""
    widths = _widths(t)
    return sum(widths.values()) + max(0, len(widths) - 1)


def rich_records(t: Table, width: int = WIDTH) -> list:
    """A table too wide for the terminal, transposed: its title, then a field per line and a column per row
    (headed by the row's first value); one block per row if even that is too wide."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text

    out: list = [Text(t.title, style="bold")]
    key = t.columns[0]
    cells = [[_cell(row.get(c)).replace("\n", " ") for c in t.columns] for row in t.rows]
    field_w = max(len(c) for c in t.columns)
    col_w = [max(len(x) for x in row) for row in cells]
    blocks = [list(range(len(cells)))] if field_w + sum(w + 1 for w in col_w) <= width else [[i] for i in range(len(cells))]
    for block in blocks:
        rt = RichTable(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False,
                       show_header=len(block) > 1)
        rt.add_column(key, style="dim", no_wrap=True)
        for i in block:
            rt.add_column(cells[i][0], overflow="fold")
        for j, c in enumerate(t.columns):
            if j == 0 and len(block) > 1:
                continue  # the header row names the columns
            rt.add_row(c, *(Text(cells[i][j]) for i in block))
        out.append(rt)
    return out


def rich_tables(t: Table) -> list:
    """Renderables of ``t``: its title, then a rich table (text columns left, number columns right). With
    ``t.group``, one table per group value under a line naming it, all with the same column widths (the header
    only on the first), so they read as one table in sections."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text

    columns = [c for c in t.columns if c != t.group]
    cells = {c: [_cell(row.get(c)) for row in t.rows] for c in columns}
    right = {c: bool(cells[c]) and all(_is_number_like(x.split("\n", 1)[0]) for x in cells[c]) for c in columns}
    width = _widths(t)
    groups: list[tuple[str | None, list[dict]]] = []
    for row in t.rows:
        key = None if t.group is None else str(row.get(t.group))
        if not groups or groups[-1][0] != key:
            groups.append((key, []))
        groups[-1][1].append(row)
    out: list = [Text(t.title, style="bold")]
    for i, (key, rows) in enumerate(groups):
        if key is not None:
            out.append(Text(("" if i == 0 else "\n") + key, style="underline", overflow="fold"))
        rt = RichTable(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False, show_header=i == 0,
                       collapse_padding=True)
        for c in columns:
            rt.add_column(c, justify="right" if right[c] else "left", width=width[c], no_wrap=True)
        for row in rows:
            rt.add_row(*(Text(_cell(row.get(c))) for c in columns))
        out.append(rt)
    return out


def print_tables(output: Output, console=None, file: TextIO | None = None) -> None:
    from rich.console import Console

    console = console or Console(width=WIDTH, file=file or sys.stdout, highlight=False)
    for line in output.header:
        console.print(line, markup=False, highlight=False)
    for t in output.tables:
        console.print()
        if not t.rows:
            console.print(f"[bold]{t.title}[/bold]")
            console.print(t.empty_note, markup=False)
            continue
        for rt in (rich_tables(t) if natural_width(t) <= console.width else rich_records(t)):
            console.print(rt)
        if t.caption:
            console.print(t.caption, markup=False, highlight=False)
