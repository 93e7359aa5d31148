"""`uqh continue`: replayed prefixes, branches, seeds, no prefix model calls, skipped prefixes, q_Z and the audit.

A source run is made with the real batch runner against the fake OpenAI server; the responder decides what the
"model" says from the request (mode and per-branch seed), so every branch outcome is known in advance.
"""
from __future__ import annotations

import hashlib
import json
import re
import os
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from uqh import __version__ as uqh_version
from uqh.domains.domain_registry import get_domain_class
from uqh.domains.arithmetic import make_question
from uqh.harness import continuation as cont
from uqh.reports.continuation_audit import audit_continuation
from uqh.cli import main as uqh
from uqh.harness.episode.loop import build_messages, derive_seed
from uqh.harness.config.build import prompt_sha256
from uqh.harness.runner import run_batch
from uqh.rundir.errors import UserError
from uqh.rundir.schema import DecodingConfig, Episode, RunConfig, StopReason
from uqh.harness.config.settings import BatchSettings
from run_files import read_episodes, read_manifest

CALC = "<think>keep going</think>\n<action>Calc[1+1]</action>\n<confidence>{c}</confidence>\n<explanation>unsure</explanation>"
FINISH = "<think>done</think>\n<action>Finish[{a}]</action>\n<confidence>0.9</confidence>\n<explanation>computed</explanation>"
GARBAGE = "I refuse to use tags."


class Responder:
    """Source mode: always Calc (so every episode hits max_steps). Branch mode: the branch's fate is a function of
    its decoding seed: seed % 4 == 0 -> correct Finish, 1 -> wrong Finish, 2 -> Calc (unresolved), 3 -> garbage
    (parse error after the repairs, whatever their seeds)."""

    def __init__(self):
        self.mode = "source"

    def __call__(self, req: dict) -> str:
        if self.mode == "source":
            return CALC.format(c=0.3)
        if any(m["role"] == "assistant" and m["content"] == GARBAGE for m in req["messages"]):
            return GARBAGE  # a repair (sent with its own seed) of a garbage branch stays garbage
        question = req["messages"][1]["content"]
        answer = _answer(question)
        fate = req["seed"] % 4
        if fate == 0:
            return FINISH.format(a=answer)
        if fate == 1:
            return FINISH.format(a=answer + 1)
        if fate == 2:
            return CALC.format(c=0.5)
        return GARBAGE


def _answer(question: str) -> int:
    from uqh.domains.arithmetic import safe_eval

    expr = re.search(r"What is (.*)\?", question).group(1)
    return int(safe_eval(expr))


def fate(source_id: str, k: int, run_seed: int = 42) -> int:
    return cont.branch_seed(run_seed, source_id, k) % 4


def make_config(domain: str, task_ids, base_url: str, *, step_budget: int, options=None) -> RunConfig:
    cls = get_domain_class(domain)
    d = cls(options or {})
    return RunConfig(
        domain=domain,
        task_ids=list(task_ids),
        model="openai/fake",
        api_base=base_url,
        decoding=DecodingConfig(max_tokens=64, seed=42),
        step_budget=step_budget,
        domain_options=options or {},
        prompt_sha256=prompt_sha256(d.system_prompt()),
        package_version=uqh_version,
    )


def tree_digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


TASKS = [f"arith-{i:04d}" for i in range(3)]


@pytest.fixture
def source_run(tmp_path, fake_server):
    responder = Responder()
    srv = fake_server(responder).__enter__()
    cfg = make_config("arithmetic", TASKS, srv.base_url, step_budget=2)
    src = tmp_path / "source"
    summary = run_batch(cfg, src, settings=BatchSettings(progress=False))
    assert summary.ok
    responder.mode = "branch"
    srv.requests.clear()
    return src, srv, responder


