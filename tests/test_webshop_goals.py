"""WebShop goals: the original's synthetic-goal construction, frozen draws identical across processes, splits,
loading the shared (prefix) catalog with its kept-goal counts."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from uqh.domains.webshop import catalog as C
from uqh.domains.webshop import goals as G
from uqh.rundir.errors import UserError

REPO = Path(__file__).resolve().parents[1]
SHARED = C.default_data_dir()  # the packaged demo data


def tiny_catalog(tmp_path, products, attrs):
    d = tmp_path / "data"
    d.mkdir(exist_ok=True)
    (d / "items_shuffle_1000.json").write_text(json.dumps(products))
    (d / "items_ins_v2_1000.json").write_text(json.dumps(attrs))
    return C.load_catalog(d)


def rec(asin, pricing, options=""):
    return {"asin": asin, "name": f"Thing {asin}", "full_description": "", "small_description": ["b"],
            "pricing": pricing, "customization_options": options, "category": "c", "query": " Things ",
            "product_category": "A › B"}


def test_catalog_cleaning():
    assert C.parse_pricing("$19.99$27.99") == ([19.99, 27.99], "$19.99 to $27.99")
    assert C.parse_pricing("$1,299.00") == ([1299.0], "$1299.0")
    assert C.parse_pricing("") == ([100.0], "$100.0")
    assert C.clean_options({"Color": [{"value": " Red/Black "}], "Size": None}) == {"color": ["red | black"]}
    (p,) = C.clean_products([rec("A1", "$5")], {})
    assert p["Attributes"] == ["DUMMY_ATTR"] and p["query"] == "things" and p["instruction_text"] is None


def test_goal_construction_closed_form(tmp_path):
    opts = {"Size": [{"value": "S"}, {"value": "M"}, {"value": "L"}], "Color": [{"value": "Red"}, {"value": "Blue"}]}
    products = [rec("A1", "$25.00", opts), rec("A2", "$10.00$20.00"), rec("A3", "$985.00"), rec("A4", "$3")]
    attrs = {
        "A1": {"attributes": ["x"], "instruction": "i need a thing", "instruction_attributes": ["soft", "warm"]},
        "A2": {"attributes": [], "instruction": "i want a range thing", "instruction_attributes": ["cheap"]},
        "A3": {"attributes": [], "instruction": "a pricey thing", "instruction_attributes": ["gold"]},
        "A4": {"attributes": []},  # no instruction: no goal
    }
    cat = tiny_catalog(tmp_path, products, attrs)
    doc = G.build_goals(cat, seed=7)
    goals = doc["goals"]
    assert doc["counts"]["goals"] == len(goals) == 3 * 2 + 1 + 1
    a1 = [g for g in goals if g["asin"] == "A1"]
    # one goal per option combination, option names sorted
    assert sorted(tuple(g["goal_options"].items()) for g in a1) == sorted(
        (("color", c), ("size", s)) for c in ("red", "blue") for s in ("s", "m", "l")
    )
    upper = a1[0]["price_upper"]
    assert upper in (40.0, 50.0, 60.0)  # max of two of the next four $10 steps above $25
    assert all(g["price_upper"] == upper for g in a1)  # one draw per product
    g = next(g for g in a1 if g["goal_options"] == {"color": "red", "size": "m"})
    assert g["instruction_text"] == f"i need a thing with color: red, and size: m, and price lower than {upper:.2f} dollars"
    assert g["attributes"] == ["soft", "warm"] and g["query"] == "things" and g["name"] == "Thing A1"
    (a2,) = [g for g in goals if g["asin"] == "A2"]
    assert 10.0 <= doc["product_prices"]["A2"] <= 20.0
    assert a2["instruction_text"].startswith("i want a range thing, and price lower than ")
    (a3,) = [g for g in goals if g["asin"] == "A3"]
    assert a3["price_upper"] == 1000000.0 and a3["instruction_text"] == "a pricey thing"  # < 2 steps above $985

    # the draws are exactly the original's sequence under random.seed(7): prices, then one sample per product
    rng = random.Random(7)
    price_a2 = rng.uniform(10.0, 20.0)
    up1 = sorted(rng.sample([30.0, 40.0, 50.0, 60.0], 2))[1]
    assert doc["product_prices"]["A2"] == price_a2 and upper == up1
    # the shuffle is the original's: random.seed(233) over the goals in catalog / option-product order
    pre = [("A1", {"color": c, "size": s}) for c in ("red", "blue") for s in ("s", "m", "l")]
    pre += [("A2", {}), ("A3", {})]
    random.Random(233).shuffle(pre)
    assert [(g["asin"], g["goal_options"]) for g in goals] == pre


def test_goals_identical_across_processes_and_hash_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(G, "CACHE_DIR", tmp_path / "cache")
    cat = C.load_catalog(SHARED)
    doc, path, sha = G.freeze_goals(cat, 42)
    assert path.read_bytes() == G.canonical_bytes(doc) and G.goals_sha256(doc) == sha
    code = (
        "import sys; from uqh.domains.webshop import catalog as C, goals as G; "
        "cat = C.load_catalog(); print(G.goals_sha256(G.build_goals(cat, int(sys.argv[1]))))"
    )
    shas = []
    for hash_seed, seed in (("1", 42), ("2", 42), ("3", 43)):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run([sys.executable, "-c", code, str(seed)], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=600, check=True)
        shas.append(out.stdout.strip())
    assert shas[0] == shas[1] == sha
    assert shas[2] != sha  # another seed draws other prices / limits
    # re-freezing leaves the file as it is
    mtime = path.stat().st_mtime_ns
    assert G.freeze_goals(cat, 42)[1:] == (path, sha) and path.stat().st_mtime_ns == mtime


def test_shared_prefix_catalog_counts_and_splits(tmp_path, monkeypatch):
    from uqh.domains.webshop import kept_goals_message, load_resources

    monkeypatch.setattr(G, "CACHE_DIR", tmp_path / "cache")
    res = load_resources(str(SHARED), None, 42, None, "synthetic")
    c = res.goals_doc["counts"]
    assert res.catalog.is_prefix and c["products"] == 214
    assert c["instructed_products_in_catalog"] == 95 and c["instructed_products_in_attributes_file"] == 415
    assert c["goals"] == len(res.goals) == 1316
    assert G.split_goals(res.goals_doc, "test") == list(range(500))
    assert G.split_goals(res.goals_doc, "eval") == list(range(500, 1316))
    assert G.split_goals(res.goals_doc, "train") == []
    msg = kept_goals_message(res)
    assert "1316 synthetic goals from 95 of 415 instructed products (214 products loaded" in msg and "prefix catalog" in msg
    # every goal's product is in the catalog and its frozen price is there
    assert all(g["asin"] in res.catalog.by_asin for g in res.goals)
    assert set(res.prices) == set(res.catalog.by_asin)
    # n_products keeps the first N records, as the original's num_products
    small = C.load_catalog(SHARED, n_products=50)
    assert len(small.products) == 50 and small.n_records == 214


def test_goals_file_option(tmp_path, monkeypatch):
    from uqh.domains.domain_registry import get_domain_class

    monkeypatch.setattr(G, "CACHE_DIR", tmp_path / "cache")
    cat = C.load_catalog(SHARED)
    doc = G.build_goals(cat, 5)
    doc["goals"] = doc["goals"][:3]
    f = tmp_path / "goals.json"
    f.write_text(json.dumps(doc))
    dom = get_domain_class("webshop")({"goals_file": str(f)})
    assert dom.all_task_ids() == ["ws-0", "ws-1", "ws-2"]
    info = dom.manifest_info()["webshop"]
    assert info["goals_file"] == str(f) and len(info["goals_sha256"]) == 64
    bad = dict(doc, goals=[dict(doc["goals"][0], asin="NOTTHERE")])
    f.write_text(json.dumps(bad))
    with pytest.raises(UserError, match="not in the loaded catalog"):
        get_domain_class("webshop")({"goals_file": str(f), "goal_seed": 9}).all_task_ids()
    with pytest.raises(UserError, match="does not exist"):
        get_domain_class("webshop")({"goals_file": str(tmp_path / "nope.json")}).all_task_ids()


def human_dir(tmp_path, products, attrs, human) -> Path:
    d = tmp_path / "hdata"
    d.mkdir(exist_ok=True)
    (d / "items_shuffle_1000.json").write_text(json.dumps(products))
    (d / "items_ins_v2_1000.json").write_text(json.dumps(attrs))
    if human is not None:
        (d / "items_human_ins.json").write_text(json.dumps(human))
    return d


def ins(text, attrs, options):
    return {"instruction": text, "instruction_attributes": attrs, "instruction_options": options,
            "asin": "x", "worker_id": "w"}


def test_human_goal_construction_closed_form(tmp_path):
    products = [rec("A1", "$25.00"), rec("A2", "$10.00$20.00"), rec("A3", "$985.00"), rec("A1", "$1")]
    human = {
        "A1": [ins("i need a thing.", ["soft"], ["red", "large"]), ins("no attributes", [], ["red"])],
        "A2": [ins("a range thing..", ["cheap", "small"], [])],
        "A3": [ins("a pricey thing", ["gold"], ["gold"])],
        "ZZ": [ins("outside the catalog", ["x"], [])],
    }
    cat = C.load_catalog(human_dir(tmp_path, products, {}, human))
    assert cat.human_instructions_path is not None
    doc = G.build_human_goals(cat, cat.human_instructions_path, seed=7)
    goals = doc["goals"]
    assert doc["source"] == "human" and len(goals) == 3
    assert doc["counts"] == {"products": 3, "human_instructions": 5, "human_instructions_in_catalog": 4,
                             "human_instructions_skipped_no_attributes": 1, "goals": 3}
    by = {g["asin"]: g for g in goals}
    # the draws: product prices first (A2's range), then one price limit per kept instruction, in catalog order
    rng = random.Random(7)
    price_a2 = rng.uniform(10.0, 20.0)
    up_a1 = sorted(rng.sample([30.0, 40.0, 50.0, 60.0], 2))[1]
    up_a2 = sorted(rng.sample([s for s in G.PRICE_STEPS if s > price_a2][:4], 2))[1]
    assert doc["product_prices"]["A2"] == price_a2
    assert by["A1"]["price_upper"] == up_a1 and by["A2"]["price_upper"] == up_a2
    # trailing dots stripped, then the price text; options are the instruction's value list
    assert by["A1"]["instruction_text"] == f"i need a thing, and price lower than {up_a1:.2f} dollars"
    assert by["A2"]["instruction_text"].startswith("a range thing, and price lower than ")
    assert by["A3"]["instruction_text"] == "a pricey thing" and by["A3"]["price_upper"] == 1000000.0
    assert by["A1"]["goal_options"] == ["red", "large"] and by["A1"]["attributes"] == ["soft"]
    assert by["A1"]["name"] == "Thing A1" and by["A1"]["query"] == "things"
    pre = ["A1", "A2", "A3"]
    random.Random(233).shuffle(pre)
    assert [g["asin"] for g in goals] == pre


def test_goal_source_auto_human_synthetic(tmp_path, monkeypatch, caplog):
    from uqh.domains.domain_registry import get_domain_class

    monkeypatch.setattr(G, "CACHE_DIR", tmp_path / "cache")
    products = [rec("A1", "$25.00")]
    attrs = {"A1": {"attributes": ["x"], "instruction": "synthetic thing", "instruction_attributes": ["x"]}}
    human = {"A1": [ins("human thing", ["x"], [])]}
    with_file = human_dir(tmp_path, products, attrs, human)
    cls = get_domain_class("webshop")
    auto = cls({"data": str(with_file), "split": "all"})
    assert auto.resources.goals[0]["instruction_text"].startswith("human thing")
    info = auto.manifest_info()["webshop"]
    assert info["goal_source"] == "human" and info["human_instructions_file"].endswith("items_human_ins.json")
    forced = cls({"data": str(with_file), "split": "all", "goal_source": "synthetic"})
    assert forced.resources.goals[0]["instruction_text"].startswith("synthetic thing")
    assert forced.manifest_info()["webshop"]["goal_source"] == "synthetic"

    without = tmp_path / "nofile"
    without.mkdir()
    for name in ("items_shuffle_1000.json", "items_ins_v2_1000.json"):
        (without / name).write_text((with_file / name).read_text())
    caplog.clear()
    with caplog.at_level("WARNING", logger="uqh.domains.webshop"):
        fallback = cls({"data": str(without), "split": "all"})
        assert fallback.resources.goals[0]["instruction_text"].startswith("synthetic thing")
    notices = [r.getMessage() for r in caplog.records if "no items_human_ins.json" in r.getMessage()]
    assert len(notices) == 1 and "\n" not in notices[0] and "using synthetic goals" in notices[0]
    assert fallback.manifest_info()["webshop"]["goal_source"] == "synthetic"
    with pytest.raises(UserError, match="goal_source=human needs items_human_ins.json.*setup.sh"):
        cls({"data": str(without), "split": "all", "goal_source": "human"}).all_task_ids()


@pytest.mark.parametrize("content", ["[1, 2]", '{"A1": [{"instruction": "x"}]}', "{not json", '{"A1": {}}'])
def test_bad_human_instructions_file_is_a_user_error(tmp_path, monkeypatch, content):
    from uqh.domains.domain_registry import get_domain_class

    monkeypatch.setattr(G, "CACHE_DIR", tmp_path / "cache")
    d = human_dir(tmp_path, [rec("A1", "$5")], {}, None)
    (d / "items_human_ins.json").write_text(content)
    with pytest.raises(UserError, match="items_human_ins.json"):
        get_domain_class("webshop")({"data": str(d)}).all_task_ids()
