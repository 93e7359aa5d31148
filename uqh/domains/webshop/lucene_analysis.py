"""The text analysis of the original's search index, in Python: Anserini's default English analyzer.

The original indexes and queries with Anserini 0.14.3 (Lucene 8), whose analyzer is: Lucene's StandardTokenizer
(Unicode word breaks, UAX #29) -> English possessive removal -> lower-casing -> Lucene's 33 English stop words ->
Porter stemming. What this keeps that a plain ``\\w+`` tokenizer loses:

- one-character tokens (``7``, ``x``) and numbers with inner separators (``3.4``, ``1,000``, ``5'6``);
- letters joined across ``:``, ``.``, ``'`` and ``_`` (``word:word``, ``u.s.a``, ``don't``, ``a_b``); a hyphen
  always splits (``x-ray`` -> ``x``, ``ray``);
- Han and Hiragana characters as one token each, Thai-like scripts as runs, emoji (with skin tones, ZWJ
  sequences, keycaps, flag pairs) as tokens;
- tokens longer than 255 characters cut into 255-character pieces.

The word-break class of each code point comes from ``lucene_word_classes.txt``, measured on the real tokenizer
(see that file's header), so characters Lucene's Unicode version does not know are never part of a token, as in
the original. Token rules (letters in the class alphabet of that file; ``x`` = absorbed X/Y/J/C marks)::

    word   = E* unit (E+ unit)* E*      unit = K (E* K)*  |  ( N ((E* | U|Q) N)*  |  A ((E* | M|Q) A)* )+
    emoji  = (B F | B | P | F) x* (after a J: (B F | B | P | F) x*)*   |   H X? C x*   |   R R x*
    other  = [SY] [SYx]*  (one run)  |  I x*  (one token per character)
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from uqh.domains.webshop.porter import stem

CLASS_FILE = Path(__file__).with_name("lucene_word_classes.txt")
MAX_TOKEN_CHARS = 255

#: Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (the 33 words Anserini's default analyzer removes).
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split()
)
_POSSESSIVE_APOSTROPHES = ("'", "\u2019", "\uff07")

_X = "[XYJC]*"
_E = f"E{_X}"
_UNIT = (
    f"(?:K{_X}(?:(?:{_E})*K{_X})*"
    f"|(?:N{_X}(?:(?:(?:{_E})*|[UQ]{_X})N{_X})*|A{_X}(?:(?:(?:{_E})*|[MQ]{_X})A{_X})*)+)"
)
_WORD = f"(?:{_E})*{_UNIT}(?:(?:{_E})+{_UNIT})*(?:{_E})*"
_ELEM = "(?:BF|[BPF])"
_EMOJI = f"{_ELEM}[XYJC]*(?:(?<=J){_ELEM}[XYJC]*)*|HX?C{_X}|RR{_X}"
_TOKEN = re.compile(f"{_WORD}|{_EMOJI}|[SY][SYXJC]*|I{_X}")


@lru_cache(maxsize=1)
def _class_table() -> str:
    """A string indexed by code point: its class letter ('O' where the file lists nothing)."""
    ranges: list[tuple[int, int, str]] = []
    top = 0
    for line in CLASS_FILE.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        first = int(parts[0], 16)
        last = int(parts[1], 16) if len(parts) == 3 else first
        ranges.append((first, last, parts[-1]))
        top = max(top, last)
    table = bytearray(b"O" * (top + 1))
    for first, last, cls in ranges:
        table[first : last + 1] = cls.encode() * (last - first + 1)
    return table.decode("ascii")


def tokenize(text: str) -> list[str]:
    """StandardTokenizer tokens of ``text``, in order, original case."""
    # Each character -> its class letter; characters past the table stay as they are (non-ASCII, so they match
    # no class letter: class O).
    classes = text.translate(_class_table())
    out: list[str] = []
    pos = 0
    while True:
        for m in _TOKEN.finditer(classes, pos):
            start, end = m.span()
            if end - start > MAX_TOKEN_CHARS:  # Lucene emits the first 255 characters and scans on from there
                out.append(text[start : start + MAX_TOKEN_CHARS])
                pos = start + MAX_TOKEN_CHARS
                break
            out.append(text[start:end])
        else:
            return out


def lower_token(token: str) -> str:
    """Lower-case one code point at a time, as Java's Character.toLowerCase (no final-sigma rule; U+0130 -> i)."""
    if token.isascii():
        return token.lower()
    return "".join(ch.lower()[0] for ch in token)


def analyze_tokens(tokens: list[str]) -> list[str]:
    """Possessive removal, lower-casing, stop words, Porter stemming (the filters after the tokenizer)."""
    kept = []
    for tok in tokens:
        if len(tok) >= 2 and tok[-1] in "sS" and tok[-2] in _POSSESSIVE_APOSTROPHES:
            tok = tok[:-2]
        tok = lower_token(tok)
        if tok not in STOP_WORDS:
            kept.append(tok)
    return [stem(t) for t in kept]


def analyze(text: str) -> list[str]:
    """The index terms of ``text`` in order (Anserini's DefaultEnglishAnalyzer)."""
    return analyze_tokens(tokenize(text))
