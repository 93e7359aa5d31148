"""WebShop (Yao et al., 2022) in its text mode: a faithful Python re-implementation of the original environment.

Paper settings (Appendix K, Table 16): the 500-task fixed evaluation subset (split ``test`` = goals 0..499 of
the shuffled human goals, as the original's test split), the 1,000-product catalog, step budget 30, actions
``Search[query]`` / ``Click[target]``.

Domain options (:class:`WebShopOptions`, RunConfig ``domain_options``; ``uqh run -D key=value`` sets any of them,
``--data DIR`` sets ``data``, ``--split`` sets ``split``):

- ``data``: directory with ``items_shuffle_1000.json`` (or ``items_shuffle_1000_prefix.json``) and
  ``items_ins_v2_1000.json`` (each plain or ``.gz``); default the demo data packaged in ``webshop/data/`` (the
  catalog's first 214 records; the manifest's ``info.webshop.data_source`` says which was used).
- ``n_products``: use only the first N catalog records (the original's ``num_products``); default all.
- ``goal_seed``: seed of the frozen price draws (default 42, the paper's seed).
- ``goals_file``: a frozen goals JSON to use instead of building one from ``goal_seed``.
- ``split``: ``test`` (default; goals 0..499), ``eval`` (500..1499), ``train`` (1500..), ``all``.
- ``page_chars``: cut the page text to N characters (the clickables list is never cut); default no cut.
- ``goal_source``: ``auto`` (default: human goals when ``items_human_ins.json`` is in the data directory, else
  synthetic goals with a one-line notice), ``human`` (require the file) or ``synthetic``. Ignored with
  ``goals_file``. The manifest records the source (``info.webshop.goal_source``).
- ``unexecutable_actions``: ``noop`` (default, the original's semantics: a well-formed action the page cannot
  execute consumes the step and leaves the page) or ``repair`` (uqh's earlier strict rules: it is rejected and the
  model asked for a repair).

Heavy imports (numpy, textblob) stay inside functions: registering the domain is cheap.
"""
from __future__ import annotations

import logging
from typing import Any, ClassVar, Literal

from uqh.rundir.errors import UserError
from uqh.rundir.schema import Episode, StopReason

from uqh.domains.domain_registry import register_domain
from uqh.domains.base import Domain, DomainOptions, Environment, NonNegativeInt, option_field
from uqh.domains.tool_offer import BracketTool

log = logging.getLogger(__name__)

DEFAULT_GOAL_SEED = 42
TASK_PREFIX = "ws-"

_RESOURCE_CACHE: dict[tuple, Any] = {}


class WebShopOptions(DomainOptions):
    """WebShop's options (module docstring); ``split`` is one of ``goals.SPLITS``, checked when the domain is built."""

    data: str | None = option_field(
        description="directory with items_shuffle_1000.json (or items_shuffle_1000_prefix.json) and "
        "items_ins_v2_1000.json (plain or .gz); default: the demo catalog prefix packaged with uqh",
        flag="--data", path="input")
    n_products: NonNegativeInt | None = option_field(
        description="use only the first N catalog records (the original's num_products); default all")
    goal_seed: NonNegativeInt = option_field(DEFAULT_GOAL_SEED, description="seed of the frozen price draws")
    goals_file: str | None = option_field(
        description="a frozen goals JSON to use instead of building one from goal_seed", path="input")
    page_chars: NonNegativeInt | None = option_field(
        description="cut the page text to N characters (the clickables list is never cut); default no cut")
    goal_source: Literal["auto", "human", "synthetic"] = option_field(
        "auto", description="auto: human goals when items_human_ins.json is in the data directory, else synthetic "
        "goals (with a notice); human: require the file; synthetic: the original's synthetic goals")
    unexecutable_actions: Literal["noop", "repair"] = option_field(
        "noop", description="noop: the original's semantics (a well-formed action the page cannot execute uses "
        "the step and leaves the page); repair: reject it and ask the model for a repair (uqh's earlier rule)")


