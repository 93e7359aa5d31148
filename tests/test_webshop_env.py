"""WebShop environment: search ranking (Lucene BM25 closed form, lossy norms, ASIN ties), every navigation path,
the original's action semantics (no-ops) and the strict repair mode, replay."""
from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from uqh.domains.base import InvalidAction, RecordedStep, ReplayMismatch
from uqh.rundir.errors import UserError

N_SOCKS = 24


def raw_product(asin, name, *, desc="", bullets=None, pricing="$25.00", options=None, query="q", category="cat",
                product_category="Clothing › Shoes › Running"):
    return {
        "asin": asin,
        "name": name,
        "full_description": desc,
        "small_description": bullets if bullets is not None else [],
        "pricing": pricing,
        "customization_options": options or "",
        "category": category,
        "query": query,
        "product_category": product_category,
        "images": [""],
        "brand": "x",
    }


def make_catalog_dir(tmp: Path) -> Path:
    """A hand-made catalog in the official file formats."""
    products = [
        raw_product(
            "P01", "Red Running Shoes", desc="Light sneakers for daily jogging.", bullets=["rubber sole"],
            options={"Size": [{"value": "7"}, {"value": "8"}], "Color": [{"value": "Red/Black"}, {"value": "white"}]},
            query="running shoes",
        ),
        raw_product("P02", "Blue Running Shoes Running", desc="", query="running shoes"),
        raw_product("P03", "Red Dress", desc="", query="dresses", product_category="Clothing › Women › Dresses"),
        raw_product("P04", "Leather Wallet", desc="", pricing="$10.00$20.00", query="wallets",
                    product_category="Accessories › Wallets"),
        raw_product("nan", "dropped: bad asin"),
        raw_product("P01", "dropped: repeated asin"),
    ]
    # Socks in reverse ASIN order: equal scores must come back sorted by ASIN (Lucene's tie-break), not by catalog order.
    for i in reversed(range(N_SOCKS)):
        products.append(raw_product(f"S{i:02d}", f"Cotton Sock style{i:02d}", query="socks",
                                    product_category="Clothing › Socks"))
    # no instruction (no goals); an option value that is also a button's text, and one value in two groups
    products.append(raw_product(
        "P05", "Odd Lamp", bullets=[""], query="lamps",
        options={"Style": [{"value": "Description"}, {"value": "Plain"}], "Finish": [{"value": "plain"}]},
    ))
    attrs = {
        "P01": {"attributes": ["running shoes", "rubber sole"], "instruction": "i need running shoes",
                "instruction_attributes": ["running shoes"]},
        "P02": {"attributes": []},
        "P04": {"attributes": ["genuine leather"], "instruction": "i want a wallet",
                "instruction_attributes": ["genuine leather"]},
    }
    d = tmp / "ws"
    d.mkdir()
    (d / "items_shuffle_1000.json").write_text(json.dumps(products))
    (d / "items_ins_v2_1000.json").write_text(json.dumps(attrs))
    return d


@pytest.fixture
def domain(tmp_path, monkeypatch):
    import uqh.domains.webshop.goals as goals_mod
    from uqh.domains.domain_registry import get_domain_class

    monkeypatch.setattr(goals_mod, "CACHE_DIR", tmp_path / "cache")
    data = make_catalog_dir(tmp_path)
    return get_domain_class("webshop")({"data": str(data), "split": "all"})


def find_goal(domain, asin, options):
    for i, g in enumerate(domain.resources.goals):
        if g["asin"] == asin and g["goal_options"] == options:
            return i
    raise AssertionError("goal not found")


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------------- search


