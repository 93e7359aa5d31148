"""Paper presets (Appendix K, Tables 15-16) and their offline dry-run plan."""
from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from uqh.harness.config import plan as dry_run
from uqh.harness.config import presets
from uqh.harness.config.build import RunOverrides, draft
from uqh.rundir.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def test_table15_decoding_shared_by_every_preset():
    assert set(presets.PRESETS) == {
        "paper-strategyqa", "paper-hotpotqa", "paper-tau2-airline", "paper-tau2-retail", "paper-tau2-telecom", "paper-webshop"}
    for name in presets.PRESETS:
        p = presets.get_preset(name)
        assert p.name == name
        dec = p.decoding
        assert (dec.temperature, dec.top_p, dec.top_logprobs, dec.max_tokens, dec.reasoning, dec.seed) == (
            0.2, 1.0, 5, 64_000, True, 42)
        assert dec.logprobs is True
        assert p.model == "openrouter/google/gemma-4-31b-it"
        assert p.observation_chars == 420
        # a preset is a typed partial RunConfig: every field but its metadata is a RunConfig field
        from uqh.rundir.schema import RunConfig

        assert set(type(p).model_fields) - {"name", "description", "expected_tasks", "out", "n_tasks"} <= set(
            RunConfig.model_fields)


@pytest.mark.parametrize(
    "name,budget,n_tasks,options",
    [
        ("paper-strategyqa", 16, None, {"top_k": 3}),
        ("paper-hotpotqa", 7, 2000, {"top_k": 5}),
        ("paper-tau2-airline", 50, None, {"max_hops": 120}),
        ("paper-webshop", 30, 500, {"n_products": 1000, "goal_source": "auto"}),
    ],
)
def test_table16_per_dataset(name, budget, n_tasks, options):
    p = presets.get_preset(name)
    assert p.step_budget == budget and p.n_tasks == n_tasks and p.domain_options == options


def test_tau2_user_simulator_and_base_split_total_278():
    tau = [presets.get_preset(n) for n in presets.expand("paper-tau2")]
    assert all(p.user_model == "openrouter/qwen/qwen-2.5-7b-instruct" and p.split == "base" for p in tau)
    assert sum(p.expected_tasks for p in tau) == 278  # Table 6: Tau2-Bench total 278


def test_get_preset_returns_a_copy_and_unknown_names_are_user_errors():
    p = presets.get_preset("paper-hotpotqa")
    p.domain_options["top_k"] = 9
    assert presets.get_preset("paper-hotpotqa").domain_options == {"top_k": 5}
    with pytest.raises(UserError, match="unknown preset 'paper-nope'"):
        presets.get_preset("paper-nope")
    with pytest.raises(UserError, match="a group"):
        presets.get_preset("paper-tau2")


def test_estimate_closed_form():
    config = draft(presets.get_preset("paper-hotpotqa"), RunOverrides()).config
    est = dry_run.estimate(config, n_tasks=10, prompt_chars=400)
    # B=7, sys=100 tokens, task=150, obs=105, step=200: 7*(100+150) + 21*(200+105) = 1750 + 6405
    assert est.prompt_tokens == 10 * 8155
    assert est.calls_max == 70 and est.calls_max_with_repairs == 210
    assert est.completion_tokens == 70 * 200 and est.completion_tokens_cap == 70 * 64_000


