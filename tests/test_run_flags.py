"""`uqh run` flags that close config gaps: --user-api-base (Tau2 user simulator endpoint), --index-dir (QA bm25s
index, outside the config hash), the domain's own observation cut (WebShop), all recorded truthfully."""
from __future__ import annotations

from test_tau2 import RETAIL_TASK, SOLVED_AGENT, USER_LINES, Script

from uqh.cli import main
from uqh.rundir.schema import RunConfig
from run_files import read_episodes, read_manifest


def uqh(*argv: str) -> int:
    return main(["run", *argv])


def test_user_api_base_reaches_the_user_simulator_and_the_manifest(fake_server, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    script = Script(SOLVED_AGENT, USER_LINES)
    agent_srv = fake_server(script).__enter__()
    user_srv = fake_server(script).__enter__()  # the user simulator is served only here
    out = tmp_path / "run"
    base = ["--domain", "tau2-retail", "--task-ids", RETAIL_TASK, "--step-budget", "1", "--model", "openai/agent",
            "--api-base", agent_srv.base_url, "--user-model", "openai/user", "--max-tokens", "256", "--out", str(out),
            "--no-progress"]
    args = [*base, "--user-api-base", user_srv.base_url]
    assert uqh(*args, "--dry-run") == 0
    assert f"user model    openai/user via {user_srv.base_url}" in capsys.readouterr().out
    assert uqh(*args) == 0
    assert user_srv.requests and all(r["model"] == "user" for r in user_srv.requests)
    assert agent_srv.requests and all(r["model"] == "agent" for r in agent_srv.requests)
    cfg = read_manifest(out).config
    assert cfg.user_api_base == user_srv.base_url and cfg.user_model == "openai/user"
    assert len(read_episodes(out)) == 1
    # where the user model is served from is not the experiment, like --api-base: another endpoint resumes
    capsys.readouterr()
    assert uqh(*base, "--user-api-base", agent_srv.base_url) == 0
    assert "1/1 finished (0 this run, 1 before)" in capsys.readouterr().out


def test_user_api_base_with_a_local_user_model_is_refused(tmp_path, capsys):
    code = uqh("--domain", "tau2-retail", "--tasks", "1", "--model", "openai/a", "--api-base", "http://127.0.0.1:9/v1",
               "--user-model", "local:smollm2", "--user-api-base", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "r"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "--user-api-base cannot be combined with local:smollm2" in err
    assert not (tmp_path / "r").exists()


def test_user_api_base_absent_keeps_old_config_hashes():
    """Run directories written before the field existed hash without it; setting it changes the hash."""
    import hashlib
    import json

    cfg = RunConfig(domain="arithmetic", task_ids=["a"], model="openai/x", step_budget=3, prompt_sha256="p",
                    package_version="0")
    old = cfg.model_dump(mode="json")
    del old["user_api_base"], old["consensus_stopping"]  # both added later
    old_hash = hashlib.sha256(json.dumps(old, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert cfg.legacy_config_hash() == old_hash  # what manifests written before carry
    assert cfg.model_copy(update={"user_api_base": "http://h/v1"}).legacy_config_hash() != old_hash
    assert cfg.model_copy(update={"user_api_base": "http://h/v1"}).config_hash() == cfg.config_hash()
    from uqh.rundir.schema import ConsensusStopping

    assert cfg.model_copy(update={"consensus_stopping": ConsensusStopping(delta=0.05)}).config_hash() != old_hash


def _search(req: dict) -> str:
    return ("<think>look it up</think>\n<action>Search[Paris]</action>\n<confidence>0.4</confidence>\n"
            "<explanation>need facts</explanation>")


def test_index_dir_builds_the_index_there_and_moving_it_resumes(fake_server, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    out, first, moved = tmp_path / "run", tmp_path / "idx", tmp_path / "elsewhere" / "idx"
    with fake_server(_search) as srv:
        base = ["--domain", "hotpotqa", "--tasks", "1", "--step-budget", "1", "--model", "openai/fake", "--api-base",
                srv.base_url, "--max-tokens", "64", "--out", str(out), "--no-progress"]
        assert uqh(*base, "--index-dir", str(first)) == 0
        assert (first / "uqh_index.json").exists()  # the bm25s index was built where asked
        m = read_manifest(out)
        assert m.config.domain_options == {"index_dir": str(first.resolve())}
        assert m.info["index_dir"] == str(first)
        n_calls = len(srv.requests)
        # same run, index elsewhere: resumes (nothing left to do), not "a different config"
        first.rename(tmp_path / "gone")
        assert uqh(*base, "--index-dir", str(moved)) == 0
        assert len(srv.requests) == n_calls and len(read_episodes(out)) == 1


def test_index_dir_is_outside_the_config_hash_other_options_are_not():
    cfg = RunConfig(domain="hotpotqa", task_ids=["a"], model="openai/x", step_budget=3, prompt_sha256="p",
                    package_version="0", domain_options={"top_k": 5})
    h = cfg.config_hash()
    assert cfg.model_copy(update={"domain_options": {"top_k": 5, "index_dir": "/a"}}).config_hash() == h
    assert cfg.model_copy(update={"domain_options": {"top_k": 3}}).config_hash() != h


def test_webshop_records_no_observation_cut_and_shows_pages_whole(fake_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    search = ("<think>t</think>\n<action>Search[hoodie]</action>\n<confidence>0.4</confidence>\n"
              "<explanation>e</explanation>")
    out = tmp_path / "run"
    with fake_server(lambda req: search) as srv:
        base = ["--domain", "webshop", "--tasks", "1", "--step-budget", "1", "--model", "openai/fake", "--api-base",
                srv.base_url, "--max-tokens", "64", "--out", str(out), "--no-progress"]
        assert uqh(*base, "--dry-run") == 0
        assert "step budget   1; observations not cut" in capsys.readouterr().out
        assert uqh(*base) == 0
    assert read_manifest(out).config.observation_chars is None
    [ep] = read_episodes(out)
    assert len(ep.steps[0].observation) > 420  # the results page, whole, as the manifest says
    # an explicit cut is recorded as given; a domain that cuts keeps 420 by default
    assert uqh(*base, "--observation-chars", "300", "--out", str(tmp_path / "r2"), "--dry-run") == 0
    assert "observations cut to 300 chars" in capsys.readouterr().out
    assert uqh("--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", "http://x/v1",
               "--out", str(tmp_path / "r3"), "--dry-run") == 0
    assert "observations cut to 420 chars" in capsys.readouterr().out
    assert uqh("--preset", "paper-webshop", "--out", str(tmp_path / "r4"), "--dry-run") == 0
    assert "30; observations not cut" in capsys.readouterr().out
