"""WebShop environment throughput: steps/s for Search and Click actions, against baselines measured in-process.

    .venv/bin/python benchmarks/webshop_env.py [--data DIR] [--queries 300] [--clicks 3000]

- search steps: ``Search[q]`` on the search page (a Lucene-BM25 query over the catalog + rendering results page 1)
  followed by ``Click[Back to Search]``; queries are distinct (the first words of distinct goal instructions), so
  the per-env query cache never hits. Baseline: the same queries (analysed the same way) scored by a naive
  pure-Python linear-scan BM25 over the analysed catalog (what a dependency-free implementation would cost).
- click steps: on an item page, ``Click`` through options, Description / Features / Reviews and ``< Prev``.
  Baseline: one JSON round trip (dumps + loads) of the product record shown on the page.

Writes benchmarks/results/webshop_env.md. Target: the environment must not be the bottleneck (>= 200 steps/s).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def naive_bm25(query_terms, docs, avgdl, df, n, k1=0.9, b=0.4):
    scores = []
    for i, d in enumerate(docs):
        tf = Counter(d)
        s = 0.0
        for t in query_terms:
            if t in tf:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * tf[t] / (tf[t] + k1 * (1 - b + b * len(d) / avgdl))
        if s > 0:
            scores.append((-s, i))
    scores.sort()
    return [i for _, i in scores[:50]]


async def bench(args) -> str:
    import uqh  # noqa: F401  (environment defaults)
    from uqh.domains.domain_registry import get_domain_class
    from uqh.domains.webshop.lucene_analysis import analyze
    from uqh.domains.webshop.search import product_search_text

    opts = {"split": "all"}
    if args.data:
        opts["data"] = args.data
    dom = get_domain_class("webshop")(opts)
    res = dom.resources
    products = res.catalog.products

    seen, queries = set(), []
    for g in res.goals:
        q = " ".join(g["instruction_text"].split(" with ")[0].split()[:6]).lower().replace("[", " ").replace("]", " ")
        if q not in seen:
            seen.add(q)
            queries.append(q)
        if len(queries) >= args.queries:
            break

    env = dom.make_env("ws-0", episode_seed=0)
    await env.reset()
    # -- search steps
    t0 = time.perf_counter()
    n_search_steps = 0
    for q in queries:
        await env.step(f"Search[{q}]")
        await env.step("Click[Back to Search]")
        n_search_steps += 2
    t_search = time.perf_counter() - t0

    # -- naive baseline over the same queries
    docs = [analyze(product_search_text(p)) for p in products]
    df = Counter(t for d in docs for t in set(d))
    avgdl = sum(len(d) for d in docs) / len(docs)
    qtoks = [analyze(q) for q in queries]
    t0 = time.perf_counter()
    for qt in qtoks:
        naive_bm25(qt, docs, avgdl, df, len(docs))
    t_naive = time.perf_counter() - t0

    # -- click steps on an item page with options
    prod = max(products, key=lambda p: sum(len(v) for v in p["options"].values()))
    env = dom.make_env("ws-0", episode_seed=0)
    await env.reset()
    await env.step(f"Search[{prod['Title'][:60].replace('[', ' ').replace(']', ' ')}]")
    if prod["asin"] not in env.observation():
        raise SystemExit("benchmark setup: the option-rich product is not on results page 1")
    await env.step(f"Click[{prod['asin']}]")
    values = [v for vs in prod["options"].values() for v in vs] or ["Description"]
    cycle = []
    for v in values:
        cycle.append(f"Click[{v}]")
    cycle += ["Click[Description]", "Click[< Prev]", "Click[Features]", "Click[< Prev]", "Click[Reviews]", "Click[< Prev]"]
    t0 = time.perf_counter()
    n_click = 0
    while n_click < args.clicks:
        for a in cycle:
            await env.step(a)
        n_click += len(cycle)
    t_click = time.perf_counter() - t0

    t0 = time.perf_counter()
    for _ in range(n_click):
        json.loads(json.dumps(prod))
    t_json = time.perf_counter() - t0

    search_sps = n_search_steps / t_search
    click_sps = n_click / t_click
    per_query_env = t_search / len(queries)
    per_query_naive = t_naive / len(queries)
    lines = [
        "# WebShop environment throughput",
        "",
        f"Catalog: {res.catalog.catalog_path.name} ({len(products)} products); "
        f"{len(queries)} distinct queries; {n_click} clicks on an item page with {len(values)} option values.",
        "Produced by `benchmarks/webshop_env.py` on this machine (2 cores shared).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| search steps/s (Search + Back to Search) | {search_sps:,.0f} |",
        f"| click steps/s (options, sub-pages, < Prev) | {click_sps:,.0f} |",
        f"| env search+back per query vs naive pure-Python BM25 scan per query | {per_query_env * 1e3:.3f} ms vs "
        f"{per_query_naive * 1e3:.3f} ms (ratio {per_query_env / per_query_naive:.2f}) |",
        f"| env click step vs JSON round trip of the product record | {t_click / n_click * 1e6:.1f} us vs "
        f"{t_json / n_click * 1e6:.1f} us (ratio {t_click / t_json:.2f}) |",
        "",
        f"Target >= 200 steps/s: search {'met' if search_sps >= 200 else 'NOT met'}, "
        f"click {'met' if click_sps >= 200 else 'NOT met'}.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="WebShop data directory (default: the packaged demo data)")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--clicks", type=int, default=3000)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "webshop_env.md"))
    args = ap.parse_args()
    report = asyncio.run(bench(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
