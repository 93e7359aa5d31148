"""Parse one model output into the four ReAct fields, or say precisely what is wrong with it.

Rules (documented in docs/harness.md):

- Exactly one of each tag ``<think>``, ``<action>``, ``<confidence>``, ``<explanation>`` (lower case, no
  attributes), each closed; the order is not enforced.
- ``<action>``, ``<confidence>`` and ``<explanation>`` must be non-empty; ``<think>`` may be empty.
- Only whitespace may appear outside the four tags (the prompts say "Output only these four tags").
- Confidence is a plain decimal number (``0.85``, ``.85``, ``1``, ``1e-1``) or a percentage (``85%`` -> 0.85);
  the parsed value is clipped to [0, 1] and the raw text is kept. Anything else (``high``, ``0.8-0.9``, ``nan``)
  is a repairable error, because the prompt asks for a number.

The error strings are what the model is told in the repair message (see :func:`repair_message`).
"""
from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass

TAGS = ("think", "action", "confidence", "explanation")
_NON_EMPTY = ("action", "confidence", "explanation")

_TAG = re.compile(r"<(/?)(" + "|".join(TAGS) + r")>")
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")

GENERIC_FORMAT = (
    "<think>your reasoning about what to do next</think>\n"
    "<action>one action</action>\n"
    "<confidence>0.XX</confidence>\n"
    "<explanation>one sentence explaining your confidence</explanation>"
)


@dataclass(frozen=True)
class ParsedStep:
    think: str
    action: str
    verbal_confidence: float
    confidence_raw: str
    explanation: str
    action_span: tuple[int, int]  # [start, end) character offsets of the stripped <action> content in the raw text


@dataclass(frozen=True)
class ParseError:
    message: str  # what was wrong, addressed to the model


def parse_confidence(text: str) -> float | None:
    """The confidence as a float clipped to [0, 1], or None if the text is not a number / percentage."""
    s = text.strip()
    percent = s.endswith("%")
    if percent:
        s = s[:-1].strip()
    if not _NUMBER.match(s):
        return None
    value = float(s)
    if not math.isfinite(value):
        return None
    if percent:
        value /= 100.0
    return min(1.0, max(0.0, value))


def parse_react(raw: str) -> ParsedStep | ParseError:
    """Parse the four tags from the full raw model output."""
    if not raw.strip():
        return ParseError("your output was empty.")
    opens: dict[str, list[re.Match]] = {t: [] for t in TAGS}
    closes: dict[str, list[re.Match]] = {t: [] for t in TAGS}
    for m in _TAG.finditer(raw):  # one scan for all eight markers
        (closes if m.group(1) else opens)[m.group(2)].append(m)
    if not any(opens[t] or closes[t] for t in TAGS):
        return ParseError(
            "none of the four tags <think>, <action>, <confidence>, <explanation> was found; "
            "write your whole answer inside them."
        )
    problems: list[str] = []
    spans: dict[str, tuple[int, int]] = {}  # content span per tag
    outer: list[tuple[int, int]] = []  # full tag spans, to find text outside the tags
    for tag in TAGS:
        o_list, c_list = opens[tag], closes[tag]
        if not o_list and not c_list:
            problems.append(f"the <{tag}>...</{tag}> tag is missing")
            continue
        if len(o_list) > 1 or len(c_list) > 1:
            problems.append(f"<{tag}> appears {max(len(o_list), len(c_list))} times; output it exactly once")
            continue
        if not o_list:
            problems.append(f"</{tag}> has no opening <{tag}>")
            continue
        if not c_list:
            problems.append(f"<{tag}> is not closed with </{tag}> (if your output was cut off, be more concise)")
            continue
        o, c = o_list[0], c_list[0]
        if c.start() < o.end():
            problems.append(f"</{tag}> comes before <{tag}>")
            continue
        spans[tag] = (o.end(), c.start())
        outer.append((o.start(), c.end()))
    if not problems:
        # Each marker appears once; if no two tag spans overlap, no tag can sit inside another's content.
        outer.sort()
        for (s1, e1), (s2, _e2) in zip(outer, outer[1:]):
            if s2 < e1:
                problems.append("the tags are nested or overlap; write the four tags one after another")
                break
    if not problems:
        outside = []
        pos = 0
        for s, e in outer:
            outside.append(raw[pos:s])
            pos = e
        outside.append(raw[pos:])
        extra = " ".join(x.strip() for x in outside if x.strip())
        if extra:
            problems.append(f"there is text outside the four tags ({_clip(extra)!r}); output only the four tags")
    if problems:
        return ParseError("; ".join(problems) + ".")

    content = {tag: raw[s:e] for tag, (s, e) in spans.items()}
    empties = [tag for tag in _NON_EMPTY if not content[tag].strip()]
    if empties:
        return ParseError("; ".join(f"<{tag}> is empty" for tag in empties) + ".")
    confidence_raw = content["confidence"].strip()
    confidence = parse_confidence(confidence_raw)
    if confidence is None:
        return ParseError(
            f"<confidence> must be a number between 0.0 and 1.0 (like 0.75), not {_clip(confidence_raw)!r}."
        )
    a_start, a_end = spans["action"]
    lead = len(content["action"]) - len(content["action"].lstrip())
    trail = len(content["action"]) - len(content["action"].rstrip())
    return ParsedStep(
        think=content["think"].strip(),
        action=content["action"].strip(),
        verbal_confidence=confidence,
        confidence_raw=confidence_raw,
        explanation=content["explanation"].strip(),
        action_span=(a_start + lead, a_end - trail),
    )


