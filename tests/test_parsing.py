"""The four-tag parser, its repair messages, and the action-span token range."""
from __future__ import annotations

import pytest

from uqh.harness.episode.parsing import (
    GENERIC_FORMAT,
    ParseError,
    ParsedStep,
    char_span_to_token_range,
    format_block,
    parse_confidence,
    parse_react,
    repair_message,
    token_offsets,
)

GOOD = (
    "<think>I should compute.</think>\n"
    "<action>Calc[2 + 3]</action>\n"
    "<confidence>0.85</confidence>\n"
    "<explanation>Simple sum.</explanation>"
)


def test_all_tags_parsed():
    p = parse_react(GOOD)
    assert isinstance(p, ParsedStep)
    assert (p.think, p.action, p.explanation) == ("I should compute.", "Calc[2 + 3]", "Simple sum.")
    assert p.verbal_confidence == 0.85 and p.confidence_raw == "0.85"
    s, e = p.action_span
    assert GOOD[s:e] == "Calc[2 + 3]"


def test_order_free_and_whitespace_inside_tags_stripped():
    raw = "<confidence> 70% </confidence><explanation>x</explanation><action>\n  Finish[5] \n</action><think></think>"
    p = parse_react(raw)
    assert isinstance(p, ParsedStep)
    assert p.verbal_confidence == pytest.approx(0.7) and p.confidence_raw == "70%"
    assert p.think == "" and raw[p.action_span[0] : p.action_span[1]] == "Finish[5]"


@pytest.mark.parametrize(
    "text,value",
    [("0.85", 0.85), (".5", 0.5), ("1", 1.0), ("0", 0.0), ("85%", 0.85), ("1.7", 1.0), ("-0.2", 0.0),
     ("1e-1", 0.1), ("250%", 1.0), (" 0.30 ", 0.3)],
)
def test_confidence_numbers_clipped(text, value):
    assert parse_confidence(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["high", "0.8-0.9", "nan", "inf", "", "0.XX", "%", "0.8 maybe", "1/2"])
def test_confidence_non_numbers(text):
    assert parse_confidence(text) is None


@pytest.mark.parametrize(
    "raw,fragment",
    [
        (GOOD.replace("<action>Calc[2 + 3]</action>", ""), "the <action>...</action> tag is missing"),
        (GOOD + "<action>Finish[5]</action>", "<action> appears 2 times"),
        (GOOD.replace("</explanation>", ""), "<explanation> is not closed"),
        (GOOD.replace("<think>", ""), "</think> has no opening <think>"),
        (GOOD.replace("Calc[2 + 3]", "  "), "<action> is empty"),
        (GOOD.replace("Simple sum.", ""), "<explanation> is empty"),
        (GOOD.replace("0.85", "very high"), "<confidence> must be a number between 0.0 and 1.0"),
        ("Sure! " + GOOD, "text outside the four tags ('Sure!')"),
        (GOOD + "\nDone.", "text outside the four tags ('Done.')"),
        ("", "your output was empty"),
        ("The answer is 5.", "none of the four tags <think>, <action>, <confidence>, <explanation> was found"),
        ("<think>a<action>b</action></think><confidence>1</confidence><explanation>c</explanation>",
         "nested or overlap"),
    ],
)
def test_malformed_outputs_give_precise_errors(raw, fragment):
    p = parse_react(raw)
    assert isinstance(p, ParseError)
    assert fragment in p.message, p.message


def test_several_problems_reported_together():
    p = parse_react("<think>x</think>")
    assert isinstance(p, ParseError)
    for tag in ("action", "confidence", "explanation"):
        assert f"the <{tag}>...</{tag}> tag is missing" in p.message


def test_repair_message_restates_domain_format():
    prompt = "You are X.\nAt every step, use this exact format:\n<think>r</think>\n<action>Search[...]</action>\n" \
             "<confidence>0.XX</confidence>\n<explanation>e</explanation>\nRules:\n- be brief"
    msg = repair_message("the <action>...</action> tag is missing.", prompt)
    assert msg.startswith("Your previous output could not be used: the <action>...</action> tag is missing.")
    assert msg.endswith("<think>r</think>\n<action>Search[...]</action>\n<confidence>0.XX</confidence>\n"
                        "<explanation>e</explanation>")
    assert format_block("no format here") == GENERIC_FORMAT


def test_real_prompt_format_block_found():
    from uqh.domains.base import PROMPTS_DIR

    block = format_block((PROMPTS_DIR / "arithmetic.txt").read_text())
    assert block.splitlines()[1] == "<action>Calc[...] or Finish[number]</action>"


# --------------------------------------------------------------------------------------- token ranges


def test_token_range_hand_computed():
    text = "<action>Calc[1]</action>"
    tokens = ["<", "action", ">", "Calc", "[", "1", "]</", "action", ">"]
    # content "Calc[1]" spans chars 8..15; tokens 3 ("Calc") .. 6 ("]</", which overlaps the closing "]")
    assert char_span_to_token_range((8, 15), tokens, text) == (3, 7)
    assert char_span_to_token_range((8, 12), tokens, text) == (3, 4)
    assert char_span_to_token_range((9, 10), tokens, text) == (3, 4)  # inside one token


def test_token_range_from_parsed_span():
    tokens = ["<think>", "I should", " compute.", "</think>\n<action>", "Calc", "[2 + 3]", "</action>\n",
              "<confidence>0.85</confidence>\n", "<explanation>Simple sum.</explanation>"]
    assert "".join(tokens) == GOOD
    p = parse_react(GOOD)
    assert char_span_to_token_range(p.action_span, tokens, GOOD) == (4, 6)


def test_token_range_null_cases():
    text = "abc"
    assert char_span_to_token_range((0, 2), None, text) is None  # no logprobs
    assert char_span_to_token_range((0, 2), ["ab", "x"], text) is None  # tokens do not join to the text
    assert char_span_to_token_range((1, 1), ["a", "bc"], text) is None  # empty span
    assert char_span_to_token_range(None, ["a", "bc"], text) is None
    assert token_offsets(["a", "", "bc"], text) == [0, 1, 1]
    assert char_span_to_token_range((1, 3), ["a", "", "bc"], text) == (2, 3)  # zero-length token skipped
