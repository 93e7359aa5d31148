"""Product search exactly as the original's Anserini index answers it (Lucene 8 BM25), in numpy.

The original indexes, per product, the lower-cased ``Title + Description + first bullet point + options text``
(options text: ``"name: v1, v2, and name2: ..."``) with Anserini 0.14.3 and searches it with pyserini's
``LuceneSearcher.search(keywords, k=50)``. What decides the ranked list, all reproduced here:

- terms: Anserini's default English analyzer (:mod:`.lucene_analysis`); a query term repeated n times is one
  clause with boost n (Anserini's bag-of-words query);
- BM25 as Lucene 8 computes it, in 32-bit floats: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``,
  ``score = w - w / (1 + tf / (k1 (1 - b + b L / avgdl)))`` with ``w = boost * idf``, k1 = 0.9, b = 0.4;
  a document's length L is Lucene's lossy one-byte norm (:func:`decoded_length`), ``avgdl`` the exact mean length;
  per-term scores are summed in double and rounded to float;
- order: score, then the ASIN string (Anserini sorts ties by the document id); at most 50 hits; only documents
  that contain a query term.

Anserini then rounds the reported scores to 4 decimals and lowers tied ones by 1e-6 steps without reordering
(:func:`anserini_reported_scores`); the original uses only the order.

Special keywords of the original (``<q> text``: products whose search query equals ``text``; ``<c> word``:
products whose category equals ``word``; both unranked, in catalog order, not cut to 50) are supported too.
``<r>`` (a random sample, unseeded in the original) and ``<a>`` (which fails in the original's server) are
searched as ordinary text.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from uqh.domains.webshop.lucene_analysis import analyze

SEARCH_RETURN_N = 50
K1 = 0.9
B = 0.4
#: Lucene's norm encoding keeps lengths below this exactly (SmallFloat.intToByte4's "free values").
_EXACT_LENGTHS = 255 - 231  # 255 - longToInt4(Integer.MAX_VALUE)


def product_search_text(p: dict[str, Any]) -> str:
    """The original's indexed ``contents`` of a product."""
    option_texts = [f"{name}: {', '.join(values)}" for name, values in p["options"].items()]
    return " ".join([p["Title"], p["Description"], p["BulletPoints"][0], ", and ".join(option_texts)]).lower()


def _long_to_int4(i: int) -> int:
    """Lucene SmallFloat.longToInt4: a 4-bit-mantissa float-like code of a non-negative integer."""
    num_bits = i.bit_length()
    if num_bits < 4:
        return i
    shift = num_bits - 4
    return ((i >> shift) & 0x07) | ((shift + 1) << 3)


