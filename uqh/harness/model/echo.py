"""Teacher-forced scoring through ``/v1/completions`` with ``echo``: a :class:`Transport` for the model client.

A conversation whose last message is the text to score (an observation) is rendered as one completion prompt in
agentuq's layout (``score-observation-uq``): every earlier message as a line ``ROLE: content``, then the marker line
``TARGET_OUTPUT:``, then the target text. The server is asked for one new token (``max_tokens`` 1: llama-cpp-python
reads 0 as "no limit"; the generated token is dropped), ``echo`` and
``logprobs``: it returns the log-probability of every prompt token given the tokens before it. The tokens that start
at or after the target's first character, and before the prompt's end, are handed back in the chat-completion shape (``message.content`` = their
text, ``logprobs.content`` = the tokens), so the client's retries, checks and accounting apply unchanged. Whether
they spell the target exactly (a token straddling the marker's newline would not) is the caller's check.

A server that refuses echo (llama.cpp's llama-server answers HTTP 500 "Only no echo is supported") or has no
``/completions`` route raises :class:`EchoUnsupported`, which the client does not retry: the caller falls back.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

from uqh.harness.model.transports import Endpoint, HTTPStatusFailure, error_text

TARGET_MARKER = "TARGET_OUTPUT:\n"
#: HTTP statuses that mean "no such endpoint or method here" rather than a passing failure.
NO_ROUTE_STATUS = frozenset({404, 405, 501})


class EchoUnsupported(Exception):
    """The endpoint does not serve ``/v1/completions`` with ``echo`` (not retryable: a fallback is needed)."""


def completion_prompt(messages: list[dict]) -> tuple[str, int]:
    """(prompt, character offset where the target -- the last message's content -- starts)."""
    *context, target = messages
    lines = [f"{m['role'].upper()}: {m.get('content') or ''}" for m in context]
    prefix = "".join(line + "\n" for line in lines) + TARGET_MARKER
    return prefix + (target.get("content") or ""), len(prefix)


def target_tokens(choice: dict, prompt: str, start: int) -> list[dict] | None:
    """The echoed tokens starting at or after ``start`` and inside ``prompt`` (a generated token after it is left
    out), chat-shaped; None when the server sent no logprobs.

    Offsets come from the server's ``text_offset``; a server without it gets offsets from the cumulative token
    texts (exact when the tokens join back to the prompt)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("tokens"), list):
        return None
    tokens = lp["tokens"]
    logprobs = lp.get("token_logprobs") or [None] * len(tokens)
    tops = lp.get("top_logprobs") or [None] * len(tokens)
    offsets = lp.get("text_offset")
    if not isinstance(offsets, list) or len(offsets) != len(tokens):
        offsets, at = [], 0
        for tok in tokens:
            offsets.append(at)
            at += len(tok)
    out = []
    for tok, off, lpv, top in zip(tokens, offsets, logprobs, tops):
        if not start <= off < len(prompt):
            continue
        alts = [{"token": t, "logprob": v} for t, v in top.items()] if isinstance(top, dict) else []
        out.append({"token": tok, "logprob": lpv, "top_logprobs": alts})
    return out


class EchoTransport:
    """``POST {api_base}/completions`` with ``echo``, ``logprobs`` and no new token; one session per call (a probe
    makes few calls, and a session of its own is never bound to a finished event loop)."""

    name: ClassVar[str] = "echo"
    openai_compatible: ClassVar[bool] = True

    def __init__(self, endpoint: Endpoint) -> None:
        if not endpoint.model.startswith("openai/") or endpoint.api_base is None:
            raise ValueError("completion echo needs an OpenAI-compatible model 'openai/NAME' with an api_base")
        self.endpoint = endpoint
        self._url = endpoint.api_base.rstrip("/") + "/completions"

    async def send(self, messages: list[dict], seed: int | None) -> Any:
        import aiohttp

        e = self.endpoint
        prompt, start = completion_prompt(messages)
        body = {"model": e.model.split("/", 1)[1], "prompt": prompt, "max_tokens": 1, "echo": True,
                "temperature": 0.0, "logprobs": e.decoding.top_logprobs if e.decoding.logprobs else None}
        if seed is not None:
            body["seed"] = seed
        headers = {"Authorization": f"Bearer {e.api_key}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=e.timeout_s), headers=headers) as s:
            async with s.post(self._url, data=json.dumps(body)) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    text = error_text(raw, resp.reason, (e.api_key,))
                    if resp.status in NO_ROUTE_STATUS or "echo" in text.lower():
                        raise EchoUnsupported(f"HTTP {resp.status}: {text}")
                    raise HTTPStatusFailure(resp.status, text)
        data = json.loads(raw)  # a truncated body raises JSONDecodeError: transient
        choices = data.get("choices") or []
        if not choices:
            return data  # the client's shape check reports it
        tokens = target_tokens(choices[0], prompt, start)
        text = "".join(t["token"] for t in tokens) if tokens is not None else prompt[start:]
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": {"content": tokens} if tokens is not None else None,
                  "finish_reason": choices[0].get("finish_reason")}
        return {"choices": [choice], "usage": data.get("usage")}

    async def aclose(self) -> None:
        pass
