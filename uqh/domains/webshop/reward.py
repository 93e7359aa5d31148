"""The WebShop reward, re-implemented from the original (web_agent_site/engine/goal.py get_reward and its parts).

    reward = (matched goal attributes + matched goal options + [price <= price limit])
             / (number of goal attributes + number of goal options + 1)  *  r_type

- attributes: a goal attribute matches if ``token_set_ratio(product attribute, goal attribute) > 85`` for some
  product attribute, or else if it is a substring of the lower-cased title, bullet points or description;
- options: each *goal* option matches if ``token_set_ratio(purchased value, goal option) > 85`` for some purchased
  option value, both sides colour-normalised. The count is over goal options, so it never exceeds their number
  and the reward never exceeds 1. Synthetic goals keep their options as a dict, and the original passes
  ``dict.items()``: each goal option is a ``(name, value)`` tuple, which thefuzz turns into the string
  ``"('name', 'value')"``, i.e. the tokens ``name value``; colour normalisation of a tuple only fires when the
  value *equals* a colour word (tuple membership). Human goals carry a list of option values. No exact match for
  sizes and no product-text fallback for options (both were uqh inventions);
- r_type (product type): 1.0, or 0.5 unless the search queries are equal, >= 2 category levels are shared or
  the title-noun overlap is > 0.2; then, whatever the query and category say, 0.1 if the overlap is < 0.1 and
  0.0 if it is 0. The overlap is |set(nouns(purchased title)) ∩ set(nouns(goal title))| / len(nouns(goal title))
  (0.2 if the goal title has no noun).

Fuzzy matching is thefuzz 0.19.0's ``token_set_ratio`` as the original pins it (no python-Levenshtein, so
difflib's SequenceMatcher): see :func:`token_set_ratio`.

Noun detection: the original runs spaCy (``en_core_web_sm``) and keeps NOUN / PROPN tokens. spaCy's models are not
installable from a package registry, so this uses TextBlob's bundled Pattern tagger (a Brill-style lexicon +
contextual rules tagger, Penn tags; NN*, i.e. NN, NNS, NNP, NNPS, count as nouns). Tokens are lower-cased like
the original's, hyphenated tokens are split into their parts (spaCy splits on hyphens) and tokens without a
letter are dropped (spaCy tags them PUNCT / NUM). Where the two taggers disagree on a word the overlap moves by
1/|goal nouns|, which changes r_type when it crosses 0.1 or 0.2 (and, below 0.1, regardless of query and
category). The differential tests substitute this tagger on both sides.
"""
from __future__ import annotations

import re
from difflib import SequenceMatcher
from functools import lru_cache
from typing import Any

FUZZY_THRESHOLD = 85

# The original's colour vocabulary (web_agent_site/engine/normalize.py): a value containing one of these words is
# normalised to the first one found, in this order.
COLOR_SET = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy camel "
    "camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral cranberry "
    "cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass gray green grey "
    "heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight "
    "mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter pink plum purple rainbow "
    "red rose royal rust sand sapphire seashell silver skull slate steel stone stonewash sunflower tan taupe teal "
    "tiger turquoise violet walnut wheat white wine yellow"
).split()

_NOUN_TAGS = ("NN", "NNS", "NNP", "NNPS")
_HAS_LETTER = re.compile(r"[^\W\d_]")


