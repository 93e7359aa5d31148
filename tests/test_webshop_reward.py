"""WebShop reward on hand-computed cases (the original's formula, thresholds, option quirks and type rules) and the
property reward in [0, 1] over every goal of the shared catalog. Differential cases: test_webshop_original.py."""
from __future__ import annotations

import random

import pytest

from uqh.domains.webshop import reward as R
from uqh.domains.webshop.catalog import clean_products


def product(asin, name, *, desc="", bullets=(""), options=None, attrs=None, query="running shoes",
            product_category="Clothing › Shoes › Running"):
    raw = {
        "asin": asin, "name": name, "full_description": desc, "small_description": list(bullets),
        "pricing": "$25.00", "customization_options": options or "", "category": "c", "query": query,
        "product_category": product_category,
    }
    return clean_products([raw], {asin: {"attributes": attrs or []}})[0]


SHOES = product(
    "P01", "Red Running Shoes", desc="Light sneakers for jogging.", bullets=["rubber sole"],
    options={"Size": [{"value": "7"}, {"value": "8"}], "Color": [{"value": "Red/Black"}, {"value": "white"}]},
    attrs=["running shoes", "rubber sole"],
)
GOAL = {
    "asin": "P01", "query": "running shoes", "name": "Red Running Shoes",
    "product_category": "Clothing › Shoes › Running",
    "attributes": ["running shoes", "machine wash"],
    "goal_options": {"color": "red | black", "size": "7"},
    "price_upper": 30.0,
}


def test_perfect_buy_is_one():
    # "machine wash" is neither an attribute nor in the text: put it in the description for a perfect match
    p = dict(SHOES, Description="Light sneakers for jogging. Machine wash.")
    reward, info = R.get_reward(p, GOAL, price=25.0, options={"color": "red | black", "size": "7"})
    assert reward == 1.0
    assert info["r_att"] == 1.0 and info["r_option"] == 1.0 and info["r_price"] is True and info["r_type"] == 1.0
    assert info["w_att"] == pytest.approx(2 / 5) and info["w_option"] == pytest.approx(2 / 5)
    assert info["w_price"] == pytest.approx(1 / 5)


def test_unmatched_attribute():
    reward, info = R.get_reward(SHOES, GOAL, price=25.0, options={"color": "red | black", "size": "7"})
    assert info["num_attr_matches"] == 1  # "machine wash" is nowhere
    assert reward == pytest.approx((1 + 2 + 1) / 5)


def test_wrong_option():
    p = dict(SHOES, Description="machine wash")
    reward, info = R.get_reward(p, GOAL, price=25.0, options={"color": "white", "size": "7"})
    assert info["num_option_matches"] == 1
    assert reward == pytest.approx((2 + 1 + 1) / 5)
    # "8" is not the goal's ("size", "7"): token sets {8} vs {size, 7}
    reward, info = R.get_reward(p, GOAL, price=25.0, options={"color": "red | black", "size": "8"})
    assert info["num_option_matches"] == 1 and reward == pytest.approx(4 / 5)
    # no options selected: only attributes and price count
    reward, info = R.get_reward(p, GOAL, price=25.0, options={})
    assert info["r_option"] == 0.0 and reward == pytest.approx(3 / 5)


def test_over_price():
    p = dict(SHOES, Description="machine wash")
    reward, info = R.get_reward(p, GOAL, price=30.01, options={"color": "red | black", "size": "7"})
    assert info["r_price"] is False and reward == pytest.approx(4 / 5)
    reward, _ = R.get_reward(p, GOAL, price=30.0, options={"color": "red | black", "size": "7"})
    assert reward == 1.0  # the limit is inclusive


def test_wrong_product_type_zero():
    wallet = product("P04", "Leather Wallet", attrs=["genuine leather"], query="wallets",
                     product_category="Accessories › Wallets")
    info = R.get_type_reward(wallet, GOAL)
    assert info == {"r_type": 0.0, "query_match": False, "category_match": False, "title_score": 0.0}
    reward, _ = R.get_reward(wallet, GOAL, price=1.0, options={})
    assert reward == 0.0


