"""`uqh run` end to end on the QA domains: scripted agent (fake OpenAI server) and one smoke run of local:smollm2."""
from __future__ import annotations

import asyncio
import json
import re

import pytest

from uqh.domains.domain_registry import get_domain_class
from uqh.domains.base import RecordedStep
from uqh.cli import main as uqh_main
from uqh.rundir.schema import StopReason
from run_files import read_episodes, read_manifest, read_sidecar


def four_tags(action: str, conf: str = "0.6") -> str:
    return f"<think>next step</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n<explanation>because.</explanation>"


def test_hotpotqa_scripted_episode_through_uqh_run(fake_server, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
    domain = get_domain_class("hotpotqa")({})
    task_id = domain.select_task_ids(1, seed=42)[0]
    task = domain.task(task_id)
    gold_title = task.row["supporting_facts"]["title"][0]

    def responder(req):
        n_assistant = sum(m["role"] == "assistant" for m in req["messages"])
        last = req["messages"][-1]["content"]
        if n_assistant == 0:
            return four_tags("Lookup[Ali]")  # invalid before any Search: a repair
        if "Observation" not in last and n_assistant == 1:
            return four_tags(f"Search[{gold_title}]")
        if n_assistant == 2:
            return four_tags("Lookup[the]")
        return four_tags(f"Finish[{task.answer}]", "0.9")

    out = tmp_path / "run"
    with fake_server(responder) as srv:
        rc = uqh_main([
            "run", "--domain", "hotpotqa", "--tasks", "1", "--model", "openai/fake", "--api-base", srv.base_url,
            "--out", str(out), "--no-progress", "--max-tokens", "64",
        ])
    assert rc == 0
    manifest = read_manifest(out)
    assert manifest.config.task_ids == [task_id]
    assert manifest.config.step_budget == 7 and manifest.config.observation_chars == 420
    assert manifest.info["corpus"] == "hotpotqa-context-union" and manifest.info["top_k"] == 5
    assert "sk-test" not in (out / "manifest.json").read_text()
    [ep] = read_episodes(out)
    assert ep.stop_reason == StopReason.clean and ep.outcome == 1
    assert ep.reward_info["em"] == 1 and ep.reward_info["f1"] == 1.0
    assert ep.task_prompt == f"Question: {task.question}"
    s1, s2, s3 = ep.steps
    assert s1.repair_attempts == 1 and "use Search[query] first" in s1.attempts[0].error
    assert s1.action == f"Search[{gold_title}]" and s1.observation.startswith("[1] ")
    assert len(s1.observation) <= 420 and f"{gold_title}:" in s1.observation
    assert re.fullmatch(r"\(Result 1 / \d+\) .+", s2.observation, re.DOTALL)
    assert s3.verbal_confidence == 0.9
    assert len(list(read_sidecar(out))) == 4  # 3 accepted calls + 1 rejected attempt

    # the recorded prefix replays exactly in a fresh environment
    async def replay():
        env = domain.make_env(task_id, episode_seed=0)
        await env.reset()
        await env.replay([RecordedStep(s.action, s.observation) for s in ep.steps[:2]])
        return env.lookup_cursor, (await env.step("Lookup[the]")).observation

    cursor, obs = asyncio.run(replay())
    assert cursor == 1 and obs.startswith("(Result 2 / ")


@pytest.mark.smoke
def test_strategyqa_local_smollm2_smoke(tmp_path):
    out = tmp_path / "sqa"
    rc = uqh_main([
        "run", "--domain", "strategyqa", "--model", "local:smollm2", "--tasks", "1", "--step-budget", "1",
        "--max-tokens", "16", "--grammar", "--out", str(out), "--no-progress",
    ])
    assert rc == 0
    manifest = read_manifest(out)
    assert manifest.info["corpus"] == "fallback-facts" and manifest.info["n_passages"] > 7000
    [ep] = read_episodes(out)
    assert ep.stop_reason in (StopReason.clean, StopReason.max_steps, StopReason.parse_error)
    assert ep.n_steps == len(ep.steps) <= 1
    for s in ep.steps:
        assert len(s.observation) <= 420
    if ep.stop_reason == StopReason.clean:
        assert ep.outcome in (0, 1) and ep.reward_info["gold"] is True
    rows = list(read_sidecar(out))
    assert rows and all(r.tokens for r in rows)
    json.dumps(ep.model_dump(mode="json"))
