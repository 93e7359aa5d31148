"""The model client: one async chat-completion call with token logprobs, retries and accounting.

Every model call of the harness goes through :func:`make_model_client`. The client owns what is the same for every
transport -- retries, response checks, logprob conversion, text rebuilding, accounting -- and sends through one
:class:`uqh.harness.model.transports.Transport` chosen when it is made:

- the **litellm** transport (``litellm.acompletion``) for every provider litellm knows;
- the **direct** path for OpenAI-compatible endpoints given by URL (``model="openai/NAME", api_base=URL``:
  llama.cpp, vLLM, Ollama, the test server): one JSON POST over a pooled ``aiohttp`` session, parsed with
  ``json.loads``. It skips litellm's per-call bookkeeping and the ``openai`` SDK's request transformation and
  response models, and costs a fraction of their CPU per call (``benchmarks/harness_throughput.py``).
  ``direct=None`` picks it automatically for such endpoints, ``direct=True/False`` forces either path.
  ``transport="openai"`` selects an ``openai.AsyncOpenAI`` transport instead (same records; kept for
  comparison and for endpoints that need the SDK's behaviour); any object implementing the
  :class:`~uqh.harness.model.transports.Transport` protocol can be passed as ``transport`` too.

What every transport guarantees:

- ``logprobs``/``top_logprobs``/``temperature``/``top_p``/``seed``/``max_tokens`` from the
  :class:`~uqh.rundir.schema.DecodingConfig` are sent; ``decoding.grammar`` adds the llama.cpp GBNF of
  ``uqh/prompts/four_tags.gbnf`` as ``extra_body={"grammar": ...}``; ``decoding.reasoning`` asks the provider
  for reasoning where it has a switch (OpenRouter ``reasoning={"enabled": true}``, litellm ``reasoning_effort``).
- Transient failures (429, 5xx, timeouts, connection resets, truncated/malformed JSON bodies, 200 answers
  without a completion) are retried
  with exponential backoff and jitter (tenacity), honouring ``Retry-After`` up to the backoff cap; the count
  goes into ``CallRecord.retries``. Non-retryable errors (400, 401, 403, 404, 422) fail at once. Either way
  the caller gets :class:`~uqh.harness.model.types.ModelCallFailed` (the API key redacted from its message).
  Until the endpoint has answered once, a failed DNS lookup or a refused connection is a wrong address or a
  server that is not up, not a transient failure: :class:`~uqh.harness.model.types.EndpointUnreachable` at once.
- A message whose content is null (and nothing else generated) is the provider's fault: retried like a malformed
  body, and the call is marked ``CallRecord.content_null``; the agent never sees it (no repair is spent on it).
- Logprobs become typed :class:`~uqh.rundir.schema.TokenLogprob` rows whose alternatives are normalised to the
  top ``top_logprobs`` by logprob, duplicates merged by string (llama-cpp-python adds the sampled token as a
  6th entry when it is not in the top 5).
  A response without logprobs gives ``tokens=None``, ``has_logprobs=False`` and one warning per client.
- ``Completion.text`` is the full raw text: litellm moves a leading ``<think>...</think>`` into
  ``reasoning_content``; it is put back (the joined logprob tokens are preferred when they reproduce it).
- Usage is copied from the response, cached prompt tokens included (``prompt_tokens_details.cached_tokens``,
  Anthropic's cache read/creation counts); cost is what the provider billed when it says so (OpenRouter's
  ``usage.cost``), else litellm's price for the model with cached tokens at its cache rates, or ``None``
  (never 0) when the model is unpriced.
"""
from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import logging
import math
import os
import random
import re
import socket
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from uqh.harness.model.pricing import cost_usd
from uqh.harness.model.types import Completion
from uqh.harness.model.breaker import DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_WINDOW_S, CircuitBreaker
from uqh.harness.model.call_errors import (
    EndpointsDown,
    EndpointUnreachable,
    ModelCallFailed,
    error_line,
    unreachable_reason,
)
from uqh.harness.model.transports import (  # noqa: F401 - HTTPStatusFailure and grammar_text are part of this module's API
    TRANSPORTS,
    Endpoint,
    HTTPStatusFailure,
    Transport,
    grammar_text,
)
from uqh.rundir.secrets import redact
from uqh.rundir.schema import CallRecord, DecodingConfig, TokenLogprob, ToolCallRecord, TopLogprob, Usage

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

