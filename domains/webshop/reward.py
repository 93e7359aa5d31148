"""The WebShop reward, re-implemented from the original (get_reward and its parts).

    reward = (matched goal attributes + matched purchased options + [price <= price limit])
             / (number of goal attributes + number of goal options + 1)  *  r_type

- attributes: a goal attribute matches if ``token_set_ratio`` with some product attribute is > 85, or if it is a
  substring of the lower-cased title, bullet points or description;
- options: each *purchased* option value (colour-normalised) matches exactly (option name ``size``) or with
  ``token_set_ratio`` > 85 some goal option value, or else appears in the title / bullets / description;
- r_type (product type): 1.0 if the purchased product's search query equals the goal's, or >= 2 category levels
  are shared, or the title-noun overlap is > 0.2; else 0.5; then 0.1 if the overlap < 0.1 and 0.0 if it is 0.
  The overlap is |nouns(purchased title) ∩ nouns(goal title)| / |nouns(goal title)| (0.2 if the goal title has
  no noun).

Fuzzy matching is thefuzz's ``token_set_ratio`` (ASCII, full processing, rounded) computed with ``rapidfuzz``,
which is what current thefuzz does internally.

Noun detection: the original runs spaCy (``en_core_web_lg`` / ``_sm``) and keeps NOUN / PROPN tokens. spaCy's
models are not installable from a package registry, so this uses TextBlob's bundled Pattern tagger (a Brill-style
lexicon + contextual rules tagger, Penn tags; NN*, i.e. NN, NNS, NNP, NNPS, count as nouns). Tokens are lower-cased
like the original's, hyphenated tokens are split into their parts (spaCy splits on hyphens) and tokens without a
letter are dropped (spaCy tags them PUNCT / NUM). Effect: both taggers tag most Title-Case product-title words
as proper nouns, so title_score is close; where they disagree on an individual word (e.g. a capitalised
adjective), title_score moves by 1/|goal nouns|, which changes r_type only when it crosses 0.1 or 0.2. Buying the
goal product itself gives the same title_score under either tagger up to repeated nouns (the original divides by
the length of the noun *list*, so a title repeating a noun scores below 1 against itself; r_type stays 1.0 through
the query match).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

EXACT_MATCH_OPTS = ("size",)
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


def normalize_color(value: str) -> str:
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


def _token_set_ratio(a: str, b: str) -> int:
    """thefuzz's ``token_set_ratio``: ASCII-only, default processing (lower-case, non-alphanumerics to spaces),
    rapidfuzz's scorer, rounded to an integer."""
    from rapidfuzz import fuzz
    from rapidfuzz.utils import default_process

    a = default_process(a.encode("ascii", "ignore").decode())
    b = default_process(b.encode("ascii", "ignore").decode())
    return int(round(fuzz.token_set_ratio(a, b)))


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


def _in_product_text(needle: str, product: dict[str, Any]) -> bool:
    return (
        needle in product["Title"].lower()
        or needle in " ".join(product["BulletPoints"]).lower()
        or needle in product["Description"].lower()
    )


def get_attribute_reward(purchased: dict[str, Any], goal: dict[str, Any]) -> tuple[float, int]:
    goal_attrs = goal["attributes"]
    matches = 0
    for g_attr in goal_attrs:
        if any(_token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in purchased["Attributes"]):
            matches += 1
        elif _in_product_text(g_attr, purchased):
            matches += 1
    return matches / len(goal_attrs), matches


def get_option_reward(
    purchased: dict[str, Any], goal_options: list[str], purchased_options: dict[str, str]
) -> tuple[float | None, int]:
    p_opts = {k: normalize_color(v) for k, v in purchased_options.items()}
    g_opts = [normalize_color(o) for o in goal_options]
    matches = 0
    for key, value in p_opts.items():
        if key.lower() in EXACT_MATCH_OPTS:
            matched = value in g_opts
        else:
            matched = any(_token_set_ratio(g, value) > FUZZY_THRESHOLD for g in g_opts)
        if matched or _in_product_text(value, purchased):
            matches += 1
    return (matches / len(g_opts) if g_opts else None), matches


def get_reward(
    purchased: dict[str, Any], goal: dict[str, Any], price: float, options: dict[str, str]
) -> tuple[float, dict[str, Any]]:
    """(reward, breakdown) for buying ``purchased`` at ``price`` with the selected ``options``."""
    type_info = get_type_reward(purchased, goal)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    r_att, n_att = get_attribute_reward(purchased, goal)
    goal_opts = goal["goal_options"]
    goal_opt_values = list(goal_opts.values()) if isinstance(goal_opts, dict) else list(goal_opts)
    r_option, n_opt = get_option_reward(purchased, goal_opt_values, options)
    denom = len(goal["attributes"]) + len(goal_opts) + 1
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
        info["w_option"] = len(goal_opts) / denom
    if r_price is not None:
        info["r_price"] = bool(r_price)
        info["w_price"] = 1 / denom
    return reward, info
