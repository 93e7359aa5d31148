"""One WebShop episode: a page state machine over the shared catalog, search index and frozen goals.

Actions (the content of the ``<action>`` tag): ``Search[query]`` (only where the search bar is, i.e. on the search
page) and ``Click[target]`` where ``target`` equals, case-insensitively, one of the current page's clickables.
Anything else raises :class:`InvalidAction` with the page left unchanged. ``Click[Buy Now]`` ends the episode
with the original reward; ``outcome = 1`` iff the reward is exactly 1.0.

Transitions follow the original's server: a search goes to results page 1 and clears the selected options;
``Next >`` / ``< Prev`` move between results pages; an ASIN opens its item page; an option value selects it
(one per option name); ``Description`` / ``Features`` / ``Reviews`` open a sub-page whose ``< Prev`` returns to the
item page with the selection kept; ``< Prev`` on an item page returns to the results page it came from (options
cleared, as the original re-runs the search); ``Back to Search`` returns to the search page.

The agent sees the page text and, after it, whether the search bar is available and the list of clickable
targets (the prompt asks for "a target that exactly matches one of the provided clickable targets"); on an item
page the currently selected options are listed too (the original shows them as checked radio buttons).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..base import EnvResponse, Environment, InvalidAction, RecordedStep, ReplayMismatch
from . import pages
from .pages import Page, PageState

_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)


@dataclass
class Resources:
    """Read-only, shared by every episode of a domain instance."""

    catalog: Any  # catalog.Catalog
    goals_doc: dict[str, Any]
    goals_sha256: str
    goals_path: str
    search: Any  # search.ProductSearch

    @property
    def goals(self) -> list[dict[str, Any]]:
        return self.goals_doc["goals"]

    @property
    def prices(self) -> dict[str, float]:
        return self.goals_doc["product_prices"]


def parse_action(action: str) -> tuple[str, str]:
    m = _ACTION.match(action or "")
    if not m:
        raise InvalidAction(
            f"the action must be Search[query] or Click[target], got {action.strip()[:80]!r}"
        )
    return m.group(1).lower(), m.group(2).strip()


class WebShopEnv(Environment):
    def __init__(self, resources: Resources, goal_index: int, *, page_chars: int | None = None):
        self.res = resources
        self.goal_index = goal_index
        self.goal = resources.goals[goal_index]
        self.instruction = self.goal["instruction_text"]
        self.page_chars = page_chars
        self.state = PageState()
        self.done = False
        self.reward: float | None = None
        self.reward_info: dict[str, Any] = {}
        self._page: Page = pages.search_page(self.instruction)

    # ------------------------------------------------------------------------------ rendering

    def _results(self, keywords: str) -> list[str]:
        return self.res.search.search(keywords)

    def render(self, state: PageState) -> Page:
        by_asin = self.res.catalog.by_asin
        if state.kind == "search":
            return pages.search_page(self.instruction)
        if state.kind == "results":
            hits = self._results(state.keywords or "")
            lo = (state.page - 1) * pages.PRODUCT_WINDOW
            shown = [by_asin[a] for a in hits[lo : lo + pages.PRODUCT_WINDOW]]
            return pages.results_page(self.instruction, state.page, len(hits), shown)
        if state.kind == "item":
            return pages.item_page(self.instruction, by_asin[state.asin])
        if state.kind == "sub":
            return pages.sub_page(self.instruction, by_asin[state.asin], state.sub)
        if state.kind == "done":
            return pages.done_page(self.reward or 0.0)
        raise AssertionError(f"unknown page kind {state.kind!r}")

    def observation(self) -> str:
        """The page text (cut to ``page_chars`` if set), then the search-bar line and the clickables."""
        page = self._page
        text = page.text
        if self.page_chars is not None and len(text) > self.page_chars:
            text = text[: self.page_chars]
        if self.state.kind == "done":
            return text
        lines = [text, ""]
        if self.state.kind == "item" and self.state.options:
            sel = "; ".join(f"{k}: {v}" for k, v in self.state.options)
            lines.append(f"Selected options: {sel}")
        lines.append("Search bar: " + ("available (use Search[query])" if page.has_search_bar else "not available"))
        clicks = " ".join(f"[{c.text}]" for c in page.clickables)
        lines.append("Clickables: " + (clicks if clicks else "none"))
        return "\n".join(lines)

    def _describe_choices(self) -> str:
        page = self._page
        bits = []
        if page.has_search_bar:
            bits.append("Search[query]")
        if page.clickables:
            bits.append("Click[x] for x in " + ", ".join(f"[{c.text}]" for c in page.clickables))
        return "; ".join(bits) if bits else "nothing"

    # ------------------------------------------------------------------------------ interface

    async def reset(self) -> str:
        self.state = PageState()
        self.done = False
        self.reward = None
        self.reward_info = {}
        self._page = self.render(self.state)
        return "Observation: " + self.observation()

    def transition(self, action: str) -> PageState:
        """The next state for ``action`` (raises InvalidAction; does not change anything)."""
        if self.done:
            raise InvalidAction("the episode is over (the purchase was made); no further actions are possible")
        kind, arg = parse_action(action)
        st = self.state
        page = self._page
        if kind == "search":
            if not page.has_search_bar:
                raise InvalidAction(
                    "there is no search bar on this page; Search[...] is only possible on the search page "
                    f"(click [Back to Search] first). Allowed now: {self._describe_choices()}"
                )
            if not arg:
                raise InvalidAction("the search query is empty; write Search[some keywords]")
            return PageState("results", arg.lower(), 1)
        target = arg.lower()
        if page.has_search_bar and target == "search":
            raise InvalidAction("the search button is pressed with Search[query], not Click[Search]")
        click = page.lookup().get(target)
        if click is None:
            raise InvalidAction(
                f"{arg[:80]!r} is not a clickable target on this page. Allowed now: {self._describe_choices()}"
            )
        if click.kind == "back":
            return PageState()
        if click.kind == "next":
            return PageState("results", st.keywords, st.page + 1)
        if click.kind == "prev":
            if st.kind == "results":
                return PageState("results", st.keywords, st.page - 1)
            if st.kind == "item":
                return PageState("results", st.keywords, st.page)
            return PageState("item", st.keywords, st.page, st.asin, st.options)
        if click.kind == "product":
            return PageState("item", st.keywords, st.page, click.arg, st.options)
        if click.kind == "option":
            name, value = click.arg
            return st.with_option(name, value)
        if click.kind == "sub":
            return PageState("sub", st.keywords, st.page, st.asin, st.options, click.arg)
        if click.kind == "buy":
            return PageState("done", st.keywords, st.page, st.asin, st.options)
        raise AssertionError(f"unknown clickable kind {click.kind!r}")

    def _buy(self, st: PageState) -> None:
        from .reward import get_reward

        product = self.res.catalog.by_asin[st.asin]
        price = self.res.prices[st.asin]
        reward, info = get_reward(product, self.goal, price=price, options=st.options_dict())
        info.update(
            {
                "purchased_asin": st.asin,
                "purchased_options": st.options_dict(),
                "purchased_price": price,
                "goal_index": self.goal_index,
                "goal_asin": self.goal["asin"],
                "goal_options": self.goal["goal_options"],
                "goal_attributes": self.goal["attributes"],
                "price_upper": self.goal["price_upper"],
            }
        )
        self.reward, self.reward_info = reward, info

    async def step(self, action: str) -> EnvResponse:
        new = self.transition(action)
        if new.kind == "done":
            self._buy(new)
            self.done = True
        self.state = new
        self._page = self.render(new)
        info = {"state": new.as_dict()}
        if self.done:
            return EnvResponse(
                observation=self.observation(),
                done=True,
                outcome=int(self.reward == 1.0),
                reward=self.reward,
                reward_info=self.reward_info,
                info=info,
            )
        return EnvResponse(observation=self.observation(), info=info)

    async def replay(self, steps: list[RecordedStep]) -> None:
        """Re-execute the recorded actions; the observation (and, when recorded, the page state) must match."""
        for i, rec in enumerate(steps, start=1):
            try:
                resp = await self.step(rec.action)
            except InvalidAction as exc:
                raise ReplayMismatch(f"step {i}: recorded action {rec.action[:60]!r} is invalid on replay: {exc}") from None
            if resp.observation != rec.observation:
                raise ReplayMismatch(
                    f"step {i}: replayed observation differs from the recorded one "
                    f"(recorded {rec.observation[:80]!r}, replayed {resp.observation[:80]!r})"
                )
            recorded_state = (rec.info or {}).get("state")
            if recorded_state is not None and recorded_state != resp.info["state"]:
                raise ReplayMismatch(
                    f"step {i}: replayed page state {resp.info['state']} differs from the recorded {recorded_state}"
                )
            if resp.done:
                raise ReplayMismatch(f"step {i}: the episode ended during replay; the prefix is not censored")