def lucene_bm25(query_terms, docs, k1=0.9, b=0.4):
    """Closed-form Lucene 8 BM25 over pre-tokenised docs (exact lengths: all documents here are < 24 terms)."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    scores = []
    for d in docs:
        s = 0.0
        for t in set(query_terms):
            df = sum(1 for x in docs if t in x)
            if df == 0 or t not in d:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = d.count(t)
            s += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
        scores.append(s)
    return scores


def test_search_ranking_matches_closed_form_bm25(domain):
    search = domain.resources.search
    hits = search.search("running shoes")
    assert hits[:2] == ["P02", "P01"]  # P02 repeats "running" in a shorter document
    assert set(hits) == {"P01", "P02"}
    # Hand analysis (Lucene tokens incl. one-character ones, stop words out, Porter stems) of every document.
    docs = {
        "P01": "red run shoe light sneaker daili jog rubber sole size 7 8 color red black white".split(),
        "P02": "blue run shoe run".split(),
        "P03": "red dress".split(),
        "P04": "leather wallet".split(),
        **{f"S{i:02d}": f"cotton sock style{i:02d}".split() for i in reversed(range(N_SOCKS))},
        "P05": "odd lamp style descript plain finish plain".split(),
    }
    assert [search.lengths[search.asins.index(a)] for a in docs] == [len(d) for d in docs.values()]
    order = list(docs)
    for query, terms in (("Red", ["red"]), ("size 7", ["size", "7"]), ("8", ["8"])):
        expected = lucene_bm25(terms, [docs[a] for a in order])
        scored = search.scored(query)
        assert [a for a, _ in scored] == sorted((a for a, s in zip(order, expected) if s > 0),
                                                key=lambda a: -expected[order.index(a)])
        for asin, score in scored:
            assert score == pytest.approx(expected[order.index(asin)], rel=1e-6)
    assert search.search("Red") == ["P03", "P01"]  # the shorter document wins
    assert search.search("7") == ["P01"]  # one-character tokens are indexed (bm25s dropped them)


def test_search_stemming_stopwords_ties_and_limit(domain):
    search = domain.resources.search
    assert search.search("shoe") == search.search("shoes")  # Porter stemming
    assert search.search("the and of") == []  # Lucene stop words only
    assert search.search("zzzz") == [] and search.search(" ") == []
    socks = search.search("socks")
    assert socks == [f"S{i:02d}" for i in range(N_SOCKS)]  # equal scores: by ASIN, although the catalog is reversed
    assert len(search.search("socks", k=5)) == 5
    # the original's special keywords: <q> = products with that search query, <c> = that category, catalog order
    assert search.search("<q> socks") == [f"S{i:02d}" for i in reversed(range(N_SOCKS))]
    assert search.search("<c> cat") == search.asins and search.search("<c> nothing") == []


def test_lucene_norm_encoding():
    from uqh.domains.webshop.search import decoded_length, encode_length

    assert [decoded_length(encode_length(n)) for n in range(24)] == list(range(24))  # small lengths are exact
    # 100 -> 24 + 76; 76 has 7 bits: keep 4 (1001), shift 3 -> (8 | 1) << 3 = 72 -> 96
    assert encode_length(100) == 24 + ((76 >> 3) & 7 | (4 << 3)) and decoded_length(encode_length(100)) == 96
    codes = [encode_length(n) for n in range(5000)]
    assert codes == sorted(codes) and max(codes) < 256
    for n in range(24, 5000):
        d = decoded_length(encode_length(n))
        assert d <= n and (n - d) / n < 1 / 8  # three significant bits after the leading one
    assert decoded_length(255) > 2**30


# ------------------------------------------------------------------------------------------- navigation


def test_every_navigation_path(domain):
    gi = find_goal(domain, "P01", {"color": "red | black", "size": "7"})
    env = domain.make_env(f"ws-{gi}", episode_seed=0)
    instr = domain.resources.goals[gi]["instruction_text"]
    first = run(env.reset())
    assert first.startswith(f"Observation: WebShop [SEP] Instruction: [SEP] {instr} [SEP] Search\n")
    assert "Search bar: available" in first and "Clickables: none" in first

    r = run(env.step("search[Socks]"))
    assert r.done is False and r.info["state"]["page"] == "results" and r.info["noop"] is False
    page1 = r.observation
    assert f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] Page 1 (Total results: 24) [SEP] Next > [SEP] S00" in page1
    assert "< Prev" not in page1
    assert "S09 [SEP] Cotton Sock style09 [SEP] $25.0" in page1 and "S10" not in page1
    assert "Search bar: not available" in page1
    assert "Clickables: [Back to Search] [Next >] [S00]" in page1

    page2 = run(env.step("Click[next >]")).observation  # case-insensitive
    assert "Page 2 (Total results: 24) [SEP] < Prev [SEP] Next > [SEP] S10" in page2 and "S09 " not in page2
    page3 = run(env.step("click[Next >]")).observation
    assert "Page 3 (Total results: 24) [SEP] < Prev [SEP] Next > [SEP] S20" in page3 and "S23" in page3
    # the original always shows Next >: past the end comes a page without products
    page4 = run(env.step("click[Next >]")).observation
    assert page4.startswith(f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] Page 4 (Total results: 24) "
                            "[SEP] < Prev [SEP] Next >\n")
    assert run(env.step("click[< Prev]")).observation == page3
    assert run(env.step("click[< Prev]")).observation == page2
    assert run(env.step("click[< Prev]")).observation == page1

    # back to search, then a new query
    r = run(env.step("click[Back to Search]"))
    assert r.info["state"] == {"page": "search", "keywords": None, "page_no": None, "asin": None, "options": {},
                               "sub_page": None}
    results = run(env.step("search[running shoes]")).observation
    assert "Page 1 (Total results: 2) [SEP] Next > [SEP] P02" in results

    item = run(env.step("click[p01]")).observation  # ASINs match case-insensitively
    assert ("Back to Search [SEP] < Prev [SEP] size [SEP] 7 [SEP] 8 [SEP] color [SEP] red | black [SEP] white "
            "[SEP] Red Running Shoes [SEP] Price: $25.0 [SEP] Rating: N.A. [SEP] Description [SEP] Features "
            "[SEP] Reviews [SEP] Buy Now") in item
    assert "Selected options" not in item

    r = run(env.step("click[white]"))
    assert r.info["state"]["options"] == {"color": "white"}
    assert "Selected options: color: white" in r.observation
    r = run(env.step("click[RED | BLACK]"))  # re-selecting in the same group replaces the value
    r = run(env.step("click[7]"))
    assert r.info["state"]["options"] == {"color": "red | black", "size": "7"}

    desc = run(env.step("click[Description]")).observation
    assert f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] < Prev [SEP] Light sneakers for daily jogging." in desc
    assert "Clickables: [Back to Search] [< Prev]" in desc
    back = run(env.step("click[< Prev]"))
    assert back.info["state"]["page"] == "item" and back.info["state"]["options"] == {"color": "red | black", "size": "7"}
    assert "[SEP] < Prev [SEP] rubber sole\n" in run(env.step("click[features]")).observation
    run(env.step("click[< Prev]"))
    # no reviews: nothing after < Prev (the original's loader never loads reviews)
    assert f"{instr} [SEP] Back to Search [SEP] < Prev\n" in run(env.step("click[Reviews]")).observation
    run(env.step("click[< Prev]"))

    # < Prev on the item page: back to the results page it came from (options cleared)
    r = run(env.step("click[< Prev]"))
    assert r.observation == results and r.info["state"]["options"] == {}
    run(env.step("click[P01]"))
    # a search from the item page runs (the original has no search-bar check)
    r = run(env.step("search[running shoes]"))
    assert r.observation == results and r.info["noop"] is False
    run(env.step("click[P01]"))
    run(env.step("click[red | black]"))
    run(env.step("click[7]"))
    r = run(env.step("click[Buy Now]"))
    assert r.done and r.reward == 1.0 and r.outcome == 1
    assert r.observation == "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0"
    assert r.reward_info["purchased_asin"] == "P01" and r.reward_info["r_type"] == 1.0
    assert r.reward_info["noop_steps"] == 0
    with pytest.raises(InvalidAction, match="episode is over"):
        run(env.step("click[Back to Search]"))


def test_buy_wrong_option_outcome_zero(domain):
    gi = find_goal(domain, "P01", {"color": "red | black", "size": "7"})
    env = domain.make_env(f"ws-{gi}", episode_seed=0)
    run(env.reset())
    for a in ("search[running shoes]", "click[P01]", "click[white]", "click[7]"):
        run(env.step(a))
    r = run(env.step("click[buy now]"))
    assert r.done and r.reward == pytest.approx(0.75) and r.outcome == 0


def test_click_dispatch_by_text_and_empty_bullet(domain):
    """As the original's server: a clicked text that names a button acts as that button even when an option has
    that value; a value in two option groups belongs to the later group; an empty bullet is an empty segment."""
    env = domain.make_env("ws-0", episode_seed=0)
    run(env.reset())
    run(env.step("search[odd lamp]"))
    item = run(env.step("click[P05]")).observation
    assert "style [SEP] description [SEP] plain [SEP] finish [SEP] plain [SEP] Odd Lamp" in item
    r = run(env.step("click[plain]"))
    assert r.info["state"]["options"] == {"finish": "plain"}
    r = run(env.step("click[description]"))
    assert r.info["state"]["page"] == "sub" and r.info["state"]["sub_page"] == "Description"
    assert r.info["state"]["options"] == {"finish": "plain"}
    run(env.step("click[< Prev]"))
    features = run(env.step("click[Features]")).observation
    assert features.split("\n")[0].endswith("Back to Search [SEP] < Prev [SEP] ")


def _obs_and_state(env):
    return env.observation(), env.state


@pytest.mark.parametrize(
    "setup,action",
    [
        ([], "click[Search]"),  # the search button is pressed with search[...], never click
        ([], "click[Back to Search]"),
        (["search[socks]"], "click[< Prev]"),  # page 1 has no < Prev
        (["search[socks]"], "click[P01]"),  # not on this page
        (["search[socks]"], "click[ S00]"),  # the argument is not stripped (the original's)
        (["search[socks]", "click[S00]"], "click[white]"),  # another product's option
        (["search[socks]", "click[S00]"], "click[cotton sock style00]"),  # the title is not a clickable
        (["search[socks]", "click[S00]", "click[Description]"], "click[Buy Now]"),
    ],
)
def test_unexecutable_actions_are_noops(domain, setup, action):
    env = domain.make_env("ws-0", episode_seed=0)
    run(env.reset())
    for a in setup:
        run(env.step(a))
    before = _obs_and_state(env)
    r = run(env.step(action))
    assert r.observation == before[0] and _obs_and_state(env) == before and not r.done
    assert r.info["noop"] is True and "not a clickable target" in r.info["noop_reason"]
    assert r.info["noop_steps"] == 1 and r.info["state"] == before[1].as_dict()
    r = run(env.step(action))
    assert r.info["noop_steps"] == 2  # the episode's running count
    ok = run(env.step("search[socks]"))  # a real step afterwards keeps the count
    assert ok.info["noop"] is False and ok.info["noop_steps"] == 2


@pytest.mark.parametrize(
    "action", ["Buy Now", "finish[done]", "search[]", "click[]", "Scroll[down]", " click[S00]", "click [S00]",
               "search[a\nb]"],
)
def test_malformed_actions_ask_for_a_repair(domain, action):
    env = domain.make_env("ws-0", episode_seed=0)
    run(env.reset())
    run(env.step("search[socks]"))
    before = _obs_and_state(env)
    with pytest.raises(InvalidAction, match="Search\\[query\\] or Click\\[target\\]"):
        run(env.step(action))
    assert _obs_and_state(env) == before


def test_action_parse_follows_the_original():
    from uqh.domains.webshop.env import parse_action

    assert parse_action("Search[Red Shoes]") == ("search", "red shoes")
    assert parse_action("CLICK[Buy Now]") == ("click", "buy now")
    assert parse_action("click[buy now] thanks") == ("click", "buy now")  # text after the last ] is ignored
    assert parse_action("click[a]b]") == ("click", "a]b")  # the argument runs to the last ]
    assert parse_action("search[ ]") == ("search", " ")  # not stripped: a blank query (0 results)
    with pytest.raises(InvalidAction):
        parse_action("search[a] and [b]")  # the name is everything before the last [


@pytest.mark.parametrize(
    "setup,action,match",
    [
        ([], "click[Search]", "Search\\[query\\]"),
        ([], "click[Back to Search]", "not a clickable target"),
        ([], "search[]", "empty"),
        (["search[socks]"], "click[< Prev]", "not a clickable target"),
        (["search[socks]"], "search[shoes]", "no search bar"),
        (["search[socks]"], "click[P01]", "not a clickable target"),  # not on this page
        (["search[socks]", "click[S00]"], "click[white]", "not a clickable target"),
        (["search[socks]", "click[S00]"], "Buy Now", "Search\\[query\\] or Click\\[target\\]"),
        (["search[socks]", "click[S00]"], "finish[done]", "Search\\[query\\] or Click\\[target\\]"),
        (["search[socks]", "click[S00]", "click[Description]"], "click[Buy Now]", "not a clickable target"),
    ],
)
def test_repair_mode_rejects_unexecutable_actions(tmp_path, monkeypatch, setup, action, match):
    """unexecutable_actions=repair: uqh's earlier rules, every rejected action leaves the page unchanged."""
    import uqh.domains.webshop.goals as goals_mod
    from uqh.domains.domain_registry import get_domain_class

    monkeypatch.setattr(goals_mod, "CACHE_DIR", tmp_path / "cache")
    dom = get_domain_class("webshop")({"data": str(make_catalog_dir(tmp_path)), "split": "all",
                                       "unexecutable_actions": "repair"})
    env = dom.make_env("ws-0", episode_seed=0)
    run(env.reset())
    for a in setup:
        run(env.step(a))
    before = _obs_and_state(env)
    with pytest.raises(InvalidAction, match=match):
        run(env.step(action))
    assert _obs_and_state(env) == before
    if "not a clickable" in match:
        with pytest.raises(InvalidAction) as exc:
            run(env.step(action))
        assert "Allowed now:" in str(exc.value)
    assert dom.manifest_info()["webshop"]["unexecutable_actions"] == "repair"


