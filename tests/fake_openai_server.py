"""A fake OpenAI-compatible chat-completions server for tests and benchmarks.

The harness must not know it is fake: responses are real ``chat.completion`` JSON, with
``logprobs.content[].{token, logprob, bytes, top_logprobs}`` whose tokens join back exactly to the text.

Use in a test (or through the ``fake_server`` fixture in ``tests/conftest.py``)::

    with FakeOpenAIServer(lambda req: "<think>hi</think>...", faults=["429"]) as srv:
        client = make_model_client("openai/fake", api_base=srv.base_url, ...)
        ...
        assert srv.requests[0]["seed"] == 42

Or from another process (benchmarks, signal tests)::

    python tests/fake_openai_server.py --port 0 --latency 0.2      # prints "READY http://127.0.0.1:PORT/v1"

(``--request-log FILE`` appends the arrival time of every chat request to FILE; ``--ignore-sigterm`` makes it
ignore SIGTERM, as a llama.cpp server busy with a generation does.)

Logprobs are deterministic functions of the token text, so tests can compute them by hand
(:func:`chosen_probability`, :func:`top_logprobs_for`):

- the chosen token has probability ``p = 0.5 + 0.1 * (len(token) % 5)`` (0.5 .. 0.9), rank 0;
- the four alternatives get ``(1 - p) * 0.5**i`` for ``i = 1..4``, in descending order, drawn from a small
  vocabulary (:data:`ALT_VOCAB`) skipping the chosen token.

Faults (consumed one per request, in order, before normal service):
``"429"`` (Retry-After: 0), ``"500"``, ``"503"``, ``"400"``, ``"401"``, ``"404"``, ``"timeout"`` (sleeps
``timeout_sleep_s`` before answering), ``"malformed"`` (HTTP 200 with a truncated JSON body), ``"reset"``
(the connection is aborted without a response), ``"no_logprobs"`` (a normal answer without a logprobs field),
``"error_200"`` (HTTP 200 whose body is ``{"error": {"code": 502, ...}}``, as some gateways do),
``"no_choices"`` (HTTP 200, a chat.completion with an empty ``choices`` list) and ``"null_content"`` (HTTP 200,
a completion whose message content is null, finish_reason ``content_filter``) and ``"echo_key"`` (HTTP 500
whose error message echoes the request's Authorization header after ``echo_padding`` characters, as careless
gateways do: with the default padding the key straddles a 300-character cut).

Prompt caching (``prompt_cache=True``): the server remembers every message-boundary prefix of the requests it
served and reports, OpenAI-style, ``usage.prompt_tokens_details.cached_tokens`` = the prompt tokens of the longest
remembered prefix of the request (automatic prefix caching, as OpenAI, DeepSeek and OpenRouter do it).

``POST /v1/messages`` answers in the Anthropic Messages format (what litellm's ``anthropic/...`` models send
when given this server's root URL as ``api_base``; no logprobs, as Anthropic has none). Its cache works the
Anthropic way whether or not ``prompt_cache`` is set: only prefixes ending at a ``cache_control`` block are
cached; ``usage`` reports ``cache_read_input_tokens`` (the longest marked prefix cached before),
``cache_creation_input_tokens`` (up to the last mark, when not cached yet) and ``input_tokens`` (the rest). The
responder sees the request converted to the chat shape (system + messages, text only).

A responder may return ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` instead of text: the answer is then
an OpenAI function call (content and logprobs null), what tau2's own LLM agent expects. Optional keys: ``"content"``
(text sent along with the calls), ``"logprobs": True`` (token logprobs of the generated call text when the request
asks for them, as llama.cpp's server returns them) and a call's ``"id"``; ``"arguments"`` given as a string is sent
verbatim (malformed JSON included). The CLI's ``--tool-calls`` serves every request with calls of the first tool the
request offers (:func:`offered_tool_call`).

With ``scripted_logprobs={token: [(alt, logprob), ...]}`` every generated token equal to a key gets exactly those
alternatives (its own logprob is its entry in the list, else the first), so a test can serve, e.g., an answer
token whose top alternatives include both ``Yes`` and ``No`` with chosen probabilities.

``POST /v1/completions`` (legacy text completions) serves teacher-forced scoring: with ``echo`` and ``logprobs``
it returns the prompt's tokens with ``token_logprobs`` (null for the first, as OpenAI does), ``top_logprobs`` (one
dict per position) and ``text_offset``, by the same rules as chat tokens (scripted tokens included), then one
generated token `` fake`` when ``max_tokens`` >= 1. The prompt is first split at newlines (``"\n"`` is a token of
its own, as in GPT-2-style BPE), so a line's first word never carries the newline before it. With ``completions_echo=False`` an echo request
gets HTTP 500 "Only no echo is supported", what llama.cpp's llama-server answers. Its requests are recorded in
``completion_requests``.

A chat request whose ``grammar`` (llama.cpp GBNF) is one string literal, ``root ::= "..."``, is answered with that
literal's text, as llama-server's constrained decoding would (its escapes decoded as llama.cpp's grammar parser
does: :func:`gbnf_literal_text`); the logprobs follow the usual rules. ``honour_grammar=False`` serves the
responder's text instead, as a server that ignores the field.

With ``quirky_top_logprobs=True`` every position lists 6 alternatives including a duplicate string and
``bytes: null`` -- the shape llama-cpp-python returns -- so clients' normalisation can be tested end to end.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import re
import socket
import sys
import threading
import time
from functools import lru_cache
from typing import Any, Callable, Iterable

from aiohttp import web

DEFAULT_TEXT = (
    "<think>The question is simple; I can answer directly.</think>\n"
    "<action>finish[42]</action>\n"
    "<confidence>0.8</confidence>\n"
    "<explanation>Direct arithmetic.</explanation>"
)

FAULTS = (
    "429", "500", "503", "400", "401", "404", "timeout", "malformed", "reset", "no_logprobs", "error_200", "no_choices",
    "null_content", "echo_key",
)

ALT_VOCAB = (" the", ",", " a", ".", " and", "\n", " of", " to", "<", ">", " is", "0")

_TOKEN_RE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")

Responder = Callable[[dict], str | dict] | str | list[str | dict] | None  # a dict: tool calls (see above)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into tokens (leading whitespace attached to the next word/punctuation); joins back exactly."""
    tokens = _TOKEN_RE.findall(text)
    assert "".join(tokens) == text
    return tokens


