"""The WebShop pages in the original's text mode: the visible text nodes of each page, joined with `` [SEP] ``.

The original renders HTML templates and turns them into text with BeautifulSoup: every visible text node,
stripped, except nodes that are only a newline. BeautifulSoup collapses a text node made only of ASCII whitespace
to ``"\\n"`` if it contains a newline (then dropped) and to ``" "`` otherwise (then kept as an *empty* segment);
an empty value renders no node at all. :func:`_node` applies exactly that rule to every value a template shows.

Pages (node by node; ``<x>`` is a value):

- search:   ``WebShop | Instruction: | <instruction> | Search``
- results:  ``Instruction: | <instruction> | Back to Search | Page P (Total results: N) | [< Prev] | Next >``
            then per product ``<ASIN> | <title> | <price>`` (10 per page). ``< Prev`` appears after page 1;
            ``Next >`` always (paging past the end shows a page without products, as the original).
- item:     ``Instruction: | <instruction> | Back to Search | < Prev |`` per option group ``<name> | <value> ...``
            then ``<title> | Price: <price> | Rating: N.A. | Description | Features | Reviews | Buy Now``
- sub-pages: ``Instruction: | <instruction> | Back to Search | < Prev |`` then the description; or one node
            `` <bullet>`` per bullet point (an empty bullet gives an empty segment); or nothing for Reviews (the
            original's loader never loads reviews: every product has none and ``Rating: N.A.``).
- done:     ``Thank you for shopping with us! | Your score (min 0.0, max 1.0) | <reward>`` -- shorter than the
            original's done page (which also prints a hidden debugging block); the agent never sees it, since the
            episode ends with the purchase.

Clickables are the original's: buttons and product links (keyed by their lower-cased text) and option values
(radio inputs; an option value overrides a button of the same text in the lookup table, and a value present in
two option groups belongs to the later group, as in the original's dict). What a click *does* is decided by its
text first (see ``env.WebShopEnv.transition``), as the original's server does.
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
_ASCII_SPACE = " \n\t\f\r"


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
        """Lower-cased target -> clickable: buttons and product links first, then options (which override)."""
        table: dict[str, Clickable] = {}
        for c in self.clickables:
            if c.kind != "option":
                table[c.text.lower()] = c
        for c in self.clickables:
            if c.kind == "option":
                table[c.text] = c
        return table


def _node(value: Any, nodes: list[str]) -> None:
    """Append the segment a template text node holding ``value`` yields in the original's text mode (if any)."""
    s = str(value)
    if not s:
        return
    if not s.strip(_ASCII_SPACE):
        if "\n" in s:
            return
        nodes.append("")
        return
    nodes.append(s.strip())


def _header(instruction: str) -> list[str]:
    nodes = ["Instruction:"]
    _node(instruction, nodes)
    return nodes


def search_page(instruction: str) -> Page:
    nodes = ["WebShop"] + _header(instruction) + ["Search"]
    return Page(nodes, [], has_search_bar=True)


def results_page(instruction: str, page: int, total: int, products: list[dict[str, Any]]) -> Page:
    nodes = _header(instruction) + [BACK_TO_SEARCH, f"Page {page} (Total results: {total})"]
    clicks = [Clickable(BACK_TO_SEARCH, "back")]
    if page > 1:
        nodes.append(PREV_PAGE)
        clicks.append(Clickable(PREV_PAGE, "prev"))
    nodes.append(NEXT_PAGE)
    clicks.append(Clickable(NEXT_PAGE, "next"))
    for p in products:
        _node(p["asin"], nodes)
        _node(p["Title"], nodes)
        _node(p["Price"], nodes)
        clicks.append(Clickable(p["asin"], "product", p["asin"]))
    return Page(nodes, clicks)


def item_page(instruction: str, product: dict[str, Any]) -> Page:
    nodes = _header(instruction) + [BACK_TO_SEARCH, PREV_PAGE]
    clicks = [Clickable(BACK_TO_SEARCH, "back"), Clickable(PREV_PAGE, "prev")]
    for name, values in product["options"].items():
        _node(name, nodes)
        for v in values:
            _node(v, nodes)
            clicks.append(Clickable(v, "option", (name, v)))
    _node(product["Title"], nodes)
    nodes += [f"Price: {product['Price']}".strip(), f"Rating: {product['Rating']}".strip()]
    for sub in SUB_PAGES:
        nodes.append(sub)
        clicks.append(Clickable(sub, "sub", sub))
    nodes.append(BUY_NOW)
    clicks.append(Clickable(BUY_NOW, "buy"))
    return Page(nodes, clicks)


def sub_page(instruction: str, product: dict[str, Any], sub: str) -> Page:
    nodes = _header(instruction) + [BACK_TO_SEARCH, PREV_PAGE]
    if sub == "Description":
        _node(product["Description"], nodes)
    elif sub == "Features":
        for bullet in product["BulletPoints"]:
            _node(f" {bullet}", nodes)
    return Page(nodes, [Clickable(BACK_TO_SEARCH, "back"), Clickable(PREV_PAGE, "prev")])


def format_reward(reward: float) -> str:
    return repr(float(reward))


def done_page(reward: float) -> Page:
    return Page(["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", format_reward(reward)])
