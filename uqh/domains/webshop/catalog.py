"""Loading and cleaning the official WebShop product files (re-implementation of the original's load_products).

Inputs, from one data directory (``--data DIR``, else the demo data packaged in ``webshop/data/``); each file may
also be stored gzip-compressed as ``NAME.gz``:

- ``items_shuffle_1000.json`` (the official 1,000-product catalog) or, when that is absent,
  ``items_shuffle_1000_prefix.json`` (its opening records, unchanged; the packaged demo catalog);
- ``items_ins_v2_1000.json`` (per-ASIN ``attributes`` and, for some products, a synthetic ``instruction`` with
  its ``instruction_attributes``);
- optionally ``items_human_ins.json`` (crowd-written instructions, the source of the original's human goals;
  see goals.py): only its path is recorded here.

Reviews: the original's loader has its review file reading commented out, so every product shows
``Rating: N.A.`` and an empty Reviews page; so does this one (a ``reviews.json`` is ignored).

Cleaning follows the original: records with ASIN ``nan`` or longer than 10 characters and repeated ASINs are
dropped; the price string ``"$a$b"`` becomes ``pricing=[a, b]`` with the tag ``"$a to $b"`` (no price -> 100.0);
option names and values are lower-cased, ``/`` in a value becomes `` | ``; ``Attributes`` come from the instruction
file (products absent from it get ``["DUMMY_ATTR"]``); ``query`` is lower-cased and stripped.
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from uqh.domains.data_files import data_sha256, find_data_file, read_data_bytes
from uqh.rundir.errors import UserError

CATALOG_FILE = "items_shuffle_1000.json"
CATALOG_PREFIX_FILE = "items_shuffle_1000_prefix.json"
ATTRIBUTES_FILE = "items_ins_v2_1000.json"
HUMAN_INSTRUCTIONS_FILE = "items_human_ins.json"
DEFAULT_PRICE = 100.0


HOW_TO_GET_DATA = (
    "get the official files from the WebShop setup download (princeton-nlp/WebShop, setup.sh -d small: "
    "items_shuffle_1000.json and items_ins_v2_1000.json) into one directory and pass it with "
    "--data DIR (domain option data)"
)
HOW_TO_GET_HUMAN_GOALS = (
    "items_human_ins.json (the human instructions of the original's test split) is downloaded by the same "
    "setup.sh of princeton-nlp/WebShop into its data/ folder; put it next to the catalog and pass --data DIR"
)


#: The demo data shipped inside the package: the catalog prefix and the attributes file, gzip-compressed
#: (SOURCES.md there gives origin, licence and the originals' sha256).
PACKAGED_DATA_DIR = Path(__file__).resolve().parent / "data"


def default_data_dir() -> Path:
    """The data directory without ``--data``: the packaged demo data."""
    return PACKAGED_DATA_DIR


def file_sha256(path: Path) -> str:
    """sha256 of a data file's content as published (a ``.gz`` copy is hashed decompressed)."""
    return data_sha256(path)


def parse_pricing(text: Any) -> tuple[list[float], str]:
    """The original's price parsing: every ``$``-separated piece, non-digits removed; at most two kept."""
    if not text:
        return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    prices: list[float] = []
    for piece in str(text).split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", piece)
        try:
            prices.append(float(Decimal(digits)))
        except InvalidOperation:
            continue
    if not prices:
        return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


def clean_options(customization_options: Any) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    if not customization_options or not isinstance(customization_options, dict):
        return options
    for name, contents in customization_options.items():
        if contents is None:
            continue
        values = [str(c["value"]).strip().replace("/", " | ").lower() for c in contents]
        options[name.lower()] = values
    return options


@dataclass
class Catalog:
    """The cleaned products in catalog order, plus where they came from."""

    products: list[dict[str, Any]]
    catalog_path: Path
    attributes_path: Path
    catalog_sha256: str
    attributes_sha256: str
    is_prefix: bool
    n_records: int
    packaged: bool
    n_instructed_in_attributes_file: int
    human_instructions_path: Path | None = None
    by_asin: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.by_asin:
            self.by_asin = {p["asin"]: p for p in self.products}

    @property
    def n_instructed(self) -> int:
        return sum(1 for p in self.products if p.get("instruction_text"))

    def describe(self) -> dict[str, Any]:
        return {
            "data_source": "packaged" if self.packaged else "file",
            "catalog_file": str(self.catalog_path),
            "catalog_sha256": self.catalog_sha256,
            "catalog_is_prefix": self.is_prefix,
            "attributes_file": str(self.attributes_path),
            "attributes_sha256": self.attributes_sha256,
            "human_instructions_file": str(self.human_instructions_path) if self.human_instructions_path else None,
            "products": len(self.products),
            "instructed_products_in_catalog": self.n_instructed,
            "instructed_products_in_attributes_file": self.n_instructed_in_attributes_file,
        }


