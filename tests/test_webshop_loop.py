"""WebShop through the real batch runner, model client and fake OpenAI-compatible server (shared prefix data)."""
from __future__ import annotations

import re

from uqh.domains.domain_registry import get_domain_class
from uqh.harness.config.build import prompt_sha256
from uqh.harness.runner import run_batch
from uqh.rundir.schema import DecodingConfig, RunConfig, StopReason
from uqh.harness.config.settings import BatchSettings
from run_files import read_episodes, read_manifest

DOMAIN = get_domain_class("webshop")({})
GOALS = DOMAIN.resources.goals


def step_text(action: str, conf: str = "0.5") -> str:
    return f"<think>t</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n<explanation>e</explanation>"


def shopper(wrong_option: bool):
    """Buys the goal product; first emits a malformed action (repaired), then a click on a target that is not on the
    page (the original's no-op: the step is consumed); optionally picks one wrong option value."""

    def respond(body: dict) -> str:
        msgs = body["messages"]
        instr = re.search(r"Instruction: \[SEP\] (.*?) \[SEP\]", msgs[1]["content"]).group(1)
        goal = next(g for g in GOALS if g["instruction_text"] == instr)
        n_assistant = sum(1 for m in msgs if m["role"] == "assistant")
        if n_assistant == 0:
            return step_text("Checkout now")  # malformed: InvalidAction -> repair
        if n_assistant == 1:
            return step_text("Click[Checkout]")  # well formed, not on the page: a no-op step
        obs = next(m["content"] for m in reversed(msgs) if m["role"] == "user" and "Clickables:" in m["content"])
        if "Search bar: available" in obs:
            return step_text(f"Search[{goal['name']}]")
        if "Total results" in obs:
            return step_text(f"Click[{goal['asin']}]")
        selected = re.search(r"Selected options: (.*)", obs)
        chosen = dict(kv.split(": ", 1) for kv in selected.group(1).split("; ")) if selected else {}
        product = DOMAIN.resources.catalog.by_asin[goal["asin"]]
        for name, value in goal["goal_options"].items():
            if name not in chosen:
                if wrong_option:
                    value = next(v for v in product["options"][name] if v != value)
                return step_text(f"Click[{value}]")
        return step_text("Click[Buy Now]", "0.9")

    return respond


def config_for(task_ids, api_base) -> RunConfig:
    return RunConfig(
        domain="webshop", task_ids=task_ids, model="openai/fake", api_base=api_base, step_budget=12,
        prompt_sha256=prompt_sha256(DOMAIN.system_prompt()), package_version="0.1.0",
        decoding=DecodingConfig(max_tokens=64),
    )


def first_goal_with_options(k: int) -> list[str]:
    """Task ids of goals whose product has options with at least two values each."""
    out = []
    for i, g in enumerate(GOALS):
        opts = DOMAIN.resources.catalog.by_asin[g["asin"]]["options"]
        if g["goal_options"] and all(len(v) >= 2 for v in opts.values()):
            out.append(f"ws-{i}")
        if len(out) == k:
            return out
    raise AssertionError("not enough goals with options")


def test_perfect_shopper_succeeds_and_wrong_option_fails(fake_server, tmp_path):
    tasks = first_goal_with_options(1)
    with fake_server(shopper(wrong_option=False)) as srv:
        summary = run_batch(config_for(tasks, srv.base_url), tmp_path / "good", settings=BatchSettings(concurrency=2, progress=False))
    assert summary.ok
    eps = {e.task_id: e for e in read_episodes(tmp_path / "good")}
    for tid in tasks:
        e = eps[tid]
        goal = GOALS[int(tid[3:])]
        assert e.stop_reason == StopReason.clean and e.outcome == 1 and e.reward == 1.0
        assert e.steps[0].repair_attempts == 1 and "Search[query] or Click[target]" in e.steps[0].attempts[0].error
        assert e.steps[0].action == "Click[Checkout]" and e.steps[0].info["noop"] is True
        assert e.steps[0].observation == e.task_prompt.removeprefix("Observation: ")  # the page stayed
        assert e.n_steps == 4 + len(goal["goal_options"])  # no-op, search, asin, options..., buy
        assert e.steps[-1].info["state"]["options"] == goal["goal_options"]
        assert e.steps[-1].info["noop_steps"] == e.reward_info["noop_steps"] == 1
        assert e.reward_info["purchased_asin"] == goal["asin"]
    info = read_manifest(tmp_path / "good").info["webshop"]
    assert info["goals_sha256"] == DOMAIN.resources.goals_sha256 and info["split"] == "test"

    with fake_server(shopper(wrong_option=True)) as srv:
        run_batch(config_for(tasks[:1], srv.base_url), tmp_path / "bad", settings=BatchSettings(concurrency=1, progress=False))
    (e,) = read_episodes(tmp_path / "bad")
    assert e.stop_reason == StopReason.clean and e.outcome == 0 and e.reward < 1.0


def test_cli_dry_run_and_data_error(tmp_path, capsys):
    from uqh.cli import main

    assert main(["run", "--domain", "webshop", "--tasks", "3", "--out", str(tmp_path / "r"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "task ids      ws-0, ws-1, ws-2" in out and "step budget   30" in out
    assert not (tmp_path / "r").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", "--domain", "webshop", "--tasks", "3", "--data", str(empty), "--out", str(tmp_path / "r"),
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqh run: error: no items_shuffle_1000.json") and "--data DIR" in err
