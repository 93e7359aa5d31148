"""One WebShop episode: a page state machine over the shared catalog, search index and frozen goals.

Actions (the content of the ``<action>`` tag) follow the original text environment (``WebAgentTextEnv.step``):

- An action is well formed when it reads ``name[argument]`` (the original's pattern ``(.+)\\[(.+)\\]``: the
  name is everything before the last ``[`` that has a ``]`` after it, the argument runs to the last ``]``, text
  after that is ignored) and the name is ``search`` or ``click``. The name is matched case-insensitively, so the
  paper prompt's ``Search[...]`` / ``Click[...]`` mean the original's ``search[...]`` / ``click[...]``; the
  argument is lower-cased and not stripped, as the original does. Anything else is malformed: it raises
  :class:`InvalidAction` and the harness asks for a repair.
- ``search[keywords]`` runs on any page (the original does not check for a search bar): results page 1 of the
  keywords, selected options cleared.
- ``click[target]`` runs when the lower-cased target is one of the page's clickables (other than the search
  button, which only ``search[...]`` presses). What it does is decided by its text, as the original's server:
  ``buy now`` purchases, ``back to search`` returns to the search page, ``next >`` / ``< prev`` page through
  results, ``< prev`` on an item page returns to its results page (options cleared) and on a sub-page to the item
  page (options kept), ``description`` / ``features`` / ``reviews`` open a sub-page; otherwise a product link opens
  its item page and an option value selects it (one value per option name).
- A well-formed action the page cannot execute (a click target that is not on the page) is the original's
  *no-op*: the page stays, the step is consumed, and ``step.info`` records ``noop: true`` with the reason and the
  episode's running count ``noop_steps`` (also in ``reward_info`` at the purchase).

Domain option ``unexecutable_actions=repair`` restores uqh's earlier, stricter rules instead: ``Search`` only on
the search page, non-empty queries, click targets on the page, and an :class:`InvalidAction` (a repair request;
three in a row end the episode ``parse_error``) for anything else.

``Click[Buy Now]`` ends the episode with the original reward; ``outcome = 1`` iff the reward is exactly 1.0.

The agent sees the page text and, after it, whether the search bar is on the page and the list of clickable
targets (the prompt asks for "a target that exactly matches one of the provided clickable targets"); on an item
page the currently selected options are listed too (the original shows them as checked radio buttons).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from uqh.domains.base import Environment, EnvResponse, InvalidAction, RecordedStep, ReplayMismatch
from uqh.domains.webshop import pages
from uqh.domains.webshop.pages import Page, PageState

_ORIGINAL_ACTION = re.compile(r"(.+)\[(.+)\]")
_STRICT_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
NOOP = "noop"
REPAIR = "repair"
UNEXECUTABLE_ACTION_MODES = (NOOP, REPAIR)


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
    """(``search`` | ``click``, lower-cased argument) as the original parses it; InvalidAction if malformed."""
    m = _ORIGINAL_ACTION.match(action or "")
    if m is None or m.group(1).lower() not in ("search", "click"):
        raise InvalidAction(
            f"the action must be Search[query] or Click[target], got {(action or '').strip()[:80]!r}"
        )
    return m.group(1).lower(), m.group(2).lower()


def parse_action_strict(action: str) -> tuple[str, str]:
    """uqh's earlier parse (surrounding blanks allowed, argument stripped, original case kept)."""
    m = _STRICT_ACTION.match(action or "")
    if not m:
        raise InvalidAction(
            f"the action must be Search[query] or Click[target], got {(action or '').strip()[:80]!r}"
        )
    return m.group(1).lower(), m.group(2).strip()


