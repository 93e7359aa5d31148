"""Record what `uqh run` made of a set of flag combinations BEFORE the build layer (commit 06261ab, where
``harness.run_command.build_config`` still existed): the RunConfig and its hash for good flags, the one error line
for bad ones. tests/test_build.py checks that ``harness.build.resolve_config`` gives the same.

Run against a checkout of that commit (not this one):

    git archive 06261ab | tar -x -C /tmp/uqh_old
    cd /tmp/uqh_old && OPENROUTER_API_KEY=sk-dummy \
        .venv/bin/python /path/to/tests/data/build_reference/generate.py > /path/to/tests/data/build_reference/reference.json

``{tmp}`` in an argument stands for a fresh directory holding ``FILES``; recorded values replace it back.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HP_ROWS = [
    {"id": f"hp{i}", "question": f"Who wrote book {i}?", "answer": f"Author {i}",
     "context": {"title": [f"Book {i}"], "sentences": [[f"Book {i} was written by Author {i}.", "It is long."]]}}
    for i in range(4)
]
SQ_ROWS = [
    {"qid": f"q{i}", "term": f"Term {i}", "description": "a thing", "question": f"Is term {i} a thing?",
     "answer": i % 2 == 0, "facts": [f"Term {i} is a thing."], "decomposition": []}
    for i in range(3)
]
FILES = {
    "hp.jsonl": "".join(json.dumps(r) + "\n" for r in HP_ROWS),
    "sq.jsonl": "".join(json.dumps(r) + "\n" for r in SQ_ROWS),
    "corpus.jsonl": "".join(json.dumps({"title": f"T{i}", "text": f"Paragraph {i} about things."}) + "\n"
                            for i in range(3)),
    "afile": "not a directory\n",
}
API = ["--model", "openai/x", "--api-base", "http://x/v1"]

GOOD = {
    "arithmetic-basic": ["--domain", "arithmetic", "--tasks", "3", "--samples", "2", "--max-tokens", "64", *API],
    "arithmetic-local-grammar": ["--domain", "arithmetic", "--task-ids", "arith-0007,arith-0003", "--grammar",
                                 "--seed", "7", "--top-logprobs", "3", "--model", "local:smollm2"],
    "arithmetic-local-decoding": ["--domain", "arithmetic", "--tasks", "2", "--model", "local:smollm2",
                                  "--no-logprobs", "--temperature", "0.7", "--top-p", "0.9", "--step-budget", "3",
                                  "--observation-chars", "100", "--reasoning"],
    "tau2-user-endpoint": ["--domain", "tau2-retail", "--tasks", "2", "--model", "openai/a", "--api-base",
                           "http://a/v1", "--user-model", "openai/u", "--user-api-base", "http://u/v1"],
    "preset-tau2-airline": ["--preset", "paper-tau2-airline", *API, "--tasks", "3", "--user-model", "openai/u",
                            "--user-api-base", "http://u/v1"],
    "preset-tau2-telecom": ["--preset", "paper-tau2-telecom", *API, "--samples", "2", "--observation-chars", "300",
                            "--step-budget", "10", "--temperature", "0"],
    "preset-webshop": ["--preset", "paper-webshop", *API, "--tasks", "2", "--split", "eval"],
    "webshop-plain": ["--domain", "webshop", "--tasks", "1", "--step-budget", "1", *API],
    "hotpotqa-qa-flags": ["--domain", "hotpotqa", "--data", "{tmp}/hp.jsonl", "--tasks", "2", "--top-k", "2",
                          "--retrieval", "bm25", "--index-dir", "{tmp}/idx", "--corpus", "{tmp}/corpus.jsonl", *API],
    "hotpotqa-es": ["--domain", "hotpotqa", "--data", "{tmp}/hp.jsonl", "--tasks", "1", "--retrieval", "es",
                    "--es-url", "http://127.0.0.1:9200", "--es-index", "hp", *API],
    "strategyqa-ids": ["--domain", "strategyqa", "--data", "{tmp}/sq.jsonl", "--task-ids", "q2,q1", "--split",
                       "train", *API],
}

BAD = {
    "unknown-domain": ["--domain", "nope", "--tasks", "1"],
    "no-domain": ["--tasks", "1", *API],
    "domain-contradicts-preset": ["--preset", "paper-webshop", "--domain", "arithmetic"],
    "unknown-preset": ["--preset", "paper-nope"],
    "tasks-zero": ["--domain", "arithmetic", "--tasks", "0", *API],
    "samples-zero": ["--domain", "arithmetic", "--tasks", "1", "--samples", "0", *API],
    "top-logprobs-negative": ["--domain", "arithmetic", "--tasks", "1", "--top-logprobs", "-1", *API],
    "observation-chars-zero": ["--domain", "arithmetic", "--tasks", "1", "--observation-chars", "0", *API],
    "temperature-negative": ["--domain", "arithmetic", "--tasks", "1", "--temperature", "-1", *API],
    "top-p-zero": ["--domain", "arithmetic", "--tasks", "1", "--top-p", "0", *API],
    "local-with-api-base": ["--domain", "arithmetic", "--tasks", "1", "--model", "local:smollm2", "--api-base",
                            "http://x/v1"],
    "no-user-model": ["--domain", "tau2-retail", "--tasks", "1", *API],
    "user-api-base-without-user-model": ["--domain", "tau2-retail", "--tasks", "1", "--user-api-base", "http://u/v1",
                                         *API],
    "task-id-twice": ["--domain", "arithmetic", "--task-ids", "arith-0001,arith-0001", *API],
    "unknown-task-id": ["--domain", "arithmetic", "--task-ids", "arith-0001,zzz", *API],
    "no-tasks": ["--domain", "arithmetic", *API],
    "data-missing": ["--domain", "hotpotqa", "--tasks", "1", "--data", "{tmp}/missing.jsonl", *API],
    "es-without-url": ["--domain", "hotpotqa", "--data", "{tmp}/hp.jsonl", "--tasks", "1", "--retrieval", "es", *API],
    "top-k-zero": ["--domain", "hotpotqa", "--data", "{tmp}/hp.jsonl", "--tasks", "1", "--top-k", "0", *API],
    "index-dir-not-a-dir": ["--domain", "hotpotqa", "--data", "{tmp}/hp.jsonl", "--tasks", "1", "--index-dir",
                            "{tmp}/afile", *API],
    "webshop-unknown-split": ["--domain", "webshop", "--tasks", "1", "--split", "dev", *API],
}


def _fill(argv: list[str], tmp: str) -> list[str]:
    return [a.replace("{tmp}", tmp) for a in argv]


def _unfill(value, tmp: str):
    return json.loads(json.dumps(value).replace(tmp, "{tmp}"))


def main() -> None:
    from harness.run_command import add_arguments, build_config
    from rundir.errors import UserError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out: dict = {"commit": "06261ab", "files": FILES, "good": {}, "bad": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in FILES.items():
            Path(tmp, name).write_text(text)
        for i, (name, argv) in enumerate(GOOD.items()):
            args = parser.parse_args(_fill([*argv, "--out", f"{tmp}/run-{i}"], tmp))
            config, _, _ = build_config(args)
            recorded = type(config).model_validate(_unfill(config.model_dump(mode="json"), tmp))
            out["good"][name] = {"argv": argv, "config": recorded.model_dump(mode="json"),
                                 "config_hash": recorded.config_hash()}
        for i, (name, argv) in enumerate(BAD.items()):
            args = parser.parse_args(_fill([*argv, "--out", f"{tmp}/bad-{i}"], tmp))
            try:
                build_config(args)
            except UserError as exc:
                out["bad"][name] = {"argv": argv, "error": _unfill(str(exc), tmp)}
            else:
                sys.exit(f"{name}: no error")
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    main()
