"""`uqh continue` on a run made with the real local model (local:smollm2 via llama.cpp), fully offline.

Tiny on purpose (the logprob path runs ~13 tokens/s): 1 task with a 1-step budget, then 1 prefix, 2 branches,
1 extra step, 160 max tokens, grammar-forced four-tag shape.
"""
from __future__ import annotations

import json

import pytest

from uqh.cli import main as uqh
from uqh.rundir.schema import StopReason
from run_files import read_episodes, read_manifest


@pytest.mark.smoke
def test_continue_local_smollm2(tmp_path, capsys):
    out = tmp_path / "cont"
    # SmolLM2 at temperature 0.2 is not reproducible across llama.cpp cache states, so the step may also be
    # rejected three times (parse_error) or be a Finish (clean): take the first task whose episode is censored.
    source = None
    # 60 tokens often cut the <think> field (parse_error); 160 let the four tags close (llama-server, issue #28).
    for task in ("arith-0002", "arith-0006", "arith-0001", "arith-0003", "arith-0004"):
        src = tmp_path / f"src-{task}"
        rc = uqh(["run", "--domain", "arithmetic", "--task-ids", task, "--step-budget", "1", "--model",
                  "local:smollm2", "--grammar", "--max-tokens", "160", "--out", str(src), "--no-progress"])
        assert rc == 0
        (ep,) = read_episodes(src)
        if ep.stop_reason == StopReason.max_steps:
            source = ep
            break
    assert source is not None, "no max_steps source episode in 5 tries"
    before = (src / "episodes.jsonl").read_bytes()
    rc = uqh(["continue", str(src), "--prefixes", "1", "--branches", "2", "--extra-steps", "1", "--min-valid", "1",
              "--out", str(out), "--no-progress", "--bootstrap", "50"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "1 prefixes selected, 0 skipped (not replayable), 2 branches written" in printed
    assert (src / "episodes.jsonl").read_bytes() == before
    branches = read_episodes(out)
    assert sorted(b.episode_id for b in branches) == [f"{source.episode_id}@b0", f"{source.episode_id}@b1"]
    for b in branches:
        assert b.prefix_steps == 1 and b.steps[0].model_dump() == source.steps[0].model_dump()
        assert b.step_budget == 2 and b.source_episode_id == source.episode_id
    assert branches[0].seed != branches[1].seed
    m = read_manifest(out)
    assert m.config.model == "local:smollm2" and m.config.continuation["branches"] == 2
    # every new call was logged with logprobs (the sidecar has one row per new attempt, none for the prefix)
    rows = [json.loads(x) for x in (out / "logprobs.jsonl").read_text().splitlines()]
    new_attempts = sum(sum(len(s.attempts) for s in b.steps[1:]) + len(b.failed_step or []) for b in branches)
    assert len(rows) == new_attempts and all(r["t"] == 2 for r in rows)
    assert (out / "qz.jsonl").exists() and (out / "audit.md").exists()
