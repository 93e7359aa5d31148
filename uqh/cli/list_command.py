"""`uqh list`: what is installed -- domains, agents, predictors and metrics -- and where each comes from (uqh itself,
another installed package through its entry points, or code that registered it)."""
from __future__ import annotations

import argparse
import json

from uqh.rundir import entry_points

KINDS = {"domains": "uqh.domains", "agents": "uqh.agents", "predictors": "uqh.predictors", "metrics": "uqh.metrics"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", nargs="?", choices=sorted(KINDS), help="list only this kind")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def _rows_of_group(group: str) -> list[dict]:
    """One row per entry point (domains, agents: the entry point is the entry; nothing is imported)."""
    return [{"name": e.name, "source": e.source, "entry_point": e.value, "shadowed": e.shadowed}
            for e in entry_points.extensions(group)]


def _rows_of_registry(registry) -> list[dict]:
    """One row per loaded entry (predictors, metrics: an entry point may give several)."""
    rows = []
    for name in registry:
        ext = registry.sources.get(name)
        rows.append({"name": name, "source": ext.source if ext else "registered in code",
                     "entry_point": f"{ext.name} = {ext.value}" if ext else "", "shadowed": False})
    return rows


def rows(kind: str) -> list[dict]:
    if kind == "predictors":
        from uqh.scoring.registry import PREDICTORS

        return _rows_of_registry(PREDICTORS)
    if kind == "metrics":
        from uqh.scoring.registry import METRICS

        return _rows_of_registry(METRICS)
    return _rows_of_group(KINDS[kind])


def run(args: argparse.Namespace) -> int:
    listing = {kind: rows(kind) for kind in ([args.kind] if args.kind else KINDS)}
    if args.format == "json":
        print(json.dumps(listing, indent=2))
        return 0
    for kind, entries in listing.items():
        print(f"{kind} ({len(entries)})")
        width = max((len(r["name"]) for r in entries), default=0)
        for r in entries:
            note = "  (shadowed by an earlier entry of the same name)" if r["shadowed"] else ""
            print(f"  {r['name']:<{width}}  {r['source']:<24} {r['entry_point']}{note}")
    return 0
