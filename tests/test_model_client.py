"""The model client against the fake OpenAI-compatible server: logprobs, retries, accounting, raw text."""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import urllib.error
import urllib.request

import pytest

from fake_openai_server import FakeOpenAIServer, tokenize, top_logprobs_for
from uqh.harness.model.client import (
    convert_logprobs,
    grammar_text,
    is_transient,
    make_model_client,
    normalise_top_logprobs,
    rebuild_text,
)
from uqh.harness.model.call_errors import ModelCallFailed
from uqh.rundir.schema import DecodingConfig, TokenLogprob, TopLogprob
from uqh.harness.config.settings import BatchSettings

PATHS = ["litellm", "aiohttp", "openai"]  # transports: litellm, the direct path, the openai SDK
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 6 times 7?"}]
STEP = "<think>Six sevens.</think>\n<action>finish[42]</action>\n<confidence>0.9</confidence>\n<explanation>Easy.</explanation>"


def _client(srv, transport, *, model="openai/fake", decoding=None, max_retries=3, timeout_s=5.0):
    return make_model_client(
        model,
        api_base=srv.base_url,
        decoding=decoding or DecodingConfig(),
        timeout_s=timeout_s,
        max_retries=max_retries,
        transport=transport,
        backoff_initial_s=0.001,
        backoff_max_s=0.01,
    )


def _complete(client, messages=MESSAGES, **kw):
    async def go():
        try:
            return await client.complete(messages, **kw)
        finally:
            await client.aclose()

    return asyncio.run(go())


# ------------------------------------------------------------------------------------- fake server itself


def test_fake_server_tokens_join_and_logprobs_are_hand_computable(fake_server):
    with fake_server("ab c") as srv:
        req = urllib.request.Request(
            srv.base_url + "/chat/completions",
            data=json.dumps({"model": "m", "messages": MESSAGES, "logprobs": True, "top_logprobs": 5}).encode(),
            headers={"Content-Type": "application/json"},
        )
        body = json.loads(urllib.request.urlopen(req).read())
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["message"] == {"role": "assistant", "content": "ab c"}
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == ["ab", " c"]
    # len("ab") = 2 -> p = 0.7; alternatives start at ALT_VOCAB[2 % 12] = " a"
    assert content[0]["logprob"] == pytest.approx(math.log(0.7))
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["ab", " a", ".", " and", "\n"]
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == pytest.approx(
        [math.log(0.7), math.log(0.15), math.log(0.075), math.log(0.0375), math.log(0.01875)]
    )
    assert content[1]["bytes"] == [32, 99]
    assert body["usage"]["completion_tokens"] == 2
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 2


def test_fake_server_script_cycles_last_and_rejects_unknown_fault(fake_server):
    assert tokenize(" <think>a, b.</think>\n") == [" <", "think", ">", "a", ",", " b", ".", "<", "/", "think", ">", "\n"]
    with pytest.raises(ValueError, match="unknown fault"):
        FakeOpenAIServer(faults=["teapot"])
    with fake_server(["one", "two"], faults=["429"]) as srv:
        client = _client(srv, "aiohttp")
        texts = [_complete(client).text for _ in range(3)]
    assert texts == ["one", "two", "two"]
    assert srv.faults_served == ["429"]
    assert len(srv.requests) == 4


def test_fake_server_prompt_token_count_matches_joined_text():
    from fake_openai_server import count_prompt_tokens

    msgs = [
        {"role": "system", "content": "Sys prompt.  "},
        {"role": "user", "content": " Question: 2+2?"},
        {"role": "assistant", "content": "<think>x</think>\n<action>Calc[2+2]</action>"},
        {"role": "user", "content": "Observation: Result: 4\n"},
        {"role": "user", "content": [{"type": "text", "text": "more"}]},
    ]
    joined = "\n".join(["Sys prompt.  ", " Question: 2+2?", "<think>x</think>\n<action>Calc[2+2]</action>",
                         "Observation: Result: 4\n", "more"])
    assert count_prompt_tokens(msgs) == len(tokenize(joined))
    assert count_prompt_tokens([]) == 0


