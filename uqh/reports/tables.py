"""A table is a title, a list of column names and a list of row dicts; written as CSV and Markdown with pandas.

Numbers are kept at full precision in CSV (so they can be compared with the scoring package's output);
Markdown (pandas' ``to_markdown``, i.e. tabulate's pipe format) rounds for reading. Missing values are empty CSV
cells and "—" in Markdown. pandas is imported when a table is written, never at import time (``uqh --help``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqh.rundir.atomic import atomic_write_text


@dataclass
class Table:
    name: str  # file stem, e.g. "termination_audit"
    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    caption: str = ""
    empty_note: str = "No applicable trajectories in these runs."
    #: A column whose value starts a new section in the terminal table (shown as a heading row, not a column);
    #: Markdown and CSV keep it as an ordinary column.
    group: str | None = None

    def to_frame(self):
        """The rows as a pandas DataFrame of the values as given (object columns: ints stay ints)."""
        import pandas as pd

        return pd.DataFrame([[row.get(c) for c in self.columns] for row in self.rows], columns=self.columns,
                            dtype=object)

    def to_csv(self) -> str:
        frame = self.to_frame()
        frame = frame.map(_csv_cell) if len(frame) else frame
        return frame.to_csv(index=False, lineterminator="\n")

    def to_markdown(self, digits: int = 3) -> str:
        lines = [f"### {self.title}", ""]
        if not self.rows:
            lines += [f"_{self.empty_note}_", ""]
        cells = [[fmt(row.get(c), digits) for c in self.columns] for row in self.rows]
        lines.append(markdown_grid(self.columns, cells, [self.numeric(c) for c in self.columns]))
        if self.caption:
            lines += ["", self.caption]
        return "\n".join(lines) + "\n"

    def numeric(self, column: str) -> bool:
        """Whether every value of ``column`` present is a number (such columns are right-aligned)."""
        values = [row.get(column) for row in self.rows if not _is_missing(row.get(column))]
        return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)

    def numeric_columns(self) -> set[str]:
        """The columns for which :meth:`numeric` holds, in one pass per column (a renderer asks once per table,
        not once per cell: per cell it is quadratic in the rows)."""
        return {c for c in self.columns if self.numeric(c)}

    def write(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        csv_path, md_path = out_dir / f"{self.name}.csv", out_dir / f"{self.name}.md"
        atomic_write_text(csv_path, self.to_csv(), fsync=False)  # a full disk leaves no empty or torn file
        atomic_write_text(md_path, self.to_markdown(), fsync=False)
        return [csv_path, md_path]


def markdown_grid(columns: list[str], cells: list[list[str]], right: list[bool] | None = None) -> str:
    """A Markdown pipe table of already formatted cells (tabulate through pandas; no number parsing: the cells
    are shown as formatted); ``right[i]``: right-align column i."""
    import pandas as pd

    frame = pd.DataFrame([[_md(c) for c in row] for row in cells], columns=[_md(c) for c in columns], dtype=object)
    align = ["right" if r else "left" for r in (right or [False] * len(columns))]
    return frame.to_markdown(index=False, tablefmt="pipe", disable_numparse=True, colalign=align)


def _md(text: Any) -> str:
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
