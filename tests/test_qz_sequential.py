"""`uqh continue --stop-rule`: the fixed design unchanged, the sequential design a prefix of it, resume, and the
cached prompt tokens / cost the audit reports -- through the real runner and the fake server (OpenAI-style automatic
caching, and Anthropic's explicit cache through litellm)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from uqh.harness import continuation as cont
from uqh.cli import main as uqh
from uqh.harness.runner import run_batch
from uqh.harness.sampling.branch_rules import StopRule, decide, resolved_outcome
from uqh.rundir.errors import UserError
from uqh.harness.config.settings import BatchSettings
from run_files import read_episodes
from test_continuation import CALC, FINISH, Responder, _answer, make_config
from test_stop_rules import upper_after_zeros

DATA = Path(__file__).parent / "data" / "qz_fixed_before"
TASKS = [f"arith-{i:04d}" for i in range(6)]


def strip(ep) -> dict:
    """An episode without what differs between two runs of the same branch (clock times; how much of the prompt
    the server had cached, which depends on what it served before)."""
    d = ep.model_dump()
    d.pop("started_at")
    d.pop("finished_at")
    for att in [a for st in d["steps"] for a in st["attempts"]] + list(d["failed_step"] or []):
        att["call"]["latency_s"] = 0
        att["call"]["usage"]["cached_prompt_tokens"] = None
    return d


# ------------------------------------------------------------------------------------------ fixed: unchanged


def test_fixed_rule_writes_the_qz_file_it_wrote_before_stop_rules(tmp_path, fake_server):
    """tests/data/qz_fixed_before/ was written by `uqh continue` at commit 49ba1db (before --stop-rule existed) on
    exactly this scenario; `--stop-rule fixed` must reproduce it."""
    responder = Responder()
    with fake_server(responder) as srv:
        cfg = make_config("arithmetic", [f"arith-{i:04d}" for i in range(8)], srv.base_url, step_budget=1)
        assert run_batch(cfg, tmp_path / "src", settings=BatchSettings(progress=False)).ok
        responder.mode = "branch"
        for method in ("mc", "hybrid"):
            rc = uqh(["continue", str(tmp_path / "src"), "--out", str(tmp_path / "cont"), "--branches", "6",
                      "--extra-steps", "1", "--min-valid", "2", "--qz-method", method, "--bootstrap", "20",
                      "--no-progress", "--stop-rule", "fixed"])
            assert rc == 0
            new = (tmp_path / "cont" / "qz.jsonl").read_text()
            old = (DATA / f"qz_{method}.jsonl").read_text()
            if method == "mc":
                assert new == old  # byte for byte
            else:  # the plug-in rows are a Newton fit: equal up to float rounding of the linear algebra
                a, b = [json.loads(x) for x in new.splitlines()], [json.loads(x) for x in old.splitlines()]
                assert [{k: v for k, v in r.items() if k != "q_hat_z"} for r in a] == [
                    {k: v for k, v in r.items() if k != "q_hat_z"} for r in b]
                assert [r["q_hat_z"] for r in a] == pytest.approx([r["q_hat_z"] for r in b], abs=1e-12)
    assert not (tmp_path / "cont" / "stop_decisions.jsonl").exists()
    assert "stop_rule" not in json.loads((tmp_path / "cont" / "manifest.json").read_text())["config"]["continuation"]


# ------------------------------------------------------------------------------------------ sequential


class PrefixResponder:
    """Source: always Calc (every episode hits max_steps). Branch: the prefix (its question) decides the policy --
    prefixes 0 and 1 always answer wrongly, 2 always right, 3 right on even seeds, 4 unresolved (Calc) on seeds
    divisible by 3 and wrong otherwise, 5 right on seeds divisible by 3."""

    def __init__(self):
        self.mode = "source"
        from uqh.domains.arithmetic import make_question

        self.prefix_of = {f"Question: {make_question(t)[0]}": i for i, t in enumerate(TASKS)}

    def __call__(self, req: dict) -> str:
        if self.mode == "source":
            return CALC.format(c=0.3)
        question = req["messages"][1]["content"]
        i, seed, answer = self.prefix_of[question], req.get("seed") or 0, _answer(question)
        right = {0: False, 1: False, 2: True, 3: seed % 2 == 0, 4: False, 5: seed % 3 == 0}[i]
        if i == 4 and seed % 3 == 0:
            return CALC.format(c=0.5)
        return FINISH.format(a=answer if right else answer + 1)


@pytest.fixture
def source(tmp_path, fake_server):
    responder = PrefixResponder()
    srv = fake_server(responder, prompt_cache=True).__enter__()
    cfg = make_config("arithmetic", TASKS, srv.base_url, step_budget=1)
    src = tmp_path / "src"
    assert run_batch(cfg, src, settings=BatchSettings(progress=False)).ok
    responder.mode = "branch"
    srv.requests.clear()
    return src, srv


def continue_(src, out, rule, concurrency=None, **kw):
    kw = {"branches": 8, "extra_steps": 1, "settings": BatchSettings(progress=False, concurrency=concurrency), **kw}
    return cont.run_continuations(src, out, stop_rule=rule, **kw)


def decisions_file(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "stop_decisions.jsonl").read_text().splitlines()]


def test_sequential_run_is_a_prefix_of_the_fixed_run(source, tmp_path, capsys):
    src, srv = source
    fixed_dir, seq_dir = tmp_path / "fixed", tmp_path / "seq"
    continue_(src, fixed_dir, "fixed", concurrency=4)
    fixed_requests = srv.n_requests
    rep = continue_(src, seq_dir, "ci:0.3", concurrency=4)
    seq_requests = srv.n_requests - fixed_requests
    assert rep.stop_rule == "ci:0.3" and rep.n_branches_max == 48 and rep.n_branches_missing == 0

    fixed = {ep.episode_id: ep for ep in read_episodes(fixed_dir)}
    seq = {ep.episode_id: ep for ep in read_episodes(seq_dir)}
    by_id = {d.episode_id: d for d in rep.decisions}
    rule = StopRule(0.3)
    for i, t in enumerate(TASKS):
        eid = f"{t}#0"
        d = by_id[eid]
        # branch k is the same episode whichever rule ran it; the sequential run has exactly branches 0..n-1
        assert sorted(b for b in seq if b.startswith(eid + "@")) == sorted(f"{eid}@b{k}" for k in range(d.branches))
        for k in range(d.branches):
            assert strip(seq[f"{eid}@b{k}"]) == strip(fixed[f"{eid}@b{k}"])
        # the decision the rule takes on the fixed run's outcomes, round by round
        outcomes = [resolved_outcome(fixed[f"{eid}@b{k}"]) for k in range(8)]
        for target in rule.rounds(8):
            expect = decide(rule, eid, outcomes[:target], planned=target, max_branches=8)
            if expect.stopped_by:
                break
        assert d == expect
        if i in (0, 1, 2):  # all wrong / all right: 5 outcomes give half-width 0.2925 <= 0.3 (4 give 0.329)
            assert (d.branches, d.resolved, d.stopped_by) == (5, 5, "half_width")
            assert d.interval == pytest.approx((0.0, upper_after_zeros(5)) if i < 2 else (1 - upper_after_zeros(5), 1))
    assert [json.loads(x.model_dump_json()) for x in rep.decisions] == decisions_file(seq_dir)
    assert rep.n_branches_written == len(seq) < len(fixed) == 48
    assert seq_requests < fixed_requests

    # qz.jsonl: the sequential run records branches, rule and (MC records) the interval; the fixed one does not
    rc = uqh(["continue", str(src), "--out", str(seq_dir), "--qz-only", "--qz-method", "hybrid", "--min-valid", "2",
              "--bootstrap", "20"])
    assert rc == 0
    records = [json.loads(x) for x in (seq_dir / "qz.jsonl").read_text().splitlines()]
    for r in records:
        d = by_id[r["episode_id"]]
        assert r["branches"] == d.branches and r["stop_rule"] == "ci:0.3"
        assert (r.get("interval") == list(d.interval)) == (r["method"] == "mc")
    assert any(r["method"] == "mc" for r in records)
    uqh(["continue", str(src), "--out", str(fixed_dir), "--qz-only", "--min-valid", "2", "--bootstrap", "20"])
    assert all(set(json.loads(x)) == {"episode_id", "q_hat_z", "n_valid", "method"}
               for x in (fixed_dir / "qz.jsonl").read_text().splitlines())
    audit = json.loads((seq_dir / "audit.json").read_text())["cost"]
    assert audit["branches"] == len(seq) and audit["branches_max"] == 48 and audit["decision_mismatch"] == 0
    assert audit["stopped_half_width"] + audit["stopped_max_branches"] == 6 and audit["open"] == 0
    text = (seq_dir / "audit.md").read_text()
    assert re.search(rf"\| ci:0\.3 +\| +{len(seq)} \| +48 \|", text)  # branches run, of at most 48
    # --format csv: numbers in the cells, never display strings (issue 33, item 13)
    capsys.readouterr()
    rc = uqh(["continue", str(src), "--out", str(seq_dir), "--qz-only", "--min-valid", "2", "--bootstrap", "20",
              "--format", "csv"])
    out = capsys.readouterr().out
    assert rc == 0 and f"ci:0.3,{len(seq)},48," in out and " of 48" not in out and "%" not in out


def test_killed_sequential_run_resumes_to_the_same_decisions(source, tmp_path):
    from uqh.harness.model.client import make_model_client
    from uqh.harness.model.call_errors import ModelCallFailed
    from uqh.rundir.schema import DecodingConfig

    src, _ = source
    reference = continue_(src, tmp_path / "ref", "ci:0.3", concurrency=1)
    calls = {"n": 0}

    class FailsOnce:  # the 9th call (in the second round) fails after retries: its branch is not written
        def __init__(self, model, api_base):
            self.inner = make_model_client(model, api_base=api_base, decoding=DecodingConfig(max_tokens=64, seed=42))

        async def complete(self, messages, *, seed=None):
            calls["n"] += 1
            if calls["n"] == 9:
                raise ModelCallFailed("simulated outage")
            return await self.inner.complete(messages, seed=seed)

        async def aclose(self):
            await self.inner.aclose()

    out = tmp_path / "cont"
    first = continue_(src, out, "ci:0.3", concurrency=1, client_factory=FailsOnce)
    assert first.n_branches_missing == 1
    (open_,) = [d for d in first.decisions if d.stopped_by is None]
    assert open_.branches < 5 and [d["stopped_by"] for d in decisions_file(out)].count(None) == 1
    (out / "stop_decisions.jsonl").unlink()  # the decisions are re-derived from the episodes, not from this file
    second = continue_(src, out, "ci:0.3", concurrency=1)
    assert second.decisions == reference.decisions and second.n_branches_missing == 0
    assert decisions_file(out) == decisions_file(tmp_path / "ref")
    assert sorted(e.episode_id for e in read_episodes(out)) == sorted(e.episode_id for e in read_episodes(tmp_path / "ref"))
    with pytest.raises(UserError, match="different config"):
        continue_(src, out, "ci:0.2")
    with pytest.raises(UserError, match="different config"):
        continue_(src, out, "fixed")


def test_stop_rule_user_errors(source, tmp_path, capsys):
    src, srv = source
    for rule, msg in [("bogus", "unknown --stop-rule"), ("ci:0.7", "must be a number in (0, 0.5)")]:
        out = tmp_path / "never"
        rc = uqh(["continue", str(src), "--out", str(out), "--stop-rule", rule, "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1
        assert not out.exists()
    assert srv.requests == []


def test_branches_share_a_byte_identical_prefix_that_the_cache_serves(source, tmp_path):
    """OpenAI-style automatic caching: the first request of every branch of a prefix is the same bytes; after the
    warm-up round (branch 0 alone), the first call of every other branch reads its whole prompt from the cache."""
    src, srv = source
    out = tmp_path / "seq"
    continue_(src, out, "ci:0.3", concurrency=4)
    first = {}
    for req in srv.requests:
        first.setdefault(req["seed"], req)
    for ep in read_episodes(out):
        same = [r for r in first.values() if r["messages"][1]["content"] == ep.task_prompt]
        assert len({json.dumps(r["messages"]) for r in same}) == 1
        usage = ep.steps[ep.prefix_steps].attempts[0].call.usage
        if ep.branch_index >= 1:
            assert usage.cached_prompt_tokens == usage.prompt_tokens > 0
        else:  # the source run's first request (system + task) was cached; the replayed step was not
            assert 0 < usage.cached_prompt_tokens < usage.prompt_tokens
    rc = uqh(["continue", str(src), "--out", str(out), "--qz-only", "--min-valid", "2", "--bootstrap", "20"])
    assert rc == 0
    cost = json.loads((out / "audit.json").read_text())["cost"]
    calls = [a.call for ep in read_episodes(out) for st in ep.steps[ep.prefix_steps:] for a in st.attempts]
    calls += [a.call for ep in read_episodes(out) for a in ep.failed_step or []]
    assert cost["calls"] == len(calls) == cost["calls_reporting_cache"]
    assert cost["cached_prompt_tokens"] == sum(c.usage.cached_prompt_tokens for c in calls)
    assert cost["prompt_tokens"] == sum(c.usage.prompt_tokens for c in calls)
    text = (out / "audit.md").read_text()
    assert re.search(rf"\| +{cost['cached_prompt_tokens']:,} \| +{cost['prompt_tokens'] - cost['cached_prompt_tokens']:,} \|",
                     text)


# ------------------------------------------------------------------------------------------ Anthropic via litellm


def test_anthropic_prefix_marked_cached_and_priced_through_litellm(tmp_path, fake_server):
    """A Claude model through litellm against the fake server's Messages API: the system prompt and the last
    message carry cache_control, parameters Anthropic rejects are not sent, the cache read / write counts land in
    the call records and the cost uses the price map's cache rates."""
    import litellm

    model = "anthropic/claude-haiku-4-5"
    price = litellm.model_cost["claude-haiku-4-5"]
    state = {"mode": "source"}

    def responder(req):
        if state["mode"] == "source":
            return CALC.format(c=0.3)
        return FINISH.format(a=_answer(req["messages"][1]["content"]))

    with fake_server(responder) as srv:
        cfg = make_config("arithmetic", TASKS[:2], srv.root_url, step_budget=1).model_copy(update={"model": model})
        assert run_batch(cfg, tmp_path / "src", settings=BatchSettings(progress=False, concurrency=1)).ok
        state["mode"] = "branch"
        srv.requests.clear()
        rep = cont.run_continuations(tmp_path / "src", tmp_path / "cont", branches=3, extra_steps=1, settings=BatchSettings(concurrency=1, progress=False))
        assert rep.n_branches_written == 6
    for req in srv.requests:
        assert "seed" not in req and "logprobs" not in req and "top_logprobs" not in req
        assert req["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert req["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
        assert sum("cache_control" in b for m in req["messages"] for b in m["content"]) == 1
    for ep in read_episodes(tmp_path / "cont"):
        call = ep.steps[ep.prefix_steps].attempts[0].call
        u = call.usage
        assert call.seed is None and not call.has_logprobs  # not sent, not recorded as if it had been
        if ep.branch_index == 0:  # the system prompt was cached by the source run; the rest is written now
            assert 0 < u.cached_prompt_tokens < u.prompt_tokens and u.cache_write_prompt_tokens > 0
        else:  # the same request again: read whole from the cache
            assert u.cached_prompt_tokens == u.prompt_tokens and u.cache_write_prompt_tokens == 0
        uncached = u.prompt_tokens - u.cached_prompt_tokens - u.cache_write_prompt_tokens
        expect = (uncached * price["input_cost_per_token"] + u.cached_prompt_tokens * price["cache_read_input_token_cost"]
                  + u.cache_write_prompt_tokens * price["cache_creation_input_token_cost"]
                  + u.completion_tokens * price["output_cost_per_token"])
        assert call.cost_usd == pytest.approx(expect, rel=1e-12)
    rc = uqh(["continue", str(tmp_path / "src"), "--out", str(tmp_path / "cont"), "--qz-only", "--min-valid", "1",
              "--bootstrap", "20"])
    assert rc == 0
    cost = json.loads((tmp_path / "cont" / "audit.json").read_text())["cost"]
    assert cost["unpriced_calls"] == 0 and cost["cost_usd"] > 0 and cost["cache_write_prompt_tokens"] > 0
    shutil.rmtree(tmp_path / "src")
