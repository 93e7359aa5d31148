"""The Python API (``uqh.run``, ``uqh.load``, ``uqh.score``) is the command line's: the same run directory, the same
config hash, the same scores -- and the one settings object reaches the model client unchanged."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import uqh
from uqh.cli import main
from uqh.harness.backends import event_loop
from uqh.harness.config.build import build_client
from uqh.rundir.errors import UserError
from run_files import read_episodes, read_manifest
from test_runner import solver

FLAGS = ["--domain", "arithmetic", "--tasks", "3", "--samples", "2", "--max-tokens", "64", "--model", "openai/fake",
         "--no-progress", "--timeout", "30", "--max-retries", "1"]


def settings(base_url: str, out: Path, **batch) -> uqh.RunSettings:
    """The settings of ``uqh run FLAGS --api-base base_url --out out``."""
    return uqh.RunSettings(
        run=uqh.RunOverrides(domain="arithmetic", tasks=3, samples=2, model="openai/fake", api_base=base_url,
                             decoding=uqh.DecodingOverrides(max_tokens=64), out=out),
        batch=uqh.BatchSettings(progress=False, client=uqh.ClientSettings(timeout_s=30, max_retries=1), **batch))


def comparable(run_dir: Path) -> list[tuple]:
    return sorted((e.episode_id, e.stop_reason.value, e.outcome, [s.action for s in e.steps])
                  for e in read_episodes(run_dir))


def test_import_uqh_stays_light():
    code = "import sys, uqh; print(sorted(m for m in sys.modules if m.startswith(('uqh.', 'pydantic', 'numpy'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_run_makes_the_run_directory_the_cli_makes(fake_server, tmp_path, capsys):
    with fake_server(solver) as srv:
        assert main(["run", *FLAGS, "--api-base", srv.base_url, "--out", str(tmp_path / "cli")]) == 0
        result = uqh.run(settings(srv.base_url, tmp_path / "api"))
        # the API's settings resume the CLI's directory: the same config, nothing left to run
        again = uqh.run(settings(srv.base_url, tmp_path / "cli"))
    cli, api = read_manifest(tmp_path / "cli"), read_manifest(tmp_path / "api")
    assert isinstance(result, uqh.RunResult) and result.ok and result.run_dir == tmp_path / "api"
    assert result.config_hash == api.config_hash == cli.config_hash
    assert api.config == cli.config and api.system_prompt == cli.system_prompt
    assert (api.execution.timeout_s, api.execution.max_retries) == (cli.execution.timeout_s, cli.execution.max_retries)
    assert result.summary.stats.done == 6 and result.summary.stats.stop_reasons == {"clean": 6}
    assert comparable(tmp_path / "api") == comparable(tmp_path / "cli")
    assert again.ok and again.summary.finished_before == 6 and again.summary.stats.done == 0


def test_run_takes_a_dict_and_refuses_bad_settings_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^--concurrency must be >= 1, got 0$"):
        uqh.run({"run": {"domain": "arithmetic", "tasks": 1}, "batch": {"concurrency": 0}})
    with pytest.raises(UserError, match=r"^--seed must be between 0 and 2147483647 .*got -5$"):
        uqh.run(uqh.RunSettings(run=uqh.RunOverrides(domain="arithmetic", tasks=1, model="openai/x",
                                                     api_base="http://127.0.0.1:9/v1", out=tmp_path / "r",
                                                     decoding=uqh.DecodingOverrides(seed=-5))))
    with pytest.raises(UserError, match=r"^run settings: batch\.workerz: Extra inputs are not permitted$"):
        uqh.run({"batch": {"workerz": 2}})
    with pytest.raises(UserError, match="--ray-address needs --backend ray"):
        uqh.BatchSettings(ray_address="auto")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_settings_object_reaches_the_model_client_unchanged(fake_server, tmp_path, monkeypatch, workers):
    """In this process the very object; in worker processes (pickled once) an equal one."""
    seen = []

    def spy(config, agent, client, client_factory=None):
        seen.append(client)
        return build_client(config, agent, client, client_factory)

    monkeypatch.setattr(event_loop, "build_client", spy)
    s = settings("", tmp_path / "r", workers=workers, concurrency=2)
    with fake_server(solver) as srv:
        s = s.model_copy(update={"run": s.run.model_copy(update={"api_base": srv.base_url})})
        assert uqh.run(s).ok
    if workers == 1:
        assert len(seen) == 1 and seen[0] is s.batch.client
    else:  # the workers build their clients in their own processes: the manifest shows what they were given
        assert seen == []
    execution = read_manifest(tmp_path / "r").execution
    assert (execution.timeout_s, execution.max_retries) == (30.0, 1)


def test_load_returns_the_manifest_and_the_frames(fake_server, tmp_path):
    with fake_server(solver) as srv:
        result = uqh.run(settings(srv.base_url, tmp_path / "r"))
    run = uqh.load(tmp_path / "r")
    assert isinstance(run, uqh.LoadedRun) and run.config_hash == result.config_hash
    assert run.manifest.config.domain == "arithmetic"
    assert len(run.episodes) == 6 and set(run.episodes.stop_reason) == {"clean"}
    assert list(run.episodes.episode) == sorted(e.episode_id for e in read_episodes(tmp_path / "r"))
    assert len(run.steps) == 12 and run.steps.verbal_confidence.tolist() == [0.5, 0.9] * 6
    assert len(run.tokens) > 0 and set(run.tokens.role) == {"agent"}  # the fake server returns logprobs
    with pytest.raises(UserError, match="not a run directory"):
        uqh.load(tmp_path)


def test_score_equals_uqh_score_format_json(fake_server, tmp_path, capsys):
    def half_right(body):  # some tasks answered wrong: the metrics have both outcomes to work with
        text = solver(body)
        return text.replace("Finish[", "Finish[9") if len(body["messages"][1]["content"]) % 2 else text

    with fake_server(half_right) as srv:
        uqh.run(settings(srv.base_url, tmp_path / "r"))
    capsys.readouterr()
    assert main(["score", str(tmp_path / "r"), "--format", "json", "--bootstrap", "50"]) == 0
    cli = json.loads(capsys.readouterr().out)
    options = uqh.ScoreOptions(n_bootstrap=50)
    assert json.loads(uqh.score(tmp_path / "r", options).model_dump_json()) == cli
    assert json.loads(uqh.score(uqh.load(tmp_path / "r"), options).model_dump_json()) == cli
