"""The simulated user's model calls without litellm's synchronous client: one async JSON POST per call.

tau2's ``UserSimulator.generate_next_message`` calls ``tau2.utils.llm_utils.generate``, i.e. litellm's synchronous
``completion``: ~12 ms of CPU per call, and it blocks, so each waiting user holds a thread that competes with the
event loop for the GIL. For an OpenAI-compatible URL (``openai/NAME`` + ``api_base``: a local llama.cpp server,
vLLM, ...) :class:`DirectUserGenerator` sends the request that litellm would send -- tau2's own message
conversion (``to_litellm_messages``, ``flip_roles``) and tool schemas, the same decoding fields -- over a pooled
aiohttp session on the episode's event loop, and builds the reply exactly as tau2 does: litellm's conversion of the JSON reply, tau2's ``get_response_cost`` / ``get_response_usage``, its retries on an empty
reply, its ``AssistantMessage`` -> ``UserMessage`` flip. ``tests/test_tau2_user_client.py`` runs both paths on
the same conversations against one server and requires equal request bodies and equal messages.

Only where litellm would send nothing else: a model litellm treats as a plain chat model (o-series and GPT-5
names get their parameters rewritten by litellm: those stay on tau2's path), and only the decoding fields below.
"""
from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from uqh.domains.tau2.access import Tau2

#: The user simulator's litellm arguments that become request fields (everything else in ``user_llm_args`` is
#: how litellm sends: retries, timeout, endpoint, key).
BODY_FIELDS = ("temperature", "top_p", "max_tokens", "seed", "logprobs", "top_logprobs")
TRANSPORT_FIELDS = frozenset({"num_retries", "drop_params", "timeout", "api_base", "api_key"})
#: HTTP statuses worth another attempt (the rest are the request's fault: a retry would get the same answer).
TRANSIENT_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
DEFAULT_TIMEOUT_S = 600.0  # litellm's


class UserCallFailed(Exception):
    """The user model's endpoint did not give a usable answer (after the retries); infrastructure, not an outcome."""


def direct_path_applies(model: str, llm_args: dict[str, Any]) -> bool:
    """True when the request litellm would build for this user model is the plain OpenAI one we build."""
    if not model.startswith("openai/") or not llm_args.get("api_base"):
        return False
    if set(llm_args) - TRANSPORT_FIELDS - set(BODY_FIELDS):
        return False
    Tau2.load()
    import litellm

    config = litellm.utils.ProviderConfigManager.get_provider_chat_config(
        model.split("/", 1)[1], litellm.LlmProviders.OPENAI)
    # OpenAIGPTConfig and its unknown-model subclass pass the fields through; the reasoning-model configs (its
    # subclasses too) rename or drop them: the exact class decides.
    return type(config).__name__ in ("OpenAIGPTConfig", "OpenAIUnknownModelConfig")


class _SessionsPerLoop:
    """aiohttp sessions are bound to the event loop they were made on: one per loop, closed by :meth:`aclose`."""

    def __init__(self, headers: dict[str, str], timeout_s: float) -> None:
        self._headers = headers
        self._timeout_s = timeout_s
        self._sessions: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}

    def get(self) -> Any:
        import aiohttp

        loop = asyncio.get_running_loop()
        for key, (other, session) in list(self._sessions.items()):
            if other.is_closed():  # a finished loop's session: its connections died with the loop
                session.detach()
                del self._sessions[key]
        entry = self._sessions.get(id(loop))
        if entry is None or entry[0] is not loop:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                headers=self._headers,
            )
            entry = self._sessions[id(loop)] = (loop, session)
        return entry[1]

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        sessions, self._sessions = self._sessions, {}
        for other, session in sessions.values():
            if other is loop:
                await session.close()
            else:
                session.detach()


