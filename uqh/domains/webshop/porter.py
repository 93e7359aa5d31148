"""The Porter stemmer as Lucene's PorterStemFilter applies it (Martin Porter's reference version).

Lucene ships Porter's own reference implementation, which departs from the 1980 paper in three places: step 2
maps ``-bli`` to ``-ble`` (the paper: ``-abli`` -> ``-able``) and ``-logi`` to ``-log`` (not in the paper), and
words of one or two characters are left alone. Snowball's ``porter`` (PyStemmer) follows the paper, so e.g.
``assembly`` -> ``assembli`` there but ``assembl`` in the original's index; NLTK's ``MARTIN_EXTENSIONS`` mode is
this algorithm but importing NLTK costs seconds. Written from the algorithm's description; checked word for word
against Lucene's output (tests/data/webshop/lucene_stems.json).

Any character other than a, e, i, o, u counts as a consonant (``y`` after a consonant or at the start counts as a
vowel / consonant as in the algorithm), so digits and non-ASCII letters pass through as consonants, as in Lucene.
"""
from __future__ import annotations

from functools import lru_cache

_VOWELS = frozenset("aeiou")

# (suffix, replacement) lists, tried in order; the first suffix that ends the word decides, whether or not its
# measure condition then holds (the reference implementation's "break" after a matching suffix).
_STEP2 = {
    "a": (("ational", "ate"), ("tional", "tion")),
    "c": (("enci", "ence"), ("anci", "ance")),
    "e": (("izer", "ize"),),
    "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
    "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
    "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
    "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
    "g": (("logi", "log"),),
}
_STEP3 = {
    "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
    "i": (("iciti", "ic"),),
    "l": (("ical", "ic"), ("ful", "")),
    "s": (("ness", ""),),
}
_STEP4 = {
    "a": ("al",),
    "c": ("ance", "ence"),
    "e": ("er",),
    "i": ("ic",),
    "l": ("able", "ible"),
    "n": ("ant", "ement", "ment", "ent"),
    "s": ("ism",),
    "t": ("ate", "iti"),
    "u": ("ous",),
    "v": ("ive",),
    "z": ("ize",),
}


def _is_consonant(w: str, i: int) -> bool:
    ch = w[i]
    if ch in _VOWELS:
        return False
    if ch == "y":
        return i == 0 or not _is_consonant(w, i - 1)
    return True


def _measure(stem: str) -> int:
    """m in [C](VC)^m[V]: the number of vowel-consonant sequences."""
    m = 0
    i, n = 0, len(stem)
    while i < n and _is_consonant(stem, i):
        i += 1
    while i < n:
        while i < n and not _is_consonant(stem, i):
            i += 1
        if i >= n:
            break
        m += 1
        while i < n and _is_consonant(stem, i):
            i += 1
    return m


def _has_vowel(stem: str) -> bool:
    return any(not _is_consonant(stem, i) for i in range(len(stem)))


def _double_consonant(w: str) -> bool:
    return len(w) >= 2 and w[-1] == w[-2] and _is_consonant(w, len(w) - 1)


def _cvc(w: str) -> bool:
    """consonant-vowel-consonant at the end, the last not w, x or y."""
    n = len(w)
    return (
        n >= 3
        and _is_consonant(w, n - 1)
        and not _is_consonant(w, n - 2)
        and _is_consonant(w, n - 3)
        and w[-1] not in "wxy"
    )


def _step1ab(w: str) -> str:
    if w.endswith("s"):
        if w.endswith("sses"):
            w = w[:-2]
        elif w.endswith("ies"):
            w = w[:-3] + "i"
        elif len(w) >= 2 and w[-2] != "s":
            w = w[:-1]
    if w.endswith("eed"):
        if _measure(w[:-3]) > 0:
            w = w[:-1]
        return w
    for suffix in ("ed", "ing"):
        if w.endswith(suffix) and _has_vowel(w[: -len(suffix)]):
            w = w[: -len(suffix)]
            if w.endswith("at") or w.endswith("bl") or w.endswith("iz"):
                return w + "e"
            if _double_consonant(w):
                return w if w[-1] in "lsz" else w[:-1]
            if _measure(w) == 1 and _cvc(w):
                return w + "e"
            return w
    return w


def _step1c(w: str) -> str:
    if w.endswith("y") and _has_vowel(w[:-1]):
        return w[:-1] + "i"
    return w


def _replace(w: str, rules: dict[str, tuple[tuple[str, str], ...]], key: str) -> str:
    for suffix, repl in rules.get(key, ()):
        if w.endswith(suffix):
            stem = w[: -len(suffix)]
            return stem + repl if _measure(stem) > 0 else w
    return w


def _step4(w: str) -> str:
    if len(w) < 2:
        return w
    key = w[-2]
    if key == "o":
        if w.endswith("ion") and len(w) > 3 and w[-4] in "st":
            stem = w[:-3]
        elif w.endswith("ou"):
            stem = w[:-2]
        else:
            return w
        return stem if _measure(stem) > 1 else w
    for suffix in _STEP4.get(key, ()):
        if w.endswith(suffix):
            stem = w[: -len(suffix)]
            return stem if _measure(stem) > 1 else w
    return w


def _step5(w: str) -> str:
    if w.endswith("e"):
        m = _measure(w[:-1])
        if m > 1 or (m == 1 and not _cvc(w[:-1])):
            w = w[:-1]
    if w.endswith("l") and _double_consonant(w) and _measure(w) > 1:
        w = w[:-1]
    return w


@lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """Porter stem of a lower-cased token, as Lucene's PorterStemmer."""
    if len(word) <= 2:
        return word
    w = _step1ab(word)
    w = _step1c(w)
    if len(w) >= 2:
        w = _replace(w, _STEP2, w[-2])
        w = _replace(w, _STEP3, w[-1])
    w = _step4(w)
    return _step5(w)