def echo_tokens(prompt: str) -> list[str]:
    """The tokens of a /v1/completions prompt: :func:`tokenize` of each line, every ``"\n"`` a token of its own."""
    out: list[str] = []
    for piece in re.split(r"(\n)", prompt):
        out += [piece] if piece == "\n" else tokenize(piece) if piece else []
    return out


_GBNF_LITERAL_RE = re.compile(r'\s*root\s*::=\s*"((?:[^"\\]|\\.)*)"\s*', re.DOTALL)
_GBNF_SIMPLE_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_GBNF_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


def gbnf_literal_text(grammar: str) -> str | None:
    """The text of a grammar ``root ::= "..."`` (one string literal), or None for any other grammar."""
    m = _GBNF_LITERAL_RE.fullmatch(grammar)
    if m is None:
        return None
    body, out, i = m.group(1), [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        kind = body[i + 1]
        if kind in _GBNF_HEX_DIGITS:
            n = _GBNF_HEX_DIGITS[kind]
            out.append(chr(int(body[i + 2:i + 2 + n], 16)))
            i += 2 + n
        else:
            out.append(_GBNF_SIMPLE_ESCAPES[kind])  # anything else is an error, as in llama.cpp
            i += 2
    return "".join(out)


def chosen_probability(token: str) -> float:
    """Probability given to the generated token: ``0.5 + 0.1 * (len(token) % 5)``."""
    return 0.5 + 0.1 * (len(token) % 5)


def top_logprobs_for(token: str) -> list[tuple[str, float]]:
    """The five (token, logprob) alternatives at a position whose generated token is ``token``, descending."""
    p = chosen_probability(token)
    alts = [a for a in ALT_VOCAB if a != token]
    start = len(token) % len(alts)
    picked = [alts[(start + i) % len(alts)] for i in range(4)]
    out = [(token, math.log(p))]
    out += [(a, math.log((1.0 - p) * 0.5**i)) for i, a in enumerate(picked, start=1)]
    return out


def _bytes(s: str) -> list[int]:
    return list(s.encode("utf-8"))


@lru_cache(maxsize=4096)
def _logprob_entry(token: str, quirky: bool) -> dict:
    tops = top_logprobs_for(token)
    if quirky:
        # llama-cpp-python: 6 entries, a duplicate string, bytes null.
        entries = [{"token": t, "logprob": lp, "bytes": None} for t, lp in tops]
        entries.insert(2, {"token": tops[1][0], "logprob": tops[1][1] - 0.5, "bytes": None})
        entries.append({"token": "~", "logprob": tops[-1][1] - 1.0, "bytes": None})
        return {"token": token, "logprob": tops[0][1], "bytes": None, "top_logprobs": entries}
    return {
        "token": token,
        "logprob": tops[0][1],
        "bytes": _bytes(token),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": _bytes(t)} for t, lp in tops],
    }


@lru_cache(maxsize=8192)
def _count_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


def count_prompt_tokens(messages: Iterable[dict]) -> int:
    """Prompt tokens of a request: the tokens of every message's text, newline-joined (cached per message)."""
    parts = []
    for m in messages or ():
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(p.get("text", "") for p in c if isinstance(p, dict))
    if not parts:
        return 0
    # Equal to the token count of the newline-joined text (exact unless a message is only whitespace), computed
    # from cached per-message counts plus what changes at each boundary, so long conversations stay cheap.
    return _count_tokens("\n".join(parts)) if len(parts) < 3 else sum(_count_tokens(p) for p in parts) + _joins(parts)


def _joins(parts: list[str]) -> int:
    # Tokens created or merged at the boundaries when parts are joined with "\n" (exactness for tests).
    total = 0
    for a, b in zip(parts, parts[1:]):
        total += _count_tokens(a[-1:] + "\n" + b[:1]) - _count_tokens(a[-1:]) - _count_tokens(b[:1]) if a and b else 0
    return total


@lru_cache(maxsize=1024)
def _completion_parts(text: str, max_tokens: int | None) -> tuple[str, tuple[str, ...], str]:
    tokens = tokenize(text)
    finish = "stop"
    if max_tokens is not None and len(tokens) > max_tokens:
        tokens = tokens[:max_tokens]
        finish = "length"
    return "".join(tokens), tuple(tokens), finish


def _scripted_entry(token: str, alternatives: tuple[tuple[str, float], ...]) -> dict:
    own = next((lp for t, lp in alternatives if t == token), alternatives[0][1])
    return {"token": token, "logprob": own, "bytes": _bytes(token),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": _bytes(t)} for t, lp in alternatives]}


@lru_cache(maxsize=1024)
def _choice_json(text: str, max_tokens: int | None, logprobs: bool, top_logprobs: int, quirky: bool,
                 scripted: tuple = ()) -> tuple[str, int]:
    content, tokens, finish = _completion_parts(text, max_tokens)
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": finish,
    }
    if logprobs:
        entries = []
        script = dict(scripted)
        for tok in tokens:
            if tok in script:
                entries.append(_scripted_entry(tok, script[tok]))
                continue
            e = _logprob_entry(tok, quirky)
            if not quirky:
                e = dict(e, top_logprobs=e["top_logprobs"][: max(0, top_logprobs)])
            entries.append(e)
        choice["logprobs"] = {"content": entries}
    else:
        choice["logprobs"] = None
    return json.dumps(choice), len(tokens)


def build_response_body(
    text: str,
    *,
    model: str,
    max_tokens: int | None,
    logprobs: bool,
    top_logprobs: int,
    quirky: bool,
    prompt_tokens: int,
    usage_cost: float | None = None,
    cached_tokens: int | None = None,
    scripted: tuple = (),
) -> bytes:
    """The exact JSON bytes the server sends for one completion (the expensive part is cached per text)."""
    choice, n_tokens = _choice_json(text, max_tokens, logprobs, top_logprobs, quirky, scripted)
    head = json.dumps(
        {
            "id": "chatcmpl-fake-%08x" % (hash((text, max_tokens)) & 0xFFFFFFFF),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_fake",
        }
    )
    usage_obj: dict[str, Any] = {
        "prompt_tokens": prompt_tokens, "completion_tokens": n_tokens, "total_tokens": prompt_tokens + n_tokens
    }
    if usage_cost is not None:  # OpenRouter reports the billed USD cost of each call in usage.cost
        usage_obj["cost"] = usage_cost
    if cached_tokens is not None:  # OpenAI-style prompt caching report
        usage_obj["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    usage = json.dumps(usage_obj)
    return f'{head[:-1]}, "choices": [{choice}], "usage": {usage}}}'.encode()


def build_tool_call_body(calls: list[dict], *, model: str, prompt_tokens: int, content: str | None = None,
                         logprobs: bool = False, top_logprobs: int = 0) -> bytes:
    """A chat.completion whose message is OpenAI function calls (``[{"name": ..., "arguments": {...}}]``, an
    ``"id"`` optional; ``arguments`` may be a string, sent as is), ``content`` null unless given, as OpenAI answers a
    tool call. With ``logprobs`` the generated text -- the content, then each call as ``{"name": ...,
    "arguments": ...}`` JSON, as a llama.cpp server generates it before parsing it into ``tool_calls`` -- comes with
    logprobs by the usual rules; without it ``logprobs`` is null (OpenAI's answer to a tool call)."""
    tool_calls = [{"id": c.get("id", f"call_fake_{i}"), "type": "function",
                   "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
                                else json.dumps(c["arguments"])}}
                  for i, c in enumerate(calls)]
    generated = (content or "") + "".join(
        json.dumps({"name": t["function"]["name"], "arguments": t["function"]["arguments"]}) for t in tool_calls)
    tokens = tokenize(generated)
    lp = {"content": [dict(_logprob_entry(t, False), top_logprobs=_logprob_entry(t, False)["top_logprobs"][
        : max(0, top_logprobs)]) for t in tokens]} if logprobs else None
    return json.dumps({
        "id": "chatcmpl-fake-tools", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
                     "logprobs": lp, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens) or 10,
                  "total_tokens": prompt_tokens + (len(tokens) or 10)},
    }).encode()


