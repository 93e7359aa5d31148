"""The self-contained HTML report, rendered from a Jinja2 template (``reports/assets/report.html.j2``).

One file, no network: CSS and JS are inlined from ``reports/assets``; figures are the matplotlib SVGs inlined
(their PNG twins are linked); the trace data is JSON in a ``<script type="application/json">`` block. Order: the
trajectory traces with their filters, the comparison across runs, then every analysis as a collapsible section.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqh.reports.tables import Table, fmt

ASSETS = Path(__file__).resolve().parent / "assets"
TEMPLATE = "report.html.j2"
#: A table with more rows than this gets a filter box on the page.
FILTER_MIN_ROWS = 20


@dataclass
class Figure:
    stem: str  # file stem: <stem>.svg / <stem>.png in the output directory
    caption: str


@dataclass
class Section:
    id: str
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    open: bool = False  # expanded when the page loads


_SVG_START = re.compile(r"<svg\b", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def inline_svg(svg_text: str) -> str:
    """The <svg> element of a matplotlib SVG file, without XML prolog and doctype."""
    m = _SVG_START.search(svg_text)
    if not m:
        return ""
    return _METADATA.sub("", svg_text[m.start():])


def json_for_script(data: Any) -> str:
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # Nothing inside a <script> block may close it or open a comment.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _environment():
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    env = Environment(loader=FileSystemLoader(str(ASSETS)), autoescape=select_autoescape(["j2", "html"]),
                      undefined=StrictUndefined, trim_blocks=False, lstrip_blocks=False)
    env.globals["fmt"] = fmt
    return env


def render_page(*, title: str, meta: list[str], sections: list[Section], comparison: Table,
                trace_data: dict[str, Any], out_dir: Path) -> str:
    """The report page: ``comparison`` is the cross-run table (two-line cells: value over CI, grouped by run)."""
    figures = {}
    for s in sections:
        for f in s.figures:
            svg_path = out_dir / f"{f.stem}.svg"
            figures[f.stem] = inline_svg(svg_path.read_text()) if svg_path.exists() else ""
    page_sections = [
        {"id": s.id, "title": s.title, "intro": s.intro, "notes": s.notes, "tables": s.tables, "open": s.open,
         "figures": [{"stem": f.stem, "caption": f.caption, "svg": figures[f.stem]} for f in s.figures]}
        for s in sections
    ]
    return _environment().get_template(TEMPLATE).render(
        title=title, meta=meta, sections=page_sections, comparison=comparison,
        trace_json=json_for_script(trace_data), css=(ASSETS / "report.css").read_text(),
        js="\n".join((ASSETS / name).read_text() for name in ("trace_chart.js", "trace.js", "table_filter.js")),
        filter_min_rows=FILTER_MIN_ROWS,
    ) + "\n"