class WebShopEnv(Environment):
    def __init__(
        self,
        resources: Resources,
        goal_index: int,
        *,
        page_chars: int | None = None,
        unexecutable_actions: str = NOOP,
    ):
        if unexecutable_actions not in UNEXECUTABLE_ACTION_MODES:
            raise ValueError(f"unexecutable_actions must be one of {UNEXECUTABLE_ACTION_MODES}")
        self.res = resources
        self.goal_index = goal_index
        self.goal = resources.goals[goal_index]
        self.instruction = self.goal["instruction_text"]
        self.page_chars = page_chars
        self.unexecutable_actions = unexecutable_actions
        self.state = PageState()
        self.done = False
        self.reward: float | None = None
        self.reward_info: dict[str, Any] = {}
        self.noop_steps = 0
        self._page: Page = pages.search_page(self.instruction)

    # ------------------------------------------------------------------------------ rendering

    def render(self, state: PageState) -> Page:
        by_asin = self.res.catalog.by_asin
        if state.kind == "search":
            return pages.search_page(self.instruction)
        if state.kind == "results":
            hits = self.res.search.search(state.keywords or "")
            lo = (state.page - 1) * pages.PRODUCT_WINDOW
            shown = [by_asin[a] for a in hits[lo : lo + pages.PRODUCT_WINDOW]] if lo >= 0 else []
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
        self.noop_steps = 0
        self._page = self.render(self.state)
        return "Observation: " + self.observation()

    def transition(self, action: str) -> tuple[PageState, str | None]:
        """(next state, no-op reason or None) for ``action``; raises InvalidAction; changes nothing."""
        if self.done:
            raise InvalidAction("the episode is over (the purchase was made); no further actions are possible")
        if self.unexecutable_actions == REPAIR:
            return self._transition_strict(action), None
        kind, arg = parse_action(action)
        st = self.state
        if kind == "search":
            return PageState("results", arg, 1), None
        click = self._page.lookup().get(arg)
        if click is None or arg == "search":
            return st, f"{arg[:80]!r} is not a clickable target on this page"
        return self._click(arg, click), None

    def _click(self, name: str, click: pages.Clickable) -> PageState:
        """The original server's dispatch: by the clicked text first, then by what the clickable is."""
        st = self.state
        if name == pages.BUY_NOW.lower():
            return PageState("done", st.keywords, st.page, st.asin, st.options)
        if name == pages.BACK_TO_SEARCH.lower():
            return PageState()
        if name == pages.NEXT_PAGE.lower() and st.kind == "results":
            return PageState("results", st.keywords, st.page + 1)
        if name == pages.PREV_PAGE.lower() and st.kind == "results":
            return PageState("results", st.keywords, st.page - 1)
        if name == pages.PREV_PAGE.lower() and st.kind == "sub":
            return PageState("item", st.keywords, st.page, st.asin, st.options)
        if name == pages.PREV_PAGE.lower() and st.kind == "item":
            return PageState("results", st.keywords, st.page)
        for sub in pages.SUB_PAGES:
            if name == sub.lower():
                return PageState("sub", st.keywords, st.page, st.asin, st.options, sub)
        if click.kind == "product":
            return PageState("item", st.keywords, st.page, click.arg, st.options)
        if click.kind == "option":
            opt_name, value = click.arg
            return st.with_option(opt_name, value)
        return PageState("item", st.keywords, st.page, st.asin, st.options)

    def _transition_strict(self, action: str) -> PageState:
        kind, arg = parse_action_strict(action)
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
        return self._click(target, click)

    def _buy(self, st: PageState) -> None:
        from uqh.domains.webshop.reward import get_reward

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
                "noop_steps": self.noop_steps,
            }
        )
        self.reward, self.reward_info = reward, info

    async def step(self, action: str) -> EnvResponse:
        new, noop_reason = self.transition(action)
        if noop_reason is not None:
            self.noop_steps += 1
            info = {"state": self.state.as_dict(), "noop": True, "noop_reason": noop_reason,
                    "noop_steps": self.noop_steps}
            return EnvResponse(observation=self.observation(), info=info)
        if new.kind == "done":
            self._buy(new)
            self.done = True
        self.state = new
        self._page = self.render(new)
        info = {"state": new.as_dict(), "noop": False, "noop_steps": self.noop_steps}
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