class DirectUserGenerator:
    """``UserSimulator.generate_next_message`` for an OpenAI-compatible URL, as a coroutine (module docstring).

    One per domain instance and process; ``tools`` are the user's tau2 tools (telecom) or None.
    """

    def __init__(self, model: str, llm_args: dict[str, Any], tools: list[Any] | None) -> None:
        import os

        self.model = model
        self.num_retries = int(llm_args.get("num_retries", 3))
        self._url = str(llm_args["api_base"]).rstrip("/") + "/chat/completions"
        # litellm's key: the argument, else OPENAI_API_KEY (its openai provider's), sent as a bearer token.
        key = llm_args.get("api_key") or os.environ.get("OPENAI_API_KEY")
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._sessions = _SessionsPerLoop(headers, float(llm_args.get("timeout") or DEFAULT_TIMEOUT_S))
        # The schemas tau2 computes from pydantic on every call (21 ms for telecom's 30 user tools): once.
        self._tool_schemas = [tool.openai_schema for tool in tools] if tools else None

    def request_body(self, messages: list[Any], llm_args: dict[str, Any]) -> dict[str, Any]:
        """The JSON litellm's ``completion`` sends for tau2's ``generate(model, messages, tools, **llm_args)``."""
        from litellm.utils import validate_and_fix_openai_messages
        from tau2.utils.llm_utils import to_litellm_messages

        # litellm's own clean-up of the messages (None fields dropped, tool calls as plain dicts), as completion does.
        sent = validate_and_fix_openai_messages(messages=to_litellm_messages(messages))
        body: dict[str, Any] = {"model": self.model.split("/", 1)[1], "messages": sent}
        for field in BODY_FIELDS:
            if llm_args.get(field) is not None:
                body[field] = llm_args[field]
        if self._tool_schemas:
            body["tools"] = self._tool_schemas
            body["tool_choice"] = "auto"  # tau2's default when there are tools
        return body

    async def next_message(self, simulator: Any, incoming: Any, state: Any) -> tuple[Any, Any]:
        """tau2's ``UserSimulator._generate_next_message`` with the model call awaited (same state updates)."""
        t2 = Tau2.load()
        if isinstance(incoming, t2.msg.MultiToolMessage):
            state.messages.extend(incoming.tool_messages)
        else:
            state.messages.append(incoming)
        messages = state.system_messages + state.flip_roles()
        reply = await self._generate(messages, simulator.llm_args)
        user_message = t2.msg.UserMessage(
            role="user", content=reply.content, cost=reply.cost, usage=reply.usage, raw_data=reply.raw_data)
        if reply.tool_calls is not None:  # the user's own tool calls (telecom), flipped to the user's side
            user_message.tool_calls = [
                t2.msg.ToolCall(id=c.id, name=c.name, arguments=c.arguments, requestor="user")
                for c in reply.tool_calls
            ]
        state.messages.append(user_message)
        return user_message, state

    async def _generate(self, messages: list[Any], llm_args: dict[str, Any]) -> Any:
        """tau2's ``generate``: the reply as an ``AssistantMessage``; an empty reply is asked again
        ``num_retries`` times, and kept (empty) after that."""
        import litellm
        from litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response import (
            convert_to_model_response_object,
        )
        from tau2.utils.llm_utils import get_response_cost, get_response_usage

        t2 = Tau2.load()
        body = json.dumps(self.request_body(messages, llm_args))
        empty_replies = 0
        while True:
            payload = await self._post(body)
            # litellm's own conversion of an OpenAI JSON reply (what its openai provider returns from completion).
            response = convert_to_model_response_object(response_object=payload,
                                                         model_response_object=litellm.ModelResponse())
            cost = get_response_cost(response)
            usage = get_response_usage(response)
            choice = response.choices[0]
            if choice.message.role != "assistant":
                raise UserCallFailed(f"the user model's reply has role {choice.message.role!r}, not 'assistant'")
            content = choice.message.content
            calls = choice.message.tool_calls or []
            if (content is None or content.strip() == "") and not calls and empty_replies < self.num_retries:
                empty_replies += 1
                continue
            tool_calls = [
                t2.msg.ToolCall(id=c.id, name=c.function.name, arguments=json.loads(c.function.arguments))
                for c in calls
            ] or None
            return t2.msg.AssistantMessage(role="assistant", content=content, tool_calls=tool_calls, cost=cost,
                                           usage=usage, raw_data=choice.to_dict())

    async def _post(self, body: str) -> dict[str, Any]:
        """One chat completion, retried ``num_retries`` times on a transient failure (connection, timeout,
        408/409/429/5xx, a truncated body) with exponential backoff."""
        import aiohttp

        last: str = ""
        for failures in range(self.num_retries + 1):
            if failures:
                await asyncio.sleep(min(8.0, 0.5 * 2 ** (failures - 1)) + random.uniform(0, 0.5))
            try:
                async with self._sessions.get().post(self._url, data=body) as resp:
                    raw = await resp.read()
                    if resp.status >= 400:
                        last = f"HTTP {resp.status}: {raw[:200].decode(errors='replace')}"
                        if resp.status in TRANSIENT_STATUS:
                            continue
                        raise UserCallFailed(last)
                payload = json.loads(raw)
            except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if not isinstance(payload, dict) or not payload.get("choices"):
                last = f"a reply without choices: {str(payload)[:200]}"
                continue
            return payload
        raise UserCallFailed(f"{self.num_retries + 1} attempts failed; last: {last}")

    async def aclose(self) -> None:
        await self._sessions.aclose()