# ------------------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("transport", PATHS)
def test_logprobs_captured_and_typed(fake_server, transport):
    with fake_server(STEP) as srv:
        c = _complete(_client(srv, transport))
    assert c.text == STEP
    assert c.tokens is not None and all(isinstance(t, TokenLogprob) for t in c.tokens)
    assert "".join(t.token for t in c.tokens) == STEP
    for t in c.tokens:
        expected = top_logprobs_for(t.token)
        assert t.logprob == pytest.approx(expected[0][1])
        assert [(a.token, a.logprob) for a in t.top_logprobs] == [(tok, pytest.approx(lp)) for tok, lp in expected]
        assert all(isinstance(a, TopLogprob) for a in t.top_logprobs)
    assert c.call.has_logprobs is True
    assert c.call.usage.completion_tokens == len(c.tokens) == len(tokenize(STEP))
    assert c.call.usage.prompt_tokens == len(tokenize("You are terse.\nWhat is 6 times 7?"))
    assert c.call.finish_reason == "stop"
    assert c.call.retries == 0
    assert c.call.model == "openai/fake"
    assert c.call.latency_s > 0


@pytest.mark.parametrize("transport", PATHS)
def test_llama_cpp_quirky_top_logprobs_normalised_to_top5(fake_server, transport):
    with fake_server("alpha, beta", quirky_top_logprobs=True) as srv:
        c = _complete(_client(srv, transport))
    for t in c.tokens:
        assert len(t.top_logprobs) == 5
        assert [(a.token, a.logprob) for a in t.top_logprobs] == [
            (tok, pytest.approx(lp)) for tok, lp in top_logprobs_for(t.token)
        ]


def test_normalise_top_logprobs_hand_case():
    raw = [
        {"token": "b", "logprob": -2.0, "bytes": None},
        {"token": "a", "logprob": -0.1, "bytes": None},
        {"token": "b", "logprob": -1.0, "bytes": None},  # duplicate string: the higher logprob is kept
        {"token": "c", "logprob": -3.0, "bytes": None},
        {"token": "d", "logprob": -4.0, "bytes": None},
        {"token": "e", "logprob": -5.0, "bytes": None},
        {"token": "f", "logprob": -0.5, "bytes": None},
    ]
    out = normalise_top_logprobs(raw, 5)
    assert [(t.token, t.logprob) for t in out] == [("a", -0.1), ("f", -0.5), ("b", -1.0), ("c", -3.0), ("d", -4.0)]
    assert normalise_top_logprobs(raw, 2) == [TopLogprob(token="a", logprob=-0.1), TopLogprob(token="f", logprob=-0.5)]
    assert convert_logprobs(None, 5) is None
    assert convert_logprobs({"content": []}, 5) is None
    assert convert_logprobs({"content": [{"token": "x", "logprob": None}]}, 5) is None


# ------------------------------------------------------------------------------------- retries


@pytest.mark.parametrize("transport", PATHS)
@pytest.mark.parametrize("fault", ["429", "500", "503", "timeout", "malformed", "reset", "error_200", "no_choices"])
def test_transient_fault_is_retried_then_succeeds(fake_server, transport, fault):
    with fake_server(STEP, faults=[fault], timeout_sleep_s=2.0) as srv:
        c = _complete(_client(srv, transport, timeout_s=0.5))
    assert c.text == STEP
    assert c.call.retries == 1
    assert srv.faults_served == [fault]
    assert len(srv.requests) == 2
    assert c.call.has_logprobs is True


@pytest.mark.parametrize("transport", PATHS)
def test_two_different_faults_count_two_retries(fake_server, transport):
    with fake_server(STEP, faults=["429", "malformed"]) as srv:
        c = _complete(_client(srv, transport))
    assert c.call.retries == 2
    assert c.call.latency_s > 0


@pytest.mark.parametrize("transport", PATHS)
def test_faults_exhausted_raise_model_call_failed(fake_server, transport):
    with fake_server(STEP, faults=["500", "500", "500", "500"]) as srv:
        with pytest.raises(ModelCallFailed, match=r"after 3 attempts \(2 retries\)"):
            _complete(_client(srv, transport, max_retries=2))
        assert len(srv.requests) == 3


@pytest.mark.parametrize("transport", PATHS)
@pytest.mark.parametrize("fault", ["400", "401", "404"])
def test_non_retryable_errors_fail_fast(fake_server, transport, fault):
    with fake_server(STEP, faults=[fault]) as srv:
        client = _client(srv, transport, max_retries=6)
        client.backoff_initial_s = 5.0  # a retry would take seconds: prove there is none
        t0 = time.perf_counter()
        with pytest.raises(ModelCallFailed, match="not retryable"):
            _complete(client)
        assert time.perf_counter() - t0 < 3.0
        assert len(srv.requests) == 1


