"""The self-contained HTML report: tables, inline SVG figures and the per-trajectory trace explorer.

One file, no network: CSS and JS are inlined from ``reports/assets``; figures are the matplotlib SVGs inlined
(their PNG twins are linked); the trace data is JSON in a ``<script type="application/json">`` block.
"""
from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports.tables import Table, fmt

ASSETS = Path(__file__).resolve().parent / "assets"


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


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def table_html(t: Table) -> str:
    head = "".join(
        f'<th class="{"" if _numeric(t.rows[0].get(c)) else "text"}">{_esc(c)}</th>' if t.rows else f"<th>{_esc(c)}</th>"
        for c in t.columns
    )
    body = []
    for row in t.rows:
        cells = []
        for c in t.columns:
            v = row.get(c)
            cls = "" if _numeric(v) else ' class="text"'
            title = f' title="{_esc(repr(v))}"' if isinstance(v, float) and math.isfinite(v) else ""
            cells.append(f"<td{cls}{title}>{_esc(fmt(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    links = f'<div class="links"><a href="{_esc(t.name)}.csv">CSV</a><a href="{_esc(t.name)}.md">Markdown</a></div>'
    caption = f'<p class="caption">{_esc(t.caption)}</p>' if t.caption else ""
    if not t.rows:
        caption = f'<p class="note">{_esc(t.empty_note)}</p>' + caption
    return (
        f'<h3 id="table-{_esc(t.name)}">{_esc(t.title)}</h3>{links}<div class="tablewrap"><table class="data" '
        f'data-table="{_esc(t.name)}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>{caption}'
    )


_SVG_START = re.compile(r"<svg\b", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def inline_svg(svg_text: str) -> str:
    """The <svg> element of a matplotlib SVG file, without XML prolog and doctype."""
    m = _SVG_START.search(svg_text)
    if not m:
        return ""
    return _METADATA.sub("", svg_text[m.start():])


def figure_html(fig: Figure, out_dir: Path) -> str:
    svg_path = out_dir / f"{fig.stem}.svg"
    svg = inline_svg(svg_path.read_text()) if svg_path.exists() else ""
    return (
        f'<figure data-figure="{_esc(fig.stem)}">{svg}<figcaption>{_esc(fig.caption)} '
        f'<span class="links"><a href="{_esc(fig.stem)}.png">PNG</a><a href="{_esc(fig.stem)}.svg">SVG</a></span>'
        "</figcaption></figure>"
    )


def _json_for_script(data: Any) -> str:
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # Nothing inside a <script> block may close it or open a comment.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def trace_section_html(trace_data: dict[str, Any]) -> str:
    return (
        '<section id="traces"><h2>Trajectory traces</h2>'
        '<p class="intro">Per-step confidence traces F_t of every predictor for one trajectory (raw streams solid, '
        "cross-fitted Platt streams dashed where available). Hover a step for its action, observation and values. "
        'Link to a trajectory with <code>#trace=RUN_INDEX/EPISODE_ID</code>.</p>'
        '<div id="trace-controls"><label>Run <select id="trace-run"></select></label>'
        '<label>Trajectory <select id="trace-episode"></select></label></div>'
        '<div id="trace-summary"></div><div id="trace-failed"></div><div id="trace-legend"></div>'
        '<svg id="trace-plot" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="confidence traces"></svg>'
        '<div class="tablewrap"><table class="data" id="trace-steps"><thead><tr><th>t</th><th class="text">action</th>'
        '<th class="text">observation</th><th colspan="99">predictor values (in legend order)</th></tr></thead>'
        "<tbody></tbody></table></div>"
        '<div id="trace-tooltip"></div>'
        f'<script type="application/json" id="trace-data">{_json_for_script(trace_data)}</script>'
        "</section>"
    )


def render_page(
    *, title: str, meta: list[str], sections: list[Section], trace_data: dict[str, Any], out_dir: Path
) -> str:
    css = (ASSETS / "report.css").read_text()
    js = (ASSETS / "trace.js").read_text()
    nav = "".join(f'<a href="#{_esc(s.id)}">{_esc(s.title)}</a>' for s in sections) + '<a href="#traces">Trajectory traces</a>'
    parts = []
    for s in sections:
        inner = [f"<h2>{_esc(s.title)}</h2>"]
        if s.intro:
            inner.append(f'<p class="intro">{_esc(s.intro)}</p>')
        inner += [f'<p class="note">{_esc(n)}</p>' for n in s.notes]
        inner += [table_html(t) for t in s.tables]
        inner += [figure_html(f, out_dir) for f in s.figures]
        parts.append(f'<section id="{_esc(s.id)}">{"".join(inner)}</section>')
    meta_html = "<br>".join(_esc(m) for m in meta)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><link rel=\"icon\" href=\"data:,\"><style>{css}</style></head><body>"
        f'<header><h1>{_esc(title)}</h1><div class="meta">{meta_html}</div></header><nav>{nav}</nav><main>'
        + "".join(parts)
        + trace_section_html(trace_data)
        + f"</main><script>{js}</script></body></html>\n"
    )
