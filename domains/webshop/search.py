"""Product search: BM25 with Lucene-like settings over the original's indexed text, using ``bm25s``.

The original indexes, per product, the lower-cased ``Title + Description + first bullet point + options text``
(options text: ``"name: v1, v2, and name2: ..."``) with pyserini/Lucene (k1 = 0.9, b = 0.4, Porter stemming,
Lucene's 33 English stop words) and returns up to 50 hits. Here ``bm25s`` (method ``lucene``) computes the same
scoring as Lucene >= 8 (idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf part tf / (tf + k1 (1 - b + b dl / avgdl))); ties are broken by catalog order (Lucene breaks them by document id, i.e. indexing order). Only products
with a positive score are returned, like a Lucene disjunctive query.

Known difference: bm25s's tokenizer keeps tokens of two or more word characters, Lucene's StandardTokenizer also
keeps single characters; one-letter query terms therefore do not match here.
"""
from __future__ import annotations

from typing import Any

SEARCH_RETURN_N = 50
K1 = 0.9
B = 0.4


def product_search_text(p: dict[str, Any]) -> str:
    option_texts = [f"{name}: {', '.join(values)}" for name, values in p["options"].items()]
    return " ".join([p["Title"], p["Description"], p["BulletPoints"][0], ", and ".join(option_texts)]).lower()


class ProductSearch:
    """An in-memory BM25 index over a product list; ``search`` returns ASINs, best first."""

    def __init__(self, products: list[dict[str, Any]]):
        import logging

        import bm25s
        import numpy as np
        import Stemmer

        # bm25s sets its own logger to DEBUG at import; keep "Building index ..." out of the user's stderr.
        bm25s_log = logging.getLogger("bm25s")
        if bm25s_log.level < logging.WARNING:
            bm25s_log.setLevel(logging.WARNING)

        self._np = np
        self._bm25s = bm25s
        self._stemmer = Stemmer.Stemmer("porter")
        self.asins = [p["asin"] for p in products]
        corpus = [product_search_text(p) for p in products]
        tokens = bm25s.tokenize(corpus, stopwords="en", stemmer=self._stemmer, show_progress=False)
        self.retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        self.retriever.index(tokens, show_progress=False)
        self._vocab = self.retriever.vocab_dict
        self._cache: dict[str, list[str]] = {}

    def query_terms(self, query: str) -> list[str]:
        toks = self._bm25s.tokenize(
            [query.lower()], stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False
        )[0]
        return [t for t in toks if t in self._vocab]

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        key = f"{k}\x00{query}"
        hit = self._cache.get(key)
        if hit is not None:
            return list(hit)
        terms = self.query_terms(query)
        if not terms:
            result: list[str] = []
        else:
            np = self._np
            scores = self.retriever.get_scores(terms)
            idx = np.flatnonzero(scores > 0)
            order = idx[np.lexsort((idx, -scores[idx]))][:k]
            result = [self.asins[i] for i in order]
        if len(self._cache) < 4096:
            self._cache[key] = result
        return list(result)
