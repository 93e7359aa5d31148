"""The Elasticsearch backend, driven by the real `elasticsearch` client against a local ES REST emulator.

No Elasticsearch server can be installed offline on this machine (not in Debian, not on PyPI), so the server
below speaks the subset of the ES 8/9 REST API that the client uses here (``GET /``, ``HEAD/PUT/DELETE /{index}``,
``POST /_bulk``, ``POST /{index}/_refresh``, ``/{index}/_count``, ``/{index}/_search``), answering with response
bodies in the wire format that ES 8.x returns (the ``X-Elastic-Product`` header the client checks, ``hits.hits[]``
with ``_index/_id/_score/_source``, bulk ``items``, ``acknowledged``...). Its ranking is a plain term-count score,
not Lucene's BM25: these tests check the client wiring, query DSL and result mapping, not ES relevance.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from uqh.domains.domain_registry import get_domain_class
from uqh.domains.qa.retrieval import ES_MAPPINGS, ElasticsearchRetriever, Paragraph, index_elasticsearch
from uqh.cli import main as uqh_main
from uqh.rundir.errors import UserError

ROOT_INFO = {  # the shape of `GET /` on Elasticsearch 8.x
    "name": "node-1",
    "cluster_name": "uqh-test",
    "cluster_uuid": "s5nGZ3VnQ2m8tZRp0c1l4A",
    "version": {
        "number": "8.15.0",
        "build_flavor": "default",
        "build_type": "tar",
        "lucene_version": "9.11.1",
        "minimum_wire_compatibility_version": "7.17.0",
        "minimum_index_compatibility_version": "7.0.0",
    },
    "tagline": "You Know, for Search",
}


class FakeElasticsearch:
    """In-memory ES REST emulator on 127.0.0.1:<free port>; ``requests`` records (method, path, body)."""

    def __init__(self):
        self.indices: dict[str, dict] = {}
        self.requests: list[tuple[str, str, object]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n).decode() if n else ""

            def _send(self, status, obj=None):
                data = b"" if obj is None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("X-Elastic-Product", "Elasticsearch")
                self.send_header("Content-Type", "application/vnd.elasticsearch+json;compatible-with=8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _handle(self):
                path = self.path.split("?")[0]
                raw = self._body()
                outer.requests.append((self.command, path, raw))
                status, obj = outer.route(self.command, path, raw)
                self._send(status, obj)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _missing(index):
        return 404, {
            "error": {"root_cause": [{"type": "index_not_found_exception", "reason": f"no such index [{index}]"}],
                      "type": "index_not_found_exception", "reason": f"no such index [{index}]", "index": index},
            "status": 404,
        }

    def route(self, method, path, raw):
        if path == "/" and method == "GET":
            return 200, ROOT_INFO
        if path == "/_bulk":
            items = []
            lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
            for action, source in zip(lines[::2], lines[1::2]):
                meta = action["index"]
                idx = self.indices.setdefault(meta["_index"], {"docs": {}, "mappings": {}})
                idx["docs"][meta["_id"]] = source
                items.append({"index": {"_index": meta["_index"], "_id": meta["_id"], "_version": 1, "result": "created",
                                        "_shards": {"total": 1, "successful": 1, "failed": 0}, "status": 201}})
            return 200, {"errors": False, "took": 3, "items": items}
        m = re.fullmatch(r"/([^/_][^/]*)(/_[a-z]+)?", path)
        if not m:
            return 400, {"error": "unsupported", "status": 400}
        index, op = m.group(1), m.group(2)
        if op is None:
            if method == "HEAD":
                return (200 if index in self.indices else 404), None
            if method == "PUT":
                body = json.loads(raw or "{}")
                self.indices[index] = {"docs": {}, "mappings": body.get("mappings", {}), "settings": body.get("settings", {})}
                return 200, {"acknowledged": True, "shards_acknowledged": True, "index": index}
            if method == "DELETE":
                if index not in self.indices:
                    return self._missing(index)
                del self.indices[index]
                return 200, {"acknowledged": True}
        if index not in self.indices:
            return self._missing(index)
        docs = self.indices[index]["docs"]
        if op == "/_refresh":
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if op == "/_count":
            return 200, {"count": len(docs), "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0}}
        if op == "/_search":
            body = json.loads(raw or "{}")
            mm = body["query"]["multi_match"]
            terms = re.findall(r"\w+", mm["query"].lower())
            scored = []
            for _id, src in docs.items():
                blob = " ".join(str(src.get(f, "")) for f in mm["fields"]).lower()
                words = re.findall(r"\w+", blob)
                score = float(sum(words.count(t) for t in terms))
                if score > 0:
                    scored.append((score, int(_id), _id, src))
            scored.sort(key=lambda x: (-x[0], x[1]))
            hits = [{"_index": index, "_id": i, "_score": s, "_source": {k: src[k] for k in body.get("_source", src)}}
                    for s, _, i, src in scored[: body.get("size", 10)]]
            return 200, {"took": 1, "timed_out": False, "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
                         "hits": {"total": {"value": len(scored), "relation": "eq"},
                                  "max_score": hits[0]["_score"] if hits else None, "hits": hits}}
        return 400, {"error": "unsupported", "status": 400}


PARAS = [
    Paragraph("Eiffel Tower", "The Eiffel Tower is in Paris. It was designed by Gustave Eiffel's company."),
    Paragraph("Gustave Eiffel", "Gustave Eiffel was born in Dijon."),
    Paragraph("Dijon", "Dijon is famous for mustard."),
]


@pytest.fixture
def es():
    with FakeElasticsearch() as srv:
        yield srv


def test_index_then_search_through_the_official_client(es):
    summary = index_elasticsearch(PARAS, es.url, "wiki")
    assert summary["count"] == 3 and summary["indexed"] == 3 and summary["es_index"] == "wiki"
    assert es.indices["wiki"]["mappings"] == ES_MAPPINGS
    assert es.indices["wiki"]["docs"]["1"] == {"title": "Gustave Eiffel", "text": "Gustave Eiffel was born in Dijon."}
    r = ElasticsearchRetriever(es.url, "wiki")
    hits = r.search("Gustave born", 2)
    assert [h.title for h in hits] == ["Gustave Eiffel", "Eiffel Tower"]
    assert hits[0].score == 3.0 and hits[1].score == 1.0
    assert hits[0].text == "Gustave Eiffel was born in Dijon."
    method, path, body = es.requests[-1]
    assert (method, path) == ("POST", "/wiki/_search")
    sent = json.loads(body)
    assert sent["query"] == {"multi_match": {"query": "Gustave born", "fields": ["title", "text"]}}
    assert sent["size"] == 2
    assert r.search("zzzz", 3) == []
    assert r.search("   ", 3) == []
    assert r.describe() == {"backend": "es", "es_url": es.url, "es_index": "wiki"}


def test_reindex_replaces_or_refuses(es):
    index_elasticsearch(PARAS, es.url, "wiki")
    index_elasticsearch(PARAS[:1], es.url, "wiki")
    assert len(es.indices["wiki"]["docs"]) == 1
    assert ("DELETE", "/wiki") in [(m, p) for m, p, _ in es.requests]
    with pytest.raises(UserError, match="exists; pass --recreate"):
        index_elasticsearch(PARAS, es.url, "wiki", recreate=False)


def test_missing_index_and_dead_server_are_user_errors(es):
    with pytest.raises(UserError, match="index 'nope'.*uqh index --backend es"):
        ElasticsearchRetriever(es.url, "nope").search("x", 3)
    with pytest.raises(UserError, match="Elasticsearch at http://127.0.0.1:9 "):
        ElasticsearchRetriever("http://127.0.0.1:9", "wiki", timeout_s=2).search("x", 3)


def test_hotpotqa_episode_over_es(es, tmp_path):
    index_elasticsearch(PARAS, es.url, "wiki")
    data = tmp_path / "h.jsonl"
    data.write_text(json.dumps({"id": "h1", "question": "Where was Eiffel born?", "answer": "Dijon"}) + "\n")
    d = get_domain_class("hotpotqa")({"data": str(data), "retrieval": "es", "es_url": es.url, "es_index": "wiki", "top_k": 2})

    async def episode():
        env = d.make_env("h1", episode_seed=0)
        await env.reset()
        s = await env.step("Search[Gustave born]")
        lk = await env.step("Lookup[born]")
        fin = await env.step("Finish[Dijon]")
        return s, lk, fin

    s, lk, fin = asyncio.run(episode())
    assert s.observation == (
        "[1] Gustave Eiffel: Gustave Eiffel was born in Dijon.\n"
        "[2] Eiffel Tower: The Eiffel Tower is in Paris. It was designed by Gustave Eiffel's company."
    )
    assert lk.observation == "(Result 1 / 1) Gustave Eiffel was born in Dijon."
    assert fin.outcome == 1
    info = d.manifest_info()
    assert info["backend"] == "es" and info["es_index"] == "wiki" and info["corpus"] == "es:wiki"


def test_uqh_index_es_command(es, tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"title": p.title, "text": p.text}) + "\n" for p in PARAS))
    rc = uqh_main(["index", "--backend", "es", "--es-url", es.url, "--es-index", "wiki", "--corpus", str(corpus)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["count"] == 3 and out["backend"] == "es"
    assert len(es.indices["wiki"]["docs"]) == 3
    rc = uqh_main(["index", "--backend", "es", "--es-url", es.url, "--corpus", str(corpus)])
    assert rc == 2 and "needs --es-url URL and --es-index NAME" in capsys.readouterr().err


def test_an_elasticsearch_error_is_cut_at_a_word_and_the_hint_fits_the_command():
    """Issue 33: the `index --backend es` error was cut mid-word and suggested the very command that failed."""
    from uqh.domains.qa.retrieval import es_error

    exc = ConnectionError("Connection error caused by: NewConnectionError(Failed to establish a new connection: "
                          "[Errno 111] Connection refused) " * 4)
    indexing = str(es_error(exc, "http://h:9200", "ix", indexing=True))
    reason = indexing.split("ConnectionError: ", 1)[1].split(";", 1)[0]
    assert reason.endswith(" ...") and reason[:-4] == " ".join(str(exc).split())[:len(reason) - 4]
    assert " ".join(str(exc).split())[len(reason) - 4] == " "  # the cut falls between words
    assert "uqh index" not in indexing
    assert "uqh index --backend es" in str(es_error(exc, "http://h:9200", "ix"))  # searching: build it first
