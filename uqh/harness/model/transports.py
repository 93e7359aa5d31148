"""How one chat-completion request reaches a provider: the :class:`Transport` protocol and its implementations.

A transport sends one request and hands back the parsed response (a dict, or an SDK object with the OpenAI
chat-completion shape) or raises; it neither retries nor interprets the answer. Retries, response checks, logprob
conversion and accounting are the client's (:class:`uqh.harness.model.client.ModelClientImpl`), the same for every
transport, so a new transport is one class with ``send`` and ``aclose`` (pass an instance as the client's
``transport``). The built-in ones, chosen by name once when a client is made:

- ``litellm``: ``litellm.acompletion``, for every provider litellm knows;
- ``aiohttp`` (the *direct* path): one JSON POST over a pooled ``aiohttp`` session to an OpenAI-compatible URL,
  parsed with ``json.loads`` (a fraction of litellm's CPU per call; needs neither litellm nor openai imported);
- ``openai``: the ``openai.AsyncOpenAI`` SDK against an OpenAI-compatible URL (kept for comparison).

All three send the same request body, built once per client from the :class:`~uqh.rundir.schema.DecodingConfig`
(:func:`request_params`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Protocol

from uqh.prompts import PROMPTS_DIR
from uqh.rundir.schema import DecodingConfig
from uqh.rundir.secrets import redact

log = logging.getLogger(__name__)

GRAMMAR_PATH = PROMPTS_DIR / "four_tags.gbnf"


class Transport(Protocol):
    """Sends one chat-completion request; returns the parsed response or raises (the client retries).

    ``tools`` (OpenAI function schemas, sent with ``tool_choice="auto"`` as tau2's agent sends them) is passed only
    when a request offers tools (``uqh run --agent tools``), so a transport that never serves such runs may leave
    the parameter out."""

    async def send(self, messages: list[dict], seed: int | None, tools: list[dict] | None = None) -> Any: ...

    async def aclose(self) -> None: ...


class HTTPStatusFailure(Exception):
    """A non-2xx answer on the direct path (status and Retry-After kept for the retry policy)."""

    def __init__(self, status_code: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.retry_after = retry_after


@lru_cache(maxsize=16)
def grammar_text(action_rule: str | None = None) -> str:
    """The llama.cpp GBNF grammar forcing the four-tag shape (``uqh/prompts/four_tags.gbnf``).

    ``action_rule`` (a domain's ``action_gbnf``) replaces the generic free-text ``action`` rule.
    """
    text = GRAMMAR_PATH.read_text()
    if action_rule is None:
        return text
    lines = [f"action      ::= {action_rule}" if line.startswith("action ") else line for line in text.splitlines()]
    return "\n".join(lines) + "\n"


def request_params(
    model: str,
    api_base: str | None,
    decoding: DecodingConfig,
    *,
    action_grammar: str | None = None,
    reasoning_effort: bool = False,
) -> dict[str, Any]:
    """The decoding parameters every request carries (the per-call seed is added by the transport).

    ``extra_body`` holds what is not an OpenAI parameter: the GBNF ``grammar`` and OpenRouter's
    ``reasoning={"enabled": true}`` switch (for ``openrouter/*`` models and OpenAI-compatible URLs). Elsewhere a
    transport that can translate it (``reasoning_effort=True``: litellm) asks for ``reasoning_effort="medium"``.
    """
    kw: dict[str, Any] = {"temperature": decoding.temperature, "top_p": decoding.top_p}
    if decoding.max_tokens is not None:
        kw["max_tokens"] = decoding.max_tokens
    if decoding.logprobs:
        kw["logprobs"] = True
        kw["top_logprobs"] = decoding.top_logprobs
    extra_body: dict[str, Any] = {}
    if decoding.grammar:
        extra_body["grammar"] = grammar_text(action_grammar)
    if decoding.reasoning:
        if model.startswith("openrouter/") or api_base is not None:
            extra_body["reasoning"] = {"enabled": True}
        elif reasoning_effort:
            kw["reasoning_effort"] = "medium"
    if extra_body:
        kw["extra_body"] = extra_body
    return kw


@dataclass(frozen=True)
class Endpoint:
    """What a built-in transport is made from: where requests go and what they carry."""

    model: str  # the litellm model string (``openai/NAME`` for the OpenAI-compatible transports)
    api_base: str | None
    api_key: str | None
    timeout_s: float
    decoding: DecodingConfig
    action_grammar: str | None = None


class _PerLoop:
    """HTTP clients are bound to the event loop they were first used on: one per loop."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}

    def get(self) -> Any:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            entry = (loop, self._make())
            self._clients[id(loop)] = entry
        return entry[1]

    async def aclose(self) -> None:
        """Close the clients of the running loop; those bound to another (finished) loop are dropped."""
        clients, self._clients = self._clients, {}
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, client in clients.values():
            if loop is not current:
                continue
            try:
                await client.close()
            except Exception:  # noqa: BLE001
                pass


#: litellm providers that serve Claude models and cache a prompt only where ``cache_control`` marks it (OpenAI,
#: DeepSeek, Gemini 2.5 and most OpenRouter routes cache automatically, with nothing to mark).
CACHE_CONTROL_PROVIDERS = frozenset({"anthropic", "bedrock", "vertex_ai", "azure_ai", "openrouter"})
#: Where the marks go (litellm's ``cache_control_injection_points``): the system prompt, shared by every call of a
#: run, and the last message, so each call caches its whole conversation and the next call of the episode -- or
#: every other branch of a prefix, whose first request is byte-identical -- reads it back. 2 of the 4 breakpoints
#: Anthropic allows.
CACHE_CONTROL_POINTS = ({"location": "message", "role": "system"}, {"location": "message", "index": -1})
#: Request parameters a provider may reject outright (litellm raises UnsupportedParamsError for them).
_OPTIONAL_PARAMS = ("seed", "logprobs", "top_logprobs", "reasoning_effort")


def needs_cache_control(model: str) -> bool:
    """Whether prompt caching for ``model`` needs explicit ``cache_control`` marks (Claude models)."""
    import litellm

    try:
        provider = litellm.get_llm_provider(model)[1]
    except Exception:  # noqa: BLE001 - an unroutable model fails on its first call, not here
        return False
    return provider in CACHE_CONTROL_PROVIDERS and "claude" in model.lower()


def unsupported_params(model: str, params: Any) -> list[str]:
    """The keys of ``params`` (plus ``seed``) that litellm says ``model``'s provider does not accept."""
    import litellm

    try:
        supported = litellm.get_supported_openai_params(model=model)
    except Exception:  # noqa: BLE001
        return []
    if supported is None:
        return []
    wanted = set(params) | {"seed"}
    return [k for k in _OPTIONAL_PARAMS if k in wanted and k not in supported]


#: litellm's loggers: each comes with its own handler that prints DEBUG records (full prompts) to stdout.
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


def route_litellm_logging() -> None:
    """litellm's records go through uqh's logging (stderr, ``uqh -v``) instead of its own stdout handler, at the
    level the user chose in ``LITELLM_LOG`` (default WARNING: its DEBUG lines carry whole prompts)."""
    chosen = os.environ.get("LITELLM_LOG", "").strip().upper()
    level = logging.getLevelName(chosen) if chosen else logging.WARNING
    for name in LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.setLevel(level if isinstance(level, int) else logging.WARNING)
        logger.propagate = True


class LitellmTransport:
    """``litellm.acompletion`` (litellm's own retries off: the client retries).

    For Claude models it marks the prompt for caching (:data:`CACHE_CONTROL_POINTS`); parameters the provider
    rejects (e.g. Anthropic: ``seed``, ``logprobs``) are not sent, with one warning naming them.
    """

    name: ClassVar[str] = "litellm"
    #: Talks to an OpenAI-compatible URL only (needs ``openai/NAME`` and always a key).
    openai_compatible: ClassVar[bool] = False

    def __init__(self, endpoint: Endpoint) -> None:
        route_litellm_logging()  # before the import too: litellm logs while it is imported
        import litellm  # imported only when used: the direct path does without it (a multi-second import)

        litellm.suppress_debug_info = True
        route_litellm_logging()
        self.endpoint = endpoint
        kw = request_params(endpoint.model, endpoint.api_base, endpoint.decoding,
                            action_grammar=endpoint.action_grammar, reasoning_effort=True)
        if endpoint.api_base is not None:
            kw["api_base"] = endpoint.api_base
        if endpoint.api_key is not None:
            kw["api_key"] = endpoint.api_key
        self._dropped = unsupported_params(endpoint.model, kw)
        for key in self._dropped:
            kw.pop(key, None)
        if self._dropped:
            log.warning("%s: the provider does not accept %s; not sent (its calls are recorded without a seed "
                        "or logprobs where those are the ones missing)", endpoint.model, ", ".join(self._dropped))
        self.sends_seed = "seed" not in self._dropped
        if needs_cache_control(endpoint.model):
            kw["cache_control_injection_points"] = [dict(p) for p in CACHE_CONTROL_POINTS]
        self._kwargs = kw

    async def send(self, messages: list[dict], seed: int | None, tools: list[dict] | None = None) -> Any:
        import litellm

        kw = dict(self._kwargs)
        if seed is not None and self.sends_seed:
            kw["seed"] = seed
        if tools:
            kw.update(tools=tools, tool_choice="auto")
        return await litellm.acompletion(
            model=self.endpoint.model, messages=messages, timeout=self.endpoint.timeout_s, num_retries=0,
            max_retries=0, **kw,
        )

    async def aclose(self) -> None:
        pass


def _served_name(model: str) -> str:
    if not model.startswith("openai/"):
        raise ValueError(f"the direct path needs an OpenAI-compatible model string 'openai/NAME', got {model!r}")
    return model.split("/", 1)[1]


class AiohttpTransport:
    """The direct path: one JSON POST per call over a pooled ``aiohttp`` session; ``json.loads`` of the body."""

    name: ClassVar[str] = "aiohttp"
    openai_compatible: ClassVar[bool] = True

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        kw = request_params(endpoint.model, endpoint.api_base, endpoint.decoding,
                            action_grammar=endpoint.action_grammar)
        extra = kw.pop("extra_body", None) or {}
        self._name = _served_name(endpoint.model)
        self._params = {**kw, **extra}  # the body has no extra_body: its keys are top-level fields
        self._url = (endpoint.api_base or "https://api.openai.com/v1").rstrip("/") + "/chat/completions"
        self._sessions = _PerLoop(self._make_session)

    def _make_session(self) -> Any:
        import aiohttp

        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=self.endpoint.timeout_s),
            headers={"Authorization": f"Bearer {self.endpoint.api_key}", "Content-Type": "application/json"},
            json_serialize=json.dumps,
        )

    async def send(self, messages: list[dict], seed: int | None, tools: list[dict] | None = None) -> Any:
        body = {"model": self._name, "messages": messages, **self._params}
        if seed is not None:
            body["seed"] = seed
        if tools:
            body.update(tools=tools, tool_choice="auto")
        session = self._sessions.get()
        async with session.post(self._url, data=json.dumps(body)) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                retry_after = resp.headers.get("Retry-After")
                try:
                    retry_after_s = float(retry_after) if retry_after is not None else None
                except ValueError:
                    retry_after_s = None
                raise HTTPStatusFailure(resp.status, error_text(raw, resp.reason), retry_after_s)
        return json.loads(raw)  # a truncated body raises JSONDecodeError: transient

    async def aclose(self) -> None:
        await self._sessions.aclose()


def error_text(raw: bytes, reason: str | None, secrets: tuple[str | None, ...] = ()) -> str:
    """What an HTTP error body says: its OpenAI-style ``error.message``, else the body redacted then cut to 200
    characters (redacted first, so no key straddles the cut), else the status line's reason."""
    try:
        err = json.loads(raw).get("error") or {}
        message = err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = None
    return message or redact(raw.decode(errors="replace"), [k for k in secrets if k])[:200] or reason or ""


class OpenAITransport:
    """The ``openai.AsyncOpenAI`` SDK against an OpenAI-compatible URL (its own retries off)."""

    name: ClassVar[str] = "openai"
    openai_compatible: ClassVar[bool] = True

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._name = _served_name(endpoint.model)
        self._kwargs = request_params(endpoint.model, endpoint.api_base, endpoint.decoding,
                                      action_grammar=endpoint.action_grammar)
        self._clients = _PerLoop(self._make_client)

    def _make_client(self) -> Any:
        import openai

        e = self.endpoint
        return openai.AsyncOpenAI(base_url=e.api_base, api_key=e.api_key, max_retries=0, timeout=e.timeout_s)

    async def send(self, messages: list[dict], seed: int | None, tools: list[dict] | None = None) -> Any:
        kw = dict(self._kwargs)
        if seed is not None:
            kw["seed"] = seed
        if tools:
            kw.update(tools=tools, tool_choice="auto")
        return await self._clients.get().chat.completions.create(model=self._name, messages=messages, **kw)

    async def aclose(self) -> None:
        await self._clients.aclose()


#: The built-in transports by name (``make_model_client(..., transport=NAME)``).
TRANSPORTS: Mapping[str, type[LitellmTransport] | type[AiohttpTransport] | type[OpenAITransport]] = {
    t.name: t for t in (LitellmTransport, AiohttpTransport, OpenAITransport)
}
