"""Every relative link in README.md and docs/*.md resolves (issue 43): the file (or folder) exists, and a
``#anchor`` into a Markdown file names one of its headings (GitHub's slugs)."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: [text](target) and [text]: target, outside code; images too
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


#: The repository's top-level folders: a code span ``docs/x.md`` or ``uqh/cli/run_command.py`` names a file of the
#: repository (the README's way of linking), relative to its root.
TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
REPO_PATH = re.compile(r"`((?:%s)/[^`\s*<>{}|]+)`" % "|".join(map(re.escape, sorted(TOP))))


#: A placeholder in a path (``uqh/cli/NAME_command.py``, ``docs/DOMAIN.md``) names no one file.
PLACEHOLDER = re.compile(r"[A-Z]{3,}")


def links(path: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", path.read_text()))
    return [a or b for a, b in LINK.findall(text)]


def code_paths(path: Path) -> list[str]:
    """Repository paths in code spans (``docs/reports.md``, ``uqh/harness/regenerate.py``), outside fences."""
    # a pytest node id (``tests/x.py::test_y``) or a line (``x.py:12``) names the file before the colon
    return [re.split(r"#|:", m)[0].rstrip(".,;") for m in REPO_PATH.findall(FENCE.sub("", path.read_text()))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|__?|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", path.read_text()), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("//")


def broken(path: Path) -> list[str]:
    bad = []
    for target in links(path):
        if not relative(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target} (no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    bad += [f"`{p}` (no such file in the repository)" for p in code_paths(path)
            if not (ROOT / p).exists() and not PLACEHOLDER.search(p)]
    return bad


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken(path) == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    monkeypatch.setattr(f"{__name__}.REPO_PATH", re.compile(r"`((?:docs)/[^`\s*<>{}|]+)`"))
    (tmp_path / "b.md").write_text("# Real heading\n\n## `uqh run` options\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md) [ok](b.md#real-heading) [ok](b.md#uqh-run-options) [web](https://x.org/y)\n"
                    "[gone](docs/gone.md) [bad](b.md#nope) `[code](nope.md)`\n"
                    "```\n[fenced](nope.md)\n`docs/fenced.md`\n```\n[self](#real)\n"
                    "Details: `docs/qa-uqh.domains.domain_registry.md`, `docs/real.md`, `docs/*.md`, "
                    "`docs/real.md::test_x`, `docs/real.md:12`, `docs/NAME_command.md`.\n")
    assert broken(page) == ["docs/gone.md (no docs/gone.md)", "b.md#nope (no heading #nope in b.md)",
                            "#real (no heading #real in a.md)",
                            "`docs/qa-uqh.domains.domain_registry.md` (no such file in the repository)"]
