"""Canonicalisation per domain (Mouzouni, "Black-box reliability certification", Definition 4.1): answers that mean the same thing get one class; an
episode without a final answer is the explicit "no answer" class (None)."""
from __future__ import annotations

import asyncio

import pytest

from uqh.domains.domain_registry import domain_names, get_domain_class
from uqh.domains.base import Domain
from uqh.rundir.schema import Attempt, CallRecord, Episode, Step, StopReason


def step(action: str, t: int = 1, info: dict | None = None) -> Step:
    return Step(t=t, think="", action=action, verbal_confidence=0.5, explanation="", observation="obs",
                attempts=[Attempt(attempt=0, raw_text="", call=CallRecord(model="m"))], info=info or {})


def episode(actions: list[str], stop: StopReason = StopReason.clean, outcome: int | None = 1, reward_info=None,
            infos: list[dict] | None = None) -> Episode:
    steps = [step(a, t, (infos or [{}] * len(actions))[t - 1]) for t, a in enumerate(actions, start=1)]
    return Episode(episode_id="t#0", task_id="t", stop_reason=stop, outcome=outcome if stop == StopReason.clean else None,
                   n_steps=len(steps), step_budget=10, task_prompt="Question: q", steps=steps,
                   reward_info=reward_info or {})


def canon(domain: str, ep: Episode) -> str | None:
    return get_domain_class(domain).canonical_answer(ep)


def test_every_registered_domain_canonicalises():
    assert all(get_domain_class(n).has_canonical_answer() for n in domain_names())


def test_a_domain_without_canonicalisation_says_so():
    class Bare(Domain):
        name = "bare"

        def all_task_ids(self):
            return []

        def make_env(self, task_id, *, episode_seed):
            raise NotImplementedError

    assert not Bare.has_canonical_answer()
    with pytest.raises(NotImplementedError, match="bare domain has no canonical answer"):
        Bare.canonical_answer(episode(["Finish[1]"]))


@pytest.mark.parametrize("actions,expected", [
    (["Calc[6*7]", "Finish[42]"], "42"),
    (["Finish[42.0]"], "42"),
    (["Finish[ 42.000 ]"], "42"),
    (["Finish[1,000]"], "1000"),
    (["Finish[-7]"], "-7"),
    (["Finish[2.5]"], "2.5"),
    (["Finish[-0]"], "0"),
])
def test_arithmetic_the_number(actions, expected):
    assert canon("arithmetic", episode(actions)) == expected


def test_arithmetic_same_number_same_class_wrong_and_right_alike():
    wrong = episode(["Finish[43]"], outcome=0)
    assert canon("arithmetic", wrong) == "43" != canon("arithmetic", episode(["Finish[42.0]"]))


@pytest.mark.parametrize("stop", [StopReason.max_steps, StopReason.parse_error])
def test_no_final_answer_is_the_no_answer_class(stop):
    ep = episode(["Calc[1+1]", "Calc[2+2]"], stop=stop)
    for name in ("arithmetic", "hotpotqa", "strategyqa", "webshop", "tau2-airline"):
        assert canon(name, ep) is None


def test_arithmetic_matches_what_the_environment_scored():
    """The class is the number the environment compared with the answer: equal classes, equal outcomes."""
    from uqh.domains.arithmetic import ArithmeticEnv, make_question

    _, answer = make_question("arith-0007")
    for given in (f"{answer}", f"{answer}.0", f"{answer + 1}"):
        env = ArithmeticEnv("arith-0007", lambda s: s)
        asyncio.run(env.reset())
        resp = asyncio.run(env.step(f"Finish[{given}]"))
        ep = episode([f"Finish[{given}]"], outcome=resp.outcome)
        assert (canon("arithmetic", ep) == str(answer)) == bool(resp.outcome)


@pytest.mark.parametrize("answer,expected", [
    ("The Beatles", "beatles"), ("the beatles.", "beatles"), ("  BEATLES!  ", "beatles"),
    ("Barack  Obama", "barack obama"), ("a Tale of Two Cities", "tale of two cities"),
])
def test_hotpotqa_squad_normalised_finish(answer, expected):
    assert canon("hotpotqa", episode(["Search[x]", f"Finish[{answer}]"])) == expected
    assert canon("hotpotqa", episode([f"finish[{answer}]"])) == expected  # tool names are case-insensitive


