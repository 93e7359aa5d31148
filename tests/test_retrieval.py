"""The bm25s backend: Lucene BM25 closed form, persistence and reuse by corpus hash, corpus files, `uqh index`."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import uqh.domains.qa.retrieval as retrieval
from uqh.domains.domain_registry import get_domain_class
from uqh.domains.qa.retrieval import (
    INDEX_META_FILE,
    Bm25Retriever,
    Paragraph,
    corpus_sha256,
    read_corpus_file,
    write_corpus_file,
)
from uqh.cli import main as uqh_main
from uqh.rundir.errors import UserError

PARAS = [
    Paragraph("Alpha", "apple banana apple"),
    Paragraph("Beta", "banana cherry"),
    Paragraph("Gamma", "cherry date elder fig"),
]


def lucene_bm25(tf, df, dl, n_docs, avgdl, k1=1.5, b=0.75):
    """Lucene's BM25 (no (k1+1) factor): idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))."""
    idf = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))


def test_scores_match_lucene_bm25_closed_form():
    r = Bm25Retriever.build(PARAS)
    # indexed text is "title text", stop words removed, stemmed: alpha appl banana appl (4) / beta banana cherri (3)
    # / gamma cherri date elder fig (5); avgdl = 4
    hits = r.search("apples", 3)  # stemming: apples -> appl
    assert [h.title for h in hits] == ["Alpha"]
    assert hits[0].score == pytest.approx(lucene_bm25(2, 1, 4, 3, 4.0), abs=1e-5)
    hits = r.search("the cherry", 3)  # 'the' is a stop word
    assert [h.title for h in hits] == ["Beta", "Gamma"]  # shorter document wins at equal tf
    assert hits[0].score == pytest.approx(lucene_bm25(1, 2, 3, 3, 4.0), abs=1e-5)
    assert hits[1].score == pytest.approx(lucene_bm25(1, 2, 5, 3, 4.0), abs=1e-5)
    # titles are searchable
    assert [h.title for h in r.search("gamma", 3)] == ["Gamma"]
    # no hit, stop-words-only query, k larger than the corpus, k = 0
    assert r.search("zebra", 3) == []
    assert r.search("the of", 3) == []
    assert len(r.search("banana cherry", 50)) == 3
    assert r.search("banana", 0) == []
    # batch search gives the same as single searches
    assert r.search_many(["apple", "zebra", "cherry"], 2) == [r.search("apple", 2), [], r.search("cherry", 2)]


def test_index_persists_and_is_reused_by_corpus_hash(tmp_path, monkeypatch):
    idx = tmp_path / "idx"
    r1 = Bm25Retriever.open(PARAS, idx)
    meta = json.loads((idx / INDEX_META_FILE).read_text())
    assert meta["corpus_sha256"] == corpus_sha256(PARAS) and meta["n_passages"] == 3
    assert meta["settings"]["method"] == "lucene"

    def no_build(*a, **k):
        raise AssertionError("the index should have been reused, not rebuilt")

    monkeypatch.setattr(Bm25Retriever, "build", classmethod(no_build))
    r2 = Bm25Retriever.open(PARAS, idx)
    assert r2.index_dir == idx
    assert r2.search("banana cherry", 3) == r1.search("banana cherry", 3)
    # loading needs no corpus: the passages are stored with the index
    r3 = Bm25Retriever.load(idx)
    assert r3.paragraphs == PARAS and r3.search("fig", 1) == r1.search("fig", 1)
    monkeypatch.undo()
    # a different corpus has another hash: the index is rebuilt in place
    changed = PARAS + [Paragraph("Delta", "fig fig fig")]
    r4 = Bm25Retriever.open(changed, idx)
    assert json.loads((idx / INDEX_META_FILE).read_text())["corpus_sha256"] == corpus_sha256(changed)
    assert r4.search("fig", 1)[0].title == "Delta"


def test_damaged_index_is_rebuilt(tmp_path):
    idx = tmp_path / "idx"
    Bm25Retriever.open(PARAS, idx)
    (idx / "passages.jsonl").write_text("garbage\n")
    r = Bm25Retriever.open(PARAS, idx)
    assert r.search("apple", 1)[0].title == "Alpha"
    assert read_corpus_file(idx / "passages.jsonl") == PARAS


def test_default_index_dir_is_under_repo_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(retrieval, "DEFAULT_INDEX_ROOT", tmp_path / "cache")
    r = Bm25Retriever.open(PARAS)
    assert r.index_dir == tmp_path / "cache" / f"bm25-{corpus_sha256(PARAS)[:16]}"
    assert (r.index_dir / INDEX_META_FILE).is_file()
    assert retrieval.DEFAULT_INDEX_ROOT.is_relative_to(tmp_path)
    monkeypatch.undo()
    assert retrieval.DEFAULT_INDEX_ROOT == Path(__file__).resolve().parents[1] / ".cache" / "uqh" / "indexes"


def test_corpus_file_round_trip_and_errors(tmp_path):
    f = tmp_path / "c.jsonl"
    assert write_corpus_file(PARAS + [PARAS[0]], f) == 4
    assert read_corpus_file(f) == PARAS  # exact duplicates dropped, order kept
    with pytest.raises(UserError, match="does not exist"):
        read_corpus_file(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "a", "text": "b"}\n{"title": "no text"}\n')
    with pytest.raises(UserError, match="line 2 is not a JSON object with 'title' and 'text'"):
        read_corpus_file(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(UserError, match="holds no paragraphs"):
        read_corpus_file(empty)
    with pytest.raises(UserError, match="not a bm25s index"):
        Bm25Retriever.load(tmp_path)


def test_uqh_index_bm25_from_corpus_and_from_domain(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    write_corpus_file(PARAS, corpus)
    out = tmp_path / "idx"
    assert uqh_main(["index", "--backend", "bm25", "--corpus", str(corpus), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_passages"] == 3 and summary["corpus_sha256"] == corpus_sha256(PARAS)
    assert Bm25Retriever.load(out).search("apple", 1)[0].title == "Alpha"

    out2, exported = tmp_path / "hidx", tmp_path / "hotpot_corpus.jsonl"
    rc = uqh_main(["index", "--domain", "hotpotqa", "--out", str(out2), "--write-corpus", str(exported)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["corpus"] == "hotpotqa-context-union" and summary["n_passages"] == len(read_corpus_file(exported))

    # a domain run pointed at the prebuilt index (no corpus file) uses it as is
    d = get_domain_class("hotpotqa")({"index_dir": str(out2)})
    info = d.manifest_info()
    assert info["corpus"] == f"index:{out2.resolve()}" and info["corpus_sha256"] == summary["corpus_sha256"]

    for argv, msg in [
        (["index", "--corpus", str(corpus)], "needs --out DIR"),
        (["index", "--corpus", str(corpus), "--out", str(out), "--data", "x"], "--data only applies with --domain"),
        (["index", "--corpus", str(tmp_path / "nope.jsonl"), "--out", str(out)], "does not exist"),
        (["index", "--backend", "es", "--es-url", "ftp://x", "--es-index", "i", "--corpus", str(corpus)], "not an http"),
    ]:
        assert uqh_main(argv) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1 and err.startswith("uqh index: error:")
