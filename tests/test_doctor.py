"""`uqh doctor`: what it reports with and without each piece, API keys by name only, and its exit codes.

The binary is a stand-in llama-server (answers ``--version``, serves tests/fake_openai_server.py); the smoke test
measures the real one.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

from environment import unavailable

from uqh.cli import main
from uqh.harness import doctor
from uqh.harness.model.llama_server import LLAMA_SERVER_ENV, LOCAL_MODELS
from uqh.harness.model.local_files import LocalModelSpec

FAKE_SERVER = Path(__file__).resolve().parent / "fake_openai_server.py"
CANARY = "sk-or-v1-canary-7f3e9b2d41c8a6f0"
OTHER_CANARY = "canary-value-of-another-key-55aa"
SCAN_DATA = doctor.packaged_data  # the real scan, pointed at a test folder below


def _server(path: Path, *, serves: bool = True, version: bool = True) -> Path:
    path.write_text("#!/bin/bash\n"
                    + (f'[ "$1" = --version ] && {{ echo "version: 7 (doctorfake)" >&2; exit 0; }}\n' if version
                       else '[ "$1" = --version ] && exit 1\n')
                    + ('while [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done\n'
                       f'exec {sys.executable} {FAKE_SERVER} --port "$port"\n' if serves else "exit 4\n"))
    path.chmod(0o755)
    return path


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A llama-server named by UQH_LLAMA_SERVER, the installed GGUF, one packaged data file, no API key."""
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(_server(tmp_path / "llama-server")))
    domains = tmp_path / "domains"
    (domains / "hotpotqa" / "data").mkdir(parents=True)
    (domains / "hotpotqa" / "data" / "sample.jsonl.gz").write_bytes(b"x" * 2500)
    (domains / "hotpotqa" / "not_data.py").write_text("")
    monkeypatch.setattr(doctor, "packaged_data", functools.partial(SCAN_DATA, domains))
    monkeypatch.setenv("UQH_CACHE_DIR", str(tmp_path / "cache"))
    for name in doctor.KNOWN_KEYS:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_everything_present_is_exit_0_with_the_speed_line(installed, capsys):
    assert main(["doctor"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert f"llama-server  {installed / 'llama-server'} (version: 7 (doctorfake))" in out
    assert "SmolLM2-135M-Instruct.Q4_1.gguf (98.4 MB)" in out
    speed = next(line for line in out.splitlines() if line.strip().startswith("speed"))
    assert speed.endswith("tokens generated, 1 thread)") and float(speed.split()[1]) > 0
    assert "hotpotqa/data/sample.jsonl.gz  2.5 kB" in out and "packaged data (1 files, 2.5 kB)" in out
    assert "not_data.py" not in out
    assert out.strip().endswith("uqh doctor: ready: uqh run --model local:smollm2 runs offline on the packaged data")


def test_no_speed_starts_no_server(installed, capsys, tmp_path):
    log = tmp_path / "started"
    script = installed / "llama-server"
    script.write_text(script.read_text().replace("while", f"touch {log}\nwhile", 1))
    assert main(["doctor", "--no-speed"]) == 0
    assert "speed         not measured" in capsys.readouterr().out
    assert not log.exists()


def test_api_keys_are_reported_by_name_never_by_value(installed, capsys, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", CANARY)
    monkeypatch.setenv("SOME_SERVICE_API_KEY", OTHER_CANARY)
    monkeypatch.setenv("EMPTY_API_KEY", "  ")
    assert main(["doctor"]) == 0
    out, err = capsys.readouterr()
    assert CANARY not in out + err and OTHER_CANARY not in out + err
    assert CANARY[:12] not in out + err  # not even a prefix
    lines = out.splitlines()
    assert "  OPENROUTER_API_KEY   set" in lines and "  SOME_SERVICE_API_KEY set" in lines
    assert "  OPENAI_API_KEY       not set" in lines
    assert not any("EMPTY_API_KEY" in line for line in lines)  # a blank variable is not a key


def test_missing_model_file_and_binary_exit_1_naming_the_fix(installed, capsys, monkeypatch):
    monkeypatch.delenv(LLAMA_SERVER_ENV)
    monkeypatch.setenv("PATH", str(installed / "empty"))
    monkeypatch.setattr(sys, "prefix", str(installed / "venv"))
    monkeypatch.setattr(sys, "executable", str(installed / "venv" / "bin" / "python"))
    monkeypatch.setitem(LOCAL_MODELS, "local:smollm2", LocalModelSpec("no_such_pkg_uqh", "m.gguf", "smollm2"))
    assert main(["doctor"]) == 1
    out, err = capsys.readouterr()
    assert "  model file    missing: the model file m.gguf of local:smollm2 is missing" in out
    assert "  llama-server  missing: llama-server is not installed" in out
    assert "  speed         not measured" in out
    assert err.count("\n") == 1 and err.startswith("uqh doctor: not ready for the offline first job: no model file: ")
    assert "; no llama-server: " in err and err.count("pip install 'uqh[local]' then uqh setup local") == 2


def test_a_binary_that_does_not_run_or_serve_is_a_problem(installed, capsys):
    _server(installed / "llama-server", version=False)
    assert main(["doctor"]) == 1
    assert "does not run (`llama-server --version` failed)" in capsys.readouterr().err
    _server(installed / "llama-server", serves=False)
    assert main(["doctor"]) == 1
    out, err = capsys.readouterr()
    assert "  speed         failed: the local model server exited with code 4 during startup" in out
    assert "llama-server did not generate: the local model server exited with code 4" in err


def test_no_packaged_data_is_reported_and_a_problem(installed, capsys, monkeypatch):
    monkeypatch.setattr(doctor, "packaged_data", functools.partial(SCAN_DATA, installed / "nothing"))
    assert main(["doctor", "--no-speed"]) == 1
    out, err = capsys.readouterr()
    assert "packaged data\n  none packaged\n" in out
    assert "no packaged data under uqh/domains/*/data" in err


def test_packaged_data_finds_the_package_folders():
    import uqh.domains

    base = Path(uqh.domains.__file__).parent
    expected = sorted(p.relative_to(base).as_posix() for p in base.glob("*/data/**/*")
                      if p.is_file() and "__pycache__" not in p.parts)
    assert [path for path, _ in doctor.packaged_data() if path.count("/") >= 2 and path.split("/")[1] == "data"] \
        == expected


def test_extras_read_from_the_metadata_of_an_installed_uqh(monkeypatch):
    monkeypatch.setattr(doctor, "is_source_checkout", lambda: False)
    requires = ['ray[default]>=2.40; extra == "ray"', 'uqh-no-such-dist-xyz>=1; extra == "tau2"', "numpy>=1.26",
                'pytest>=8; extra == "dev"', 'uqh[tau2,ray]; extra == "all"']
    monkeypatch.setattr(doctor.importlib.metadata, "requires", lambda name: requires)
    by_name = {e.name: e for e in doctor.extras()}
    assert by_name["ray"].installed is True and by_name["dev"].installed is True
    assert by_name["tau2"].installed is False and by_name["tau2"].missing == ("uqh-no-such-dist-xyz",)
    assert by_name["tau2"].pip_command == "pip install 'uqh[tau2]'"
    assert by_name["view"].installed is None and by_name["local"].installed is None


def test_extras_of_a_source_checkout_are_read_from_its_pyproject():
    declared = doctor.declared_extras()  # an editable install's metadata may predate the pyproject
    assert declared["local"] == ["cmake", "ninja"]  # what uqh setup local needs from PyPI


def test_extras_are_shown_with_their_pip_command(installed, capsys, monkeypatch):
    monkeypatch.setattr(doctor, "is_source_checkout", lambda: False)
    monkeypatch.setattr(doctor.importlib.metadata, "requires",
                        lambda name: ['uqh-no-such-dist-xyz; extra == "tau2"', 'numpy; extra == "view"'])
    assert main(["doctor", "--no-speed"]) == 0  # a missing extra is reported, not a problem
    lines = capsys.readouterr().out.splitlines()
    assert "  tau2   missing uqh-no-such-dist-xyz: pip install 'uqh[tau2]'" in lines
    assert "  view   installed" in lines and "  ray    not declared by this uqh" in lines


@pytest.mark.smoke
def test_speed_of_the_real_llama_server(monkeypatch):
    monkeypatch.delenv(LLAMA_SERVER_ENV, raising=False)
    found = doctor.find_server_binary()
    if found.path is None:
        unavailable("no llama-server here (scripts/setup.sh builds one)")  # a failure under CI, which builds it
    assert found.detail.startswith("version: ")
    speed = doctor.measure_speed(doctor.find_model_file("local:smollm2").path, found.path)
    assert speed.tokens == doctor.SPEED_TOKENS and speed.tokens_per_s > 0 and speed.threads >= 1
