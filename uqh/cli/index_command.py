"""`uqh index`: build a retrieval index from a paragraph corpus.

    uqh index --backend bm25 --corpus FILE --out DIR
    uqh index --backend es --es-url URL --es-index NAME --corpus FILE
    uqh index --backend bm25 --domain hotpotqa [--data PATH] --out DIR [--write-corpus FILE]

``--corpus`` is JSONL with one ``{"title", "text"}`` object per line. ``--domain`` derives the corpus the domain
would use by default (HotpotQA: the union of the questions' context paragraphs; StrategyQA: the fallback corpus
built from facts and term descriptions).
"""
from __future__ import annotations

import argparse
import json

import time
from uqh.rundir.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("bm25", "es"), default="bm25", help="bm25s on disk (default) or Elasticsearch")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", metavar="FILE", help="paragraph file: JSONL with one {title, text} object per line")
    src.add_argument("--domain", choices=("hotpotqa", "strategyqa"), help="derive the domain's default corpus")
    parser.add_argument("--data", metavar="PATH", help="with --domain: the question file or directory (as for uqh run)")
    parser.add_argument("--out", metavar="DIR", help="bm25: the index directory to write")
    parser.add_argument("--es-url", metavar="URL", help="es: e.g. http://localhost:9200 (credentials via UQH_ES_API_KEY)")
    parser.add_argument("--es-index", metavar="NAME", help="es: the index name to (re)create")
    parser.add_argument("--no-recreate", action="store_true", help="es: fail instead of replacing an existing index")
    parser.add_argument("--write-corpus", metavar="FILE", help="also write the corpus as JSONL {title, text}")


def run(args: argparse.Namespace) -> int:
    from uqh.domains.qa.retrieval import Bm25Retriever, check_es_url, index_elasticsearch, read_corpus_file, write_corpus_file

    if args.backend == "bm25" and not args.out:
        raise UserError("--backend bm25 needs --out DIR (where the index is written)")
    if args.backend == "bm25":  # before the corpus is read and indexed: not in a run, writable, new/empty/an index
        from uqh.rundir.output_dir import check_output_dir

        check_output_dir(args.out, "--out", is_own=lambda p: Bm25Retriever.read_meta(p) is not None)
    if args.backend == "es":
        if not args.es_url or not args.es_index:
            raise UserError("--backend es needs --es-url URL and --es-index NAME")
        check_es_url(args.es_url)
    if args.data and not args.domain:
        raise UserError("--data only applies with --domain; with --corpus the corpus file is indexed as is")

    if args.corpus:
        paragraphs, label = read_corpus_file(args.corpus), f"file:{args.corpus}"
    else:
        from uqh.domains.domain_registry import get_domain_class

        domain = get_domain_class(args.domain)({"data": args.data} if args.data else {})
        paragraphs, label = domain.default_corpus()
    if args.write_corpus:
        write_corpus_file(paragraphs, args.write_corpus)

    t0 = time.perf_counter()
    if args.backend == "bm25":
        retriever = Bm25Retriever.build(paragraphs)
        retriever.save(args.out, flag="--out")
        summary = retriever.describe()
    else:
        summary = index_elasticsearch(paragraphs, args.es_url, args.es_index, recreate=not args.no_recreate)
    summary["corpus"] = label
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(summary, indent=2))
    return 0