def _error_body(status: int, message: str, etype: str, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": etype, "param": None, "code": code}}).encode()


_FAULT_ERRORS = {
    "429": (429, "Rate limit reached for requests (fake).", "rate_limit_error", "rate_limit_exceeded"),
    "500": (500, "The server had an error while processing your request (fake).", "server_error", None),
    "503": (503, "The server is overloaded (fake).", "server_error", None),
    "400": (400, "Invalid request: 'messages' is malformed (fake).", "invalid_request_error", None),
    "401": (401, "Incorrect API key provided (fake).", "invalid_request_error", "invalid_api_key"),
    "404": (404, "The model does not exist (fake).", "invalid_request_error", "model_not_found"),
}


class FakeOpenAIServer:
    """An aiohttp OpenAI-compatible server on 127.0.0.1 in a background thread with its own event loop."""

    def __init__(
        self,
        responder: Responder = None,
        *,
        latency_s: float = 0.0,
        faults: list[str] | None = None,
        logprobs: bool = True,
        timeout_sleep_s: float = 3.0,
        quirky_top_logprobs: bool = False,
        port: int = 0,
        record_requests: bool = True,
        usage_cost: float | None = None,
        prompt_cache: bool = False,
        scripted_logprobs: dict[str, list[tuple[str, float]]] | None = None,
        echo_padding: int = 270,
        completions_echo: bool = True,
        honour_grammar: bool = True,
    ) -> None:
        for f in faults or ():
            if f not in FAULTS:
                raise ValueError(f"unknown fault {f!r}; known: {', '.join(FAULTS)}")
        self.responder = responder
        self.latency_s = latency_s
        # while set, a chat request it returns True for waits (re-checked every 10 ms) before it is answered:
        # tests freeze episodes at a chosen step, then release them by setting it back to None
        self.hold: Callable[[dict], bool] | None = None
        self.faults: list[str] = list(faults or [])
        self.logprobs = logprobs
        self.timeout_sleep_s = timeout_sleep_s
        self.quirky_top_logprobs = quirky_top_logprobs
        self.record_requests = record_requests
        self.usage_cost = usage_cost  # when set, every answer reports usage.cost (as OpenRouter does)
        self.prompt_cache = prompt_cache  # when set, answers report prompt_tokens_details.cached_tokens
        self.scripted_logprobs = tuple((tok, tuple(alts)) for tok, alts in (scripted_logprobs or {}).items())
        self._cached_prefixes: set[str] = set()  # keys of the message prefixes seen (chat) or marked (messages)
        self.echo_padding = echo_padding
        self.completions_echo = completions_echo
        self.honour_grammar = honour_grammar
        self.completion_requests: list[dict] = []  # bodies of /v1/completions requests
        self.requests: list[dict] = []
        self.faults_served: list[str] = []
        self.responder_errors: list[BaseException] = []  # exceptions raised by a callable responder
        self.n_requests = 0
        self.answered_at: list[float] = []  # wall-clock time of every completion served (benchmarks' clock)
        self.request_times: list[float] = []  # wall-clock arrival time of every chat request
        self.request_log: str | None = None  # a file to append each arrival time to (separate-process use)
        self.in_flight = 0  # chat requests being served now, and the most ever at once
        self.max_in_flight = 0
        self._list_index = 0
        self._port = port
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ----------------------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The server without ``/v1`` (litellm's ``anthropic/...`` models append ``/v1/messages`` to api_base)."""
        return self.base_url[: -len("/v1")]

    def start(self) -> "FakeOpenAIServer":
        if self._thread is not None:
            return self
        ready = threading.Event()
        errors: list[BaseException] = []

        def _run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=_run, name="fake-openai-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            self._thread = None
            raise errors[0]
        return self

    async def _start_site(self) -> None:
        app = self.make_app()
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------------------- serving

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_post("/v1/messages", self._anthropic_messages)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/models", self._models)
        app.router.add_get("/_answered", self._answered)
        return app

    async def _answered(self, request: web.Request) -> web.Response:
        """Not OpenAI: hand over (and forget) the times completions were served, for benchmarks."""
        with self._lock:
            times, self.answered_at = self.answered_at, []
        return web.json_response({"answered_at": times})

    async def _models(self, request: web.Request) -> web.Response:
        body = {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]}
        return web.json_response(body)

    def _next_text(self, body: dict, *, advance: bool = True) -> str:
        r = self.responder
        if r is None:
            return DEFAULT_TEXT
        if isinstance(r, str):
            return r
        if isinstance(r, (list, tuple)):
            with self._lock:
                i = min(self._list_index, len(r) - 1)
                if advance:
                    self._list_index += 1
            return r[i]
        text = r(body)
        if isinstance(text, (list, tuple)):  # a responder may hand back a script; serve it in order too
            self.responder = list(text)
            return self._next_text(body, advance=advance)
        return text

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1  # one event loop: no lock needed
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._serve_chat(request)
        finally:
            self.in_flight -= 1

    async def _serve_chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.time()
        self.request_times.append(arrived)
        if self.request_log:
            with open(self.request_log, "a") as f:
                f.write(f"{arrived:.6f}\n")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return web.Response(
                status=400,
                body=_error_body(400, "request body is not JSON", "invalid_request_error"),
                content_type="application/json",
            )
        with self._lock:
            self.n_requests += 1
            if self.record_requests:
                self.requests.append(body)
            fault = self.faults.pop(0) if self.faults else None
            if fault:
                self.faults_served.append(fault)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        while (hold := self.hold) is not None and hold(body):
            await asyncio.sleep(0.01)

        if fault in _FAULT_ERRORS:
            status, msg, etype, code = _FAULT_ERRORS[fault]
            headers = {"Retry-After": "0"} if fault == "429" else {}
            return web.Response(
                status=status, body=_error_body(status, msg, etype, code), content_type="application/json",
                headers=headers,
            )
        if fault == "echo_key":
            msg = "(fake) " + "x" * self.echo_padding + " rejected " + request.headers.get("Authorization", "")
            return web.Response(status=500, body=_error_body(500, msg, "server_error"), content_type="application/json")
        if fault == "error_200":
            body200 = {"error": {"message": "Upstream provider error (fake).", "code": 502, "metadata": {}}}
            return web.Response(body=json.dumps(body200).encode(), content_type="application/json")
        if fault == "no_choices":
            empty = {"id": "chatcmpl-fake-empty", "object": "chat.completion", "created": int(time.time()),
                     "model": str(body.get("model", "fake")), "choices": [], "usage": None}
            return web.Response(body=json.dumps(empty).encode(), content_type="application/json")
        if fault == "null_content":
            null = {"id": "chatcmpl-fake-null", "object": "chat.completion", "created": int(time.time()),
                    "model": str(body.get("model", "fake")),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": None}, "logprobs": None,
                                 "finish_reason": "content_filter"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}}
            return web.Response(body=json.dumps(null).encode(), content_type="application/json")
        if fault == "timeout":
            await asyncio.sleep(self.timeout_sleep_s)
        if fault == "reset":
            transport = request.transport
            if transport is not None:
                transport.abort()  # the client sees the connection drop; aiohttp then cancels this handler
            await asyncio.sleep(60)
            raise ConnectionResetError("fake server: connection reset")

        # A response the client never reads (timeout) or cannot parse (malformed) does not use up a scripted text.
        try:
            text = self._next_text(body, advance=fault not in ("timeout", "malformed"))
        except Exception as exc:  # noqa: BLE001 - a broken responder is a test bug: fail the call fast and loudly
            self.responder_errors.append(exc)
            msg = f"fake server responder raised {type(exc).__name__}: {exc}"
            return web.Response(
                status=400, body=_error_body(400, msg, "invalid_request_error"), content_type="application/json"
            )
        forced = gbnf_literal_text(str(body["grammar"])) if self.honour_grammar and body.get("grammar") else None
        if forced is not None:
            text = forced
        messages = body.get("messages", [])
        if isinstance(text, dict):  # a native tool call: no content and no token logprobs unless the script says
            payload = build_tool_call_body(
                text["tool_calls"], model=str(body.get("model", "fake")), prompt_tokens=count_prompt_tokens(messages),
                content=text.get("content"),
                logprobs=bool(text.get("logprobs")) and bool(body.get("logprobs")) and self.logprobs,
                top_logprobs=int(body.get("top_logprobs") or 0))
            self.answered_at.append(time.time())
            return web.Response(body=payload, content_type="application/json")
        cached = self._remember_prefixes(messages) if self.prompt_cache else None
        want_logprobs = bool(body.get("logprobs")) and self.logprobs and fault != "no_logprobs"
        top_n = body.get("top_logprobs")
        top_n = int(top_n) if top_n is not None else 0
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        payload = build_response_body(
            text,
            model=str(body.get("model", "fake")),
            max_tokens=int(max_tokens) if max_tokens is not None else None,
            logprobs=want_logprobs,
            top_logprobs=top_n,
            quirky=self.quirky_top_logprobs,
            prompt_tokens=count_prompt_tokens(messages),
            usage_cost=self.usage_cost,
            cached_tokens=cached,
            scripted=self.scripted_logprobs,
        )
        if fault == "malformed":
            payload = payload[: max(1, len(payload) // 2)]
        else:
            self.answered_at.append(time.time())
        return web.Response(body=payload, content_type="application/json")


    async def _completions(self, request: web.Request) -> web.Response:
        """Legacy text completions: only the teacher-forced echo of the prompt (no generation is served)."""
        body = json.loads(await request.read())
        with self._lock:
            self.n_requests += 1
            if self.record_requests:
                self.completion_requests.append(body)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if body.get("echo") and not self.completions_echo:
            return web.Response(status=500, body=_error_body(500, "Only no echo is supported", "server_error"),
                                content_type="application/json")
        prompt = str(body.get("prompt", ""))
        generated = [" fake"] if int(body.get("max_tokens") or 0) > 0 else []  # one token past the prompt
        tokens = (echo_tokens(prompt) if body.get("echo") else []) + generated
        choice: dict[str, Any] = {"index": 0, "text": "".join(tokens), "finish_reason": "length", "logprobs": None}
        if body.get("logprobs") is not None and self.logprobs:
            script = dict(self.scripted_logprobs)
            lps, tops, offsets, at = [], [], [], 0
            for i, tok in enumerate(tokens):
                alts = list(script[tok]) if tok in script else top_logprobs_for(tok)[: max(1, int(body["logprobs"]))]
                own = next((lp for t, lp in alts if t == tok), alts[0][1]) if tok in script else math.log(
                    chosen_probability(tok))
                lps.append(None if i == 0 else own)
                tops.append(None if i == 0 else {t: lp for t, lp in alts})
                offsets.append(at)
                at += len(tok)
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
        out = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()),
               "model": str(body.get("model", "fake")), "choices": [choice],
               "usage": {"prompt_tokens": len(tokens), "completion_tokens": 0, "total_tokens": len(tokens)}}
        return web.Response(body=json.dumps(out).encode(), content_type="application/json")

    # ----------------------------------------------------------------------------- prompt caching

    def _remember_prefixes(self, messages: list[dict]) -> int:
        """Automatic prefix caching: the prompt tokens of the longest message prefix served before; then remember
        every prefix of this request."""
        keys = _prefix_keys(messages)
        with self._lock:
            hit = max((j for j, k in enumerate(keys, start=1) if k in self._cached_prefixes), default=0)
            self._cached_prefixes.update(keys)
        return count_prompt_tokens(messages[:hit]) if hit else 0

    async def _anthropic_messages(self, request: web.Request) -> web.Response:
        """The Anthropic Messages API (text only), with Anthropic's explicit prompt cache."""
        body = json.loads(await request.read())
        with self._lock:
            self.n_requests += 1
            if self.record_requests:
                self.requests.append(body)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        blocks = _anthropic_blocks(body)  # [(role, text, marked)]
        chat = [{"role": "system", "content": "".join(t for r, t, _ in blocks if r == "system")}] if any(
            r == "system" for r, _, _ in blocks) else []
        for m in body.get("messages", []):
            c = m.get("content")
            chat.append({"role": m.get("role"), "content": c if isinstance(c, str) else "".join(
                p.get("text", "") for p in c if isinstance(p, dict))})
        try:
            text = self._next_text({"model": body.get("model"), "messages": chat, "seed": None})
        except Exception as exc:  # noqa: BLE001 - a broken responder is a test bug
            self.responder_errors.append(exc)
            return web.Response(status=400, body=_error_body(400, f"responder raised {exc}", "invalid_request_error"),
                                content_type="application/json")
        content, tokens, finish = _completion_parts(text, body.get("max_tokens"))
        keys = _prefix_keys([{"role": r, "content": t} for r, t, _ in blocks], api="messages")
        marks = [i for i, (_, _, marked) in enumerate(blocks) if marked]
        size = [count_prompt_tokens([{"content": t} for _, t, _ in blocks[: i + 1]]) for i in marks]
        total = count_prompt_tokens([{"content": t} for _, t, _ in blocks])
        with self._lock:
            read = max((n for i, n in zip(marks, size) if keys[i] in self._cached_prefixes), default=0)
            write = size[-1] - read if marks and keys[marks[-1]] not in self._cached_prefixes else 0
            self._cached_prefixes.update(keys[i] for i in marks)
        answer = {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": body.get("model"),
            "content": [{"type": "text", "text": content}],
            "stop_reason": "max_tokens" if finish == "length" else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": total - read - write, "output_tokens": len(tokens),
                      "cache_read_input_tokens": read, "cache_creation_input_tokens": write},
        }
        self.answered_at.append(time.time())
        return web.Response(body=json.dumps(answer).encode(), content_type="application/json")


