"""Teacher-forced scoring by grammar-forced decoding: a :class:`Transport` for the model client.

For servers that take a llama.cpp GBNF ``grammar`` with a chat completion (llama.cpp's ``llama-server``, which
refuses ``/v1/completions`` echo). A conversation whose last message is the text to score (an observation) is
sent without that message, with a grammar that admits exactly the text (:func:`literal_grammar`), greedy
(temperature 0), with ``logprobs`` and ``top_logprobs``, and room for one token per byte of the text plus the
end token. Under the grammar the only possible reply is the text; greedy decoding picks, at every position, the
most likely token that keeps the reply on it.

llama-server reports each generated token's log-probability from the model's distribution *before* the grammar
and the sampler (``post_sampling_probs`` false, its default, sent explicitly). Checked on SmolLM2-135M
(docs/probes.md): forcing ``Zebra ...`` where the greedy reply starts with ``The`` reports ``Z`` at -10.04 while
``The`` (-0.42) stays first among the alternatives; on a forced text that is also the greedy reply every logprob
equals the unconstrained one. So the reply's tokens carry the teacher-forced log-probabilities of that token path
under the model, given the conversation rendered by the server's chat template -- the context the chat-replay
fallback uses. The path is the model's greedy tokenization under the constraint, which can differ from the
canonical tokenization an echo scores.

Whether the reply spells the text exactly (a server that ignores ``grammar`` generates freely) is the caller's
check, as for echo.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

from uqh.harness.model.transports import Endpoint, HTTPStatusFailure, error_text

#: Characters a GBNF string literal must escape (llama.cpp's grammar parser: ``parse_char``); every other
#: character is written as itself, which the parser reads as UTF-8.
_GBNF_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def gbnf_string(text: str) -> str:
    """``text`` as a GBNF string literal: quotes, backslashes and the control characters escaped
    (``\\n \\r \\t``, the rest as ``\\xHH``), everything else as itself."""
    out = ['"']
    for ch in text:
        esc = _GBNF_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def literal_grammar(text: str) -> str:
    """A GBNF grammar whose only sentence is ``text``."""
    return f"root ::= {gbnf_string(text)}\n"


def forced_max_tokens(text: str) -> int:
    """Enough tokens for any tokenization of ``text``: every token carries at least one byte, plus the end token."""
    return len(text.encode("utf-8")) + 1


class ForcedTransport:
    """``POST {api_base}/chat/completions`` of the conversation without its last message, forced by a grammar to
    reply with that message's text; one session per call (as :class:`~uqh.harness.model.echo.EchoTransport`)."""

    name: ClassVar[str] = "forced"
    openai_compatible: ClassVar[bool] = True

    def __init__(self, endpoint: Endpoint) -> None:
        if not endpoint.model.startswith("openai/") or endpoint.api_base is None:
            raise ValueError("grammar forcing needs an OpenAI-compatible model 'openai/NAME' with an api_base")
        self.endpoint = endpoint
        self._url = endpoint.api_base.rstrip("/") + "/chat/completions"

    def request_body(self, messages: list[dict], seed: int | None) -> dict[str, Any]:
        *context, target = messages
        text = target.get("content") or ""
        d = self.endpoint.decoding
        body: dict[str, Any] = {
            "model": self.endpoint.model.split("/", 1)[1], "messages": context, "temperature": 0.0,
            "max_tokens": forced_max_tokens(text), "grammar": literal_grammar(text),
            "post_sampling_probs": False,  # llama-server's default, pinned: logprobs before grammar and sampler
        }
        if d.logprobs:
            body.update(logprobs=True, top_logprobs=d.top_logprobs)
        if seed is not None:
            body["seed"] = seed
        return body

    async def send(self, messages: list[dict], seed: int | None) -> Any:
        import aiohttp

        e = self.endpoint
        headers = {"Authorization": f"Bearer {e.api_key}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=e.timeout_s), headers=headers) as s:
            async with s.post(self._url, data=json.dumps(self.request_body(messages, seed))) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    text = error_text(raw, resp.reason, (e.api_key,))
                    raise HTTPStatusFailure(resp.status, text)
        return json.loads(raw)  # a truncated body raises JSONDecodeError: transient

    async def aclose(self) -> None:
        pass