# ------------------------------------------------------------------------------------------- replay

ACTIONS = ["search[socks]", "click[Next >]", "click[S12]", "click[Features]", "click[< Prev]", "click[nowhere]",
           "click[Back to Search]", "search[running shoes]", "click[P01]", "click[8]"]


def _record(env, actions):
    steps = []
    for a in actions:
        r = run(env.step(a))
        # what the run directory stores: JSON round trip of the step info
        steps.append(RecordedStep(action=a, observation=r.observation, info=json.loads(json.dumps(r.info))))
    return steps


def test_replay_reaches_the_same_page_state(domain):
    env1 = domain.make_env("ws-1", episode_seed=0)
    run(env1.reset())
    steps = _record(env1, ACTIONS)
    env2 = domain.make_env("ws-1", episode_seed=0)
    run(env2.reset())
    run(env2.replay(steps))
    assert env2.state == env1.state and env2.observation() == env1.observation()
    # and continues identically
    assert run(env2.step("click[Buy Now]")).reward == run(env1.step("click[Buy Now]")).reward


def test_replay_mismatch_detection(domain):
    env1 = domain.make_env("ws-1", episode_seed=0)
    run(env1.reset())
    steps = _record(env1, ACTIONS)

    def fresh():
        e = domain.make_env("ws-1", episode_seed=0)
        run(e.reset())
        return e

    bad_obs = [RecordedStep(s.action, s.observation, s.info) for s in steps]
    bad_obs[3] = RecordedStep(steps[3].action, steps[3].observation + " tampered", steps[3].info)
    with pytest.raises(ReplayMismatch, match="step 4: replayed observation differs"):
        run(fresh().replay(bad_obs))

    bad_state = list(steps)
    info = json.loads(json.dumps(steps[-1].info))
    info["state"]["options"] = {"size": "7"}
    bad_state[-1] = RecordedStep(steps[-1].action, steps[-1].observation, info)
    with pytest.raises(ReplayMismatch, match="step 10: replayed page state"):
        run(fresh().replay(bad_state))

    with pytest.raises(ReplayMismatch, match="invalid on replay"):
        run(fresh().replay([RecordedStep("finish[done]", "x", {})]))
    # a no-op replays as a no-op: same observation, same state
    noop = _record(fresh(), ["click[Next >]"])
    assert noop[0].info["noop"] is True
    run(fresh().replay(noop))

    env3 = fresh()
    done_steps = _record(env3, ["search[socks]", "click[S00]", "click[Buy Now]"])
    with pytest.raises(ReplayMismatch, match="ended during replay"):
        run(fresh().replay(done_steps))

    # a different goal (instruction shown on every page) cannot replay another task's record
    j = next(i for i, g in enumerate(domain.resources.goals)
             if g["instruction_text"] != domain.resources.goals[1]["instruction_text"])
    other = domain.make_env(f"ws-{j}", episode_seed=0)
    run(other.reset())
    with pytest.raises(ReplayMismatch, match="step 1: replayed observation differs"):
        run(other.replay(steps))


