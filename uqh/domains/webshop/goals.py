"""Goals as the original builds them (get_synthetic_goals / get_human_goals), with the random draws frozen.

The original draws, with Python's global ``random`` and no seed, (1) one price per range-priced product
(``uniform(low, high)``, generate_product_prices) and (2) one price limit per instructed product
(``sorted(sample(the next four $10 steps above the price, 2))[1]``), then shuffles the goals with
``random.seed(233)``. Here the same draws come, in the same order, from ``random.Random(seed)``, and the shuffle
from ``random.Random(233)`` -- so with the full catalog the goal list equals the original's after
``random.seed(seed)`` -- and the result is frozen into a goals file (JSON, sha256 recorded in the manifest).
Every run and every replay with the same catalog and seed sees byte-identical goals.

Human goals (``items_human_ins.json``: ``{asin: [{instruction, instruction_attributes, instruction_options,
...}]}``, the crowd-written instructions the original's test split uses) are built like the original's
get_human_goals: for each catalog product in order, each of its instructions with at least one attribute becomes
a goal (``instruction`` with trailing dots stripped, plus the price text), with one price-limit draw per goal;
instructions without attributes are skipped (counted). The goal options are the instruction's list of option
values. Product prices and the shuffle are drawn as for synthetic goals.

Task *i* is goal *i* of the shuffled list. Splits follow the original's convention: ``test`` = goals[0:500]
(the 500-task fixed evaluation subset), ``eval`` = goals[500:1500], ``train`` = goals[1500:], ``all``.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
from pathlib import Path
from typing import Any

from uqh.domains.locations import cache_root
from uqh.rundir.errors import UserError

from uqh.domains.webshop.catalog import Catalog, file_sha256

PRICE_STEPS = [10.0 * i for i in range(1, 100)]
SHUFFLE_SEED = 233
GOALS_FORMAT = 1
SPLITS: dict[str, tuple[int, int | None]] = {
    "test": (0, 500),
    "eval": (500, 1500),
    "train": (1500, None),
    "all": (0, None),
}

CACHE_DIR = cache_root() / "webshop"


def draw_product_prices(products: list[dict[str, Any]], rng: random.Random) -> dict[str, float]:
    """One price per product: the single price, or a uniform draw inside a two-price range."""
    prices: dict[str, float] = {}
    for p in products:
        pricing = p["pricing"]
        if not pricing:
            prices[p["asin"]] = 100.0
        elif len(pricing) == 1:
            prices[p["asin"]] = pricing[0]
        else:
            prices[p["asin"]] = rng.uniform(*pricing[:2])
    return prices


def price_limit(price: float, rng: random.Random) -> tuple[float, str]:
    """The original's price upper bound: the larger of two of the next four $10 steps above the price."""
    candidates = [s for s in PRICE_STEPS if s > price][:4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000.0, ""


def build_goals(catalog: Catalog, seed: int) -> dict[str, Any]:
    """The frozen goals document: product prices, the shuffled goals and the counts."""
    rng = random.Random(seed)
    products = catalog.products
    prices = draw_product_prices(products, rng)
    goals: list[dict[str, Any]] = []
    skipped_no_attributes = 0
    for p in products:
        instruction = p.get("instruction_text")
        if instruction is None:
            continue
        attributes = p.get("instruction_attributes") or []
        if not attributes:  # the original asserts this never happens
            skipped_no_attributes += 1
            continue
        upper, price_text = price_limit(prices[p["asin"]], rng)
        names = sorted(p["options"])
        for combo in itertools.product(*(p["options"][n] for n in names)):
            goal_options = dict(zip(names, combo))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = f" with {option_text}" if option_text else ""
            goals.append(
                {
                    "asin": p["asin"],
                    "category": p["category"],
                    "query": p["query"],
                    "name": p["Title"],
                    "product_category": p["product_category"],
                    "instruction_text": f"{instruction}{option_text}{price_text}",
                    "attributes": list(attributes),
                    "price_upper": upper,
                    "goal_options": goal_options,
                }
            )
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return {
        "format": GOALS_FORMAT,
        "seed": seed,
        "shuffle_seed": SHUFFLE_SEED,
        "catalog_sha256": catalog.catalog_sha256,
        "attributes_sha256": catalog.attributes_sha256,
        "counts": {
            "products": len(products),
            "instructed_products_in_catalog": catalog.n_instructed,
            "instructed_products_in_attributes_file": catalog.n_instructed_in_attributes_file,
            "instructed_products_skipped_no_attributes": skipped_no_attributes,
            "goals": len(goals),
        },
        "product_prices": prices,
        "goals": goals,
    }


def build_human_goals(catalog: Catalog, human_path: Path, seed: int) -> dict[str, Any]:
    """The frozen goals document for the human instructions in ``human_path`` (the original's get_human_goals)."""
    human = _read_human_file(human_path)
    rng = random.Random(seed)
    products = catalog.products
    prices = draw_product_prices(products, rng)
    goals: list[dict[str, Any]] = []
    skipped_no_attributes = 0
    for p in products:
        for ins in human.get(p["asin"], ()):
            attributes = ins["instruction_attributes"]
            if len(attributes) == 0:
                skipped_no_attributes += 1
                continue
            upper, price_text = price_limit(prices[p["asin"]], rng)
            goals.append(
                {
                    "asin": p["asin"],
                    "category": p["category"],
                    "query": p["query"],
                    "name": p["name"],
                    "product_category": p["product_category"],
                    "instruction_text": ins["instruction"].strip(".") + price_text,
                    "attributes": list(attributes),
                    "price_upper": upper,
                    "goal_options": list(ins["instruction_options"]),
                }
            )
    random.Random(SHUFFLE_SEED).shuffle(goals)
    in_catalog = [a for a in human if a in catalog.by_asin]
    return {
        "format": GOALS_FORMAT,
        "source": "human",
        "seed": seed,
        "shuffle_seed": SHUFFLE_SEED,
        "catalog_sha256": catalog.catalog_sha256,
        "attributes_sha256": catalog.attributes_sha256,
        "human_instructions_sha256": file_sha256(human_path),
        "counts": {
            "products": len(products),
            "human_instructions": sum(len(v) for v in human.values()),
            "human_instructions_in_catalog": sum(len(human[a]) for a in in_catalog),
            "human_instructions_skipped_no_attributes": skipped_no_attributes,
            "goals": len(goals),
        },
        "product_prices": prices,
        "goals": goals,
    }


def _read_human_file(path: Path) -> dict[str, list[dict[str, Any]]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read the human instructions file {str(path)!r}: {exc}") from None
    bad = (
        f"{str(path)!r} is not a WebShop human instructions file "
        "({asin: [{instruction, instruction_attributes, instruction_options}, ...]})"
    )
    if not isinstance(data, dict):
        raise UserError(bad)
    for rows in data.values():
        if not isinstance(rows, list) or not all(
            isinstance(r, dict) and {"instruction", "instruction_attributes", "instruction_options"} <= set(r)
            for r in rows
        ):
            raise UserError(bad)
    return data


def canonical_bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def goals_sha256(doc: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_bytes(doc)).hexdigest()


def default_goals_path(catalog: Catalog, seed: int, human_path: Path | None = None) -> Path:
    if human_path is not None:
        return CACHE_DIR / f"goals-human-{catalog.catalog_sha256[:12]}-{file_sha256(human_path)[:12]}-seed{seed}.json"
    return CACHE_DIR / f"goals-{catalog.catalog_sha256[:12]}-{catalog.attributes_sha256[:12]}-seed{seed}.json"


def freeze_goals(
    catalog: Catalog, seed: int, path: Path | None = None, *, human_path: Path | None = None
) -> tuple[dict[str, Any], Path, str]:
    """Build the goals (human ones from ``human_path`` if given, else synthetic), write them (atomically) unless an
    identical file is there; return (doc, path, sha256)."""
    doc = build_human_goals(catalog, human_path, seed) if human_path is not None else build_goals(catalog, seed)
    data = canonical_bytes(doc)
    sha = hashlib.sha256(data).hexdigest()
    path = Path(path) if path else default_goals_path(catalog, seed, human_path)
    if not (path.is_file() and path.read_bytes() == data):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return doc, path, sha


def load_goals_file(path: str | Path, catalog: Catalog) -> tuple[dict[str, Any], str]:
    """A user-supplied frozen goals file (e.g. draws taken from the original environment)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"goals file {str(p)!r} does not exist; omit goals_file to build goals from goal_seed")
    data = p.read_bytes()
    try:
        doc = json.loads(data)
        goals, prices = doc["goals"], doc["product_prices"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise UserError(f"{str(p)!r} is not a WebShop goals file (needs 'goals' and 'product_prices')") from None
    missing = sorted({g["asin"] for g in goals} - set(catalog.by_asin))
    if missing:
        raise UserError(
            f"goals file {str(p)!r} names {len(missing)} ASINs not in the loaded catalog (e.g. {missing[0]}); "
            "use the catalog the goals were frozen from"
        )
    missing_prices = sorted(set(catalog.by_asin) - set(prices))
    if missing_prices:
        raise UserError(f"goals file {str(p)!r} has no frozen price for {len(missing_prices)} catalog products")
    return doc, hashlib.sha256(data).hexdigest()


def split_goals(doc: dict[str, Any], split: str) -> list[int]:
    """Goal indices of a split (task i = goal i)."""
    if split not in SPLITS:
        raise UserError(f"unknown WebShop split {split!r}; choose one of: {', '.join(SPLITS)}")
    lo, hi = SPLITS[split]
    n = len(doc["goals"])
    return list(range(min(lo, n), n if hi is None else min(hi, n)))