def _int4_to_long(code: int) -> int:
    bits = code & 0x07
    shift = (code >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


def encode_length(length: int) -> int:
    """The one-byte norm Lucene stores for a field of ``length`` terms (SmallFloat.intToByte4)."""
    if length < _EXACT_LENGTHS:
        return length
    return _EXACT_LENGTHS + _long_to_int4(length - _EXACT_LENGTHS)


def decoded_length(code: int) -> int:
    """The length BM25 sees for a norm byte (SmallFloat.byte4ToInt): exact below 24, then ~3 significant bits."""
    if code < _EXACT_LENGTHS:
        return code
    return _EXACT_LENGTHS + _int4_to_long(code - _EXACT_LENGTHS)


def anserini_reported_scores(scores: list[float]) -> list[float]:
    """Scores as Anserini reports them: rounded to 4 decimals, each one within 1e-4 of the one above lowered by
    k * 1e-6 (k-th tie in a row). Float32 arithmetic, as Java's."""
    import numpy as np

    f32 = np.float32
    out: list[Any] = []
    ties = 0
    for i, s in enumerate(scores):
        v = f32(round(float(f32(s)) * 10000.0) / 10000.0)
        if i == 0 or f32(out[-1] - v) > f32(1e-4):
            ties = 0
        else:
            ties += 1
            v = f32(v - f32(f32(ties) * f32(1e-6)))
        out.append(v)
    return [float(v) for v in out]


class ProductSearch:
    """An in-memory Lucene-BM25 index over a product list; ``search`` returns ASINs, best first."""

    def __init__(self, products: list[dict[str, Any]]):
        import numpy as np

        self._np = np
        self.products = products
        self.asins = [p["asin"] for p in products]
        n = len(products)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        lengths = np.zeros(n, dtype=np.int64)
        for d, p in enumerate(products):
            terms = analyze(product_search_text(p))
            lengths[d] = len(terms)
            for term, tf in Counter(terms).items():
                docs, tfs = postings.setdefault(term, ([], []))
                docs.append(d)
                tfs.append(tf)
        self._postings = {t: (np.asarray(d, dtype=np.int64), np.asarray(f, dtype=np.float32))
                          for t, (d, f) in postings.items()}
        self.lengths = lengths
        # Lucene's collection statistics count documents that have the field (at least one term).
        self.doc_count = int((lengths > 0).sum())
        f32 = np.float32
        self.avgdl = f32(float(lengths.sum()) / self.doc_count) if self.doc_count else f32(1.0)
        table = np.array([decoded_length(i) for i in range(256)], dtype=np.float32)
        k1, b = f32(K1), f32(B)
        # BM25Similarity's per-norm cache, evaluated in the same float32 operation order as Lucene.
        inv_norm = f32(1.0) / (k1 * ((f32(1.0) - b) + b * table / self.avgdl))
        codes = np.array([encode_length(int(x)) for x in lengths], dtype=np.int64)
        self._doc_inv_norm = inv_norm[codes].astype(np.float32)
        # Ties are broken by the ASIN string: rank of each document's ASIN in sorted order.
        order = sorted(range(n), key=lambda i: self.asins[i])
        self._asin_rank = np.empty(n, dtype=np.int64)
        self._asin_rank[order] = np.arange(n)
        self._by_query = self._group(products, "query")
        self._by_category = self._group(products, "category")
        self._cache: dict[str, list[str]] = {}

    def __getstate__(self) -> dict[str, Any]:  # the numpy module itself is imported again where unpickled
        state = dict(self.__dict__)
        state.pop("_np", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        import numpy as np

        self.__dict__.update(state)
        self._np = np

    @staticmethod
    def _group(products: list[dict[str, Any]], key: str) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for p in products:
            groups.setdefault(p.get(key) or "", []).append(p["asin"])
        return groups

    def idf(self, term: str) -> float:
        import math

        df = len(self._postings[term][0])
        return float(self._np.float32(math.log(1 + (self.doc_count - df + 0.5) / (df + 0.5))))

    def scored(self, query: str, k: int = SEARCH_RETURN_N) -> list[tuple[str, float]]:
        """(ASIN, float32 score) of the top ``k`` documents for a free-text query, in the original's order."""
        np = self._np
        f32 = np.float32
        counts = Counter(analyze(query))
        acc = np.zeros(len(self.asins), dtype=np.float64)
        hit = np.zeros(len(self.asins), dtype=bool)
        for term, boost in counts.items():
            posting = self._postings.get(term)
            if posting is None:
                continue
            docs, tfs = posting
            weight = f32(f32(boost) * f32(self.idf(term)))
            contrib = weight - weight / (f32(1.0) + tfs * self._doc_inv_norm[docs])
            acc[docs] += contrib.astype(np.float64)
            hit[docs] = True
        idx = np.flatnonzero(hit)
        scores = acc[idx].astype(np.float32)
        order = idx[np.lexsort((self._asin_rank[idx], -scores))][:k]
        final = acc[order].astype(np.float32)
        return [(self.asins[i], float(s)) for i, s in zip(order, final)]

    def search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """The original's result list for a search (``keywords`` as typed, already lower-cased by the env)."""
        key = f"{k}\x00{keywords}"
        hit = self._cache.get(key)
        if hit is not None:
            return list(hit)
        words = keywords.split(" ")
        if words[0] == "<q>":
            result = list(self._by_query.get(" ".join(words[1:]).strip(), []))
        elif words[0] == "<c>" and len(words) > 1:
            result = list(self._by_category.get(words[1].strip(), []))
        else:
            result = [asin for asin, _ in self.scored(keywords, k)]
        if len(self._cache) < 4096:
            self._cache[key] = result
        return list(result)
