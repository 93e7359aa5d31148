"""`uqh regenerate` (issue 43): per-preset options, the quick protocol end to end on the fake OpenAI server (the four
benchmarks, their continuations, ONE report over all of them that renders in Chromium without a console error),
resume (a second call runs no episode), a later call with fewer presets keeps the others in the report, and bad
input (one line, exit 2, nothing written)."""
from __future__ import annotations

import json

import pytest

from uqh.cli import main as uqh
from uqh.harness.regenerate import QUICK_PRESETS, build_plan, parse_setting, report_inputs
from uqh.rundir.errors import UserError
from uqh.rundir.reader import RunDir
from tau2_fixtures import AGENT_MARK, ORDER, USER_MARK, USER_OPEN, tool


def test_set_gives_each_preset_its_own_options():
    plan = build_plan(["paper-webshop", "paper-tau2-retail"], settings=[
        "all:model=local:smollm2", "all:tasks=2",
        "paper-webshop:-D goal_source=synthetic", "paper-webshop:tasks=3",
        "paper-tau2-retail:user_model=local:smollm2", "paper-tau2-retail:decoding.max_tokens=128"])
    web, tau = plan.runs["paper-webshop"], plan.runs["paper-tau2-retail"]
    assert web.domain_options == {"goal_source": "synthetic"} and web.tasks == 3 and web.user_model is None
    assert tau.domain_options == {} and tau.tasks == 2 and tau.user_model == "local:smollm2"
    assert tau.decoding.max_tokens == 128 and web.decoding.max_tokens is None
    assert web.model == tau.model == "local:smollm2"
    assert plan.continued() == []  # the paper continues HotpotQA only, which is not among these presets
    assert parse_setting("p:top_k=5") == ("p", ["top_k"], 5)
    assert parse_setting('p:domain_options.data="x.json"') == ("p", ["domain_options", "data"], "x.json")


def test_quick_plan_runs_the_four_benchmarks_offline_and_continues_each():
    plan = build_plan([], quick=True, settings=["paper-hotpotqa:tasks=2"])
    assert plan.presets == QUICK_PRESETS and plan.continued() == QUICK_PRESETS
    assert all(o.model == "local:smollm2" for o in plan.runs.values())
    assert plan.runs["paper-webshop"].domain_options == {"goal_source": "synthetic"}
    assert plan.runs["paper-tau2-retail"].user_model == "local:smollm2"
    assert plan.runs["paper-hotpotqa"].tasks == 2 and plan.runs["paper-hotpotqa"].step_budget == 3
    # the user's `all` wins over the protocol's per-preset settings (tasks 6 / 4 / 3 / 1), the rest stays
    plan = build_plan([], quick=True, settings=["all:tasks=1"])
    assert {o.tasks for o in plan.runs.values()} == {1} and plan.runs["paper-webshop"].step_budget == 3


