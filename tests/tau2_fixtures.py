"""Shared pieces of the Tau2 tests: a scripted fake server, episode runner, and the check against tau2's own path.

One fake OpenAI-compatible server plays both sides: requests whose system prompt is ours are the agent,
requests whose system prompt is tau2's user-simulation guidelines are the simulated user. Each side's reply
is chosen by how many turns that side has already taken in the request (so the script is deterministic).

Every episode :func:`play` runs is checked by :func:`assert_tau2_scores_it_the_same`: tau2's own environment
constructor (a fresh parse of the DB: none of our copy-on-write or hash memo) replays the recorded conversation
and must reach the recorded DB hash, and tau2's own ``evaluate_simulation`` on the recorded conversation must give
exactly the recorded ``RewardInfo``.
"""
from __future__ import annotations

import asyncio
import json
import time

from uqh.domains.domain_registry import get_domain_class
from uqh.domains.tau2.domain import message_from_dict
from uqh.harness.episode.loop import EpisodeSpec, run_episode
from uqh.harness.model.client import make_model_client
from uqh.rundir.schema import DecodingConfig, StopReason

AGENT_MARK = "You are a customer-support agent operating in the tau2-bench domain"
USER_MARK = "# User Simulation Guidelines"

# Retail base task 73: one gold write (a return), no communicate_info -> reward 1 iff the DB matches.
RETAIL_TASK = "73"
ORDER = "#W5272531"
RETURN_ARGS = {
    "order_id": ORDER,
    "item_ids": ["7228247242", "2698416822", "8098621301", "3320557165"],
    "payment_method_id": "credit_card_6824399",
}
TELECOM_TASK = "[mobile_data_issue]airplane_mode_on|user_abroad_roaming_enabled_off[PERSONA:None]"
USER_DECODING = DecodingConfig(temperature=0.0, top_p=1.0, seed=7, max_tokens=64, logprobs=True)
AGENT_DECODING = DecodingConfig(temperature=0.2, seed=42, max_tokens=256)


def react(action: str, confidence: str = "0.8") -> str:
    return (
        f"<think>next step</think>\n<action>{action}</action>\n"
        f"<confidence>{confidence}</confidence>\n<explanation>I think so.</explanation>"
    )


def tool(name: str, args: dict) -> str:
    return react(f"Tool[{name}, {json.dumps(args)}]")


def respond(text: str) -> str:
    return react(f'Respond["{text}"]')


SOLVED_AGENT = [
    tool("get_order_details", {"order_id": ORDER}),
    tool("return_delivered_order_items", RETURN_ARGS),
    respond("Your return is processed; the refund goes to your credit card."),
]
USER_OPEN = "Hi, I want to return everything from order #W5272531."
USER_LINES = [USER_OPEN, "###STOP###"]


class Script:
    """Responder for the fake server: agent outputs and user replies, indexed by turns already taken."""

    def __init__(self, agent: list[str], user: list[str]):
        self.agent, self.user = agent, user
        self.agent_requests: list[dict] = []
        self.user_requests: list[dict] = []

    def __call__(self, req: dict) -> str:
        system = req["messages"][0]["content"]
        n = sum(1 for m in req["messages"] if m["role"] == "assistant")
        if system.startswith(AGENT_MARK):
            self.agent_requests.append(req)
            return self.agent[min(n, len(self.agent) - 1)]
        assert system.startswith(USER_MARK), system[:80]
        self.user_requests.append(req)
        return self.user[min(n, len(self.user) - 1)]