def load_resources(
    data: str | None, n_products: int | None, goal_seed: int, goals_file: str | None, goal_source: str = "auto"
):
    """Catalog, frozen goals and search index, cached per process (they are read-only)."""
    key = (data, n_products, goal_seed, goals_file, goal_source)
    hit = _RESOURCE_CACHE.get(key)
    if hit is not None:
        return hit
    from uqh.domains.webshop.catalog import HOW_TO_GET_HUMAN_GOALS, load_catalog
    from uqh.domains.webshop.env import Resources
    from uqh.domains.webshop.goals import freeze_goals, load_goals_file
    from uqh.domains.webshop.search import ProductSearch

    catalog = load_catalog(data, n_products=n_products)
    if goals_file:
        doc, sha = load_goals_file(goals_file, catalog)
        path = goals_file
    else:
        human = catalog.human_instructions_path if goal_source in ("auto", "human") else None
        if goal_source == "human" and human is None:
            raise UserError(
                f"goal_source=human needs items_human_ins.json in the WebShop data directory; {HOW_TO_GET_HUMAN_GOALS}"
            )
        if goal_source == "auto" and human is None:
            log.warning(
                "webshop: no items_human_ins.json in %s: using synthetic goals (the original's test split uses "
                "human goals: put items_human_ins.json beside the catalog for them)", catalog.catalog_path.parent,
            )
        doc, gpath, sha = freeze_goals(catalog, goal_seed, human_path=human)
        path = str(gpath)
    res = Resources(catalog=catalog, goals_doc=doc, goals_sha256=sha, goals_path=path, search=ProductSearch(catalog.products))
    _RESOURCE_CACHE[key] = res
    log.warning("%s", kept_goals_message(res))
    return res


def goal_source_of(doc: dict[str, Any]) -> str:
    """``human`` or ``synthetic`` (frozen synthetic goal files predate the ``source`` field)."""
    return str(doc.get("source", "synthetic"))


def kept_goals_message(res) -> str:
    """One line saying how many goals the loaded catalog supports (and why fewer than the full set)."""
    c = res.goals_doc["counts"]
    if goal_source_of(res.goals_doc) == "human":
        msg = (
            f"webshop: {c['goals']} human goals from {c['human_instructions_in_catalog']} of "
            f"{c['human_instructions']} human instructions ({c['human_instructions_skipped_no_attributes']} without "
            f"attributes skipped; {c['products']} products loaded, goals sha256 {res.goals_sha256[:12]})"
        )
    else:
        msg = (
            f"webshop: {c['goals']} synthetic goals from {c['instructed_products_in_catalog']} of "
            f"{c['instructed_products_in_attributes_file']} instructed products ({c['products']} products loaded, "
            f"goals sha256 {res.goals_sha256[:12]})"
        )
    if res.catalog.is_prefix:
        msg += "; prefix catalog: goals of products outside it are not available, and task ids differ from a full-catalog run"
    return msg


