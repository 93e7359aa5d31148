"""The WebShop pages in the original's text mode: the visible text nodes of each page, joined with `` [SEP] ``.

Pages (the original's templates, in the layout its text environment was published with):

- search:   ``WebShop | Instruction: | <instruction> | Search``            (the search bar is only here)
- results:  ``Instruction: | <instruction> | Back to Search | Page P (Total results: N) | [< Prev] | [Next >] |``
            then per product ``ASIN | Title | Price`` (10 per page)
- item:     ``Instruction: | <instruction> | Back to Search | < Prev |`` per option group ``name | value | value ...``
            then ``Title | Price: $.. | Rating: .. | Description | Features | Reviews | Buy Now``
- sub-pages (Description / Features / Reviews): ``Instruction: | <instruction> | Back to Search | < Prev |`` content
- done:     ``Thank you for shopping with us! | Your score (min 0.0, max 1.0) | <reward>``

``< Prev`` appears on results pages after the first; ``Next >`` only while more results follow (the original's
later template; its first one showed ``Next >`` even on the last page, leading to an empty page).

Clickables are the original's: button texts, product ASINs (product links) and option values (radio inputs);
a click target matches case-insensitively. When an option value equals another clickable's text, the option wins
(the original's dict overwrote buttons with options).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEP = " [SEP] "
PRODUCT_WINDOW = 10

BACK_TO_SEARCH = "Back to Search"
PREV_PAGE = "< Prev"
NEXT_PAGE = "Next >"
BUY_NOW = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")


@dataclass(frozen=True)
class PageState:
    """Everything that determines the current page (and nothing else): the replay-comparable state."""

    kind: str = "search"  # search | results | item | sub | done
    keywords: str | None = None
    page: int | None = None
    asin: str | None = None
    options: tuple[tuple[str, str], ...] = ()  # selected options, in selection order (re-selecting keeps the slot)
    sub: str | None = None  # Description | Features | Reviews

    def options_dict(self) -> dict[str, str]:
        return dict(self.options)

    def with_option(self, name: str, value: str) -> "PageState":
        opts = dict(self.options)
        opts[name] = value
        return PageState(self.kind, self.keywords, self.page, self.asin, tuple(opts.items()), self.sub)

    def as_dict(self) -> dict[str, Any]:
        return {
            "page": self.kind,
            "keywords": self.keywords,
            "page_no": self.page,
            "asin": self.asin,
            "options": dict(self.options),
            "sub_page": self.sub,
        }


@dataclass
class Clickable:
    text: str  # as displayed
    kind: str  # back | prev | next | product | option | sub | buy
    arg: Any = None  # product: asin; option: (name, value); sub: page name


@dataclass
class Page:
    nodes: list[str]
    clickables: list[Clickable] = field(default_factory=list)
    has_search_bar: bool = False

    @property
    def text(self) -> str:
        return SEP.join(self.nodes)

    def lookup(self) -> dict[str, Clickable]:
        """Lower-cased target -> clickable (buttons and product links first, then options, as the original)."""
        table: dict[str, Clickable] = {}
        for c in self.clickables:
            if c.kind != "option":
                table[c.text.lower()] = c
        for c in self.clickables:
            if c.kind == "option":
                table[c.text.lower()] = c
        return table


def _nodes(*texts: Any) -> list[str]:
    """Visible text nodes: stripped, empty ones dropped."""
    out = []
    for t in texts:
        s = str(t).strip()
        if s:
            out.append(s)
    return out


def search_page(instruction: str) -> Page:
    return Page(_nodes("WebShop", "Instruction:", instruction, "Search"), [], has_search_bar=True)


def results_page(instruction: str, page: int, total: int, products: list[dict[str, Any]]) -> Page:
    nodes = _nodes("Instruction:", instruction, BACK_TO_SEARCH, f"Page {page} (Total results: {total})")
    clicks = [Clickable(BACK_TO_SEARCH, "back")]
    if page > 1:
        nodes.append(PREV_PAGE)
        clicks.append(Clickable(PREV_PAGE, "prev"))
    if page * PRODUCT_WINDOW < total:
        nodes.append(NEXT_PAGE)
        clicks.append(Clickable(NEXT_PAGE, "next"))
    for p in products:
        nodes += _nodes(p["asin"], p["Title"], p["Price"])
        clicks.append(Clickable(p["asin"], "product", p["asin"]))
    return Page(nodes, clicks)


def item_page(instruction: str, product: dict[str, Any]) -> Page:
    nodes = _nodes("Instruction:", instruction, BACK_TO_SEARCH, PREV_PAGE)
    clicks = [Clickable(BACK_TO_SEARCH, "back"), Clickable(PREV_PAGE, "prev")]
    for name, values in product["options"].items():
        nodes += _nodes(name)
        for v in values:
            nodes += _nodes(v)
            clicks.append(Clickable(v, "option", (name, v)))
    nodes += _nodes(product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}")
    for sub in SUB_PAGES:
        nodes.append(sub)
        clicks.append(Clickable(sub, "sub", sub))
    nodes.append(BUY_NOW)
    clicks.append(Clickable(BUY_NOW, "buy"))
    return Page(nodes, clicks)


def sub_page(instruction: str, product: dict[str, Any], sub: str) -> Page:
    nodes = _nodes("Instruction:", instruction, BACK_TO_SEARCH, PREV_PAGE)
    if sub == "Description":
        nodes += _nodes(product["Description"])
    elif sub == "Features":
        nodes += _nodes(*product["BulletPoints"])
    else:
        reviews = product.get("Reviews") or []
        if not reviews:
            nodes.append("No reviews found")
        for r in reviews:
            nodes += _nodes(f'"{r.get("title", "")}"', r.get("score", ""), r.get("body", ""))
    return Page(nodes, [Clickable(BACK_TO_SEARCH, "back"), Clickable(PREV_PAGE, "prev")])


def format_reward(reward: float) -> str:
    return repr(float(reward))


def done_page(reward: float) -> Page:
    return Page(_nodes("Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", format_reward(reward)))