def test_color_normalisation_and_fuzzy_threshold():
    assert R.normalize_color("red | black") == "black"  # first colour of the original's list order
    assert R.normalize_color("charcoal grey") == "charcoal"
    assert R.normalize_color("7") == "7"
    assert R.token_set_ratio("Machine-Wash", "machine wash") == 100
    assert R.token_set_ratio("navy blue", "blue navy") == 100
    assert R.token_set_ratio("x-large", "large") == 100  # {large} is a subset of {x, large}
    assert R.token_set_ratio("forest green", "kelly green") <= 85
    # difflib, as thefuzz 0.19.0 without python-Levenshtein: 2 * matches / total, rounded
    assert R.token_set_ratio("abcd", "abce") == round(100 * 6 / 8)
    assert R.token_set_ratio("", "a") == 0 and R.token_set_ratio("!!", "a") == 0
    # only code points 128-255 are dropped; other non-word characters separate tokens
    assert R.token_set_ratio("café", "caf") == 100 and R.token_set_ratio("a™b", "a b") == 100
    # colour option: "jet black" normalises to "black", whose token set is inside the goal's ("color", "red | black")
    p = dict(SHOES, Description="machine wash")
    _, info = R.get_reward(p, GOAL, price=1.0, options={"color": "jet black"})
    assert info["num_option_matches"] == 1


def test_synthetic_goal_options_are_name_value_tuples():
    """The original passes goal_options.items(): tuples, stringified by thefuzz, colour-normalised by equality."""
    assert R.goal_option_items({"color": "black", "size": "m"}) == [("color", "black"), ("size", "m")]
    assert R.goal_option_items(["black", "m"]) == ["black", "m"]  # human goals: values
    assert R.normalize_color(("color", "black")) == "black"  # an element equals a colour word
    assert R.normalize_color(("color", "jet black")) == ("color", "jet black")  # tuple membership, not substring
    assert R.normalize_color("antique graywash") == "ash"  # strings: substring, first in the list order
    # a perfect buy of "antique graywash": "ash" against the tokens {color, antique, graywash}: no match
    assert R.token_set_ratio("ash", ("color", "antique graywash")) <= 85
    graywash = dict(SHOES, Description="machine wash")
    goal = dict(GOAL, goal_options={"color": "antique graywash", "size": "7"})
    reward, info = R.get_reward(graywash, goal, price=1.0, options={"color": "antique graywash", "size": "7"})
    assert info["num_option_matches"] == 1 and reward == pytest.approx(4 / 5)
    # a wrong size whose tokens do not overlap the goal's: "medium" vs ("size", "3x-large")
    goal = dict(GOAL, goal_options={"color": "black", "size": "3x-large"}, attributes=["running shoes"] * 4)
    reward, _ = R.get_reward(graywash, goal, price=1.0, options={"color": "black", "size": "medium"})
    assert reward == pytest.approx(6 / 7)


def test_reward_never_exceeds_one_goal_without_options():
    """uqh used to count purchased options found in the product text: 1.2 for a goal without options."""
    p = dict(SHOES, Description="machine wash, red | black, size 7")
    goal = dict(GOAL, goal_options={})
    reward, info = R.get_reward(p, goal, price=1.0, options={"color": "red | black", "size": "7"})
    assert reward == 1.0 and info["num_option_matches"] == 0 and "r_option" not in info
    # human goals: a list of option values, each matched by some purchased value
    reward, info = R.get_reward(p, dict(GOAL, goal_options=["red", "7"]), price=1.0, options={"color": "red | black"})
    assert info["num_option_matches"] == 0  # "red | black" normalises to "black"; "red" stays "red"
    reward, info = R.get_reward(p, dict(GOAL, goal_options=["black", "7"]), price=1.0,
                                options={"color": "red | black", "size": "7"})
    assert info["num_option_matches"] == 2 and reward == 1.0


def test_attribute_fallback_to_text_fields():
    p = dict(SHOES, Attributes=[], BulletPoints=["Easy machine wash"], Description="")
    r_att, n = R.get_attribute_reward(p, {"attributes": ["machine wash", "running shoes", "waterproof"]})
    assert n == 2 and r_att == pytest.approx(2 / 3)  # bullet + title substrings; waterproof nowhere


