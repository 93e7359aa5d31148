"""StrategyQA / HotpotQA environments on hand-made corpora: every action, scoring, truncation, replay."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from uqh.domains.domain_registry import get_domain_class
from uqh.domains.base import InvalidAction, RecordedStep, ReplayMismatch
from uqh.domains.qa.hotpotqa import exact_match, f1_score, normalize_answer
from uqh.domains.qa.strategyqa import parse_yes_no

CORPUS = [
    {"title": "Eiffel Tower", "text": "The Eiffel Tower is a wrought-iron lattice tower in Paris. It was designed by Gustave Eiffel's company. The tower is 330 metres tall."},
    {"title": "Gustave Eiffel", "text": "Gustave Eiffel was a French civil engineer. Eiffel was born in Dijon in 1832."},
    {"title": "Dijon", "text": "Dijon is a city in eastern France. Dijon is famous for its mustard."},
    {"title": "Mount Everest", "text": "Mount Everest is Earth's highest mountain above sea level. It lies in the Himalayas."},
    {"title": "Long Page", "text": "Zanzibarian chronicles " + " ".join(f"word{i}" for i in range(200)) + "."},
]

SQA_ROWS = [
    {"qid": "q-yes", "term": "Eiffel Tower", "description": "tower in Paris", "question": "Is the Eiffel Tower in France?",
     "answer": True, "facts": ["The Eiffel Tower is in Paris.", "Paris is in France."], "decomposition": []},
    {"qid": "q-no", "term": "Mount Everest", "description": "mountain", "question": "Is Mount Everest in Dijon?",
     "answer": False, "facts": ["Mount Everest is in the Himalayas."], "decomposition": []},
]

HQA_ROWS = [
    {"id": "h1", "question": "Where was the designer of the Eiffel Tower born?", "answer": "Dijon", "type": "bridge"},
    {"id": "h2", "question": "What is the tallest mountain?", "answer": "the Mount Everest", "type": "bridge"},
]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def files(tmp_path: Path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    sqa = tmp_path / "sqa.json"
    sqa.write_text(json.dumps(SQA_ROWS))
    hqa = tmp_path / "hqa.jsonl"
    hqa.write_text("".join(json.dumps(r) + "\n" for r in HQA_ROWS))
    return {"corpus": corpus, "sqa": sqa, "hqa": hqa, "index": tmp_path / "index"}


def make(name, files, **extra):
    data = files["sqa"] if name == "strategyqa" else files["hqa"]
    opts = {"data": str(data), "corpus": str(files["corpus"]), "index_dir": str(files["index"]), **extra}
    return get_domain_class(name)(opts)


def test_reset_returns_question(files):
    d = make("strategyqa", files)
    env = d.make_env("q-yes", episode_seed=0)
    assert run(env.reset()) == "Question: Is the Eiffel Tower in France?"
    assert d.all_task_ids() == ["q-yes", "q-no"]


def test_search_hit_loads_top_k_in_score_order(files):
    d = make("hotpotqa", files, top_k=2)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    r = run(env.step("Search[Gustave Eiffel birthplace]"))
    assert not r.done and r.outcome is None
    assert r.info["titles"][0] == "Gustave Eiffel"
    assert len(r.info["titles"]) == 2
    assert r.info["scores"] == sorted(r.info["scores"], reverse=True)
    assert r.observation.startswith("[1] Gustave Eiffel: Gustave Eiffel was a French civil engineer.")
    assert "\n[2] " in r.observation
    # the loaded context is the sentences of exactly those two passages
    assert {c.title for c in env.context} == set(r.info["titles"])


def test_search_no_hit_clears_context_and_lookup_then_invalid(files):
    d = make("hotpotqa", files)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    run(env.step("Search[Eiffel]"))
    assert env.context
    r = run(env.step("Search[quantum chromodynamics]"))
    assert r.observation.startswith("No passage matches 'quantum chromodynamics'")
    assert env.context == [] and r.info["titles"] == []
    with pytest.raises(InvalidAction, match="Search"):
        run(env.step("Lookup[Eiffel]"))
    # a query made only of stop words has no terms: also no hit, not a crash
    r = run(env.step("Search[the of and]"))
    assert r.observation.startswith("No passage matches")


def test_lookup_before_search_is_invalid_and_state_unchanged(files):
    d = make("strategyqa", files)
    env = d.make_env("q-yes", episode_seed=0)
    run(env.reset())
    with pytest.raises(InvalidAction, match="use Search\\[query\\] first"):
        run(env.step("Lookup[tower]"))
    assert env.context == [] and env.lookup_keyword is None and env.lookup_cursor == 0


def test_lookup_cycles_through_matches_then_exhausts(files):
    d = make("hotpotqa", files, top_k=1)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    r = run(env.step("Search[Gustave Eiffel civil engineer]"))
    assert r.info["titles"] == ["Gustave Eiffel"]
    # case-insensitive substring match over the loaded sentences, in order
    obs = [run(env.step("Lookup[eiffel]")).observation for _ in range(3)]
    assert obs == [
        "(Result 1 / 2) Gustave Eiffel was a French civil engineer.",
        "(Result 2 / 2) Eiffel was born in Dijon in 1832.",
        "No more results for 'eiffel' (all 2 shown).",
    ]
    # a new keyword restarts the cursor; a keyword with no match says so
    assert run(env.step("Lookup[Dijon]")).observation == "(Result 1 / 1) Eiffel was born in Dijon in 1832."
    assert run(env.step("Lookup[mustard]")).observation == "No sentence in the loaded context contains 'mustard'."
    # going back to an earlier keyword restarts it from 1
    assert run(env.step("Lookup[eiffel]")).observation.startswith("(Result 1 / 2)")
    # a new Search resets the lookup cursor
    run(env.step("Search[Dijon mustard]"))
    assert run(env.step("Lookup[Dijon]")).observation == "(Result 1 / 2) Dijon is a city in eastern France."


def test_lookup_scans_only_loaded_context(files):
    d = make("hotpotqa", files, top_k=1)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    run(env.step("Search[Mount Everest Himalayas]"))
    assert run(env.step("Lookup[Dijon]")).observation == "No sentence in the loaded context contains 'Dijon'."


def test_observation_truncated_to_420_chars(files):
    d = make("hotpotqa", files, top_k=1)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    r = run(env.step("Search[Zanzibarian chronicles]"))
    full = "[1] Long Page: " + CORPUS[4]["text"]
    assert len(full) > 420
    assert len(r.observation) == 420 and r.observation == full[:420]
    # lookup results are truncated as well
    assert len(run(env.step("Lookup[word199]")).observation) == 420
    # observation_chars=None switches truncation off
    d2 = get_domain_class("hotpotqa")(
        {"data": str(files["hqa"]), "corpus": str(files["corpus"]), "index_dir": str(files["index"]), "top_k": 1},
        observation_chars=None,
    )
    env2 = d2.make_env("h1", episode_seed=0)
    run(env2.reset())
    assert run(env2.step("Search[Zanzibarian chronicles]")).observation == full


@pytest.mark.parametrize(
    "action,message",
    [
        ("Search[]", "non-empty query"),
        ("Lookup[  ]", "non-empty keyword"),
        ("Jump[x]", "unknown tool 'Jump'"),
        ("search for eiffel", "not of the form Tool\\[argument\\]"),
        ("", "not of the form"),
    ],
)
def test_malformed_actions_are_invalid(files, action, message):
    d = make("hotpotqa", files)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    with pytest.raises(InvalidAction, match=message):
        run(env.step(action))


def test_tool_names_are_case_insensitive(files):
    d = make("hotpotqa", files)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    assert run(env.step("  search[Dijon] ")).info["titles"][0] == "Dijon"


# ---------------------------------------------------------------------------------- StrategyQA finish


@pytest.mark.parametrize("answer,value", [("yes", True), ("No", False), (" YES. ", True), ('"no"', False), ("no!", False)])
def test_parse_yes_no_accepts_variants(answer, value):
    assert parse_yes_no(answer) is value


@pytest.mark.parametrize("answer", ["maybe", "yes, it is", "true", "", "y"])
def test_parse_yes_no_rejects_others(answer):
    with pytest.raises(InvalidAction, match="exactly yes or no"):
        parse_yes_no(answer)


def test_strategyqa_finish_scores_against_gold(files):
    d = make("strategyqa", files)
    cases = [("q-yes", "yes", 1), ("q-yes", "no", 0), ("q-no", "no", 1), ("q-no", "yes", 0)]
    for task_id, ans, y in cases:
        env = d.make_env(task_id, episode_seed=0)
        run(env.reset())
        r = run(env.step(f"Finish[{ans}]"))
        assert r.done and r.outcome == y and r.reward == float(y)
        assert r.reward_info == {"answer": ans, "gold": task_id == "q-yes", "correct": bool(y)}
        assert r.stop_reason is None


def test_strategyqa_free_text_finish_is_repairable(files):
    d = make("strategyqa", files)
    env = d.make_env("q-yes", episode_seed=0)
    run(env.reset())
    run(env.step("Search[Eiffel Tower]"))
    before = (list(env.context), env.finished)
    with pytest.raises(InvalidAction, match="Finish\\[yes\\] or Finish\\[no\\]"):
        run(env.step("Finish[Paris]"))
    assert (env.context, env.finished) == before
    assert run(env.step("Finish[yes]")).outcome == 1
    with pytest.raises(InvalidAction, match="already finished"):
        run(env.step("Search[x]"))


# ---------------------------------------------------------------------------------- HotpotQA finish


@pytest.mark.parametrize(
    "raw,norm",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple, a pear!  ", "apple pear"),
        ("U.S.A.", "usa"),
        ("Theatre", "theatre"),  # 'the' only as a whole word
        ("A", ""),
        ("Gesellschaft mit beschränkter Haftung", "gesellschaft mit beschränkter haftung"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_and_f1_closed_forms():
    assert exact_match("the  Dijon.", "Dijon") == 1
    assert exact_match("Dijon, France", "Dijon") == 0
    # pred tokens {dijon, france}, gold {dijon}: P = 1/2, R = 1, F1 = 2/3
    assert f1_score("Dijon, France", "Dijon") == pytest.approx(2 / 3)
    # pred {city, of, paris}, gold {paris, france}: overlap 1, P = 1/3, R = 1/2, F1 = 0.4
    assert f1_score("city of Paris", "Paris France") == pytest.approx(0.4)
    assert f1_score("London", "Paris") == 0.0
    # yes/no must match exactly (official HotpotQA rule)
    assert f1_score("yes", "yes it is") == 0.0
    assert f1_score("no", "no") == 1.0
    # repeated tokens count with multiplicity: pred {a1,a1,b}, gold {a1,b}: common 2, P=2/3, R=1 -> 0.8
    assert f1_score("x x y", "x y") == pytest.approx(0.8)


def test_hotpotqa_finish_records_em_and_f1(files):
    d = make("hotpotqa", files)
    env = d.make_env("h2", episode_seed=0)  # gold "the Mount Everest"
    run(env.reset())
    r = run(env.step("Finish[Mount Everest.]"))
    assert r.done and r.outcome == 1 and r.reward == 1.0
    assert r.reward_info == {"answer": "Mount Everest.", "gold": "the Mount Everest", "em": 1, "f1": 1.0}
    env = d.make_env("h1", episode_seed=0)  # gold "Dijon"
    run(env.reset())
    r = run(env.step("Finish[Dijon, France]"))
    assert r.outcome == 0 and r.reward_info["em"] == 0 and r.reward_info["f1"] == pytest.approx(2 / 3, abs=1e-6)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    with pytest.raises(InvalidAction, match="non-empty answer"):
        run(env.step("Finish[ ]"))


# ---------------------------------------------------------------------------------- replay


def _record(env, actions):
    out = []
    for a in actions:
        r = run(env.step(a))
        out.append(RecordedStep(action=a, observation=r.observation, info=r.info))
    return out


def test_replay_restores_context_and_lookup_cursor(files):
    d = make("hotpotqa", files, top_k=2)
    actions = ["Search[Gustave Eiffel]", "Lookup[Eiffel]", "Lookup[Eiffel]"]
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    rec = _record(env, actions)
    nxt = run(env.step("Lookup[Eiffel]")).observation

    env2 = d.make_env("h1", episode_seed=0)
    run(env2.reset())
    run(env2.replay(rec))
    assert env2.context == env.context
    assert (env2.lookup_keyword, env2.lookup_cursor) == ("Eiffel", 2)
    assert run(env2.step("Lookup[Eiffel]")).observation == nxt

    # a fresh domain object (as after a crash, new process) rebuilds the same state from the persisted index
    d3 = make("hotpotqa", files, top_k=2)
    env3 = d3.make_env("h1", episode_seed=0)
    run(env3.reset())
    run(env3.replay(rec))
    assert env3.context == env.context


def test_replay_mismatch_is_reported(files):
    d = make("hotpotqa", files, top_k=2)
    env = d.make_env("h1", episode_seed=0)
    run(env.reset())
    rec = _record(env, ["Search[Gustave Eiffel]", "Lookup[Eiffel]"])
    rec[1] = RecordedStep(action=rec[1].action, observation="(Result 1 / 9) something else")
    env2 = d.make_env("h1", episode_seed=0)
    run(env2.reset())
    with pytest.raises(ReplayMismatch, match="step 2"):
        run(env2.replay(rec))
    # a different top_k changes the observation: replay against another config is caught
    d4 = make("hotpotqa", files, top_k=1)
    env4 = d4.make_env("h1", episode_seed=0)
    run(env4.reset())
    good = _record(d.make_env("h1", episode_seed=0), [])  # empty prefix replays trivially
    run(env4.replay(good))
    env5 = d.make_env("h1", episode_seed=0)
    run(env5.reset())
    rec_ok = _record(env5, ["Search[Gustave Eiffel]"])
    with pytest.raises(ReplayMismatch, match="step 1"):
        run(env4.replay(rec_ok))


def test_replay_of_finished_prefix_is_rejected(files):
    d = make("strategyqa", files)
    env = d.make_env("q-yes", episode_seed=0)
    run(env.reset())
    rec = _record(env, ["Finish[yes]"])
    env2 = d.make_env("q-yes", episode_seed=0)
    run(env2.reset())
    with pytest.raises(ReplayMismatch, match="not censored"):
        run(env2.replay(rec))
