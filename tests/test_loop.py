"""The ReAct loop: every stop reason, repairs, conversation building, prefixes, sidecar rows.

Unit tests use :class:`ScriptedClient` (a real ModelClient-protocol object that answers from a script);
the logprob-capture tests go through the real client and the fake OpenAI-compatible HTTP server.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math

import pytest

from uqh.domains.arithmetic import ArithmeticDomain, ArithmeticEnv, make_question
from uqh.domains.base import EnvResponse, Environment, ReplayMismatch
from uqh.harness.episode.loop import (
    Branch,
    EpisodeSpec,
    Fresh,
    Resume,
    attempt_seed,
    build_messages,
    derive_seed,
    open_episode,
    run_episode,
)
from uqh.harness.model.types import Completion
from uqh.harness.model.call_errors import ModelCallFailed
from uqh.harness.episode.parsing import repair_message
from uqh.rundir.schema import CallRecord, DecodingConfig, StopReason, TokenLogprob, TopLogprob, Usage

SYSTEM = ArithmeticDomain().system_prompt()


def step_text(action: str, conf: str = "0.6", think: str = "t", expl: str = "e") -> str:
    return f"<think>{think}</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n<explanation>{expl}</explanation>"


def split_tokens(text: str) -> list[str]:
    """Deterministic tokenization that joins back to the text: chunks of 3 characters."""
    return [text[i : i + 3] for i in range(0, len(text), 3)]


class ScriptedClient:
    """A ModelClient answering from a list of texts (or a callable of the messages); records every request."""

    model = "scripted"

    def __init__(self, script, *, logprobs: bool = True, fail_at: int | None = None):
        self.script = script
        self.logprobs = logprobs
        self.fail_at = fail_at
        self.requests: list[list[dict]] = []
        self.seeds: list[int | None] = []

    async def complete(self, messages, *, seed=None) -> Completion:
        n = len(self.requests)
        self.requests.append([dict(m) for m in messages])
        self.seeds.append(seed)
        if self.fail_at is not None and n == self.fail_at:
            raise ModelCallFailed("scripted failure")
        text = self.script(messages) if callable(self.script) else self.script[min(n, len(self.script) - 1)]
        tokens = None
        if self.logprobs:
            tokens = [
                TokenLogprob(token=t, logprob=-0.1 * (i % 3), top_logprobs=[TopLogprob(token=t, logprob=-0.1 * (i % 3))])
                for i, t in enumerate(split_tokens(text))
            ]
        call = CallRecord(model=self.model, usage=Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15),
                          cost_usd=None, seed=seed, has_logprobs=tokens is not None)
        return Completion(text=text, tokens=tokens, call=call)

    async def aclose(self) -> None:
        pass


def run(env, client, *, budget=6, spec=None, on_step=None):
    spec = spec or EpisodeSpec(episode_id="arith-0000#0", task_id="arith-0000", seed=7)
    return asyncio.run(run_episode(env, client, spec=spec, system_prompt=SYSTEM, step_budget=budget, on_step=on_step))


def arith_env(task_id="arith-0000"):
    return ArithmeticDomain().make_env(task_id, episode_seed=0)


ANSWER = make_question("arith-0000")[1]


def test_derive_seed_is_sha256_based_and_stable():
    expected = int.from_bytes(hashlib.sha256(b"42:arith-0000#0").digest()[:4], "big") & 0x7FFFFFFF
    assert derive_seed(42, "arith-0000#0") == expected
    assert derive_seed(42, "arith-0000#1") != expected
    assert 0 <= expected < 2**31


def test_clean_success_two_steps():
    client = ScriptedClient([step_text("Calc[1+1]", "0.5"), step_text(f"Finish[{ANSWER}]", "0.9")])
    res = run(arith_env(), client)
    ep = res.episode
    assert ep.stop_reason == StopReason.clean and ep.outcome == 1 and ep.reward == 1.0
    assert ep.n_steps == 2 and [s.t for s in ep.steps] == [1, 2]
    assert ep.verbal_confidences == [0.5, 0.9]
    assert ep.steps[0].observation == "Result: 2"
    assert ep.reward_info["answer"] == ANSWER
    assert ep.task_prompt.startswith("Question: What is")
    assert client.seeds == [7, 7] and ep.seed == 7
    # one sidecar row per call, accepted, with the action token range
    assert [(r.t, r.attempt, r.accepted) for r in res.sidecar] == [(1, 0, True), (2, 0, True)]
    text = ep.steps[0].attempts[0].raw_text
    s, e = res.sidecar[0].action_token_range
    toks = [t.token for t in res.sidecar[0].tokens]
    assert "".join(toks[s:e]).find("Calc[1+1]") >= 0
    assert "".join(toks[s + 1 : e]).find("Calc[1+1]") < 0 and "".join(toks[s : e - 1]).find("Calc[1+1]") < 0
    assert "".join(toks) == text


def test_clean_failure_outcome_zero():
    res = run(arith_env(), ScriptedClient([step_text(f"Finish[{ANSWER + 1}]")]))
    assert res.episode.stop_reason == StopReason.clean and res.episode.outcome == 0 and res.episode.reward == 0.0


def test_max_steps_outcome_null():
    client = ScriptedClient([step_text("Calc[2*3]")])
    res = run(arith_env(), client, budget=3)
    ep = res.episode
    assert ep.stop_reason == StopReason.max_steps and ep.outcome is None and ep.reward is None
    assert ep.n_steps == 3 and len(client.requests) == 3 and ep.step_budget == 3


def test_parse_error_after_two_repairs():
    bad = ["no tags at all", "<think>x</think>", step_text("Calc[1]", conf="sure")]
    client = ScriptedClient([step_text("Calc[1+1]"), *bad])
    res = run(arith_env(), client)
    ep = res.episode
    assert ep.stop_reason == StopReason.parse_error and ep.outcome is None
    assert ep.n_steps == 1 and len(ep.failed_step) == 3
    assert [a.raw_text for a in ep.failed_step] == bad
    assert "none of the four tags" in ep.failed_step[0].error
    assert "<confidence> must be a number" in ep.failed_step[2].error
    assert [(r.t, r.attempt, r.accepted) for r in res.sidecar] == [(1, 0, True), (2, 0, False), (2, 1, False), (2, 2, False)]
    # each repair call saw the rejected output and the repair message
    last = client.requests[-1]
    assert last[-4:] == [
        {"role": "assistant", "content": bad[0]},
        {"role": "user", "content": repair_message(ep.failed_step[0].error, SYSTEM)},
        {"role": "assistant", "content": bad[1]},
        {"role": "user", "content": repair_message(ep.failed_step[1].error, SYSTEM)},
    ]


def test_repair_then_success_and_invalid_action_repair():
    client = ScriptedClient(
        [
            "<think>a</think><action>Calc[3]</action>",  # missing tags
            step_text("Jump[3]"),  # environment grammar rejects it
            step_text("Calc[3*3]"),
            step_text(f"Finish[{ANSWER}]"),
        ]
    )
    res = run(arith_env(), client)
    ep = res.episode
    assert ep.stop_reason == StopReason.clean and ep.n_steps == 2
    s1 = ep.steps[0]
    assert s1.repair_attempts == 2 and [a.error is None for a in s1.attempts] == [False, False, True]
    assert "the <confidence>...</confidence> tag is missing" in s1.attempts[0].error
    assert s1.attempts[1].error.startswith("the action 'Jump[3]' was rejected: the action must be exactly")
    assert [(r.t, r.attempt, r.accepted) for r in res.sidecar] == [(1, 0, False), (1, 1, False), (1, 2, True), (2, 0, True)]
    assert res.sidecar[1].action_token_range is not None  # parsed, rejected by the env
    assert res.sidecar[0].action_token_range is None  # did not parse
    # the incremental conversation equals build_messages over the finished steps
    assert client.requests[-1] == build_messages(SYSTEM, ep.task_prompt, ep.steps[:1])
    msgs = build_messages(SYSTEM, ep.task_prompt, ep.steps[:1])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert msgs[-1]["content"] == "Observation: Result: 9"


def test_missing_logprobs_recorded_as_null():
    res = run(arith_env(), ScriptedClient([step_text(f"Finish[{ANSWER}]")], logprobs=False))
    row = res.sidecar[0]
    assert row.tokens is None and row.action_token_range is None and row.accepted
    assert res.episode.steps[0].attempts[0].call.has_logprobs is False


class _EndingEnv(Environment):
    def __init__(self, reason):
        self.reason = reason

    async def reset(self):
        return "task"

    async def step(self, action):
        return EnvResponse(observation="bye", done=True, stop_reason=self.reason, reward=0.0)


@pytest.mark.parametrize("reason", [StopReason.env_terminated, StopReason.tool_error])
def test_environment_stop_reasons(reason):
    res = run(_EndingEnv(reason), ScriptedClient([step_text("Respond[hi]")]))
    assert res.episode.stop_reason == reason and res.episode.outcome is None and res.episode.n_steps == 1


def test_model_call_failed_propagates():
    client = ScriptedClient([step_text("Calc[1]")], fail_at=1)
    with pytest.raises(ModelCallFailed):
        run(arith_env(), client)


def test_on_step_gets_partial_after_each_nonterminal_step():
    seen = []
    client = ScriptedClient([step_text("Calc[1]"), step_text("Calc[2]"), step_text(f"Finish[{ANSWER}]")])
    res = run(arith_env(), client, on_step=lambda p: seen.append((len(p.steps), len(p.sidecar), p.steps[-1].t)))
    assert seen == [(1, 1, 1), (2, 2, 2)] and res.episode.n_steps == 3


def test_continue_from_prefix_without_prefix_calls():
    first = run(arith_env(), ScriptedClient([step_text("Calc[1+2]"), step_text("Calc[2+2]")]), budget=2).episode
    assert first.stop_reason == StopReason.max_steps

    async def go():
        spec = EpisodeSpec(episode_id="arith-0000#0@b0", task_id="arith-0000", seed=3, start=Branch(first, index=0))
        env, task_prompt, spec = await open_episode(ArithmeticDomain(), spec)
        client = ScriptedClient([step_text("Calc[5]"), step_text(f"Finish[{ANSWER}]")])
        res = await run_episode(env, client, spec=spec, task_prompt=task_prompt, system_prompt=SYSTEM, step_budget=6)
        return client, res

    client, res = asyncio.run(go())
    ep = res.episode
    assert len(client.requests) == 2  # no model calls for the prefix
    assert client.requests[0] == build_messages(SYSTEM, first.task_prompt, first.steps)
    assert [s.t for s in ep.steps] == [1, 2, 3, 4] and ep.prefix_steps == 2
    assert ep.steps[:2] == first.steps
    assert ep.stop_reason == StopReason.clean and ep.outcome == 1
    assert ep.source_episode_id == "arith-0000#0" and ep.branch_index == 0
    assert [r.t for r in res.sidecar] == [3, 4]  # only this episode's own calls


# --------------------------------------------------------------------------------------- real client, fake server


def _real_client(srv, **dec):
    from uqh.harness.model.client import make_model_client

    return make_model_client("openai/fake", api_base=srv.base_url, decoding=DecodingConfig(**dec), max_retries=2,
                             backoff_initial_s=0.01, backoff_max_s=0.05, timeout_s=10)


def _arith_episode_on(srv, seed: int):
    """One arithmetic episode (task 0) through the real client against the fake server ``srv``."""

    async def go():
        client = _real_client(srv)
        try:
            return await run_episode(arith_env(), client, spec=EpisodeSpec("arith-0000#0", "arith-0000", seed=seed),
                                     system_prompt=SYSTEM, step_budget=4)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_logprob_capture_through_fake_server(fake_server):
    from fake_openai_server import chosen_probability, tokenize

    texts = [step_text("Calc[4*5]", "0.4"), step_text(f"Finish[{ANSWER}]", "0.95")]

    with fake_server(texts) as srv:
        res = _arith_episode_on(srv, seed=11)
        reqs = srv.requests
    ep = res.episode
    assert ep.stop_reason == StopReason.clean and ep.outcome == 1
    assert reqs[0]["seed"] == 11 and reqs[0]["logprobs"] is True and reqs[0]["top_logprobs"] == 5
    assert reqs[1]["messages"][-1] == {"role": "user", "content": "Observation: Result: 20"}
    for row, text in zip(res.sidecar, texts):
        toks = [t.token for t in row.tokens]
        assert toks == tokenize(text)
        for t in row.tokens:
            assert t.logprob == pytest.approx(math.log(chosen_probability(t.token)))
            assert len(t.top_logprobs) == 5
        s, e = row.action_token_range
        action = "Calc[4*5]" if row.t == 1 else f"Finish[{ANSWER}]"
        assert "".join(toks[s:e]).strip() == action


def test_each_repair_gets_a_fresh_recorded_seed_derived_from_the_step_seed_and_attempt(fake_server):
    """A deterministic model repeats a wrong text when the repair is sent with the same seed: each repair attempt
    gets its own seed, derived (sha256) from the step seed and the attempt number, sent and recorded."""
    repair1 = int.from_bytes(hashlib.sha256(b"11:repair-1").digest()[:4], "big") & 0x7FFFFFFF
    repair2 = int.from_bytes(hashlib.sha256(b"11:repair-2").digest()[:4], "big") & 0x7FFFFFFF
    assert attempt_seed(11, 0) == 11 and attempt_seed(11, 1) == repair1 and attempt_seed(11, 2) == repair2
    assert len({11, repair1, repair2}) == 3 and attempt_seed(None, 2) is None
    texts = ["no tags", "<think>x</think>", step_text(f"Finish[{ANSWER}]"), step_text(f"Finish[{ANSWER}]")]

    with fake_server(texts) as srv:
        res = _arith_episode_on(srv, seed=11)
        sent = [r["seed"] for r in srv.requests]
    ep = res.episode
    assert ep.stop_reason == StopReason.clean and ep.steps[0].repair_attempts == 2
    assert sent == [11, repair1, repair2]  # the accepted third attempt was a repair too
    assert [a.call.seed for a in ep.steps[0].attempts] == [11, repair1, repair2]
    # the next step starts from the step seed again, and a re-run derives the same seeds
    again = ScriptedClient(texts)
    run(arith_env(), again, spec=EpisodeSpec("arith-0000#0", "arith-0000", seed=11))
    assert again.seeds == [11, repair1, repair2]


def test_no_logprobs_fault_recorded_per_call(fake_server):
    with fake_server([step_text("Calc[1]"), step_text(f"Finish[{ANSWER}]")], faults=["no_logprobs"]) as srv:
        res = _arith_episode_on(srv, seed=1)
    assert res.sidecar[0].tokens is None and res.sidecar[0].action_token_range is None
    assert res.sidecar[1].tokens is not None
    assert [s.attempts[0].call.has_logprobs for s in res.episode.steps] == [False, True]


# --------------------------------------------------------------------------------------- open_episode: start modes


class _TrackedEnv(ArithmeticEnv):
    """The arithmetic environment, recording the actions it was stepped with and whether it was closed."""

    def __init__(self, *args, reset_prompt=None):
        super().__init__(*args)
        self.actions: list[str] = []
        self.closed = False
        self.reset_prompt = reset_prompt

    async def reset(self):
        prompt = await super().reset()
        return self.reset_prompt or prompt

    async def step(self, action):
        self.actions.append(action)
        return await super().step(action)

    def close(self):
        self.closed = True


class _TrackedDomain(ArithmeticDomain):
    def __init__(self, reset_prompt=None):
        super().__init__()
        self.envs: list[_TrackedEnv] = []
        self.reset_prompt = reset_prompt

    def make_env(self, task_id, *, episode_seed):
        env = _TrackedEnv(task_id, self.truncate, reset_prompt=self.reset_prompt)
        self.envs.append(env)
        return env


def _censored(actions=("Calc[1+2]", "Calc[2+2]")):
    """A max_steps episode of arith-0000 (source of branches) and the checkpoint taken after its first step."""
    partials = []
    res = run(arith_env(), ScriptedClient([step_text(a) for a in actions]), budget=len(actions),
              on_step=lambda p: partials.append(p.model_copy(deep=True)))
    assert res.episode.stop_reason == StopReason.max_steps
    return res.episode, partials[0]


def test_open_fresh_resets_and_replays_nothing():
    domain = _TrackedDomain()
    spec = EpisodeSpec("arith-0000#0", "arith-0000", seed=7)
    env, task_prompt, opened = asyncio.run(open_episode(domain, spec))
    assert opened == spec and env is domain.envs[0] and not env.closed
    assert task_prompt == f"Question: {make_question('arith-0000')[0]}" and env.actions == []


def test_open_resume_replays_the_checkpoint_and_continues_it():
    _, partial = _censored()
    partial = partial.model_copy(update={"started_at": "2020-01-01T00:00:00.000+00:00"})
    domain = _TrackedDomain()
    spec = EpisodeSpec("arith-0000#0", "arith-0000", seed=7, start=Resume(partial))

    async def go():
        env, task_prompt, opened = await open_episode(domain, spec)
        client = ScriptedClient([step_text(f"Finish[{ANSWER}]")])
        res = await run_episode(env, client, spec=opened, task_prompt=task_prompt, system_prompt=SYSTEM, step_budget=6)
        return env, opened, client, res

    env, opened, client, res = asyncio.run(go())
    assert opened.start == Resume(partial) and env.actions == ["Calc[1+2]", f"Finish[{ANSWER}]"]
    ep = res.episode
    assert ep.steps[0] == partial.steps[0] and ep.n_steps == 2 and ep.prefix_steps == 0 and ep.outcome == 1
    assert ep.started_at == "2020-01-01T00:00:00.000+00:00"  # the episode's own start, not the resume's
    assert client.requests[0] == build_messages(SYSTEM, partial.task_prompt, partial.steps)
    assert [r.t for r in res.sidecar] == [1, 2] and res.sidecar[0] == partial.sidecar[0]  # its own earlier call kept


def test_open_resume_whose_replay_fails_restarts_fresh(caplog):
    _, partial = _censored()
    partial.steps[0].observation = "Result: -1"  # not what the environment says
    domain = _TrackedDomain()
    spec = EpisodeSpec("arith-0000#0", "arith-0000", seed=7, start=Resume(partial))
    with caplog.at_level("WARNING", logger="uqh.harness.episode.loop"):
        env, task_prompt, opened = asyncio.run(open_episode(domain, spec))
    assert opened == EpisodeSpec("arith-0000#0", "arith-0000", seed=7) and isinstance(opened.start, Fresh)
    assert len(domain.envs) == 2 and domain.envs[0].closed and env is domain.envs[1] and not env.closed
    assert env.actions == [] and task_prompt.startswith("Question:")
    assert "checkpoint replay failed" in caplog.text and "arith-0000#0" in caplog.text


def test_open_resumed_branch_whose_replay_fails_restarts_as_the_branch():
    source, _ = _censored()
    partials = []

    async def branch_then_checkpoint():
        spec = EpisodeSpec("arith-0000#0@b1", "arith-0000", seed=3, start=Branch(source, index=1))
        env, prompt, spec = await open_episode(ArithmeticDomain(), spec)
        await run_episode(env, ScriptedClient([step_text("Calc[7]")]), spec=spec, task_prompt=prompt,
                          system_prompt=SYSTEM, step_budget=3, on_step=lambda p: partials.append(p))
        return spec

    branch = asyncio.run(branch_then_checkpoint())
    partial = partials[0].model_copy(deep=True)
    assert (partial.prefix_steps, partial.source_episode_id, partial.branch_index) == (2, "arith-0000#0", 1)
    partial.steps[2].observation = "Result: 8"  # the branch's own step no longer replays
    domain = _TrackedDomain()
    resumed = dataclasses.replace(branch, start=Resume(partial, restart=branch.start))
    env, task_prompt, opened = asyncio.run(open_episode(domain, resumed))
    assert opened == branch and env.actions == ["Calc[1+2]", "Calc[2+2]"]  # the source prefix replayed again
    assert task_prompt == source.task_prompt and domain.envs[0].closed


def test_open_branch_replays_the_source_and_records_it():
    source, _ = _censored()
    domain = _TrackedDomain()
    spec = EpisodeSpec("arith-0000#0@b0", "arith-0000", seed=3, step_budget=4, start=Branch(source))

    async def go():
        env, task_prompt, opened = await open_episode(domain, spec)
        res = await run_episode(env, ScriptedClient([step_text(f"Finish[{ANSWER}]")]), spec=opened,
                                task_prompt=task_prompt, system_prompt=SYSTEM, step_budget=opened.step_budget)
        return env, opened, res

    env, opened, res = asyncio.run(go())
    assert opened == spec and env.actions == ["Calc[1+2]", "Calc[2+2]", f"Finish[{ANSWER}]"]
    ep = res.episode
    assert (ep.source_episode_id, ep.branch_index, ep.prefix_steps, ep.step_budget) == ("arith-0000#0", 0, 2, 4)
    assert ep.steps[:2] == source.steps and [r.t for r in res.sidecar] == [3]  # the source's calls are not its own


@pytest.mark.parametrize("tamper", ["observation", "task_prompt"])
def test_open_branch_that_does_not_replay_raises_and_closes(tamper):
    source, _ = _censored()
    reset_prompt = None
    if tamper == "observation":
        source.steps[1].observation = "Result: 5"
    else:
        reset_prompt = "Question: something else"  # the default replay must reproduce the recorded reset too
    domain = _TrackedDomain(reset_prompt=reset_prompt)
    spec = EpisodeSpec("arith-0000#0@b0", "arith-0000", seed=3, start=Branch(source))
    with pytest.raises(ReplayMismatch, match="step 2" if tamper == "observation" else "task prompt differs"):
        asyncio.run(open_episode(domain, spec))
    assert len(domain.envs) == 1 and domain.envs[0].closed