# ------------------------------------------------------------------------------------------- domain


def test_domain_task_ids_prompt_and_errors(domain, tmp_path):
    from uqh.domains.domain_registry import get_domain_class

    n = len(domain.resources.goals)
    assert n == 5  # P01: 2 colors x 2 sizes; P04: no options
    assert domain.all_task_ids() == [f"ws-{i}" for i in range(5)]
    prompt = domain.system_prompt()
    assert "from split: all." in prompt and "{WEBSHOP_SPLIT}" not in prompt
    assert domain.default_step_budget == 30
    with pytest.raises(UserError, match="out of range"):
        domain.make_env("ws-5", episode_seed=0)
    with pytest.raises(UserError, match="unknown webshop task id"):
        domain.make_env("5", episode_seed=0)
    cls = get_domain_class("webshop")
    with pytest.raises(UserError, match="unknown webshop option"):
        cls({"colour": 1})
    with pytest.raises(UserError, match="goal_source must be 'auto', 'human' or 'synthetic'"):
        cls({"goal_source": "crowd"})
    with pytest.raises(UserError, match="unexecutable_actions must be 'noop' or 'repair'"):
        cls({"unexecutable_actions": "ignore"})
    with pytest.raises(UserError, match="unknown WebShop split"):
        cls({"split": "dev"})
    with pytest.raises(UserError, match="does not exist"):
        cls({"data": str(tmp_path / "missing")}).all_task_ids()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="items_shuffle_1000.json"):
        cls({"data": str(empty)}).all_task_ids()


def test_page_chars_cuts_page_text_but_keeps_clickables(tmp_path, monkeypatch):
    import uqh.domains.webshop.goals as goals_mod
    from uqh.domains.domain_registry import get_domain_class

    monkeypatch.setattr(goals_mod, "CACHE_DIR", tmp_path / "cache")
    data = make_catalog_dir(tmp_path)
    dom = get_domain_class("webshop")({"data": str(data), "split": "all", "page_chars": "60"}, observation_chars=420)
    env = dom.make_env("ws-0", episode_seed=0)
    run(env.reset())
    obs = run(env.step("search[socks]")).observation
    page_text, footer = obs.split("\n\n", 1)
    assert len(page_text) == 60
    assert footer.endswith("[S09]") and "[Next >]" in footer
    # the generic 420-character limit is not applied to WebShop pages
    full = get_domain_class("webshop")({"data": str(data), "split": "all"}, observation_chars=420)
    env = full.make_env("ws-0", episode_seed=0)
    run(env.reset())
    assert len(run(env.step("search[socks]")).observation.split("\n\n", 1)[0]) > 420