class ToolCallingServer:
    """The fake server, plus: a responder text ``CALL name {json}`` is answered as an OpenAI tool call."""

    @staticmethod
    def make(fake_server, responder):
        from aiohttp import web

        chosen: list[str] = []  # the text chosen for the request being served, handed to the plain server

        def once(body):  # the plain server asks again for the same request: the text already chosen
            return chosen.pop() if chosen else responder(body)

        srv = fake_server(once)
        plain_chat = srv._chat

        async def chat(request):
            body = json.loads(await request.read())
            text = responder(body)
            if not text.startswith("CALL "):
                chosen.append(text)
                return await plain_chat(request)
            srv.requests.append(body)
            _, name, args = text.split(" ", 2)
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"user_call_{len(body['messages'])}", "type": "function", "function": {"name": name, "arguments": args}}]}
            payload = {"id": "chatcmpl-tool", "object": "chat.completion", "created": int(time.time()),
                       "model": body["model"], "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            return web.json_response(payload)

        def make_app():
            app = web.Application(client_max_size=64 * 1024**2)
            app.router.add_post("/v1/chat/completions", chat)
            return app

        srv.make_app = make_app
        return srv


def make_domain(name: str, srv, *, user_decoding: DecodingConfig | None = USER_DECODING, **options):
    domain = get_domain_class(name)(options)
    runtime = {"user_model": "openai/fake-user", "user_api_base": srv.base_url}
    if user_decoding is not None:
        runtime["user_decoding"] = user_decoding
    domain.prepare_runtime(runtime)
    return domain


def play(domain, srv, task_id: str, *, step_budget: int = 50, episode_seed: int = 1000):
    """One episode through ``uqh.harness.episode.loop.run_episode``; checked against tau2's own path before it is returned."""

    async def go():
        env = domain.make_env(task_id, episode_seed=episode_seed)
        client = make_model_client("openai/fake-agent", api_base=srv.base_url, decoding=AGENT_DECODING, api_key="x")
        try:
            result = await run_episode(
                env,
                client,
                spec=EpisodeSpec(episode_id=f"{task_id}#0", task_id=task_id, seed=5),
                system_prompt=domain.system_prompt(),
                step_budget=step_budget,
            )
        finally:
            await client.aclose()
            await domain.aclose()  # the simulated user's HTTP session on this event loop
        return env, result

    env, result = asyncio.run(go())
    assert_tau2_scores_it_the_same(domain, result.episode)
    return env, result


def recorded_conversation(episode) -> list:
    """The tau2 messages of an episode's steps, in order, numbered as tau2 numbers turns."""
    messages = [message_from_dict(m) for s in episode.steps for m in s.info.get("tau2_messages", [])]
    for i, m in enumerate(messages):
        m.turn_idx = i
    return messages


def assert_tau2_scores_it_the_same(domain, episode) -> None:
    """tau2's own code, none of ours, on the recorded conversation: same DB hashes and same ``RewardInfo``."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.registry import registry

    task = domain.tasks()[episode.task_id]
    messages = recorded_conversation(episode)
    if episode.steps:
        env = registry.get_env_constructor(domain.tau2_domain)()  # tau2's constructor: its own parse of the DB
        init = task.initial_state
        env.set_state(
            initialization_data=init.initialization_data if init else None,
            initialization_actions=init.initialization_actions if init else None,
            message_history=messages,
        )
        last = episode.steps[-1].info
        assert (env.get_db_hash(), env.get_user_db_hash()) == (last["db_hash"], last["user_db_hash"])
    reason = episode.reward_info.get("tau2_termination_reason")
    if reason is None:  # our loop ended it (step budget, repairs exhausted): tau2 has no verdict
        assert episode.stop_reason in (StopReason.max_steps, StopReason.parse_error)
        return
    sim = SimulationRun(id="check", task_id=task.id, start_time="", end_time="", duration=0.0,
                        termination_reason=TerminationReason(reason), messages=messages)
    theirs = evaluate_simulation(simulation=sim, task=task, evaluation_type=EvaluationType.ALL, solo_mode=False,
                                 domain=domain.tau2_domain)
    assert theirs.model_dump(mode="json", exclude_none=True) == episode.reward_info["tau2"]
    assert theirs.reward == episode.reward_info["tau2_reward"]
    if episode.stop_reason == StopReason.clean:
        assert episode.reward == theirs.reward and episode.outcome == int(theirs.reward == 1.0)
    else:
        assert episode.reward is None and episode.outcome is None