def test_is_transient_classification():
    import litellm
    import openai

    assert is_transient(json.JSONDecodeError("Expecting value", "", 0))
    assert is_transient(ConnectionResetError())
    assert is_transient(litellm.Timeout("t", model="m", llm_provider="openai"))
    assert is_transient(litellm.ServiceUnavailableError("s", model="m", llm_provider="openai"))
    assert is_transient(litellm.APIConnectionError("c", model="m", llm_provider="openai"))
    assert not is_transient(litellm.BadRequestError("b", model="m", llm_provider="openai"))
    assert not is_transient(litellm.PermissionDeniedError("p", model="m", llm_provider="openai", response=_httpx_response(403)))
    assert not is_transient(ValueError("a bug"))
    assert isinstance(litellm.RateLimitError("r", model="m", llm_provider="openai"), openai.RateLimitError)


def _httpx_response(status):
    import httpx

    return httpx.Response(status, request=httpx.Request("POST", "http://x"))


# ------------------------------------------------------------------------------------- missing logprobs, cost


@pytest.mark.parametrize("transport", PATHS)
def test_missing_logprobs_recorded_with_exactly_one_warning(fake_server, transport, caplog):
    caplog.set_level(logging.WARNING, logger="uqh.harness.model.client")
    with fake_server(STEP, logprobs=False) as srv:
        client = _client(srv, transport)

        async def two_calls():
            out = [await client.complete(MESSAGES), await client.complete(MESSAGES)]
            await client.aclose()
            return out

        results = asyncio.run(two_calls())
    for c in results:
        assert c.tokens is None
        assert c.call.has_logprobs is False
        assert c.text == STEP
    warnings = [r for r in caplog.records if r.name == "uqh.harness.model.client" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "no token logprobs" in warnings[0].getMessage()


@pytest.mark.parametrize("transport", PATHS)
def test_no_logprobs_fault_on_one_call_only(fake_server, transport):
    with fake_server(STEP, faults=["no_logprobs"]) as srv:
        client = _client(srv, transport)

        async def two_calls():
            out = [await client.complete(MESSAGES), await client.complete(MESSAGES)]
            await client.aclose()
            return out

        first, second = asyncio.run(two_calls())
    assert first.tokens is None and first.call.has_logprobs is False and first.call.retries == 0
    assert second.tokens is not None and second.call.has_logprobs is True


@pytest.mark.parametrize("transport", PATHS)
def test_cost_is_none_for_unpriced_model(fake_server, transport):
    with fake_server(STEP) as srv:
        c = _complete(_client(srv, transport, model="openai/not-a-priced-model-xyz"))
    assert c.call.cost_usd is None
    assert c.call.usage.total_tokens is not None


@pytest.mark.parametrize("transport", PATHS)
def test_cost_for_priced_model_matches_price_map(fake_server, transport):
    import litellm

    price = litellm.model_cost["gpt-4o-mini"]
    with fake_server(STEP) as srv:
        c = _complete(_client(srv, transport, model="openai/gpt-4o-mini"))
    u = c.call.usage
    expected = u.prompt_tokens * price["input_cost_per_token"] + u.completion_tokens * price["output_cost_per_token"]
    assert c.call.cost_usd == pytest.approx(expected)
    assert c.call.cost_usd > 0


# ------------------------------------------------------------------------------------- raw text, paths


@pytest.mark.parametrize("logprobs", [True, False], ids=["tokens", "no-tokens"])
@pytest.mark.parametrize("transport", PATHS)
def test_leading_think_block_is_kept_in_text(fake_server, transport, logprobs):
    with fake_server(STEP) as srv:
        c = _complete(_client(srv, transport, decoding=DecodingConfig(logprobs=logprobs)))
    assert c.text == STEP
    assert c.text.startswith("<think>Six sevens.</think>\n<action>")


def test_litellm_really_splits_think_and_we_rebuild(fake_server):
    """Guard the premise: litellm moves the <think> block into reasoning_content."""
    import litellm

    with fake_server(STEP) as srv:
        resp = asyncio.run(
            litellm.acompletion(model="openai/fake", api_base=srv.base_url, api_key="x", messages=MESSAGES)
        )
    msg = resp.choices[0].message
    assert msg.reasoning_content == "Six sevens."
    assert not msg.content.startswith("<think>")
    assert rebuild_text(msg.content, msg.reasoning_content, None) == STEP


def test_rebuild_text_prefers_tokens_for_other_tag_spellings():
    text = "<thinking>hmm</thinking>\n<action>x</action>"
    tokens = [TokenLogprob(token=t, logprob=-0.1) for t in tokenize(text)]
    assert rebuild_text("\n<action>x</action>", "hmm", tokens) == text
    assert rebuild_text("\n<action>x</action>", "hmm", None) == "<think>hmm</think>\n<action>x</action>"
    assert rebuild_text("plain", None, None) == "plain"
    assert rebuild_text(None, None, None) == ""


def test_all_transports_give_the_same_completion(fake_server):
    with fake_server(STEP, quirky_top_logprobs=True) as srv:
        results = [_complete(_client(srv, t)) for t in PATHS]
        assert all(r["messages"] == MESSAGES for r in srv.requests)
    first = results[0]
    for other in results[1:]:
        assert other.text == first.text == STEP
        assert other.tokens == first.tokens
        assert other.call.model_dump(exclude={"latency_s"}) == first.call.model_dump(exclude={"latency_s"})
    # the request bodies are the same too (litellm may add nothing we did not ask for)
    bodies = [{k: v for k, v in r.items()} for r in srv.requests]
    assert all(b == bodies[0] for b in bodies[1:]), bodies


def test_transport_choice():
    dec = DecodingConfig()
    url = "http://127.0.0.1:1/v1"
    assert make_model_client("openai/x", api_base=url, decoding=dec).transport.name == "aiohttp"
    assert make_model_client("openai/x", api_base=url, decoding=dec, direct=False).transport.name == "litellm"
    assert make_model_client("openai/x", api_base=url, decoding=dec, transport="openai").transport.name == "openai"
    assert make_model_client("openai/x", api_base=None, decoding=dec).transport.name == "litellm"
    openrouter = make_model_client("openrouter/google/gemma-4-31b-it", api_base=None, decoding=dec)
    assert openrouter.transport.name == "litellm"
    with pytest.raises(ValueError, match="resolve_model"):
        make_model_client("local:smollm2", api_base=None, decoding=dec)
    with pytest.raises(ValueError, match="direct path"):
        make_model_client("anthropic/claude", api_base=None, decoding=dec, direct=True)
    with pytest.raises(ValueError, match="unknown transport"):
        make_model_client("openai/x", api_base=url, decoding=dec, transport="carrier-pigeon")


# ------------------------------------------------------------------------------------- request body


@pytest.mark.parametrize("transport", PATHS)
def test_decoding_settings_are_sent(fake_server, transport):
    dec = DecodingConfig(temperature=0.35, top_p=0.9, top_logprobs=3, seed=7, max_tokens=40, grammar=True, reasoning=True)
    with fake_server(STEP) as srv:
        c = _complete(_client(srv, transport, decoding=dec), seed=1234)
        body = srv.requests[0]
    assert body["model"] == "fake"
    assert body["messages"] == MESSAGES
    assert body["seed"] == 1234
    assert body["temperature"] == 0.35
    assert body["top_p"] == 0.9
    assert body["logprobs"] is True
    assert body["top_logprobs"] == 3
    assert body.get("max_tokens", body.get("max_completion_tokens")) == 40
    assert body["grammar"] == grammar_text()
    assert body["reasoning"] == {"enabled": True}
    assert c.call.seed == 1234
    assert all(len(t.top_logprobs) == 3 for t in c.tokens)


@pytest.mark.parametrize("transport", PATHS)
def test_defaults_send_paper_decoding_and_no_grammar(fake_server, transport):
    with fake_server(STEP) as srv:
        c = _complete(_client(srv, transport))
        body = srv.requests[0]
    assert (body["temperature"], body["top_p"], body["seed"], body["top_logprobs"]) == (0.2, 1.0, 42, 5)
    assert "grammar" not in body and "reasoning" not in body
    assert c.call.seed == 42


@pytest.mark.parametrize("transport", PATHS)
def test_max_tokens_truncation_reports_length(fake_server, transport):
    with fake_server(STEP) as srv:
        c = _complete(_client(srv, transport, decoding=DecodingConfig(max_tokens=5)))
    assert c.call.finish_reason == "length"
    assert c.tokens is not None and len(c.tokens) == 5
    assert c.text == "".join(tokenize(STEP)[:5])


def test_grammar_file_has_the_four_tags():
    g = grammar_text()
    assert g.count("root ") + g.count("root\t") >= 1
    for tag in ("think", "action", "confidence", "explanation"):
        assert f'"<{tag}>"' in g and f'"</{tag}>"' in g


def test_concurrent_calls_share_one_client(fake_server):
    with fake_server(lambda req: req["messages"][-1]["content"].upper(), latency_s=0.05) as srv:
        client = _client(srv, "aiohttp")

        async def many():
            outs = await asyncio.gather(
                *(client.complete([{"role": "user", "content": f"q{i}"}]) for i in range(20))
            )
            await client.aclose()
            return outs

        outs = asyncio.run(many())
    assert [o.text for o in outs] == [f"Q{i}" for i in range(20)]
    assert len(srv.requests) == 20
    assert srv.max_in_flight > 1  # they overlapped (counted by the server, not timed: CI machines are loaded)


def test_direct_path_needs_neither_litellm_nor_openai_imports(fake_server):
    """Worker processes on the direct path start fast: the multi-second litellm import is not needed."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, asyncio; import uqh.harness\n"
        "from uqh.harness.model.client import make_model_client\n"
        "from uqh.rundir.schema import DecodingConfig\n"
        "c = make_model_client('openai/fake', api_base=sys.argv[1], decoding=DecodingConfig())\n"
        "async def go():\n"
        "    r = await c.complete([{'role': 'user', 'content': 'x'}]); await c.aclose(); return r\n"
        "r = asyncio.run(go())\n"
        "print(r.call.cost_usd, r.call.has_logprobs, 'litellm' in sys.modules, 'openai' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parent.parent
    with fake_server(STEP) as srv:
        out = subprocess.run(
            [sys.executable, "-c", code, srv.base_url], cwd=root, capture_output=True, text=True, timeout=60
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "True", "False", "False"]


def test_backoff_is_exponential_with_jitter_and_honours_retry_after():
    from uqh.harness.model.client import HTTPStatusFailure

    c = make_model_client(
        "openai/x", api_base="http://127.0.0.1:1/v1", decoding=DecodingConfig(), backoff_initial_s=1.0, backoff_max_s=10.0
    )
    for failures, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (9, 10.0)]:
        waits = [c.backoff_s(failures) for _ in range(200)]
        assert all(base <= w <= base + 1.0 for w in waits)
        assert max(waits) - min(waits) > 0.5  # jitter really spreads retries
    assert c.backoff_s(1, HTTPStatusFailure(429, "slow down", retry_after=7.0)) >= 7.0
    assert c.backoff_s(1, HTTPStatusFailure(429, "slow down", retry_after=3600.0)) == 10.0  # capped at max
    assert is_transient(HTTPStatusFailure(429, "x")) and is_transient(HTTPStatusFailure(502, "x"))
    assert not is_transient(HTTPStatusFailure(401, "x")) and not is_transient(HTTPStatusFailure(422, "x"))


def test_broken_responder_fails_fast_with_its_message(fake_server):
    def responder(req):
        raise KeyError("no script line for this request")

    with fake_server(responder) as srv:
        with pytest.raises(ModelCallFailed, match="responder raised KeyError"):
            _complete(_client(srv, "aiohttp", max_retries=3))
        assert len(srv.requests) == 1
        assert isinstance(srv.responder_errors[0], KeyError)


def test_check_response_classifies_bodies_without_a_completion():
    from uqh.harness.model.client import HTTPStatusFailure, MalformedResponse, _check_response

    _check_response({"choices": [{"message": {"role": "assistant", "content": "x"}}]})  # fine
    with pytest.raises(MalformedResponse):
        _check_response({"choices": []})
    with pytest.raises(MalformedResponse):
        _check_response({"choices": [{"index": 0}]})
    with pytest.raises(HTTPStatusFailure) as exc:
        _check_response({"error": {"code": 401, "message": "No auth credentials found"}})
    assert exc.value.status_code == 401 and not is_transient(exc.value)
    with pytest.raises(HTTPStatusFailure) as exc:
        _check_response({"error": {"code": 502, "message": "upstream"}})
    assert is_transient(exc.value)
    with pytest.raises(MalformedResponse, match="weird"):
        _check_response({"error": {"code": "weird_string_code", "message": "weird"}})
    assert is_transient(MalformedResponse("x"))


@pytest.mark.parametrize("transport", PATHS)
def test_api_key_never_appears_in_failure_messages(fake_server, transport):
    secret = "sk-test-secret-0123456789"

    def responder(req):
        raise KeyError(f"server echoed the key {secret}")

    with fake_server(responder) as srv:
        client = make_model_client(
            "openai/fake", api_base=srv.base_url, decoding=DecodingConfig(), api_key=secret, transport=transport,
            max_retries=0,
        )
        with pytest.raises(ModelCallFailed) as exc:
            _complete(client)
    assert secret not in str(exc.value)
    assert "***" in str(exc.value)


@pytest.mark.parametrize("transport", PATHS)
def test_provider_reported_cost_is_used(fake_server, transport):
    """OpenRouter bills in usage.cost; the paper's model is not in litellm's price map."""
    with fake_server(STEP, usage_cost=0.00078) as srv:
        c = _complete(_client(srv, transport, model="openai/not-a-priced-model-xyz"))
    assert c.call.cost_usd == pytest.approx(0.00078)


# ------------------------------------------------------------------------------------- a plugged-in transport


class CannedTransport:
    """A transport written against the protocol only: answers from a list of outcomes (an exception is raised,
    anything else returned as the response body) and records what it was sent."""

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.sent: list[tuple[list[dict], int | None]] = []
        self.closed = False

    async def send(self, messages, seed):
        self.sent.append((messages, seed))
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def aclose(self):
        self.closed = True


def _body(text: str, *, logprobs: bool = True, cost: float | None = None) -> dict:
    """An OpenAI-shaped chat completion of ``text`` (tokens as the fake server makes them)."""
    content = None
    if logprobs:
        content = [
            {"token": t, "logprob": top_logprobs_for(t)[0][1],
             "top_logprobs": [{"token": a, "logprob": lp} for a, lp in top_logprobs_for(t)]}
            for t in tokenize(text)
        ]
    usage = {"prompt_tokens": 11, "completion_tokens": len(tokenize(text)), "total_tokens": 11 + len(tokenize(text))}
    if cost is not None:
        usage["cost"] = cost
    return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                         "logprobs": {"content": content} if content else None}], "usage": usage}


def test_a_new_transport_plugs_in_without_touching_the_client():
    """Retries, checks, logprob conversion and accounting are the client's, whatever the transport."""
    from uqh.harness.model.client import HTTPStatusFailure

    transport = CannedTransport([ConnectionError("reset"), {"choices": []}, _body(STEP, cost=0.002)])
    client = make_model_client("my-provider/model", api_base=None, decoding=DecodingConfig(top_logprobs=3),
                               transport=transport, backoff_initial_s=0.001, backoff_max_s=0.01)
    c = _complete(client, seed=9)
    assert client.transport is transport and transport.closed
    assert transport.sent == [(MESSAGES, 9)] * 3  # two transient failures retried with the same request
    assert c.text == STEP and c.call.retries == 2 and c.call.seed == 9 and c.call.cost_usd == pytest.approx(0.002)
    assert c.call.model == "my-provider/model" and c.call.finish_reason == "stop" and c.call.has_logprobs
    assert [t.token for t in c.tokens] == tokenize(STEP) and all(len(t.top_logprobs) == 3 for t in c.tokens)
    assert [(a.token, a.logprob) for a in c.tokens[0].top_logprobs] == top_logprobs_for(c.tokens[0].token)[:3]
    assert c.call.usage.prompt_tokens == 11 and c.call.usage.completion_tokens == len(tokenize(STEP))

    secret = "sk-plugged-in-0123456789"
    fatal = CannedTransport([HTTPStatusFailure(401, f"bad key {secret}"), _body(STEP)])
    client = make_model_client("my-provider/model", api_base=None, decoding=DecodingConfig(), transport=fatal,
                               api_key=secret, backoff_initial_s=5.0)
    with pytest.raises(ModelCallFailed, match="not retryable") as exc:
        _complete(client)
    assert len(fatal.sent) == 1 and secret not in str(exc.value)  # not retried, key redacted

    bare = CannedTransport([_body("no logprobs here", logprobs=False)])
    c = _complete(make_model_client("my-provider/model", api_base=None, decoding=DecodingConfig(), transport=bare))
    assert c.tokens is None and c.call.has_logprobs is False and c.call.cost_usd is None


# ------------------------------------------------------------------------------------- unreachable, timeouts, null


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.mark.parametrize("transport", PATHS)
@pytest.mark.parametrize("where,reason", [("dns", "DNS lookup failed"), ("refused", "connection refused")])
def test_first_call_that_cannot_connect_fails_fast(transport, where, reason):
    from uqh.harness.model.call_errors import EndpointUnreachable

    base = "http://nohost.invalid/v1" if where == "dns" else f"http://127.0.0.1:{_closed_port()}/v1"
    client = make_model_client("openai/fake", api_base=base, decoding=DecodingConfig(), max_retries=6,
                               transport=transport, backoff_initial_s=5.0)  # a single retry would take 5 s
    t0 = time.perf_counter()
    with pytest.raises(EndpointUnreachable) as exc:
        _complete(client)
    assert time.perf_counter() - t0 < 4.0
    msg = str(exc.value)
    assert msg.startswith(f"openai/fake: cannot reach {base}: {reason}")
    assert "ssl" not in msg.lower() and "\n" not in msg and exc.value.retries == 0


def test_refused_connection_after_a_success_is_retried(fake_server):
    """Once the endpoint has answered, a refused connection is a restarting server: transient, retried."""
    from uqh.harness.model.call_errors import EndpointUnreachable

    srv = fake_server(STEP).start()
    client = _client(srv, "aiohttp", max_retries=2)

    async def go():
        try:
            first = await client.complete(MESSAGES)
            srv.stop()
            with pytest.raises(ModelCallFailed) as exc:
                await client.complete(MESSAGES)
            return first, exc.value
        finally:
            await client.aclose()

    first, failure = asyncio.run(go())
    assert first.text == STEP
    assert not isinstance(failure, EndpointUnreachable)
    assert "after 3 attempts (2 retries)" in str(failure) and failure.retries == 2


@pytest.mark.parametrize("transport", PATHS)
def test_timeout_is_per_call_and_named(fake_server, transport):
    with fake_server(STEP, faults=["timeout"], timeout_sleep_s=30.0) as srv:
        t0 = time.perf_counter()
        with pytest.raises(ModelCallFailed) as exc:
            _complete(_client(srv, transport, max_retries=0, timeout_s=0.3))
        assert time.perf_counter() - t0 < 10.0  # the server would have answered after 30 s
    assert "after 1 attempts (0 retries)" in str(exc.value)
    if transport == "aiohttp":
        assert "no answer within 0.3 s" in str(exc.value)


@pytest.mark.parametrize("transport", PATHS)
def test_null_content_is_retried_as_the_providers_fault_and_recorded(fake_server, transport):
    with fake_server(STEP, faults=["null_content"]) as srv:
        c = _complete(_client(srv, transport))
    assert c.text != "" and c.call.content_null is True and c.call.retries == 1 and srv.n_requests == 2
    with fake_server(STEP) as srv:
        assert _complete(_client(srv, transport)).call.content_null is False
    with fake_server(STEP, faults=["null_content"] * 4) as srv:  # never anything else: an infrastructure failure
        with pytest.raises(ModelCallFailed, match="null content"):
            _complete(_client(srv, transport))


# ------------------------------------------------------------------------------------- prompt caching


@pytest.mark.parametrize("transport", PATHS)
def test_cached_prompt_tokens_recorded_and_priced_at_the_cache_rate(fake_server, transport):
    """The fake server caches like OpenAI and reports usage.prompt_tokens_details.cached_tokens: the second identical
    request is read whole from the cache, a longer one up to the shared prefix; the cost uses gpt-4o's cached rate."""
    import litellm

    price = litellm.model_cost["gpt-4o"]
    longer = MESSAGES + [{"role": "assistant", "content": STEP}, {"role": "user", "content": "Observation: ok"}]
    with fake_server(STEP, prompt_cache=True) as srv:
        client = _client(srv, transport, model="openai/gpt-4o")

        async def go():
            try:
                return [await client.complete(m) for m in (MESSAGES, MESSAGES, longer)]
            finally:
                await client.aclose()

        first, again, extended = asyncio.run(go())
    from fake_openai_server import count_prompt_tokens

    assert first.call.usage.cached_prompt_tokens == 0
    assert again.call.usage.cached_prompt_tokens == again.call.usage.prompt_tokens == count_prompt_tokens(MESSAGES)
    assert extended.call.usage.cached_prompt_tokens == count_prompt_tokens(MESSAGES) < extended.call.usage.prompt_tokens
    for c in (first, again, extended):
        u = c.call.usage
        assert u.cache_write_prompt_tokens is None and u.uncached_prompt_tokens == u.prompt_tokens - u.cached_prompt_tokens
        expect = (u.uncached_prompt_tokens * price["input_cost_per_token"]
                  + u.cached_prompt_tokens * price["cache_read_input_token_cost"]
                  + u.completion_tokens * price["output_cost_per_token"])
        assert c.call.cost_usd == pytest.approx(expect, rel=1e-12)
    assert price["cache_read_input_token_cost"] < price["input_cost_per_token"]
    assert again.call.cost_usd < first.call.cost_usd


def test_usage_cache_fields_from_each_provider_style():
    from uqh.harness.model.client import _usage_of
    from uqh.harness.model.pricing import cost_usd
    from uqh.rundir.schema import Usage

    base = {"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010}
    openai_style = {"usage": {**base, "prompt_tokens_details": {"cached_tokens": 800}}}
    anthropic_style = {"usage": {**base, "cache_read_input_tokens": 700, "cache_creation_input_tokens": 200}}
    deepseek_style = {"usage": {**base, "prompt_cache_hit_tokens": 600, "prompt_cache_miss_tokens": 400}}
    silent = {"usage": base}
    assert (_usage_of(openai_style).cached_prompt_tokens, _usage_of(openai_style).cache_write_prompt_tokens) == (800, None)
    assert (_usage_of(anthropic_style).cached_prompt_tokens, _usage_of(anthropic_style).cache_write_prompt_tokens) == (
        700, 200)
    assert _usage_of(deepseek_style).cached_prompt_tokens == 600
    assert (_usage_of(silent).cached_prompt_tokens, _usage_of(silent).cache_write_prompt_tokens) == (None, None)
    # a model without a cache rate in the price map pays the input rate for cached tokens too (litellm's fallback)
    import litellm

    assert "cache_read_input_token_cost" not in litellm.model_cost["gpt-3.5-turbo"]
    plain = Usage(prompt_tokens=1000, completion_tokens=10)
    cached = Usage(prompt_tokens=1000, completion_tokens=10, cached_prompt_tokens=800)
    assert cost_usd("gpt-3.5-turbo", cached) == pytest.approx(cost_usd("gpt-3.5-turbo", plain))
    # Anthropic: reads at the read rate, writes at the write rate, the rest at the input rate
    p = litellm.model_cost["claude-haiku-4-5"]
    u = _usage_of(anthropic_style)
    assert cost_usd("anthropic/claude-haiku-4-5", u) == pytest.approx(
        100 * p["input_cost_per_token"] + 700 * p["cache_read_input_token_cost"]
        + 200 * p["cache_creation_input_token_cost"] + 10 * p["output_cost_per_token"], rel=1e-12)


def test_claude_models_get_cache_control_and_no_rejected_parameters():
    from uqh.harness.model.transports import Endpoint, LitellmTransport, needs_cache_control, unsupported_params

    assert needs_cache_control("anthropic/claude-haiku-4-5") and needs_cache_control("openrouter/anthropic/claude-3.5-sonnet")
    assert not needs_cache_control("openai/gpt-4o") and not needs_cache_control("openrouter/google/gemma-4-31b-it")
    assert not needs_cache_control("deepseek/deepseek-chat")
    assert set(unsupported_params("anthropic/claude-haiku-4-5", {"logprobs": True, "top_logprobs": 5})) == {
        "seed", "logprobs", "top_logprobs"}
    assert unsupported_params("hosted_vllm/x", {"logprobs": True, "top_logprobs": 5}) == []
    t = LitellmTransport(Endpoint("anthropic/claude-haiku-4-5", "http://127.0.0.1:9", "k", 5.0, DecodingConfig()))
    assert not t.sends_seed and "logprobs" not in t._kwargs
    assert t._kwargs["cache_control_injection_points"] == [{"location": "message", "role": "system"},
                                                           {"location": "message", "index": -1}]
    t = LitellmTransport(Endpoint("hosted_vllm/x", "http://127.0.0.1:9", "k", 5.0, DecodingConfig()))
    assert t.sends_seed and t._kwargs["logprobs"] and "cache_control_injection_points" not in t._kwargs


def test_null_content_at_a_high_rate_never_reaches_the_agent(fake_server, tmp_path):
    """Issue 33 item 7: at a 60% rate, 11 of 30 episodes used to end parse_error; a null content is retried as the
    provider's fault, so every episode ends as the agent played it."""
    from uqh.harness.runner import run_batch
    from test_runner import make_config, solver

    faults = ["null_content" if i % 5 < 3 else None for i in range(40)]
    with fake_server(solver, faults=[f for f in faults if f]) as srv:  # the first 24 requests: null content
        config = make_config(n_tasks=6).model_copy(update={"api_base": srv.base_url})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=6, progress=False),
                            client_factory=lambda m, b: make_model_client(
                                m, api_base=b, decoding=config.decoding, backoff_initial_s=0.01, max_retries=30))
    assert summary.ok and summary.stats.stop_reasons == {"clean": 6}


def test_llama_server_end_of_generation_entry_is_left_out():
    """llama-server lists the end token (token "", bytes []) after a stop; the records keep the text's tokens only."""
    from uqh.harness.model.client import convert_logprobs

    def entry(token, lp, raw):
        return {"token": token, "logprob": lp, "bytes": raw,
                "top_logprobs": [{"token": token, "logprob": lp, "bytes": raw}]}

    eos = entry("", -0.49, [])
    tokens = convert_logprobs({"content": [entry("Paris", -0.1, [80, 97, 114, 105, 115]), entry(".", -0.2, [46]), eos]}, 5)
    assert [t.token for t in tokens] == ["Paris", "."] and tokens[-1].logprob == -0.2
    assert convert_logprobs({"content": [eos]}, 5) == []  # only the end token: empty completion, not missing
    assert convert_logprobs({"content": []}, 5) is None
    # an empty token that is not last, or one with bytes, is kept (it is not the end token)
    kept = convert_logprobs({"content": [entry("", -1.0, []), entry("a", -0.3, [97])]}, 5)
    assert [t.token for t in kept] == ["", "a"]
