"""What installed packages add to uqh: the ``uqh.domains``, ``uqh.agents``, ``uqh.predictors`` and ``uqh.metrics``
entry points. uqh declares its own built-ins the same way (``pyproject.toml``), so a package outside the repository
is a first-class citizen. It sits in the lowest layer because domains, harness and scoring all discover through it.

Listing reads package metadata only; an entry point's module is imported when it is first loaded. uqh's own entries
come first, then other distributions' in name order; a name given twice keeps its first entry and the later one is
reported as shadowed (``uqh list``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from uqh.rundir.errors import UserError, first_line

GROUPS = {"uqh.domains": "domain", "uqh.agents": "agent", "uqh.predictors": "predictor", "uqh.metrics": "metric"}
OWN_DISTRIBUTION = "uqh"


@dataclass(frozen=True)
class Extension:
    """One entry point: ``name = value`` in ``group``, declared by ``distribution`` (``version``)."""

    group: str
    name: str
    value: str
    distribution: str
    version: str
    shadowed: bool = False

    @property
    def builtin(self) -> bool:
        return self.distribution == OWN_DISTRIBUTION

    @property
    def source(self) -> str:
        return f"{self.distribution} {self.version}"


def _declared(group: str) -> list[Extension]:
    """The entry points of ``group`` of each distribution, the first of a name on ``sys.path`` -- except that a copy
    of uqh declaring none (a stale build's ``uqh.egg-info`` in a checkout) is passed over for the installed one
    (a slower scan of every distribution's metadata, only when the quick look finds none of uqh's)."""
    quick = [Extension(group, ep.name, ep.value, ep.dist.metadata["Name"] or "?", ep.dist.version or "?")
             for ep in metadata.entry_points(group=group)]
    if any(e.builtin for e in quick):
        return quick
    seen: set[str] = set()
    found = []
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or "?"
        key = name.lower().replace("_", "-")
        eps = [ep for ep in dist.entry_points if ep.group == group]
        if key in seen or (key == OWN_DISTRIBUTION and not eps):
            continue
        seen.add(key)
        found += [Extension(group, ep.name, ep.value, name, dist.version or "?") for ep in eps]
    return found


@functools.cache
def extensions(group: str) -> tuple[Extension, ...]:
    """Every entry point of ``group``: uqh's own first, then by distribution name (declaration order kept).
    Refuses (one line) an install whose own entry points are missing: nothing built in could be found."""
    found = _declared(group)
    if not any(e.builtin for e in found):
        raise UserError(f"uqh's own {group} entry points are not installed (an install from before they existed, or "
                        "sources without an install): reinstall uqh (in a checkout: pip install -e .)")
    found.sort(key=lambda e: (not e.builtin, e.distribution.lower()))
    seen: set[str] = set()
    out = []
    for e in found:
        out.append(Extension(**{**e.__dict__, "shadowed": e.name in seen}))
        seen.add(e.name)
    return tuple(out)


def active(group: str) -> dict[str, Extension]:
    """The entry points of ``group`` that are in force, by name (shadowed ones left out)."""
    return {e.name: e for e in extensions(group) if not e.shadowed}


def load(ext: Extension) -> Any:
    """The object an entry point names; a module that cannot be imported is one line naming its distribution."""
    try:
        return metadata.EntryPoint(ext.name, ext.value, ext.group).load()
    except ImportError as exc:
        kind = GROUPS.get(ext.group, ext.group)
        raise UserError(f"the {kind} {ext.name!r} (from {ext.source}) cannot be imported: {first_line(exc)}; "
                        f"install what it needs or uninstall {ext.distribution}") from None