def normalize_color(value: Any) -> Any:
    """The original's normalize_color: the first colour word ``in`` the value, else the value unchanged.

    For a string ``in`` is a substring test; for a ``(name, value)`` tuple it is element equality."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


@lru_cache(maxsize=1)
def _tagger():
    from textblob.en.taggers import PatternTagger

    return PatternTagger()


@lru_cache(maxsize=8192)
def title_nouns(title: str) -> tuple[str, ...]:
    """Lower-cased noun tokens of a product title, in order (duplicates kept, like the original's list)."""
    nouns: list[str] = []
    for word, tag in _tagger().tag(title):
        if tag not in _NOUN_TAGS:
            continue
        for part in str(word).split("-"):
            if _HAS_LETTER.search(part):
                nouns.append(part.lower())
    return tuple(nouns)


# thefuzz 0.19.0's processing: drop code points 128-255 ("asciidammit"), every non-word character to a space,
# lower-case, strip.
_LATIN1_HIGH = {c: None for c in range(128, 256)}
_NON_WORD = re.compile(r"(?ui)\W")


def _fuzz_process(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return _NON_WORD.sub(" ", text.translate(_LATIN1_HIGH)).lower().strip()


def _ratio(a: str, b: str) -> int:
    """thefuzz's ``ratio``: 100 if equal, 0 if either is empty, else round(100 * difflib ratio)."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return round(100 * SequenceMatcher(None, a, b).ratio())


@lru_cache(maxsize=1 << 16)
def _token_set_ratio_cached(a: Any, b: Any) -> int:
    p1, p2 = _fuzz_process(a), _fuzz_process(b)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    sect = " ".join(sorted(t1 & t2))
    c12 = (sect + " " + " ".join(sorted(t1 - t2))).strip()
    c21 = (sect + " " + " ".join(sorted(t2 - t1))).strip()
    return max(_ratio(sect, c12), _ratio(sect, c21), _ratio(c12, c21))


def token_set_ratio(a: Any, b: Any) -> int:
    """thefuzz 0.19.0 ``fuzz.token_set_ratio(a, b)`` (argument order matters: difflib is not symmetric).

    Non-strings are stringified first (a tuple ``('color', 'red')`` becomes the tokens ``color red``). The
    processed strings are split into token sets; the sorted intersection and the intersection followed by each
    side's remainder are compared pairwise with ``ratio``; the best of the three wins."""
    return _token_set_ratio_cached(a, b)


def get_type_reward(purchased: dict[str, Any], goal: dict[str, Any]) -> dict[str, Any]:
    query_match = purchased["query"] == goal["query"]
    p_cat = {x.strip() for x in purchased["product_category"].split("›")}
    g_cat = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(p_cat & g_cat) >= 2
    p_nouns = title_nouns(purchased["name"])
    g_nouns = title_nouns(goal["name"])
    if not g_nouns:
        title_score = 0.2
    else:
        title_score = len(set(p_nouns) & set(g_nouns)) / len(g_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def get_attribute_reward(purchased: dict[str, Any], goal: dict[str, Any]) -> tuple[float, int]:
    goal_attrs = goal["attributes"]
    title = purchased["Title"].lower()
    bullets = " ".join(purchased["BulletPoints"]).lower()
    description = purchased["Description"].lower()
    matches = 0
    for g_attr in goal_attrs:
        if any(token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in purchased["Attributes"]):
            matches += 1
        elif g_attr in title or g_attr in bullets or g_attr in description:
            matches += 1
    return matches / len(goal_attrs), matches


def goal_option_items(goal_options: Any) -> list[Any]:
    """What the original passes as goal options: ``dict.items()`` tuples (synthetic goals) or the list itself."""
    if isinstance(goal_options, dict):
        return list(goal_options.items())
    return [tuple(o) if isinstance(o, list) else o for o in goal_options]


def get_option_reward(purchased_values: list[str], goal_options: list[Any]) -> tuple[float | None, int]:
    """Goal options matched by some purchased option value (both colour-normalised), as the original."""
    purchased = [normalize_color(v) for v in purchased_values]
    goals = [normalize_color(o) for o in goal_options]
    matches = 0
    for g in goals:
        if any(token_set_ratio(p, g) > FUZZY_THRESHOLD for p in purchased):
            matches += 1
    return (matches / len(goals) if goals else None), matches


def get_reward(
    purchased: dict[str, Any], goal: dict[str, Any], price: float, options: dict[str, str]
) -> tuple[float, dict[str, Any]]:
    """(reward, breakdown) for buying ``purchased`` at ``price`` with the selected ``options``."""
    type_info = get_type_reward(purchased, goal)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    r_att, n_att = get_attribute_reward(purchased, goal)
    r_option, n_opt = get_option_reward(list(options.values()), goal_option_items(goal["goal_options"]))
    denom = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    reward = (n_att + n_opt + (r_price or 0)) / denom * type_info["r_type"]
    info: dict[str, Any] = {
        "r_type": type_info["r_type"],
        "r_att": r_att,
        "w_att": len(goal["attributes"]) / denom,
        "query_match": type_info["query_match"],
        "category_match": type_info["category_match"],
        "title_score": type_info["title_score"],
        "num_attr_matches": n_att,
        "num_option_matches": n_opt,
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal["goal_options"]) / denom
    if r_price is not None:
        info["r_price"] = bool(r_price)
        info["w_price"] = 1 / denom
    return reward, info