log = logging.getLogger(__name__)

#: A call (retries included) at least this long is logged (``uqh -v``): the local model takes 10-20 s per step.
SLOW_CALL_S = 30.0

#: HTTP statuses that are worth retrying.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
#: HTTP statuses that never get better by retrying.
FATAL_STATUS = frozenset({400, 401, 402, 403, 404, 405, 413, 415, 422})


# ------------------------------------------------------------------------------------- error classes


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def is_transient(exc: BaseException) -> bool:
    """True for failures a retry can cure: rate limits, server errors, timeouts, resets, broken bodies."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError, json.JSONDecodeError, MalformedResponse)):
        return True
    # Only look at libraries already imported: an exception cannot come from one that is not.
    openai = sys.modules.get("openai")
    if openai is not None and isinstance(
        exc, (openai.APITimeoutError, openai.APIConnectionError, openai.APIResponseValidationError)
    ):
        return True
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
        return True
    status = _status_of(exc)
    if status is not None:
        if status in FATAL_STATUS:
            return False
        if status in RETRYABLE_STATUS or status >= 500:
            return True
        return False
    # litellm wraps some transport problems in exceptions without a status; a JSON decode message is a
    # truncated body.
    text = str(exc)
    return any(s in text for s in ("Expecting value", "Unterminated string", "JSONDecodeError", "Connection error"))


class MalformedResponse(ValueError):
    """A 2xx body that is JSON but not a chat completion (no choices/message): retried like a truncated body."""


class NullContent(MalformedResponse):
    """A completion whose message content is null with nothing else generated: the provider's fault (a filter, a
    dropped generation), retried like a malformed body -- never handed to the agent as an empty answer to repair."""


def _check_content(resp: Any) -> None:
    message = _get(_get(resp, "choices")[0], "message")
    if _get(message, "content") is None and not _reasoning_of(message) and not _get(message, "tool_calls"):
        finish = _get(_get(resp, "choices")[0], "finish_reason")
        raise NullContent(f"the provider answered with null content (finish_reason {finish})")


def _check_response(resp: Any) -> None:
    """Raise for bodies that parsed but carry no completion (some gateways answer 200 with an error object)."""
    choices = _get(resp, "choices")
    if choices and _get(choices[0], "message") is not None:
        return
    error = _get(resp, "error")
    if error is not None:
        code = _get(error, "code")
        message = _get(error, "message") or str(error)
        if isinstance(code, int) and 100 <= code <= 599:
            raise HTTPStatusFailure(code, redact(str(message))[:300])
        raise MalformedResponse(f"the response carries an error instead of a completion: {redact(str(message))[:300]}")
    raise MalformedResponse("the response has no choices/message")


def _retry_after_s(exc: BaseException) -> float | None:
    if isinstance(exc, HTTPStatusFailure):
        return exc.retry_after
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        value = headers.get("retry-after") or headers.get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------- conversion


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if type(obj) is dict:
        return obj.get(key, default)
    value = getattr(obj, key, default)
    if value is default:
        extra = getattr(obj, "model_extra", None)
        if isinstance(extra, dict):
            return extra.get(key, default)
    return value


def _top_k(entries: Any, k: int) -> list[dict]:
    if type(entries) is list and len(entries) <= k:
        # Fast path (the usual OpenAI-compatible answer, parsed by json.loads): already at most k distinct tokens
        # sorted by logprob descending -- then the general path below would return exactly this.
        out = []
        prev = math.inf
        for e in entries:
            if type(e) is not dict:
                break
            token = e.get("token")
            lp = e.get("logprob")
            if type(token) is not str or type(lp) not in (float, int) or not lp <= prev:
                break
            prev = lp
            out.append({"token": token, "logprob": float(lp)})
        else:
            if len({d["token"] for d in out}) == len(out):
                return out
    best: dict[str, float] = {}
    for e in entries or ():
        token = _get(e, "token")
        lp = _get(e, "logprob")
        if token is None or lp is None:
            continue
        lp = float(lp)
        if token not in best or lp > best[token]:
            best[token] = lp
    ranked = sorted(best.items(), key=lambda kv: kv[1], reverse=True)[: max(0, k)]
    return [{"token": t, "logprob": lp} for t, lp in ranked]


def normalise_top_logprobs(entries: Any, k: int) -> list[TopLogprob]:
    """The top ``k`` alternatives by logprob, duplicates merged by string (keeping the highest logprob)."""
    return [TopLogprob(**d) for d in _top_k(entries, k)]


@lru_cache(maxsize=1)
def _tokens_adapter():
    from pydantic import TypeAdapter

    return TypeAdapter(list[TokenLogprob])


def convert_logprobs(logprobs: Any, k: int) -> list[TokenLogprob] | None:
    """Provider ``choices[0].logprobs`` -> typed tokens; ``None`` when the provider sent none.

    A last entry with an empty token string is the end-of-generation token (llama-server lists it, rendered as
    ``""``; llama-cpp-python, vLLM and OpenAI do not): it is not part of the text, so it is left out and the token
    predictors see the same positions on every server.
    """
    content = _get(logprobs, "content")
    if content and _get(content[-1], "token") == "" and not _get(content[-1], "bytes"):
        content = content[:-1]
        if not content:
            return []  # only the end token: an empty completion, nothing missing
    if not content:
        return None
    rows = []
    for e in content:
        token = _get(e, "token")
        lp = _get(e, "logprob")
        if token is None or lp is None:
            return None  # a position without a logprob: the provider did not really return them
        rows.append({"token": token, "logprob": float(lp), "top_logprobs": _top_k(_get(e, "top_logprobs"), k)})
    return _tokens_adapter().validate_python(rows)  # one pass in pydantic-core, not one call per object


_THINK_OPEN = ("<think>", "<thinking>", "<budget:thinking>")


def rebuild_text(content: str | None, reasoning: str | None, tokens: list[TokenLogprob] | None) -> str:
    """The full raw generated text, with a reasoning block litellm (or the server) split off put back.

    litellm turns ``"<think>R</think>C"`` into ``reasoning_content="R", content="C"``. When the logprob tokens
    join to a text that ends with ``C`` and contains ``R`` they are the ground truth (this also keeps the
    original tag spelling); otherwise ``<think>R</think>C`` is rebuilt.
    """
    content = content or ""
    if reasoning is None or "<think>" in content:
        return content
    candidate = f"<think>{reasoning}</think>{content}"
    if tokens:
        joined = "".join(t.token for t in tokens)
        if joined != candidate and joined.endswith(content) and reasoning in joined and "\ufffd" not in joined:
            if joined.lstrip().startswith(_THINK_OPEN):
                return joined
    return candidate


def _reasoning_of(message: Any) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        value = _get(message, key)
        if isinstance(value, str):
            return value
    return None


def tool_calls_of(message: Any) -> list[ToolCallRecord] | None:
    """The message's native function calls, their arguments kept as the provider's text (litellm objects or
    dicts); None when it made none."""
    calls = _get(message, "tool_calls")
    if not calls:
        return None
    out = []
    for call in calls:
        function = _get(call, "function")
        arguments = _get(function, "arguments")
        if not isinstance(arguments, str):  # some providers send an object; keep it as JSON text
            arguments = json.dumps(arguments if arguments is not None else {})
        out.append(ToolCallRecord(id=_get(call, "id"), name=str(_get(function, "name") or ""), arguments=arguments))
    return out


def _count(obj: Any, key: str) -> int | None:
    value = _get(obj, key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _first_count(*found: int | None) -> int | None:
    return next((v for v in found if v is not None), None)


def _usage_of(resp: Any) -> Usage:
    usage = _get(resp, "usage")
    details = _get(usage, "prompt_tokens_details")
    return Usage(
        prompt_tokens=_count(usage, "prompt_tokens"),
        completion_tokens=_count(usage, "completion_tokens"),
        total_tokens=_count(usage, "total_tokens"),
        # OpenAI-style details (also what litellm fills in for Anthropic), then Anthropic's and DeepSeek's own names
        cached_prompt_tokens=_first_count(
            _count(details, "cached_tokens"), _count(usage, "cache_read_input_tokens"),
            _count(usage, "prompt_cache_hit_tokens"),
        ),
        cache_write_prompt_tokens=_first_count(
            _count(usage, "cache_creation_input_tokens"), _count(details, "cache_creation_tokens"),
        ),
    )


def _provider_cost(resp: Any) -> float | None:
    """The billed USD cost when the provider reports it (OpenRouter's ``usage.cost``), else None."""
    value = _get(_get(resp, "usage"), "cost")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


# ------------------------------------------------------------------------------------- client


def is_openai_compatible_url(model: str, api_base: str | None) -> bool:
    """Whether ``model``/``api_base`` name an OpenAI-compatible server by URL: such runs take the direct path by
    default and never import litellm."""
    return model.startswith("openai/") and api_base is not None


class ModelClientImpl:
    """The model client: retries, checks and records around one :class:`~uqh.harness.model.transports.Transport`.

    ``transport``: a built-in transport's name (``"litellm"``, ``"aiohttp"`` = the direct path, ``"openai"`` =
    the openai SDK), or any object implementing the protocol (then ``api_key`` only serves redaction); ``None``
    picks by ``direct``: ``None`` takes the direct path for OpenAI-compatible URLs, ``True``/``False`` forces it
    on/off. ``backoff_initial_s``/``backoff_max_s`` shape the exponential backoff (jitter up to
    ``backoff_initial_s``). ``action_grammar``: a domain's GBNF rule for the <action> field
    (``Domain.action_gbnf``), used with ``decoding.grammar``. ``api_bases``: two or more endpoints serving the
    model; calls are spread over them by an :class:`uqh.harness.model.endpoints.EndpointPool` (``api_base`` is then the
    first, used in messages), ``endpoint_capacity`` the requests each serves at once when known (a local server's
    slots).
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None,
        decoding: DecodingConfig,
        timeout_s: float = 600.0,
        max_retries: int = 6,
        direct: bool | None = None,
        api_key: str | None = None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        transport: str | Transport | None = None,
        action_grammar: str | None = None,
        api_bases: Sequence[str] | None = None,
        endpoint_capacity: int | None = None,
        breaker_failures: int = DEFAULT_BREAKER_FAILURES,
        breaker_window_s: float = DEFAULT_BREAKER_WINDOW_S,
    ) -> None:
        self.model = model
        self.api_base = api_base
        self.decoding = decoding
        self.timeout_s = timeout_s
        self.max_retries = max(0, int(max_retries))
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        if transport is None:
            use_direct = is_openai_compatible_url(model, api_base) if direct is None else bool(direct)
            transport = "aiohttp" if use_direct else "litellm"
        if isinstance(transport, str):
            kind = TRANSPORTS.get(transport)
            if kind is None:
                raise ValueError(f"unknown transport {transport!r}; known: {', '.join(TRANSPORTS)}")
            # Servers given by URL often need no key, but litellm and openai insist on one being set: use
            # OPENAI_API_KEY when present, else a placeholder. Without a URL the provider's own env var is used.
            if api_key is None and (api_base is not None or kind.openai_compatible):
                api_key = os.environ.get("OPENAI_API_KEY") or "sk-no-key"
            urls = list(api_bases) if api_bases and len(api_bases) > 1 else [api_base]
            made = [kind(Endpoint(model, url, api_key, timeout_s, decoding, action_grammar)) for url in urls]
            if len(made) == 1:
                transport = made[0]
            else:  # several endpoints serving the model: calls spread over them (uqh/harness/model/endpoints.py)
                from uqh.harness.model.endpoints import EndpointPool

                transport = EndpointPool(urls, made, capacity=endpoint_capacity)
        elif api_bases and len(api_bases) > 1:
            raise ValueError("several api_bases need a built-in transport (one is made per endpoint)")
        self.transport: Transport = transport
        self._api_key = api_key
        self._warned_no_logprobs = False
        #: Set once any call got through to the endpoint: before that, a refused connection or a failed DNS
        #: lookup is a wrong address or a server that is not up (fail fast); after it, a transient hiccup.
        self._reached = False
        #: Shared by every call of this client: trips when all its endpoints keep failing (breaker.py).
        self.breaker = CircuitBreaker(breaker_failures, breaker_window_s)

    # ---------------------------------------------------------------- public

    def endpoint_counts(self) -> list:
        """Per-endpoint request counts (:class:`uqh.harness.model.endpoints.EndpointCounts`) when the client spreads its
        calls over several endpoints; empty for one endpoint (the run's call counts say it all)."""
        counts = getattr(self.transport, "counts", None)
        return counts() if callable(counts) else []

    def _redact(self, text: str) -> str:
        """Error texts end up in logs and run summaries: never with the API key (nor any other known secret) in
        them."""
        return redact(text, [self._api_key])

    def backoff_s(self, failures: int, exc: BaseException | None = None) -> float:
        """Seconds to wait after the ``failures``-th failure: exponential with jitter, at least Retry-After.

        ``min(max, initial * 2**(failures-1)) + U(0, initial)``, raised to the server's Retry-After (capped at max).
        """
        backoff = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (failures - 1))
        backoff += random.uniform(0, self.backoff_initial_s)
        ra = _retry_after_s(exc) if exc is not None else None
        if ra is not None:
            backoff = max(backoff, min(ra, self.backoff_max_s))
        return backoff

    async def complete(self, messages: list[dict], *, seed: int | None = None,
                       tools: list[dict] | None = None) -> Completion:
        """One chat completion with retries; raises ModelCallFailed (:meth:`_failure`) when it cannot succeed."""
        from tenacity import AsyncRetrying, RetryError, retry_if_exception, stop_after_attempt

        seed = self.decoding.seed if seed is None else seed
        send = self._sender(tools)
        t0 = time.perf_counter()
        attempts = 0

        def _wait(state: Any) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return self.backoff_s(state.attempt_number, exc)

        def _before_sleep(state: Any) -> None:
            exc = state.outcome.exception()
            log.info(
                "%s: transient failure (%s); retry %d/%d",
                self.model, self._redact(error_line(exc, self.timeout_s)), state.attempt_number, self.max_retries,
            )

        unreachable: str | None = None
        breaker = self.breaker
        null_answers = 0
        if breaker.open:  # tripped by another call of this client: do not knock again
            raise EndpointsDown(self._redact(f"{self.model}: {breaker.reason()}"), retries=0)

        def _retry(exc: BaseException) -> bool:
            nonlocal unreachable
            if not self._reached:
                unreachable = unreachable_reason(exc)
                if unreachable is not None:
                    return False
                if _status_of(exc) is not None or isinstance(exc, (MalformedResponse, json.JSONDecodeError)):
                    self._reached = True  # the endpoint answered (an HTTP error is an answer): the address is right
            if not is_transient(exc):
                return False
            breaker.failure(error_line(exc, self.timeout_s))
            return not breaker.open

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=_wait,
            retry=retry_if_exception(_retry),
            before_sleep=_before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    resp = await send(messages, seed)
                    self._reached = True
                    _check_response(resp)
                    try:
                        _check_content(resp)
                    except NullContent:
                        null_answers += 1
                        raise
                    breaker.success()
        except RetryError as exc:  # pragma: no cover - reraise=True hands back the last exception instead
            raise ModelCallFailed(f"{self.model}: {attempts} attempts failed", retries=attempts - 1) from exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - everything else is a failed call
            failure = self._failure(exc, attempts, unreachable)
            raise failure from (None if isinstance(failure, (EndpointUnreachable, EndpointsDown)) else exc)
        latency = time.perf_counter() - t0
        if latency >= SLOW_CALL_S:
            log.info("%s: slow call: %.1f s (%d retries)", self.model, latency, attempts - 1)
        return self._to_completion(resp, retries=attempts - 1, latency_s=latency, seed=seed,
                                   null_answers=null_answers)

    def _failure(self, exc: BaseException, attempts: int, unreachable: str | None) -> ModelCallFailed:
        """What a call that failed for good raises: the endpoint unreachable (no retry), every endpoint down (the
        breaker), or the call failed with its last error."""
        if unreachable is not None:
            urls = getattr(self.transport, "urls", None)
            where = f"any of {', '.join(urls)}" if urls else self.api_base or "the provider"
            return EndpointUnreachable(self._redact(f"{self.model}: cannot reach {where}: {unreachable}"), retries=0)
        if self.breaker.open:
            return EndpointsDown(self._redact(f"{self.model}: {self.breaker.reason()}"), retries=attempts - 1)
        short = error_line(exc, self.timeout_s)
        if is_transient(exc):
            msg = f"{self.model}: call failed after {attempts} attempts ({attempts - 1} retries); last error: {short}"
        else:
            msg = f"{self.model}: call failed (not retryable): {short}"
        return ModelCallFailed(self._redact(msg), retries=attempts - 1)

    def _sender(self, tools: list[dict] | None) -> Any:
        """The transport's ``send``, given the request's tools when it offers some (only then: a custom transport
        that never serves such runs may not take the argument)."""
        return functools.partial(self.transport.send, tools=tools) if tools else self.transport.send

    def _to_completion(self, resp: Any, *, retries: int, latency_s: float, seed: int | None,
                       null_answers: int = 0) -> Completion:
        choice = _get(resp, "choices")[0]  # shape checked by _check_response
        message = _get(choice, "message")
        tokens = convert_logprobs(_get(choice, "logprobs"), self.decoding.top_logprobs) if self.decoding.logprobs else None
        tool_calls = tool_calls_of(message)
        if self.decoding.logprobs and tokens is None:
            text_so_far = _get(message, "content") or ""
            if text_so_far or _reasoning_of(message) or tool_calls:
                self._warn_no_logprobs()
            else:
                tokens = []  # an empty completion has no tokens to score; nothing is missing
        content = _get(message, "content")
        text = rebuild_text(content, _reasoning_of(message), tokens)
        usage = _usage_of(resp)
        record = CallRecord(
            model=self.model,
            usage=usage,
            cost_usd=_provider_cost(resp) if _provider_cost(resp) is not None else cost_usd(self.model, usage),
            latency_s=latency_s,
            retries=retries,
            finish_reason=_get(choice, "finish_reason"),
            seed=seed if getattr(self.transport, "sends_seed", True) else None,  # recorded only if sent
            has_logprobs=tokens is not None,
            content_null=(content is None and not tool_calls) or null_answers > 0,
        )
        return Completion(text=text, tokens=tokens, call=record, tool_calls=tool_calls)

    def _warn_no_logprobs(self) -> None:
        if not self._warned_no_logprobs:
            self._warned_no_logprobs = True
            log.warning(
                "%s: the provider returned no token logprobs; such calls are recorded with logprobs null "
                "(has_logprobs=false), and logprob-based predictors will be missing for them",
                self.model,
            )

    async def aclose(self) -> None:
        """Close the transport's HTTP clients (those bound to another, finished, event loop are dropped)."""
        await self.transport.aclose()


def make_model_client(model: str, **options: Any) -> ModelClientImpl:
    """Build the client for a litellm model string (``openai/NAME`` + ``api_base`` for any OpenAI-compatible URL);
    ``options`` are :class:`ModelClientImpl`'s (``api_base`` and ``decoding`` required). A ``local:`` model must
    be resolved (started) first."""
    if model.startswith("local:"):
        raise ValueError(f"{model!r} must be resolved first: use uqh.harness.model.llama_server.resolve_model()")
    return ModelClientImpl(model, **options)
