"""A table is a title, a list of column names and a list of row dicts; written as CSV and Markdown.

Numbers are kept at full precision in CSV (so they can be compared with the scoring package's output);
Markdown rounds for reading. Missing values are written as empty CSV cells and "—" in Markdown.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Table:
    name: str  # file stem, e.g. "termination_audit"
    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    caption: str = ""
    empty_note: str = "No applicable trajectories in these runs."

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.columns)
        for row in self.rows:
            w.writerow([_csv_cell(row.get(c)) for c in self.columns])
        return buf.getvalue()

    def to_markdown(self, digits: int = 3) -> str:
        lines = [f"### {self.title}", ""]
        if not self.rows:
            lines += [f"_{self.empty_note}_", ""]
        lines.append("| " + " | ".join(_md(c) for c in self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(_md(fmt(row.get(c), digits)) for c in self.columns) + " |")
        if self.caption:
            lines += ["", self.caption]
        return "\n".join(lines) + "\n"

    def write(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        csv_path, md_path = out_dir / f"{self.name}.csv", out_dir / f"{self.name}.md"
        csv_path.write_text(self.to_csv())
        md_path.write_text(self.to_markdown())
        return [csv_path, md_path]


def _md(text: str) -> str:
    """A Markdown table cell: pipes escaped, newlines flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _csv_cell(v: Any) -> str:
    if _is_missing(v):
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def fmt(v: Any, digits: int = 3) -> str:
    if _is_missing(v):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if v != 0 and abs(v) < 0.1:  # small scores (TPS_beta, Δ) keep their significant digits
            return f"{v:.{digits}g}"
        return f"{v:.{digits}f}"
    return str(v)
