"""Passage retrieval for the QA domains: one small interface, two backends.

- :class:`Bm25Retriever` -- embedded default: a ``bm25s`` index (Lucene scoring, English stop words, PyStemmer
  stemmer) over ``{title, text}`` paragraphs, persisted to a directory and reused when the corpus hash matches.
- :class:`ElasticsearchRetriever` -- the paper's "Local ES": the official ``elasticsearch`` client against an index
  built by :func:`index_elasticsearch` (``uqh index --backend es``) from the same corpus.

Heavy imports (bm25s, Stemmer, elasticsearch) stay inside functions so that importing ``domains`` stays cheap.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol
from urllib.parse import urlsplit

from uqh.domains.locations import cache_root
from uqh.rundir.errors import OutputWriteError, UserError, read_user_text
from uqh.rundir.secrets import mask_url, url_credentials

log = logging.getLogger(__name__)

DEFAULT_INDEX_ROOT = cache_root() / "indexes"

INDEX_META_FILE = "uqh_index.json"
INDEX_PASSAGES_FILE = "passages.jsonl"
BM25_SETTINGS = {"method": "lucene", "stopwords": "en", "stemmer": "english", "k1": 1.5, "b": 0.75}


@dataclass(frozen=True)
class Paragraph:
    """One corpus entry."""

    title: str
    text: str


@dataclass(frozen=True)
class Passage:
    """One retrieved paragraph with its backend score (higher is better)."""

    title: str
    text: str
    score: float


class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[Passage]:
        """The best ``k`` passages for ``query``, best first; an empty list when nothing matches."""

    def describe(self) -> dict[str, Any]:
        """Facts for the manifest (backend, corpus hash, size); never secrets."""


# --------------------------------------------------------------------------------------- corpus


def corpus_sha256(paragraphs: Iterable[Paragraph]) -> str:
    """A content hash of the corpus (order matters: passage ids are positions)."""
    h = hashlib.sha256()
    for p in paragraphs:
        h.update(json.dumps([p.title, p.text], ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def dedupe(paragraphs: Iterable[Paragraph]) -> list[Paragraph]:
    """Drop exact duplicates, keeping first-seen order."""
    seen: set[tuple[str, str]] = set()
    out: list[Paragraph] = []
    for p in paragraphs:
        key = (p.title, p.text)
        if key not in seen and p.text.strip():
            seen.add(key)
            out.append(p)
    return out


def read_corpus_file(path: str | os.PathLike) -> list[Paragraph]:
    """Read a paragraph file: JSONL with one ``{"title": ..., "text": ...}`` object per line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"corpus file {path} does not exist; pass a JSONL file with one {{title, text}} object per line")
    out: list[Paragraph] = []
    for n, line in enumerate(read_user_text(path, f"corpus file {path}").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            out.append(Paragraph(title=str(obj["title"]), text=str(obj["text"])))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(
                f"corpus file {path} line {n} is not a JSON object with 'title' and 'text'; fix or remove that line"
            ) from None
    if not out:
        raise UserError(f"corpus file {path} holds no paragraphs; it needs one {{title, text}} JSON object per line")
    return dedupe(out)


def write_corpus_file(paragraphs: Iterable[Paragraph], path: str | os.PathLike) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for p in paragraphs:
            f.write(json.dumps({"title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


# --------------------------------------------------------------------------------------- bm25s


def _stemmer():
    import Stemmer

    return Stemmer.Stemmer(BM25_SETTINGS["stemmer"])


def _doc_text(p: Paragraph) -> str:
    return f"{p.title} {p.text}"


class Bm25Retriever:
    """bm25s over a paragraph list. Build with :meth:`build`, persist with :meth:`save`, reuse with :meth:`open`."""

    backend = "bm25"

    def __init__(self, paragraphs: list[Paragraph], model: Any, *, sha256: str, index_dir: Path | None = None):
        self.paragraphs = paragraphs
        self.model = model
        self.sha256 = sha256
        self.index_dir = index_dir
        self._stem = _stemmer()

    def __getstate__(self) -> dict[str, Any]:  # the stemmer is a C object: made again where unpickled
        state = dict(self.__dict__)
        state.pop("_stem", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stem = _stemmer()

    @classmethod
    def build(cls, paragraphs: list[Paragraph]) -> "Bm25Retriever":
        import bm25s

        if not paragraphs:
            raise UserError("the retrieval corpus is empty; pass a corpus file with at least one paragraph")
        tokens = bm25s.tokenize(
            [_doc_text(p) for p in paragraphs],
            stopwords=BM25_SETTINGS["stopwords"],
            stemmer=_stemmer(),
            show_progress=False,
        )
        model = bm25s.BM25(method=BM25_SETTINGS["method"], k1=BM25_SETTINGS["k1"], b=BM25_SETTINGS["b"])
        model.index(tokens, show_progress=False)
        return cls(paragraphs, model, sha256=corpus_sha256(paragraphs))

    def save(self, index_dir: str | os.PathLike, flag: str = "--index-dir") -> Path:
        """Write the index atomically (temp dir + rename); concurrent writers of the same corpus are harmless.
        ``flag`` names ``index_dir`` in the error (``uqh run --index-dir``, ``uqh index --out``)."""
        import bm25s

        index_dir = Path(index_dir)
        what = f"the bm25s index ({flag})"
        try:
            index_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=index_dir.parent))
        except OSError as exc:
            raise OutputWriteError(index_dir, exc, what=what) from None
        try:
            self.model.save(str(tmp), show_progress=False)
            write_corpus_file(self.paragraphs, tmp / INDEX_PASSAGES_FILE)
            meta = {
                "backend": "bm25s",
                "bm25s_version": bm25s.__version__,
                "settings": BM25_SETTINGS,
                "corpus_sha256": self.sha256,
                "n_passages": len(self.paragraphs),
            }
            (tmp / INDEX_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            existing = self.read_meta(index_dir)
            if existing and existing.get("corpus_sha256") == self.sha256 and existing.get("settings") == BM25_SETTINGS:
                shutil.rmtree(tmp, ignore_errors=True)  # another process saved the same index meanwhile
            else:
                if index_dir.exists():
                    shutil.rmtree(index_dir)
                os.replace(tmp, index_dir)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if (index_dir / INDEX_META_FILE).exists():  # another process won the race
                return index_dir
            raise OutputWriteError(index_dir, exc, what=what) from None
        self.index_dir = index_dir
        return index_dir

    @staticmethod
    def read_meta(index_dir: str | os.PathLike) -> dict[str, Any] | None:
        path = Path(index_dir) / INDEX_META_FILE
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    @classmethod
    def load(cls, index_dir: str | os.PathLike) -> "Bm25Retriever":
        """Load a saved index (and its passages) without the original corpus file."""
        import bm25s

        index_dir = Path(index_dir)
        meta = cls.read_meta(index_dir)
        if meta is None:
            raise UserError(f"{index_dir} is not a bm25s index built by uqh; build one with `uqh index --backend bm25`")
        paragraphs = read_corpus_file(index_dir / INDEX_PASSAGES_FILE)
        model = bm25s.BM25.load(str(index_dir), show_progress=False)
        return cls(paragraphs, model, sha256=meta["corpus_sha256"], index_dir=index_dir)

    @classmethod
    def open(cls, paragraphs: list[Paragraph], index_dir: str | os.PathLike | None = None) -> "Bm25Retriever":
        """Reuse the index in ``index_dir`` when its corpus hash matches ``paragraphs``; else build and save it.

        Without ``index_dir`` the index lives in ``.cache/uqh/indexes/bm25-<hash16>`` under the repository.
        """
        sha = corpus_sha256(paragraphs)
        index_dir = Path(index_dir) if index_dir else DEFAULT_INDEX_ROOT / f"bm25-{sha[:16]}"
        meta = cls.read_meta(index_dir)
        if meta and meta.get("corpus_sha256") == sha and meta.get("settings") == BM25_SETTINGS:
            try:
                return cls.load(index_dir)
            except (UserError, OSError, ValueError) as exc:  # a damaged cache is rebuilt, not trusted
                log.warning("rebuilding damaged bm25s index in %s (%s)", index_dir, exc)
                shutil.rmtree(index_dir, ignore_errors=True)
        retriever = cls.build(paragraphs)
        retriever.save(index_dir)
        return retriever

    def _query_tokens(self, queries: list[str]) -> list[list[str]]:
        import bm25s

        return bm25s.tokenize(
            queries, stopwords=BM25_SETTINGS["stopwords"], stemmer=self._stem, return_ids=False, show_progress=False
        )

    def search(self, query: str, k: int) -> list[Passage]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: list[str], k: int) -> list[list[Passage]]:
        k = max(0, min(int(k), len(self.paragraphs)))
        token_lists = self._query_tokens(queries)
        out: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, toks in enumerate(token_lists) if toks]
        if not live or k == 0:
            return out
        docs, scores = self.model.retrieve(
            [token_lists[i] for i in live], k=k, show_progress=False, n_threads=1, return_as="tuple"
        )
        for row, i in enumerate(live):
            for doc, score in zip(docs[row].tolist(), scores[row].tolist()):
                if score > 0:  # a zero score means no query term occurs in the paragraph
                    p = self.paragraphs[int(doc)]
                    out[i].append(Passage(title=p.title, text=p.text, score=round(float(score), 6)))
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "bm25",
            "bm25_settings": BM25_SETTINGS,
            "corpus_sha256": self.sha256,
            "n_passages": len(self.paragraphs),
            "index_dir": str(self.index_dir) if self.index_dir else None,
        }


# --------------------------------------------------------------------------------------- Elasticsearch

ES_MAPPINGS = {
    "properties": {
        "title": {"type": "text", "analyzer": "english"},
        "text": {"type": "text", "analyzer": "english"},
    }
}


def check_es_url(url: str) -> str:
    """Reject credentials in the URL (userinfo, ``;`` parameters, a query string, a fragment): the URL is part of
    the run config and would be written to the manifest. Messages show the URL masked."""
    found = url_credentials(url)
    if found is not None:
        raise UserError(
            f"do not put credentials in --es-url: {mask_url(url)} contains {found} (it would be recorded in the "
            "manifest); "
            "set UQH_ES_API_KEY or UQH_ES_USER and UQH_ES_PASSWORD in the environment instead"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--es-url {mask_url(url)!r} is not an http(s) URL; pass e.g. http://localhost:9200")
    return url


def es_client(url: str, *, timeout_s: float = 30.0):
    """An official ``elasticsearch`` client; credentials only from the environment."""
    from elasticsearch import Elasticsearch

    check_es_url(url)
    kwargs: dict[str, Any] = {"request_timeout": timeout_s}
    if os.environ.get("UQH_ES_API_KEY"):
        kwargs["api_key"] = os.environ["UQH_ES_API_KEY"]
    elif os.environ.get("UQH_ES_USER"):
        kwargs["basic_auth"] = (os.environ["UQH_ES_USER"], os.environ.get("UQH_ES_PASSWORD", ""))
    return Elasticsearch(url, **kwargs)


def es_error(exc: Exception, url: str, index: str, *, indexing: bool = False) -> UserError:
    """One line for a failed Elasticsearch request: the reason's first line cut at a word (never mid-word), and a
    hint that fits -- never "build it with `uqh index`" to the `uqh index` that just failed."""
    reason = " ".join(str(exc).split())
    if len(reason) > 200:
        reason = reason[:200].rsplit(" ", 1)[0] + " ..."
    hint = ("check --es-url and that Elasticsearch is running and accepts writes" if indexing else
            "check --es-url/--es-index and that the index was built with `uqh index --backend es`")
    return UserError(f"Elasticsearch at {url} (index {index!r}) failed: {type(exc).__name__}: {reason}; {hint}")


def index_elasticsearch(
    paragraphs: list[Paragraph], url: str, index: str, *, recreate: bool = True, chunk_size: int = 500
) -> dict[str, Any]:
    """Index ``paragraphs`` into ``index`` (``_id`` = position in the corpus). Returns a summary."""
    from elasticsearch import ApiError, TransportError, helpers

    client = es_client(url)
    sha = corpus_sha256(paragraphs)
    try:
        if client.indices.exists(index=index):
            if not recreate:
                raise UserError(f"Elasticsearch index {index!r} exists; pass --recreate to replace it")
            client.indices.delete(index=index)
        client.indices.create(
            index=index, mappings=ES_MAPPINGS, settings={"number_of_shards": 1, "number_of_replicas": 0}
        )
        actions = (
            {"_index": index, "_id": str(i), "_source": {"title": p.title, "text": p.text}}
            for i, p in enumerate(paragraphs)
        )
        ok, errors = helpers.bulk(client, actions, chunk_size=chunk_size, raise_on_error=False)
        if errors:
            raise UserError(f"Elasticsearch rejected {len(errors)} of {len(paragraphs)} paragraphs: {str(errors[0])[:200]}")
        client.indices.refresh(index=index)
        count = int(client.count(index=index)["count"])
    except (ApiError, TransportError) as exc:
        raise es_error(exc, url, index, indexing=True) from None
    finally:
        client.close()
    return {"backend": "es", "es_url": url, "es_index": index, "indexed": ok, "count": count, "corpus_sha256": sha}


class ElasticsearchRetriever:
    """Search an Elasticsearch index of ``{title, text}`` documents with a ``multi_match`` query."""

    backend = "es"

    def __init__(self, url: str, index: str, *, timeout_s: float = 30.0):
        self.url = check_es_url(url)
        self.index = index
        self.timeout_s = timeout_s
        self.client = es_client(url, timeout_s=timeout_s)

    def __getstate__(self) -> dict[str, Any]:  # a connection pool: a copy connects anew
        return {"url": self.url, "index": self.index, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["index"], timeout_s=state["timeout_s"])

    def search(self, query: str, k: int) -> list[Passage]:
        from elasticsearch import ApiError, TransportError

        if not query.strip() or k <= 0:
            return []
        try:
            resp = self.client.search(
                index=self.index,
                query={"multi_match": {"query": query, "fields": ["title", "text"]}},
                size=int(k),
                source=["title", "text"],
            )
        except (ApiError, TransportError) as exc:
            raise es_error(exc, self.url, self.index) from None
        out = []
        for hit in resp["hits"]["hits"]:
            src = hit.get("_source") or {}
            out.append(Passage(title=str(src.get("title", "")), text=str(src.get("text", "")), score=float(hit.get("_score") or 0.0)))
        return out

    def describe(self) -> dict[str, Any]:
        return {"backend": "es", "es_url": self.url, "es_index": self.index}

    def close(self) -> None:
        self.client.close()
