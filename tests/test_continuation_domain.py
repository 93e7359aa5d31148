"""`uqh continue` builds the source run's domain exactly as the source run did (split, domain_options,
observation_chars) and refuses, before writing anything, a source whose recorded system prompt it cannot rebuild."""
from __future__ import annotations

import json

from uqh.cli import main as uqh
from uqh.rundir.schema import StopReason
from run_files import read_episodes, read_manifest

SEARCH = "<think>t</think>\n<action>Search[hoodie]</action>\n<confidence>0.4</confidence>\n<explanation>e</explanation>"


def _webshop_source(fake_server, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    srv = fake_server(lambda req: SEARCH).__enter__()
    src = tmp_path / "src"
    assert uqh(["run", "--domain", "webshop", "--split", "eval", "--tasks", "1", "--step-budget", "1",
                "--observation-chars", "300", "--model", "openai/fake", "--api-base", srv.base_url,
                "--max-tokens", "64", "--out", str(src), "--no-progress"]) == 0
    return src, srv


def test_webshop_continuation_keeps_split_options_and_prompt(fake_server, tmp_path, monkeypatch):
    src, srv = _webshop_source(fake_server, tmp_path, monkeypatch)
    source = read_manifest(src)
    assert source.config.split == "eval" and "split: eval" in source.system_prompt
    [ep] = read_episodes(src)
    assert ep.stop_reason == StopReason.max_steps
    n_source_calls = len(srv.requests)
    out = tmp_path / "cont"
    assert uqh(["continue", str(src), "--out", str(out), "--branches", "2", "--extra-steps", "1",
                "--no-progress"]) == 0
    cont = read_manifest(out)
    assert cont.system_prompt == source.system_prompt
    for key in ("domain", "split", "domain_options", "observation_chars", "prompt_sha256"):
        assert getattr(cont.config, key) == getattr(source.config, key), key
    assert cont.info["webshop"]["split"] == "eval"
    branch_calls = srv.requests[n_source_calls:]
    assert branch_calls and all(r["messages"][0]["content"] == source.system_prompt for r in branch_calls)
    assert sorted(b.episode_id for b in read_episodes(out)) == [f"{ep.episode_id}@b0", f"{ep.episode_id}@b1"]


def test_source_prompt_that_cannot_be_rebuilt_is_refused_before_writing(fake_server, tmp_path, monkeypatch, capsys):
    src, srv = _webshop_source(fake_server, tmp_path, monkeypatch)
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["system_prompt"] = manifest["system_prompt"].replace("split: eval", "split: test")
    (src / "manifest.json").write_text(json.dumps(manifest))
    n = len(srv.requests)
    capsys.readouterr()
    out = tmp_path / "cont"
    assert uqh(["continue", str(src), "--out", str(out), "--branches", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("uqh continue: error: the webshop split eval system prompt")
    assert not out.exists() and len(srv.requests) == n