def test_branches_continue_recorded_prefix_without_prefix_calls(source_run, tmp_path):
    src, srv, _ = source_run
    before = tree_digest(src)
    source = {ep.episode_id: ep for ep in read_episodes(src)}
    assert all(ep.stop_reason == StopReason.max_steps and ep.n_steps == 2 for ep in source.values())
    out = tmp_path / "cont"
    report = cont.run_continuations(src, out, branches=4, extra_steps=1, settings=BatchSettings(concurrency=3, progress=False))
    assert report.skipped == [] and report.n_branches_planned == 12 and report.n_branches_written == 12
    assert tree_digest(src) == before  # the source run is never modified

    manifest = read_manifest(out)
    c = manifest.config.continuation
    assert c["source_run_dir"] == str(src.resolve()) and c["branches"] == 4 and c["extra_steps"] == 1
    assert c["source_config_hash"] == read_manifest(src).config_hash
    assert manifest.config.step_budget == 3 and manifest.config.model == "openai/fake"

    branches = {ep.episode_id: ep for ep in read_episodes(out)}
    assert sorted(branches) == sorted(f"{s}@b{k}" for s in source for k in range(4))
    system = read_manifest(src).system_prompt
    first_requests = {}
    for req in srv.requests:
        if not any(m["role"] == "assistant" and m["content"] == GARBAGE for m in req["messages"]):  # not a repair
            first_requests.setdefault(req["seed"], req)
    for bid, br in branches.items():
        s = source[br.source_episode_id]
        k = br.branch_index
        assert bid == f"{s.episode_id}@b{k}" and br.prefix_steps == 2
        assert br.seed == derive_seed(42, bid) == cont.branch_seed(42, s.episode_id, k)
        # the prefix is the source record, unchanged (forecasts included)
        assert [st.model_dump() for st in br.steps[:2]] == [st.model_dump() for st in s.steps]
        # the first request of the branch is the conversation rebuilt from the record
        req = first_requests[br.seed]
        assert req["messages"] == build_messages(system, s.task_prompt, s.steps)
        f = fate(s.episode_id, k)
        expect = {0: (StopReason.clean, 1), 1: (StopReason.clean, 0), 2: (StopReason.max_steps, None),
                  3: (StopReason.parse_error, None)}[f]
        assert (br.stop_reason, br.outcome) == expect
        if f in (0, 1):  # first new observation continues from the stopped state
            assert br.steps[2].t == 3 and br.steps[2].observation.startswith("Episode finished.")
    # no model call for the prefix: exactly one call per new attempt
    new_attempts = sum(
        sum(len(st.attempts) for st in br.steps[br.prefix_steps:]) + len(br.failed_step or []) for br in branches.values()
    )
    assert len(srv.requests) == new_attempts
    # seeds differ per branch (the repairs of the garbage branches send seeds of their own)
    assert len({first["seed"] for first in first_requests.values()}) == 12
    repairs = [a.call.seed for br in branches.values() for a in (br.failed_step or [])[1:]]
    assert repairs and all(seed not in first_requests for seed in repairs)

    # q_Z from the branches, hand-computed from the fates
    res, _ = audit_continuation(out, min_valid=1, method="mc", n_boot=50)
    for rec in res.records:
        fates = [fate(rec.episode_id, k) for k in range(4)]
        resolved = [f for f in fates if f in (0, 1)]
        assert rec.n_valid == len(resolved) and rec.method == "mc"
        assert rec.q_hat_z == pytest.approx(sum(f == 0 for f in resolved) / len(resolved))
    lines = (out / "qz.jsonl").read_text().splitlines()
    assert len(lines) == len(res.records)


def test_seeds_reproducible_and_resume(source_run, tmp_path):
    src, srv, _ = source_run
    a, b = tmp_path / "a", tmp_path / "b"
    cont.run_continuations(src, a, branches=2, extra_steps=1, settings=BatchSettings(progress=False))
    seeds_a = sorted(r["seed"] for r in srv.requests)
    srv.requests.clear()
    cont.run_continuations(src, b, branches=2, extra_steps=1, settings=BatchSettings(progress=False))
    assert sorted(r["seed"] for r in srv.requests) == seeds_a

    def strip(ep: Episode):
        d = ep.model_dump()
        for k in ("started_at", "finished_at"):
            d.pop(k)
        for st in d["steps"]:
            for att in st["attempts"]:
                att["call"]["latency_s"] = 0
        for att in d["failed_step"] or []:
            att["call"]["latency_s"] = 0
        return d

    ea = sorted((strip(e) for e in read_episodes(a)), key=lambda d: d["episode_id"])
    eb = sorted((strip(e) for e in read_episodes(b)), key=lambda d: d["episode_id"])
    assert ea == eb
    # re-running the same command resumes: nothing left to do, no model call
    srv.requests.clear()
    rep = cont.run_continuations(src, a, branches=2, extra_steps=1, settings=BatchSettings(progress=False))
    assert srv.requests == [] and rep.n_branches_written == 6
    # a different continuation config in the same directory is refused, as is a smaller M (a larger one resumes:
    # tests/test_continue_resume.py)
    with pytest.raises(UserError, match="different config"):
        cont.run_continuations(src, a, branches=2, extra_steps=2, settings=BatchSettings(progress=False))
    with pytest.raises(UserError, match="cannot be resumed with fewer"):
        cont.run_continuations(src, a, branches=1, extra_steps=1, settings=BatchSettings(progress=False))