def resolve_files(data_dir: str | Path | None) -> tuple[Path, Path, bool]:
    """The catalog file, the attributes file and whether the catalog is the prefix, from ``data_dir`` (None: the
    packaged demo data); each found plain or as ``NAME.gz``."""
    d = Path(data_dir) if data_dir else default_data_dir()
    if not d.is_dir():
        raise UserError(f"WebShop data directory {str(d)!r} does not exist; {HOW_TO_GET_DATA}")
    full, prefix = find_data_file(d, CATALOG_FILE), find_data_file(d, CATALOG_PREFIX_FILE)
    attrs = find_data_file(d, ATTRIBUTES_FILE)
    if full is not None:
        catalog, is_prefix = full, False
    elif prefix is not None:
        catalog, is_prefix = prefix, True
    else:
        raise UserError(f"no {CATALOG_FILE} (or {CATALOG_PREFIX_FILE}) in {str(d)!r}; {HOW_TO_GET_DATA}")
    if attrs is None:
        raise UserError(f"no {ATTRIBUTES_FILE} in {str(d)!r}; {HOW_TO_GET_DATA}")
    return catalog, attrs, is_prefix


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_data_bytes(path))
    except (gzip.BadGzipFile, EOFError) as exc:
        raise UserError(f"{str(path)!r} is not a whole gzip file ({exc}); re-download it: {HOW_TO_GET_DATA}") from None
    except UnicodeDecodeError:
        raise UserError(f"{str(path)!r} is not UTF-8 text; re-download it: {HOW_TO_GET_DATA}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{str(path)!r} is not valid JSON ({exc}); re-download it: {HOW_TO_GET_DATA}") from None


def clean_products(raw_products: list[dict[str, Any]], attributes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Clean raw catalog records into the product dicts the pages, search and reward read."""
    products: list[dict[str, Any]] = []
    seen: set[str] = set()
    for raw in raw_products:
        asin = str(raw.get("asin"))
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        bullets = raw.get("small_description")
        bullets = list(bullets) if isinstance(bullets, list) else [bullets or ""]
        if not bullets:
            bullets = [""]
        pricing, price_tag = parse_pricing(raw.get("pricing"))
        attr_rec = attributes.get(asin)
        if attr_rec is not None and "attributes" in attr_rec:
            attrs = list(attr_rec["attributes"])
        else:
            attrs = ["DUMMY_ATTR"]
        name = raw.get("name") or ""
        products.append(
            {
                "asin": asin,
                "name": name,
                "Title": name,
                "Description": raw.get("full_description") or "",
                "BulletPoints": [str(b) for b in bullets],
                "pricing": pricing,
                "Price": price_tag,
                "options": clean_options(raw.get("customization_options")),
                "Attributes": attrs,
                "Reviews": [],
                "Rating": "N.A.",
                "category": raw.get("category") or "",
                "product_category": raw.get("product_category") or "",
                "query": str(raw.get("query") or "").lower().strip(),
                "instruction_text": (attr_rec or {}).get("instruction"),
                "instruction_attributes": (attr_rec or {}).get("instruction_attributes"),
            }
        )
    return products


def load_catalog(data_dir: str | Path | None = None, *, n_products: int | None = None) -> Catalog:
    """Load and clean the catalog; ``n_products`` keeps only the first N records (the original's num_products)."""
    catalog_path, attrs_path, is_prefix = resolve_files(data_dir)
    raw = _read_json(catalog_path)
    attributes = _read_json(attrs_path)
    if not isinstance(raw, list) or not isinstance(attributes, dict):
        raise UserError(
            f"{str(catalog_path)!r} must be a JSON list and {str(attrs_path)!r} a JSON object; {HOW_TO_GET_DATA}"
        )
    n_records = len(raw)
    if n_products is not None:
        raw = raw[:n_products]
    products = clean_products(raw, attributes)
    human_path = catalog_path.parent / HUMAN_INSTRUCTIONS_FILE
    return Catalog(
        products=products,
        catalog_path=catalog_path,
        attributes_path=attrs_path,
        catalog_sha256=file_sha256(catalog_path),
        attributes_sha256=file_sha256(attrs_path),
        is_prefix=is_prefix,
        n_records=n_records,
        packaged=not data_dir,
        n_instructed_in_attributes_file=sum(1 for v in attributes.values() if v.get("instruction")),
        human_instructions_path=human_path if human_path.is_file() else None,
    )