def _prefix_keys(messages: list[dict], api: str = "chat") -> list[str]:
    """Key of every message prefix ``messages[:j]`` (j = 1..n): a running sha256 of the messages' JSON (one cache
    per ``api``)."""
    keys, h = [], hashlib.sha256(api.encode())
    for m in messages:
        h.update(json.dumps(m, sort_keys=True).encode())
        keys.append(h.copy().hexdigest())
    return keys


def _anthropic_blocks(body: dict) -> list[tuple[str, str, bool]]:
    """(role, text, has cache_control) of every text block: the system blocks, then each message's blocks."""
    out = []
    system = body.get("system")
    if isinstance(system, str):
        out.append(("system", system, False))
    for b in system if isinstance(system, list) else ():
        out.append(("system", b.get("text", ""), b.get("cache_control") is not None))
    for m in body.get("messages", []):
        c = m.get("content")
        if isinstance(c, str):
            out.append((m.get("role"), c, False))
            continue
        for b in c or ():
            out.append((m.get("role"), b.get("text", ""), b.get("cache_control") is not None))
    return out


def offered_tool_call(body: dict, confidence: float = 0.9, value: str = "42") -> dict | str:
    """An answer to a request that offers tools: a call of the last tool offered, every required argument set
    (``confidence`` to ``confidence``, numbers to 1, anything else to ``value``); DEFAULT_TEXT without tools."""
    tools = body.get("tools") or []
    if not tools:
        return DEFAULT_TEXT
    function = tools[-1]["function"]
    params = function.get("parameters") or {}
    args: dict[str, Any] = {}
    for name in params.get("required", []):
        kind = (params.get("properties", {}).get(name) or {}).get("type")
        args[name] = confidence if name == "confidence" else 1 if kind in ("number", "integer") else value
    return {"tool_calls": [{"name": function["name"], "arguments": args}]}


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Fake OpenAI-compatible server (tests/benchmarks).")
    p.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    p.add_argument("--latency", type=float, default=0.0, help="seconds of latency per request")
    p.add_argument("--text", default=None, help="completion text (default: a four-tag answer)")
    p.add_argument("--no-logprobs", action="store_true", help="never return logprobs")
    p.add_argument("--request-log", metavar="FILE", help="append the arrival time of every chat request to FILE")
    p.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM (only SIGKILL stops it)")
    p.add_argument("--tool-calls", type=float, metavar="CONFIDENCE", default=None,
                   help="answer a request that offers tools with a call of its last tool, confidence CONFIDENCE "
                        "(offered_tool_call)")
    args = p.parse_args(argv)
    if args.ignore_sigterm:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    responder: Responder = args.text
    if args.tool_calls is not None:
        responder = lambda body: offered_tool_call(body, args.tool_calls)  # noqa: E731
    srv = FakeOpenAIServer(
        responder, latency_s=args.latency, logprobs=not args.no_logprobs, port=args.port, record_requests=False
    )
    srv.request_log = args.request_log

    async def serve() -> None:
        runner = web.AppRunner(srv.make_app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", args.port))
        sock.listen(4096)
        site = web.SockSite(runner, sock)
        await site.start()
        port = sock.getsockname()[1]
        print(f"READY http://127.0.0.1:{port}/v1", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(_main())