def test_tampered_prefix_is_reported_and_not_continued(source_run, tmp_path, capsys):
    src, srv, _ = source_run
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    lines = (copy / "episodes.jsonl").read_text().splitlines()
    ep = json.loads(lines[1])
    tampered_id = ep["episode_id"]
    ep["steps"][1]["observation"] = "Result: 3"  # Calc[1+1] replays to "Result: 2"
    lines[1] = json.dumps(ep)
    ep2 = json.loads(lines[2])
    ep2["steps"][0]["action"] = "Bogus[1]"  # the environment now rejects the recorded action
    lines[2] = json.dumps(ep2)
    (copy / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "cont"
    rc = uqh(["continue", str(copy), "--branches", "2", "--extra-steps", "1", "--out", str(out), "--no-progress",
              "--min-valid", "1", "--bootstrap", "20"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"skipped {tampered_id}: replay mismatch: step 2" in printed
    skipped = [json.loads(x) for x in (out / "skipped_prefixes.jsonl").read_text().splitlines()]
    assert sorted(s["episode_id"] for s in skipped) == sorted([tampered_id, ep2["episode_id"]])
    reasons = {s["episode_id"]: s["reason"] for s in skipped}
    assert reasons[ep2["episode_id"]].startswith("replay failed: InvalidAction")
    ids = {e.source_episode_id for e in read_episodes(out)}
    assert ids.isdisjoint(reasons) and len(ids) == 1
    bad_questions = {f"Question: {make_question(i.split('#')[0])[0]}" for i in reasons}
    assert all(r["messages"][1]["content"] not in bad_questions for r in srv.requests)
    assert len(srv.requests) >= 2
    assert "skipped (not replayable) 2" in (out / "audit.md").read_text()


def test_user_errors(source_run, tmp_path, capsys):
    src, srv, _ = source_run
    cases = [
        (["--ids", "arith-0000#5"], "not in the source run"),
        (["--prefixes", "0"], "--prefixes must be at least 1"),
        (["--branches", "0"], "--branches must be at least 1"),
        (["--score", "bogus"], "unknown score"),
        (["--weights", "bogus"], "unknown weights"),
        (["--min-valid", "0"], "--min-valid must be at least 1"),
    ]
    for extra, msg in cases:
        out = tmp_path / "never"
        rc = uqh(["continue", str(src), "--out", str(out), "--extra-steps", "1", "--no-progress", *extra])
        assert rc == 2
        assert msg in capsys.readouterr().err
        assert not out.exists()
    rc = uqh(["continue", str(src), "--out", str(src / "inside"), "--no-progress"])
    assert rc == 2 and "outside the source run" in capsys.readouterr().err
    rc = uqh(["continue", str(tmp_path / "nope"), "--out", str(tmp_path / "x")])
    assert rc == 2 and "not a run directory" in capsys.readouterr().err
    assert srv.requests == []


def _write_run(run_dir: Path, config: RunConfig, episodes: list[Episode], system_prompt: str = "sys") -> None:
    from uqh.harness.store.writer import RunStore

    with RunStore.open_or_create(run_dir, config, system_prompt=system_prompt) as store:
        for ep in episodes:
            store.append_episode(ep, [])


def _step(t, conf, action="Calc[1+1]", obs="Result: 2", repairs=0):
    from uqh.rundir.schema import Attempt, CallRecord, Step

    return Step(t=t, think="", action=action, verbal_confidence=conf, explanation="e", observation=obs,
                repair_attempts=repairs, attempts=[Attempt(attempt=0, raw_text="x", call=CallRecord(model="m"))])


def test_estimate_qz_on_generated_runs(tmp_path):
    """Aggregation with unresolved / parse-error branches, sensitivity rows, hybrid plug-in and the projection
    identity (to 1e-12), on run directories written directly."""
    from uqh.rundir.qz_file import read_qz_file

    rng = np.random.default_rng(5)
    Z = 4
    src_cfg = RunConfig(domain="arithmetic", task_ids=[f"t{i}" for i in range(12)] + [f"c{i}" for i in range(4)], model="openai/m", step_budget=Z,
                        prompt_sha256="x", package_version="0")
    sources, branches = [], []
    plan = {}
    for i in range(12):
        conf = rng.uniform(0.05, 0.95, size=Z)
        actions = ["Calc[1+1]"] * Z if i % 2 else [f"Calc[{j}]" for j in range(Z)]
        steps = [_step(t + 1, float(conf[t]), action=actions[t]) for t in range(Z)]
        src = Episode(episode_id=f"t{i}#0", task_id=f"t{i}", stop_reason=StopReason.max_steps, n_steps=Z,
                      step_budget=Z, task_prompt="q", steps=steps)
        sources.append(src)
        if i >= 9:
            continue  # not continued: hybrid must use the plug-in
        m = 6 if i < 6 else 3  # prefixes 6..8 have too few valid branches for MC
        ys = rng.integers(0, 2, size=m)
        plan[src.episode_id] = ys
        extra = [("max_steps", None), ("parse_error", None)] if i % 3 == 0 else []
        for k, (sr, y) in enumerate([("clean", int(y)) for y in ys] + extra):
            br_steps = steps + [_step(Z + 1, 0.5, action="Finish[1]", obs="done")]
            branches.append(Episode(episode_id=f"{src.episode_id}@b{k}", task_id=src.task_id,
                                    stop_reason=StopReason(sr), outcome=y, n_steps=Z + 1, step_budget=Z + 1,
                                    task_prompt="q", steps=br_steps, source_episode_id=src.episode_id,
                                    branch_index=k, prefix_steps=Z))
    complete = [
        Episode(episode_id=f"c{i}#0", task_id=f"c{i}", stop_reason=StopReason.clean, outcome=i % 2, n_steps=3,
                step_budget=Z, task_prompt="q",
                steps=[_step(1, 0.5), _step(2, 0.6), _step(3, 0.7, action="Finish[1]", obs="done")])
        for i in range(4)
    ]
    src_dir, out = tmp_path / "src", tmp_path / "cont"
    _write_run(src_dir, src_cfg, sources + complete)
    cont_cfg = cont.continuation_config(read_manifest(src_dir), src_dir, sources[:9], branches=8, extra_steps=1)
    _write_run(out, cont_cfg, branches)

    res, text = audit_continuation(out, min_valid=5, method="hybrid", n_boot=200)
    recs = read_qz_file(out / "qz.jsonl")
    assert len(recs) == 12
    for i in range(6):
        r = recs[f"t{i}#0"]
        assert r.method == "mc" and r.n_valid == 6
        assert r.q_hat_z == pytest.approx(plan[f"t{i}#0"].mean())
    assert all(recs[f"t{i}#0"].method == "plugin" for i in range(6, 12))
    # prefixes 6..8 are labelled (3 branches each) -> cross-fitted; 9..11 unlabelled -> full model
    mc = res.mc["exclude"]
    assert mc.n_unresolved[[0, 3]].tolist() == [1, 1] and mc.n_parse_error[[0, 3]].tolist() == [1, 1]
    assert res.mc["failure"].q_hat[0] == pytest.approx(plan["t0#0"].sum() / 7)
    assert res.mc["success"].q_hat[0] == pytest.approx((plan["t0#0"].sum() + 1) / 7)
    a = res.audit
    assert a.counts.retained == 6 and a.counts.scored == 6
    assert a.identity_max_error < 1e-12
    assert a.counts.max_abs_branch_vs_source_forecast == 0.0
    # Eq. (17): exact - simple = q * sum_t w_t logit(F_t), per prefix
    from uqh.scoring.weights import trajectory_weights

    for row in a.per_prefix:
        i = int(row.episode_id[1:].split("#")[0])
        f = np.array([s.verbal_confidence for s in sources[i].steps])
        w = trajectory_weights(np.array([0, Z]), "linear-front")
        assert row.exact_mc - row.simple == pytest.approx(row.q_hat_mc * np.sum(w * np.log(f / (1 - f))))
        assert row.simple == pytest.approx(np.sum(w * np.log1p(-f)))
    assert set(a.sensitivity) == {"excluded (primary)", "as failures", "as successes"}
    assert "conditional-projection identity" in text and "Mean q_hat_Z^MC" in text

    # plug-in n_valid: training branches behind the estimate (all 45 labelled branches for unlabelled prefixes)
    assert [recs[f"t{i}#0"].n_valid for i in (9, 10, 11)] == [45, 45, 45]
    # complete episodes as extra plug-in training rows (training only: no records for them)
    res_c, _ = audit_continuation(out, min_valid=5, n_boot=20, train_complete=True, write=False)
    assert [r.n_valid for r in res_c.records if r.episode_id in ("t9#0", "t10#0", "t11#0")] == [49, 49, 49]
    assert len(res_c.records) == 12 and not any(r.episode_id.startswith("c") for r in res_c.records)
    assert not np.allclose(res_c.q_hat[9:], res.q_hat[9:])
    assert np.allclose(res_c.q_hat[:6], res.q_hat[:6])  # MC records unchanged

    # the q_Z file is what `uqh score --censoring exact` consumes
    rc = uqh(["score", str(src_dir), "--censoring", "exact", "--q-z", str(out / "qz.jsonl"), "--predictor", "verbal",
              "--calibration", "none", "--score", "log", "--bootstrap", "0", "--format", "json"])
    assert rc == 0

    # mc-only: no records for prefixes without an MC estimate (never imputed)
    res_mc, _ = audit_continuation(out, min_valid=5, method="mc", n_boot=20, write=False)
    assert len(res_mc.records) == 6 and res_mc.audit.counts.without_estimate == 6

    # a branch whose copied prefix differs from the source is not counted
    bad = branches[0].model_copy(deep=True)
    bad.steps[0].action = "Calc[9]"
    bad.episode_id = "t0#0@b99"
    bad.branch_index = 99
    bad2 = branches[1].model_copy(deep=True)
    bad2.task_prompt = "another question"
    bad2.episode_id = "t0#0@b98"
    bad2.branch_index = 98
    with open(out / "episodes.jsonl", "a") as fh:
        fh.write(bad.model_dump_json() + "\n")
        fh.write(bad2.model_dump_json() + "\n")
    res2, _ = audit_continuation(out, min_valid=5, n_boot=20, write=False)
    assert res2.audit.counts.join_mismatch_branches == 2
    assert res2.mc["exclude"].n_resolved[0] == 6


# ------------------------------------------------------------------------------------------ HotpotQA: stateful env

QA_CORPUS = [
    {"title": "Gustave Eiffel", "text": "Gustave Eiffel was a French civil engineer. Eiffel was born in Dijon in 1832. "
                                        "Eiffel designed the tower."},
    {"title": "Dijon", "text": "Dijon is a city in eastern France. Dijon is famous for its mustard."},
]
QA_ROWS = [{"id": "h1", "question": "Where was the designer of the Eiffel Tower born?", "answer": "Dijon", "type": "bridge"}]


def _qa(action: str, c: float = 0.4) -> str:
    return f"<think>t</think>\n<action>{action}</action>\n<confidence>{c}</confidence>\n<explanation>e</explanation>"


def test_hotpotqa_branch_resumes_lookup_cursor(tmp_path, fake_server):
    """The prefix ends after Lookup[Eiffel] showed result 1; a branch's Lookup[Eiffel] must show result 2, which only
    a faithfully replayed environment can produce (a fresh one has no context loaded)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in QA_CORPUS))
    data = tmp_path / "hqa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in QA_ROWS))
    options = {"data": str(data), "corpus": str(corpus), "index_dir": str(tmp_path / "index"), "top_k": 1}
    state = {"mode": "source"}

    def responder(req):
        n_assistant = sum(m["role"] == "assistant" for m in req["messages"])
        if state["mode"] == "source":
            return _qa("Search[Gustave Eiffel]" if n_assistant == 0 else "Lookup[Eiffel]")
        return _qa("Lookup[Eiffel]") if req["seed"] % 2 == 0 else _qa("Finish[Dijon]", 0.8)

    with fake_server(responder) as srv:
        cfg = make_config("hotpotqa", ["h1"], srv.base_url, step_budget=2, options=options)
        src = tmp_path / "src"
        assert run_batch(cfg, src, settings=BatchSettings(progress=False)).ok
        (ep,) = read_episodes(src)
        assert ep.stop_reason == StopReason.max_steps
        assert ep.steps[1].observation.startswith("(Result 1 / 3) Gustave Eiffel was a French civil engineer.")
        state["mode"] = "branch"
        srv.requests.clear()
        out = tmp_path / "cont"
        rep = cont.run_continuations(src, out, branches=4, extra_steps=1, settings=BatchSettings(progress=False))
        assert rep.skipped == [] and rep.n_branches_written == 4
        assert len(srv.requests) == 4  # one call per branch: nothing for the two prefix steps
    seen = set()
    for br in read_episodes(out):
        new = br.steps[2]
        seen.add(br.seed % 2)
        if br.seed % 2 == 0:
            assert new.observation.startswith("(Result 2 / 3) Eiffel was born in Dijon in 1832.")
            assert br.stop_reason == StopReason.max_steps
        else:
            assert br.stop_reason == StopReason.clean and br.outcome == 1
    assert seen == {0, 1}
    res, _ = audit_continuation(out, min_valid=1, method="mc", n_boot=20)
    (rec,) = res.records
    assert rec.q_hat_z == 1.0 and rec.n_valid == sum(b.seed % 2 for b in read_episodes(out))
    assert res.mc["failure"].q_hat[0] == pytest.approx(rec.n_valid / 4)


def test_interrupted_branch_resumes_from_its_checkpoint(source_run, tmp_path):
    """Issue item 6 through the same machinery: a branch whose model fails mid-way keeps its checkpoint (prefix +
    completed new steps); re-running continues from the last completed step instead of restarting."""
    from uqh.harness.model.client import make_model_client
    from uqh.harness.model.call_errors import ModelCallFailed

    src, srv, responder = source_run
    responder.mode = "source"  # always Calc: branches only end on their budget
    calls = {"n": 0}

    class FailingSecondCall:
        def __init__(self, model, api_base):
            self.inner = make_model_client(model, api_base=api_base, decoding=DecodingConfig(max_tokens=64, seed=42))
            self.model = model

        async def complete(self, messages, *, seed=None):
            calls["n"] += 1
            if calls["n"] == 2:
                raise ModelCallFailed("simulated outage")
            return await self.inner.complete(messages, seed=seed)

        async def aclose(self):
            await self.inner.aclose()

    out = tmp_path / "cont"
    first = cont.run_continuations(src, out, branches=1, extra_steps=3, ids=["arith-0000#0"], settings=BatchSettings(concurrency=1, progress=False), client_factory=FailingSecondCall)
    assert first.n_branches_written == 0 and first.n_branches_missing == 1
    ckpts = list((out / "checkpoints").glob("*.json"))
    assert len(ckpts) == 1
    assert len(srv.requests) == 1
    srv.requests.clear()
    second = cont.run_continuations(src, out, branches=1, extra_steps=3, ids=["arith-0000#0"], settings=BatchSettings(concurrency=1, progress=False))
    assert second.n_branches_written == 1
    (br,) = read_episodes(out)
    assert br.n_steps == 5 and br.prefix_steps == 2 and br.stop_reason == StopReason.max_steps
    assert len(srv.requests) == 2  # steps 4 and 5 only: neither the prefix nor step 3 is generated again
    assert [len(m) for m in (r["messages"] for r in srv.requests)] == [2 + 2 * 3, 2 + 2 * 4]
    assert not list((out / "checkpoints").glob("*.json"))


def test_qz_only_recomputes_without_model_calls(source_run, tmp_path, capsys):
    src, srv, _ = source_run
    out = tmp_path / "cont"
    cont.run_continuations(src, out, branches=4, extra_steps=1, settings=BatchSettings(progress=False))
    n = len(srv.requests)
    (out / "qz.jsonl").unlink(missing_ok=True)
    rc = uqh(["continue", str(src), "--out", str(out), "--qz-only", "--qz-method", "mc", "--min-valid", "1",
              "--bootstrap", "10"])
    assert rc == 0 and len(srv.requests) == n
    assert (out / "qz.jsonl").exists() and "Mean q_hat_Z^MC" in capsys.readouterr().out
    rc = uqh(["continue", str(tmp_path), "--out", str(out), "--qz-only"])
    assert rc == 2 and "continues the run" in capsys.readouterr().err
    rc = uqh(["continue", str(src), "--out", str(tmp_path / "empty"), "--qz-only"])
    assert rc == 2 and "not a continuation run directory" in capsys.readouterr().err


def _next_command(out: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.startswith("next: "))
    return shlex.split(line[len("next: "):].split("   (")[0])[1:]


@pytest.mark.parametrize("method", ["mc", "hybrid"])
def test_continue_with_no_retained_prefix_says_so_and_suggests_a_score_that_works(source_run, tmp_path, capsys,
                                                                                  method):
    src, srv, _ = source_run
    out = tmp_path / "cont"
    cont.run_continuations(src, out, branches=2, extra_steps=1, settings=BatchSettings(progress=False))
    capsys.readouterr()
    rc = uqh(["continue", str(src), "--out", str(out), "--qz-only", "--qz-method", method, "--min-valid", "5",
              "--bootstrap", "10"])
    printed = capsys.readouterr().out
    assert rc == 0 and "no prefix retained: none of the 3 continued prefixes has 5 valid resolved branches" in printed
    argv = _next_command(printed)
    assert argv[0] == "score" and main_ok(argv + ["--bootstrap", "0"])
    if method == "mc":  # no estimate at all: the simple censored score
        assert "--censoring simple" in " ".join(argv)


def test_continue_next_command_uses_the_q_z_file_when_it_covers_the_prefixes(source_run, tmp_path, capsys):
    src, srv, _ = source_run
    out = tmp_path / "cont"
    cont.run_continuations(src, out, branches=4, extra_steps=1, settings=BatchSettings(progress=False))
    capsys.readouterr()
    assert uqh(["continue", str(src), "--out", str(out), "--qz-only", "--qz-method", "mc", "--min-valid", "1",
                "--bootstrap", "10", "--format", "md"]) == 0
    printed = capsys.readouterr().out
    assert "### q_hat_Z^MC over retained prefixes" in printed and "no prefix retained" not in printed
    argv = _next_command(printed)
    assert "--censoring exact" in " ".join(argv) and main_ok(argv + ["--bootstrap", "0"])


def test_the_next_hint_spells_paths_as_the_user_gave_them(source_run, tmp_path, capsys, monkeypatch):
    """Issue 33: the source came out absolute (from the manifest) and the q_Z file relative."""
    src, srv, _ = source_run
    cont.run_continuations(src, tmp_path / "cont", branches=4, extra_steps=1, settings=BatchSettings(progress=False))
    monkeypatch.chdir(src.parent)
    capsys.readouterr()
    assert uqh(["continue", src.name, "--out", str(Path(os.path.relpath(tmp_path / "cont"))), "--qz-only",
                "--qz-method", "mc", "--min-valid", "1", "--bootstrap", "10"]) == 0
    argv = _next_command(capsys.readouterr().out)
    assert argv[1] == src.name and not any(a.startswith("/") for a in argv)


def main_ok(argv: list[str]) -> bool:
    return uqh(argv) == 0


# ------------------------------------------------------------------------------------------ WebShop: page + options


def test_webshop_branch_resumes_page_and_selected_options(tmp_path, fake_server):
    """A WebShop prefix stopped on an item page after one option was clicked; each branch clicks the next option and
    its first observation must show *both* options selected (state restored by replay), then it buys."""
    ws = get_domain_class("webshop")({})
    goals, catalog = ws.resources.goals, ws.resources.catalog
    task = None
    for i, g in enumerate(goals):
        opts = catalog.by_asin[g["asin"]]["options"]
        if len(g["goal_options"]) >= 2 and all(len(v) >= 2 for v in opts.values()):
            task = f"ws-{i}"
            break
    assert task is not None
    goal = goals[int(task[3:])]

    def shopper(req):
        msgs = req["messages"]
        obs = next(m["content"] for m in reversed(msgs) if m["role"] == "user" and "Clickables:" in m["content"])
        if "Search bar: available" in obs:
            return _qa(f"Search[{goal['name']}]")
        if "Total results" in obs:
            return _qa(f"Click[{goal['asin']}]")
        selected = re.search(r"Selected options: (.*)", obs)
        chosen = dict(kv.split(": ", 1) for kv in selected.group(1).split("; ")) if selected else {}
        for name, value in goal["goal_options"].items():
            if name not in chosen:
                return _qa(f"Click[{value}]")
        return _qa("Click[Buy Now]", 0.9)

    with fake_server(shopper) as srv:
        cfg = RunConfig(domain="webshop", task_ids=[task], model="openai/fake", api_base=srv.base_url, step_budget=3,
                        prompt_sha256=prompt_sha256(ws.system_prompt()), package_version=uqh_version,
                        decoding=DecodingConfig(max_tokens=64))
        src = tmp_path / "src"
        assert run_batch(cfg, src, settings=BatchSettings(progress=False)).ok
        (ep,) = read_episodes(src)
        assert ep.stop_reason == StopReason.max_steps
        first_option = ep.steps[2].info["state"]["options"]
        assert len(first_option) == 1
        srv.requests.clear()
        out = tmp_path / "cont"
        rep = cont.run_continuations(src, out, branches=2, extra_steps=len(goal["goal_options"]) + 1, settings=BatchSettings(progress=False))
        assert rep.n_branches_written == 2 and rep.skipped == []
    for br in read_episodes(out):
        new = br.steps[3]
        assert new.info["state"]["page"] == "item"
        assert len(new.info["state"]["options"]) == 2 and first_option.items() <= new.info["state"]["options"].items()
        assert br.stop_reason == StopReason.clean and br.outcome == 1 and br.reward == 1.0
        assert br.reward_info["purchased_asin"] == goal["asin"]
    # one call per new step, none for the three prefix steps
    assert len(srv.requests) == sum(b.n_steps - b.prefix_steps for b in read_episodes(out))


def test_changed_task_prompt_is_a_replay_mismatch(source_run, tmp_path):
    src, srv, _ = source_run
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    lines = (copy / "episodes.jsonl").read_text().splitlines()
    ep = json.loads(lines[0])
    ep["task_prompt"] = "Question: What is (1 + 1) + 1?"
    lines[0] = json.dumps(ep)
    (copy / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    rep = cont.run_continuations(copy, tmp_path / "cont", branches=1, extra_steps=1, settings=BatchSettings(progress=False))
    assert [(s.episode_id, s.reason) for s in rep.skipped] == [
        (ep["episode_id"], "replay mismatch: the reset environment's task prompt differs from the recorded one")
    ]
    assert rep.n_branches_written == 2


def _held_by_another_process(path: Path) -> bool:
    import subprocess
    import sys

    code = "import sys; from uqh.harness.store import lock as run_lock; print(run_lock.is_held(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent, check=True)
    return done.stdout.strip() == "True"


def test_continue_holds_the_out_lock_until_its_caller_is_done_and_refuses_a_busy_out(source_run, tmp_path):
    import contextlib

    from test_run_lock import hold_in_subprocess

    src, _, _ = source_run
    out = tmp_path / "cont"
    with contextlib.ExitStack() as scope:
        cont.run_continuations(src, out, branches=2, extra_steps=1, settings=BatchSettings(progress=False), lock_scope=scope)
        assert _held_by_another_process(out)  # still held: `uqh continue` writes q_Z and the audit under it
    assert not _held_by_another_process(out)
    holder = hold_in_subprocess(out)
    try:
        with pytest.raises(UserError, match=f"is being written by pid {holder.pid}"):
            cont.run_continuations(src, out, branches=2, extra_steps=1, settings=BatchSettings(progress=False))
        assert uqh(["continue", str(src), "--out", str(out), "--branches", "2", "--extra-steps", "1",
                    "--no-progress"]) == 2
        assert uqh(["continue", str(src), "--out", str(out), "--qz-only"]) == 2
    finally:
        holder.kill()
        holder.wait()
