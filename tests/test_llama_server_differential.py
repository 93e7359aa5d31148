"""The native llama-server records the same per-token logprobs as llama-cpp-python did.

Reference: ``tests/data/llama_reference/reference.json``, produced by ``make_reference.py`` beside it with
llama-cpp-python 0.3.16 (greedy, seed 42, top-5) on the same GGUF and messages. Both evaluate the same llama.cpp
source; llama-cpp-python's wheel and our llama-server differ in compile flags (SIMD kernels, thread count), so
float sums are ordered differently.

Tolerance: every logprob (the generated token's and each of the top 5) within ``ATOL`` = 0.05 nats of the
reference; greedy tokens identical; the top-5 alternatives the same set except where two neighbours are within
``ATOL`` of each other (their order may swap under rounding). Measured difference on this machine: see
docs/model-client.md.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from uqh.harness.model.client import make_model_client
from uqh.harness.model.llama_server import resolve_model
from uqh.rundir.schema import DecodingConfig

REFERENCE = json.loads((Path(__file__).parent / "data" / "llama_reference" / "reference.json").read_text())
ATOL = 0.05


def _complete_all(cases: list[dict]) -> list:
    meta = REFERENCE["meta"]
    decoding = DecodingConfig(temperature=0.0, logprobs=True, top_logprobs=meta["top_logprobs"],
                              max_tokens=meta["max_tokens"], seed=meta["seed"], grammar=False)

    async def go(model: str, base: str) -> list:
        client = make_model_client(model, api_base=base, decoding=decoding, timeout_s=300, max_retries=1, direct=True)
        try:
            return [await client.complete(case["messages"], seed=meta["seed"]) for case in cases]
        finally:
            await client.aclose()

    with resolve_model("local:smollm2", None) as (model, base):
        return asyncio.run(go(model, base))


def _top_set_matches(ours: list[tuple[str, float]], ref: list[tuple[str, float]]) -> bool:
    """Same top-5 strings, allowing a swap at the boundary when the 5th and 6th are within ATOL (rounding)."""
    ours_tokens, ref_tokens = {t for t, _ in ours}, {t for t, _ in ref}
    if ours_tokens == ref_tokens:
        return True
    differ = ours_tokens ^ ref_tokens
    return len(differ) == 2 and abs(ours[-1][1] - ref[-1][1]) < ATOL


@pytest.mark.smoke
def test_native_server_logprobs_match_llama_cpp_python():
    cases = REFERENCE["cases"]
    results = _complete_all(cases)
    worst = 0.0
    for case, got in zip(cases, results):
        assert got.call.usage.prompt_tokens == case["prompt_tokens"]  # the same chat template and tokenisation
        assert [t.token for t in got.tokens] == [t["token"] for t in case["tokens"]], got.text
        assert got.text == case["text"]
        for ours, ref in zip(got.tokens, case["tokens"]):
            worst = max(worst, abs(ours.logprob - ref["logprob"]))
            assert ours.logprob == pytest.approx(ref["logprob"], abs=ATOL)
            ours_top = [(x.token, x.logprob) for x in ours.top_logprobs]
            ref_top = [(x["token"], x["logprob"]) for x in ref["top_logprobs"]]
            assert len(ours_top) == len(ref_top) == 5
            assert _top_set_matches(ours_top, ref_top), (ours.token, ours_top, ref_top)
            ref_by_token = dict(ref_top)
            for token, lp in ours_top:
                if token in ref_by_token:
                    worst = max(worst, abs(lp - ref_by_token[token]))
                    assert lp == pytest.approx(ref_by_token[token], abs=ATOL), token
    print(f"largest |logprob difference| vs llama-cpp-python: {worst:.4g} nats")


def test_top_set_comparison_allows_only_a_boundary_swap():
    ref = [("a", -0.1), ("b", -1.0), ("c", -2.0), ("d", -3.0), ("e", -4.0)]
    assert _top_set_matches(list(ref), ref)
    swapped = [("a", -0.1), ("b", -1.0), ("c", -2.0), ("d", -3.0), ("f", -4.01)]
    assert _top_set_matches(swapped, ref)  # the 5th place is a near tie
    assert not _top_set_matches([("a", -0.1), ("b", -1.0), ("c", -2.0), ("d", -3.0), ("f", -3.5)], ref)
    assert not _top_set_matches([("x", -0.1), ("y", -1.0), ("c", -2.0), ("d", -3.0), ("e", -4.0)], ref)