@pytest.mark.parametrize("settings, message", [
    (["nope:tasks=1"], "unknown preset 'nope'"),
    (["paper-webshop:tasks=1"], "paper-webshop is not among the presets run"),
    (["paper-hotpotqa:taks=1"], "--set paper-hotpotqa:taks: Extra inputs are not permitted"),
    (["paper-hotpotqa:tasks=many"], "--set paper-hotpotqa:tasks:"),
    (["paper-hotpotqa:out=x"], "is not an option: runs go to --out/PRESET"),
    (["paper-hotpotqa"], "--set expects PRESET:KEY=VALUE"),
])
def test_bad_settings_are_one_line_errors(settings, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[")):
        build_plan(["paper-hotpotqa"], settings=settings)


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "runs"
    for argv, message in ([["--quick", "--set", "nope:tasks=1"], "unknown preset"],
                          [["--quick", "--branches", "0"], "--branches: Input should be greater than or equal to 1"],
                          [["--quick", "--min-valid", "0"], "--min-valid must be at least 1"],
                          [["paper-nope"], "unknown preset 'paper-nope'"]):
        assert uqh(["regenerate", *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
        assert not out.exists()


def responder(req: dict) -> str:
    """Every quick benchmark on one server: Tau2's user opens with a return request and the agent keeps reading
    the order; QA agents search (and finish once in a while, by the call's seed); WebShop searches, then clicks a
    target that is not on the page (the original's no-op). Budgets this short leave max_steps prefixes."""
    system = req["messages"][0]["content"]
    if system.startswith(USER_MARK):
        return USER_OPEN
    if system.startswith(AGENT_MARK):
        return tool("get_order_details", {"order_id": ORDER})
    n = sum(m["role"] == "assistant" for m in req["messages"])
    if "Search[...] or Click[...]" in system:
        action = "Search[hoodie]" if "Search bar: available" in req["messages"][-1]["content"] else "Click[Checkout]"
    elif n >= 1 and req.get("seed", 0) % 3 == 0:
        action = "Finish[yes]"
    else:
        action = "Search[river]"
    return f"<think>t</think>\n<action>{action}</action>\n<confidence>0.{3 + n}</confidence>\n<explanation>e</explanation>"


def test_quick_protocol_end_to_end_resumes_and_keeps_one_report(fake_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    out = tmp_path / "runs"
    with fake_server(responder) as srv:
        fake = ["--set", "all:model=openai/fake", "--set", f"all:api_base={srv.base_url}",
                "--set", "paper-tau2-retail:user_model=openai/fake",
                "--set", f"paper-tau2-retail:user_api_base={srv.base_url}"]
        argv = ["regenerate", "--quick", "--out", str(out), "--bootstrap", "20", *fake]
        assert uqh(argv) == 0
        first = capsys.readouterr()
        n_calls = len(srv.requests)
        # progress throughout: every step announced, and the runner's own progress lines for runs and branches
        for i, name in enumerate(QUICK_PRESETS, 1):
            assert f"[{i}/8] run {name}" in first.out and f"[{i + 4}/8] continue {name}" in first.out
        assert "uqh run: 4 episodes to run" in first.err and "uqh continue: " in first.err
        runs = [out / name for name in QUICK_PRESETS]
        episodes = {d: (d / "episodes.jsonl").read_bytes() for d in runs}
        conts = [d for d in out.iterdir() if d.name.endswith("-continue")]
        assert len(conts) == 4 and all(RunDir.open(c).episodes() for c in conts)
        report = json.loads((out / "report-paper" / "report.json").read_text())
        assert len(report["runs"]) == 4  # ONE report over every preset
        assert sum(len(r["censored_prefixes"]) for r in report["runs"]) == 4  # ... and every continuation
        assert RunDir.open(out / "paper-webshop").manifest.info["webshop"]["goal_source"] == "synthetic"
        page = (out / "report-paper" / "report.html").read_text()
        assert "SYNTHETIC WebShop goals" in page

        assert uqh(argv) == 0  # resume: everything is done, no episode runs, no model is called
        second = capsys.readouterr().out
        assert len(srv.requests) == n_calls and {d: (d / "episodes.jsonl").read_bytes() for d in runs} == episodes
        assert "0 episodes and branches this call" in second

    # another continuation design over the same directories is refused before any step runs, naming the field
    before = {d: d.stat().st_mtime_ns for d in out.rglob("*") if d.is_file()}
    with fake_server(responder) as srv2:
        assert uqh(["regenerate", "--quick", "--out", str(out), "--seed", "7", "--set", "all:model=openai/fake",
                    "--set", f"all:api_base={srv2.base_url}", "--set", "paper-tau2-retail:user_model=openai/fake",
                    "--set", f"paper-tau2-retail:user_api_base={srv2.base_url}"]) == 2
        assert srv2.requests == []
    err = capsys.readouterr().err
    assert err.startswith("uqh regenerate: error: paper-strategyqa: ") and err.count("\n") == 1, err
    assert {d: d.stat().st_mtime_ns for d in out.rglob("*") if d.is_file()} == before
    # a later call with one preset reports on the four runs (not overwritten per preset), saying so
    runs_, conts_, notes = report_inputs(build_plan(["paper-webshop"], quick=True, out=out))
    assert sorted(runs_) == sorted(runs) and sorted(conts_) == sorted(conts)
    assert len(notes) == 3 and all("run by an earlier call" in n for n in notes)
    _renders_without_console_error(out / "report-paper" / "report.html")


def _renders_without_console_error(html):
    import importlib.util

    from environment import unavailable

    if importlib.util.find_spec("playwright") is None:
        unavailable("playwright not installed")
    from uqh.reports.report.browser import browser, find_chromium, open_report

    chromium = find_chromium()
    if chromium is None:
        unavailable("chromium not installed")
    with browser(chromium) as b:
        page, errors = open_report(b, html, url_hash="sensitivity")
        assert page.locator("#trace-list tbody tr").count() > 0
        box = page.locator("#sensitivity input[data-filter]").first
        if box.count():  # a long table: filtering keeps only the rows with every word
            name = box.get_attribute("data-filter")
            total = page.locator(f"table[data-table='{name}'] tbody tr").count()
            box.fill("platt uniform")
            shown = page.locator(f"table[data-table='{name}'] tbody tr:not([hidden])").count()
            assert 0 < shown < total
        assert errors == []


def test_a_local_user_simulator_under_a_preset_gets_the_local_cap():
    """The quick protocol simulates Tau2's user with the local model: it gets the local user decoding (128 tokens),
    not the preset's API user model's 2,048 (a 135M model rambles to the cap on every turn)."""
    from uqh.harness.config.build import RunOverrides, draft, local_user_decoding
    from uqh.harness.config.presets import get_preset

    preset = get_preset("paper-tau2-retail")
    local = draft(preset, RunOverrides(user_model="local:smollm2")).config.user_decoding
    assert local == local_user_decoding() and local.max_tokens == 128
    assert draft(preset, RunOverrides()).config.user_decoding == preset.user_decoding  # the paper's user: unchanged