@register_domain("webshop")
class WebShopDomain(Domain):
    prompt_file = "webshop.txt"
    display_name = "WebShop"
    default_step_budget = 30
    action_gbnf = '("Search[" | "Click[") [^\\]<\\n]{1,120} "]"'
    default_split = "test"
    #: WebShop pages are not cut by the generic observation limit (Table 16 gives 420 chars for the retrieval QA
    #: sets only; WebShop is "Text env."). Use the ``page_chars`` option for an explicit cut.
    default_observation_chars: ClassVar[int | None] = None
    Options = WebShopOptions
    bracket_tools = (
        BracketTool("Search", "search", "Submit a search query (when the page shows the search bar).", "query",
                    "the search keywords"),
        BracketTool("Click", "click", "Click one of the page's clickable targets.", "target",
                    "a target exactly as the page lists it"),
    )
    tool_instructions = ("You are shopping in the WebShop text environment for a product that matches the "
                         "instruction. Use search to submit a query when the search bar is available, and click "
                         "with a target that exactly matches one of the page's clickable targets.")

    def __init__(self, options: dict[str, Any] | None = None, *, observation_chars: int | None = 420):
        super().__init__(options, observation_chars=observation_chars)
        from uqh.domains.webshop.goals import SPLITS

        opts: WebShopOptions = self.settings
        self.split = str(opts.split or self.default_split)
        if self.split not in SPLITS:
            raise UserError(f"unknown WebShop split {self.split!r}; choose one of: {', '.join(SPLITS)}")
        self.data = opts.data
        self.n_products = opts.n_products
        self.goal_seed = opts.goal_seed
        self.goals_file = opts.goals_file
        self.page_chars = opts.page_chars
        self.goal_source = opts.goal_source
        self.unexecutable_actions = opts.unexecutable_actions
        self._res = None

    @property
    def resources(self):
        if self._res is None:
            self._res = load_resources(
                str(self.data) if self.data else None, self.n_products, self.goal_seed, self.goals_file,
                self.goal_source,
            )
        return self._res

    def load_data(self) -> None:
        self.resources  # noqa: B018 - catalog, goals and search index, so that a pickled copy carries them

    def goal_indices(self) -> list[int]:
        from uqh.domains.webshop.goals import split_goals

        return split_goals(self.resources.goals_doc, self.split)

    def all_task_ids(self) -> list[str]:
        return [f"{TASK_PREFIX}{i}" for i in self.goal_indices()]

    def goal_index(self, task_id: str) -> int:
        n = len(self.resources.goals)
        try:
            if not task_id.startswith(TASK_PREFIX):
                raise ValueError
            i = int(task_id[len(TASK_PREFIX) :])
        except ValueError:
            raise UserError(f"unknown webshop task id {task_id!r}; task ids are ws-0 .. ws-{n - 1}") from None
        if not 0 <= i < n:
            raise UserError(f"webshop task id {task_id!r} is out of range: the loaded goals are ws-0 .. ws-{n - 1}")
        return i

    def system_prompt(self) -> str:
        return super().system_prompt().replace("{WEBSHOP_SPLIT}", self.split)

    def make_env(self, task_id: str, *, episode_seed: int) -> Environment:
        from uqh.domains.webshop.env import WebShopEnv

        return WebShopEnv(
            self.resources, self.goal_index(task_id), page_chars=self.page_chars,
            unexecutable_actions=self.unexecutable_actions,
        )

    def manifest_info(self) -> dict[str, Any]:
        from uqh.domains.webshop.search import B, K1, SEARCH_RETURN_N

        res = self.resources
        n_split = len(self.goal_indices())
        info = {
            "webshop": {
                **res.catalog.describe(),
                "n_products_option": self.n_products,
                "goals_file": res.goals_path,
                "goals_sha256": res.goals_sha256,
                "goal_source": goal_source_of(res.goals_doc),
                "goal_seed": res.goals_doc.get("seed"),
                "goal_counts": res.goals_doc.get("counts"),
                "split": self.split,
                "split_goals": n_split,
                "search": {"engine": "lucene-bm25 (Anserini 0.14.3 semantics, numpy)", "k1": K1, "b": B,
                           "analyzer": "anserini-default-english", "norms": "lucene-lossy-byte",
                           "ties": "asin", "return_n": SEARCH_RETURN_N},
                "unexecutable_actions": self.unexecutable_actions,
                "noun_tagger": "textblob PatternTagger (Penn NN*), instead of spaCy en_core_web_*",
                "page_chars": self.page_chars,
                "observation_chars_applied": False,
            }
        }
        return info

    @classmethod
    def canonical_answer(cls, episode: Episode) -> str | None:
        """The purchase: the bought ASIN and the chosen options, options sorted by name (``B0123 | color: red;
        size: m``); the reward is a function of exactly these (and the ASIN's fixed price)."""
        info = episode.reward_info if episode.stop_reason == StopReason.clean else {}
        asin = info.get("purchased_asin")
        if not asin:
            return None
        options = info.get("purchased_options") or {}
        chosen = "; ".join(f"{k}: {options[k]}" for k in sorted(options))
        return f"{asin} | {chosen}" if chosen else str(asin)