def test_hotpotqa_class_agrees_with_exact_match():
    from uqh.domains.qa.hotpotqa import exact_match

    a, b = "The Eiffel Tower", "eiffel tower!"
    assert exact_match(a, b) == 1
    assert canon("hotpotqa", episode([f"Finish[{a}]"])) == canon("hotpotqa", episode([f"Finish[{b}]"]))


@pytest.mark.parametrize("answer,expected", [("yes", "yes"), ("Yes.", "yes"), ("'NO'", "no"), (" no ", "no")])
def test_strategyqa_yes_no(answer, expected):
    assert canon("strategyqa", episode([f"Finish[{answer}]"])) == expected


def test_strategyqa_unparseable_finish_has_no_class():
    # a clean episode always ended on a valid Finish; a record that did not is not an answer
    assert canon("strategyqa", episode(["Finish[maybe]"])) is None
    assert canon("strategyqa", episode(["Search[x]"])) is None


def test_webshop_purchased_asin_and_options():
    info = {"purchased_asin": "B0ABC", "purchased_options": {"size": "large", "color": "red"}}
    same_other_order = {"purchased_asin": "B0ABC", "purchased_options": {"color": "red", "size": "large"}}
    a = canon("webshop", episode(["Click[buy now]"], reward_info=info))
    assert a == "B0ABC | color: red; size: large"
    assert canon("webshop", episode(["Click[buy now]"], outcome=0, reward_info=same_other_order)) == a
    other = {"purchased_asin": "B0ABC", "purchased_options": {"size": "small", "color": "red"}}
    assert canon("webshop", episode(["Click[buy now]"], reward_info=other)) != a
    assert canon("webshop", episode(["Click[buy now]"], reward_info={"purchased_asin": "B0XYZ"})) == "B0XYZ"


@pytest.fixture
def webshop(tmp_path, monkeypatch):
    import uqh.domains.webshop.goals as goals_mod
    from test_webshop_env import make_catalog_dir

    monkeypatch.setattr(goals_mod, "CACHE_DIR", tmp_path / "cache")
    return get_domain_class("webshop")({"data": str(make_catalog_dir(tmp_path)), "split": "all"})


def test_webshop_purchases_through_the_environment(webshop):
    """Two purchases of the same item and options (options clicked in either order) are one class, and the class
    decides the reward; another option is another class."""
    from test_webshop_env import find_goal

    gi = find_goal(webshop, "P01", {"color": "red | black", "size": "7"})

    def buy(clicks):
        env = webshop.make_env(f"ws-{gi}", episode_seed=0)
        asyncio.run(env.reset())
        actions = ["search[running shoes]", "click[P01]", *clicks, "click[Buy Now]"]
        for a in actions:
            r = asyncio.run(env.step(a))
        return r, episode(actions, outcome=r.outcome, reward_info=r.reward_info)

    r1, e1 = buy(["click[red | black]", "click[7]"])
    r2, e2 = buy(["click[7]", "click[red | black]"])
    r3, e3 = buy(["click[white]", "click[7]"])
    assert r1.outcome == r2.outcome == 1 and r3.outcome == 0
    assert canon("webshop", e1) == canon("webshop", e2) == "P01 | color: red | black; size: 7"
    assert canon("webshop", e3) == "P01 | color: white; size: 7"


def test_tau2_final_database_hash():
    infos = [{"db_hash": "h1", "user_db_hash": None}, {"db_hash": "h2", "user_db_hash": None}]
    ep = episode(['Tool[get_user, {"id": 1}]', 'Respond["done"]'], infos=infos)
    assert canon("tau2-airline", ep) == "db:h2"
    telecom = episode(['Respond["ok"]'], infos=[{"db_hash": "h3", "user_db_hash": "u9"}])
    assert canon("tau2-telecom", telecom) == "db:h3 user_db:u9"
    # a transfer or a tool-error ending has no clean label: no answer
    for stop in (StopReason.env_terminated, StopReason.tool_error):
        assert canon("tau2-retail", episode(['Respond["x"]'], stop=stop, infos=[{"db_hash": "h"}])) is None