@pytest.mark.parametrize(
    "query_match,category_levels,goal_nouns,bought_nouns,expected",
    [
        (True, 0, ["shoes", "sole"], ["shoes"], 1.0),       # query match, overlap 0.5
        (False, 2, ["shoes", "sole"], ["shoes"], 1.0),      # two shared category levels
        (False, 0, ["a", "b", "c", "d", "e"], ["a"], 0.5),  # overlap exactly 0.2 is not > 0.2
        (False, 0, ["a", "b", "c"], ["a"], 1.0),            # overlap 1/3 > 0.2
        (True, 0, list("abcdefghijk"), ["a"], 0.1),         # overlap 1/11 < 0.1 caps even a query match
        (True, 2, list("abcdefghijk"), ["a"], 0.1),         # ... and a category match
        (True, 2, ["a"], ["z"], 0.0),                        # no shared noun: 0
        (False, 0, [], ["z"], 0.5),                          # goal title without nouns: overlap 0.2
    ],
)
def test_type_reward_rules(monkeypatch, query_match, category_levels, goal_nouns, bought_nouns, expected):
    nouns = {"goal": tuple(goal_nouns), "bought": tuple(bought_nouns)}
    monkeypatch.setattr(R, "title_nouns", lambda title: nouns[title])
    cats = ["A", "B", "C"]
    goal = {"query": "q", "name": "goal", "product_category": " › ".join(cats)}
    bought = {
        "query": "q" if query_match else "other",
        "name": "bought",
        "product_category": " › ".join(cats[:category_levels] + ["X", "Y"]),
    }
    assert R.get_type_reward(bought, goal)["r_type"] == expected


def test_offline_noun_tagger():
    nouns = R.title_nouns("Leather Wallet for Men, Slim-Fit 3-Pack")
    assert "wallet" in nouns and "men" in nouns
    assert "for" not in nouns and "," not in nouns
    assert "slim" in nouns and "fit" in nouns  # hyphenated tokens are split like spaCy does
    assert "3" not in nouns  # numbers are not nouns
    assert R.title_nouns("easy carry refillable containers")[-1] == "containers"


def test_reward_in_unit_interval_for_every_goal(tmp_path, monkeypatch):
    """Property: for every goal of the shared catalog (synthetic, and human from the sample instructions file) and
    random purchases (any product, any subset of its option values, prices below and above the limit) the reward
    is in [0, 1], and perfect buys reach 1."""
    import shutil
    from pathlib import Path

    import uqh.domains.webshop.goals as G
    from uqh.domains.webshop import catalog as C
    from uqh.domains.webshop import load_resources
    from uqh.domains.data_files import find_data_file

    monkeypatch.setattr(G, "CACHE_DIR", tmp_path / "cache")
    shared = C.default_data_dir()
    human_dir = tmp_path / "human"
    human_dir.mkdir()
    for name in (C.CATALOG_PREFIX_FILE, C.ATTRIBUTES_FILE):
        src = find_data_file(shared, name)
        (human_dir / src.name).symlink_to(src)
    sample = Path(__file__).resolve().parent / "data" / "webshop" / "items_human_ins_sample.json"
    shutil.copy(sample, human_dir / C.HUMAN_INSTRUCTIONS_FILE)
    rng = random.Random(0)
    for data, source, n_goals in ((shared, "synthetic", 1316), (human_dir, "human", 41)):
        res = load_resources(str(data), None, 42, None, source)
        assert res.goals_doc.get("source", "synthetic") == source and len(res.goals) == n_goals
        products = res.catalog.products
        seen_one = 0
        for goal in res.goals:
            for product in (res.catalog.by_asin[goal["asin"]], rng.choice(products), rng.choice(products)):
                options = {k: rng.choice(v) for k, v in product["options"].items() if v and rng.random() < 0.8}
                price = rng.choice([res.prices[product["asin"]], goal["price_upper"] + 1.0])
                reward, info = R.get_reward(product, goal, price=price, options=options)
                assert 0.0 <= reward <= 1.0, (goal["asin"], product["asin"], options)
                assert info["num_option_matches"] <= len(goal["goal_options"])
                seen_one += reward == 1.0
        assert seen_one > 0