def test_plan_is_offline_and_states_tasks_calls_tokens(monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("the dry run opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    for name in list(presets.PRESETS) + ["paper-tau2", "paper-all"]:
        text = dry_run.plan(name)
        assert "dry run: no model was called." in text
        for block in text.split("\n\n")[:-1]:
            tasks = int(re.search(r"tasks\s+([\d,]+)", block).group(1).replace(",", ""))
            budget = int(re.search(r"step budget\s+(\d+)", block).group(1))
            calls = int(re.search(r"model calls\s+<= ([\d,]+)", block).group(1).replace(",", ""))
            assert calls == tasks * budget
            assert re.search(r"prompt tokens\s+~[\d,]+", block)
    assert dry_run.plan("paper-all").count("preset paper-") == 6


def test_plan_overrides_model():
    assert "model           openai/my-model" in dry_run.plan("paper-webshop", overrides=RunOverrides(model="openai/my-model"))


def test_regenerate_script_dry_run_exits_zero_without_network():
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "HOME": "/tmp", "NO_PROXY": "*",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    # every preset's plan is checked in-process above (sockets forbidden); here the script's wiring, on two presets
    # (the script is `uqh regenerate`: per-preset options with --set, tests/test_regenerate.py)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "regenerate_paper.sh"), "--dry-run", "paper-strategyqa",
                           "paper-hotpotqa", "--set", "all:model=openai/other", "--set", "paper-strategyqa:tasks=2"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("preset paper-") == 2 and "dry run: no model was called." in proc.stdout
    assert proc.stdout.count("model           openai/other") == 2


def test_regenerate_script_rejects_unknown_preset_before_running_anything():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "regenerate_paper.sh"), "--dry-run", "paper-nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown preset 'paper-nope'" in proc.stderr and proc.stdout == ""


def test_python_m_presets_cli(capsys):
    assert dry_run.main(["paper-webshop", "--model", "openai/x"]) == 0
    assert "model           openai/x" in capsys.readouterr().out
    assert dry_run.main(["nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err


def test_note_only_when_the_local_data_holds_fewer_tasks_than_asked():
    assert "NOTE" not in dry_run.plan("paper-strategyqa", overrides=RunOverrides(tasks=2))
    text = dry_run.plan("paper-hotpotqa", overrides=RunOverrides(tasks=10**6))
    assert "NOTE            1,000,000 tasks asked for; the local data holds" in text


def test_plan_falls_back_to_the_configured_count_when_the_domain_cannot_list(monkeypatch):
    from uqh.domains.webshop import WebShopDomain

    def broken(self, n, seed):
        raise UserError("cannot load webshop: data missing")

    monkeypatch.setattr(WebShopDomain, "select_task_ids", broken)
    dry_run._INSPECTED.clear()
    try:
        text = dry_run.plan("paper-webshop")
        assert "tasks           500 (as configured; the domain could not list tasks offline: cannot load webshop" in text
        assert "tasks           7 (as configured" in dry_run.plan("paper-webshop", overrides=RunOverrides(tasks=7))
    finally:
        dry_run._INSPECTED.clear()


def _no_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the dry run opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _map_price(model: str) -> tuple[float, float]:
    """(input, output) USD per token of ``model`` in litellm's bundled price map, read as plain JSON."""
    import importlib.util
    import json
    from pathlib import Path

    folder = Path(importlib.util.find_spec("litellm").submodule_search_locations[0])
    entry = json.loads((folder / "model_prices_and_context_window_backup.json").read_text())[model]
    return entry["input_cost_per_token"], entry["output_cost_per_token"]


def test_dry_run_dollar_estimate_from_litellms_price_map_offline(monkeypatch):
    _no_network(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy")
    p_in, p_out = _map_price("gpt-4o-mini")
    assert dry_run.dollar_estimate("gpt-4o-mini", 1_000_000, 10_000) == pytest.approx(1e6 * p_in + 1e4 * p_out)
    assert dry_run.dollar_estimate("openai/my-server-model", 10, 10) is None
    assert dry_run.dollar_estimate("local:smollm2", 10, 10) is None

    text = dry_run.plan("paper-strategyqa", overrides=RunOverrides(model="gpt-4o-mini", tasks=10))
    block = text.split("\n\n")[0]
    prompt = int(re.search(r"prompt tokens\s+~([\d,]+)", block).group(1).replace(",", ""))
    output = int(re.search(r"output tokens\s+~([\d,]+)", block).group(1).replace(",", ""))
    usd = float(re.search(r"cost\s+~\$([\d,.]+) at litellm's prices for gpt-4o-mini", block).group(1).replace(",", ""))
    assert usd == pytest.approx(prompt * p_in + output * p_out, rel=1e-3, abs=1e-4)
    assert f"cost ~${usd}" in text.split("\n\n")[-1] or f"cost ~${usd:,.2f}" in text.split("\n\n")[-1]
    # the paper's OpenRouter model is not in the map: unpriced, never $0
    paper = dry_run.plan("paper-strategyqa", overrides=RunOverrides(tasks=10))
    assert "unpriced (litellm's price map has no openrouter/google/gemma-4-31b-it" in paper
    assert "cost unpriced" in paper.split("\n\n")[-1] and "$0" not in paper


def test_plan_prompt_line_reads_plainly():
    text = dry_run.plan("paper-hotpotqa", overrides=RunOverrides(tasks=3))
    line = next(ln for ln in text.splitlines() if "prompt tokens" in ln)
    assert re.search(r"\(system prompt ~[\d,]+ tokens, resent every call; measured on ", line), line
    assert "system prompt the domain" not in text


def test_uqh_run_dry_run_states_tokens_and_cost(tmp_path, capsys, monkeypatch):
    from uqh.cli import main

    _no_network(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy")
    assert main(["run", "--domain", "arithmetic", "--tasks", "4", "--model", "gpt-4o-mini", "--out",
                 str(tmp_path / "r"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    p_in, p_out = _map_price("gpt-4o-mini")
    prompt = int(re.search(r"prompt tokens ~([\d,]+)", out).group(1).replace(",", ""))
    output = int(re.search(r"output tokens ~([\d,]+)", out).group(1).replace(",", ""))
    usd = float(re.search(r"cost\s+~\$([\d.]+) at litellm's prices", out).group(1))
    assert usd == pytest.approx(prompt * p_in + output * p_out, abs=1e-4)
    assert not (tmp_path / "r").exists()
    assert main(["run", "--domain", "arithmetic", "--tasks", "4", "--model", "local:smollm2", "--out",
                 str(tmp_path / "r"), "--dry-run"]) == 0
    assert "cost          unpriced (a local model" in capsys.readouterr().out


def test_regenerate_script_dry_run_plans_the_continuation_and_the_report():
    """Issue 29: the whole protocol -- the runs, HotpotQA's continuation on a seeded sample of 100 prefixes, one
    report -- with the continuation's call bound; no continuation when HotpotQA is not among the presets."""
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "HOME": "/tmp", "NO_PROXY": "*",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    script = str(ROOT / "scripts" / "regenerate_paper.sh")
    model: list[str] = []  # the paper's model: planning needs no key
    proc = subprocess.run(["bash", script, "--dry-run", "paper-hotpotqa", *model], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    budget = presets.get_preset("paper-hotpotqa").step_budget
    assert (f"continue paper-hotpotqa: <= 100 sampled max-step prefixes (seed 42) x 10 branches x <= {budget} extra "
            f"steps = <= {1000 * budget:,} steps, <= {3000 * budget:,} model calls") in proc.stdout
    assert "-> runs/paper-hotpotqa-continue" in proc.stdout
    assert "report   every run and continuation under runs -> runs/report-paper (--min-valid 5)" in proc.stdout
    proc = subprocess.run(["bash", script, "--dry-run", "--sample", "20", "--branches", "4", "paper-strategyqa",
                           *model], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "continue paper-" not in proc.stdout and "report   every run" in proc.stdout
