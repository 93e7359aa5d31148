"""What a judge is shown (the trace rendering withholds outcome and confidence) and how its reply is validated."""
from __future__ import annotations

import hashlib

import pytest

from uqh.harness.judge.prompts import (
    JUDGE_PROMPTS_DIR,
    ReplyError,
    judge_messages,
    judge_system_prompt,
    parse_reply,
    prompts_sha256,
    render_trace,
)
from uqh.rundir.judgments import JudgeMetric, parse_metrics
from uqh.rundir.errors import UserError
from uqh.rundir.schema import Attempt, CallRecord
from scoring_fixtures import make_episode

SYSTEM = "You are an agent. Tools: Calc[expr], Finish[number]."


def _episode(stop="clean", outcome=0):
    ep = make_episode("t#0", stop, [0.61, 0.37], outcome=outcome)
    ep.steps[0].think, ep.steps[0].action, ep.steps[0].observation = "compute it first", "Calc[2+3]", "Result: 5"
    ep.steps[1].think, ep.steps[1].action = "now answer", "Finish[6]"
    ep.steps[1].observation = "Episode finished. Your answer 6 is wrong."
    ep.steps[1].explanation = "SECRET-EXPLANATION"
    return ep


def test_trace_shows_plan_action_observation_and_withholds_outcome_and_confidence():
    text = render_trace(_episode(), SYSTEM)
    assert SYSTEM in text and "Question: ?" in text
    assert "[step 1]\nTHINK: compute it first\nACTION: Calc[2+3]\nOBSERVATION: Result: 5" in text
    assert "ACTION: Finish[6]\nOBSERVATION: (withheld" in text
    for hidden in ("wrong", "0.61", "0.37", "SECRET-EXPLANATION", "confidence>"):
        assert hidden not in text
    assert "final action at step 2" in text


def test_trace_endings():
    censored = render_trace(make_episode("t#0", "max_steps", [0.5, 0.4], step_budget=2), SYSTEM)
    assert "step budget (2 steps) ran out" in censored and "(withheld" not in censored
    assert "OBSERVATION: obs" in censored  # a censored episode's last observation is not a verdict: shown
    pe = make_episode("t#0", "parse_error", [0.5])
    call = CallRecord(model="m")
    pe.failed_step = [Attempt(attempt=0, raw_text="garbage", error="no <action> tag", call=call),
                      Attempt(attempt=1, raw_text="still garbage", error="no <action> tag", call=call)]
    text = render_trace(pe, SYSTEM)
    assert "output for step 2 could not be used after 1 repair" in text and "still garbage" in text
    empty = make_episode("t#0", "parse_error", [])
    assert "(no completed step)" in render_trace(empty, SYSTEM)


def test_every_judge_prompt_is_complete_and_hashed():
    shas = prompts_sha256()
    assert sorted(shas) == sorted(m.value for m in JudgeMetric)
    for m in JudgeMetric:
        prompt = judge_system_prompt(m)
        assert "{JUDGE_INSTRUCTIONS}" not in prompt and m.label.upper() in prompt
        assert '"score"' in prompt and '"cited_steps"' in prompt and "0 (lowest) to 3 (highest)" in prompt
        assert shas[m.value] == hashlib.sha256(prompt.encode()).hexdigest()
        msgs = judge_messages(m, _episode(), SYSTEM)
        assert [x["role"] for x in msgs] == ["system", "user"] and msgs[0]["content"] == prompt
    assert len(set(shas.values())) == 7
    assert {p.name for p in JUDGE_PROMPTS_DIR.glob("*.txt")} == {"common.txt"} | {f"{m.value}.txt" for m in JudgeMetric}


@pytest.mark.parametrize("text", [
    '{"score": 2, "rationale": "fine", "cited_steps": [2, 1, 2]}',
    '```json\n{"score": 2, "rationale": "fine", "cited_steps": [1, 2]}\n```',
    '<think>let me see</think>\n{"score": 2, "rationale": "fine", "cited_steps": [2, 1]}',
    'Here is my verdict:\n{"score": 2, "rationale": "fine", "cited_steps": [1, 2], "criteria": "x"}\nThanks.',
])
def test_valid_replies(text):
    reply = parse_reply(text, n_steps=2)
    assert reply.score == 2 and reply.rationale == "fine" and reply.cited_steps == [1, 2]


@pytest.mark.parametrize("text,fragment", [
    ("Score: 2. The agent did fine.", "no JSON object"),
    ('{"score": 2, "rationale": "x",', "no JSON object"),
    ('{"score": 2 "rationale": "x"}', "does not parse"),
    ('[2, "x"]', "not an object"),
    ('{"score": 4, "rationale": "x"}', "score"),
    ('{"score": "2", "rationale": "x"}', "score"),
    ('{"score": 2.5, "rationale": "x"}', "score"),
    ('{"score": true, "rationale": "x"}', "score"),
    ('{"score": 2}', "rationale"),
    ('{"score": 2, "rationale": "  "}', "rationale"),
    ('{"score": 2, "rationale": "x", "cited_steps": [3]}', "not steps of the trace"),
    ('{"score": 2, "rationale": "x", "cited_steps": ["1"]}', "cited_steps"),
])
def test_invalid_replies_say_why(text, fragment):
    with pytest.raises(ReplyError, match=fragment):
        parse_reply(text, n_steps=2)


def test_parse_metrics():
    assert parse_metrics("gf, TC") == [JudgeMetric.GF, JudgeMetric.TC]
    with pytest.raises(UserError, match="unknown judge metric"):
        parse_metrics("GF,XX")
    with pytest.raises(UserError, match="twice"):
        parse_metrics("GF,GF")