def _clip(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def format_block(system_prompt: str | None) -> str:
    """The four-tag format lines of a domain prompt (from the ``<think>`` line to the ``<explanation>`` line)."""
    if system_prompt:
        lines = system_prompt.splitlines()
        start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("<think>")), None)
        if start is not None:
            for j in range(start, min(start + 8, len(lines))):
                if lines[j].lstrip().startswith("<explanation>"):
                    return "\n".join(ln.strip() for ln in lines[start : j + 1])
    return GENERIC_FORMAT


def repair_message(problem: str, system_prompt: str | None = None) -> str:
    """The user message sent after a rejected output: what was wrong, then the required format again."""
    return (
        f"Your previous output could not be used: {problem}\n"
        "Reply again with exactly these four tags, each once, and nothing outside them:\n"
        f"{format_block(system_prompt)}"
    )


def invalid_action_problem(action: str, reason: str) -> str:
    """The problem text for an action the environment rejected (InvalidAction)."""
    reason = reason.strip() or "the action is not valid here"
    return f"the action {_clip(action, 120)!r} was rejected: {reason}"


# --------------------------------------------------------------------------------------- token spans


def token_offsets(tokens: list[str], text: str) -> list[int] | None:
    """Start character offset of every token, or None if the tokens do not join exactly to ``text``."""
    if "".join(tokens) != text:
        return None
    offsets = []
    pos = 0
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    return offsets


def char_span_to_token_range(
    span: tuple[int, int] | None, tokens: list[str] | None, text: str
) -> tuple[int, int] | None:
    """Half-open token index range [start, end) of the tokens that overlap the character span [s, e).

    None when the tokens are missing, do not join to ``text``, or the span is empty.
    """
    if span is None or tokens is None:
        return None
    s, e = span
    if e <= s or s < 0 or e > len(text):
        return None
    offsets = token_offsets(tokens, text)
    if offsets is None:
        return None
    # first token whose end is > s; last token whose start is < e
    ends = [o + len(t) for o, t in zip(offsets, tokens)]
    start = bisect.bisect_right(ends, s)
    end = bisect.bisect_left(offsets, e)
    # skip zero-length tokens on the edges (they cover no character of the span)
    while start < end and len(tokens[start]) == 0:
        start += 1
    while end > start and len(tokens[end - 1]) == 0:
        end -= 1
    return (start, end) if end > start else None
