"""The wheel is a package others can adopt: one top-level package, every prompt inside, and it runs from outside
the repository (a fresh virtual environment, another working directory, no PYTHONPATH into the checkout)."""
from __future__ import annotations

import contextlib
import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from run_files import read_episodes

from uqh.harness.model.llama_server import LLAMA_SERVER_ENV, find_llama_server
from uqh.rundir.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


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
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv (outside the repository) with the wheel installed; its dependencies come from this
    environment's site-packages through a .pth line (a .pth line does not run that directory's own .pth files,
    so this checkout's editable install stays out)."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "project_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", purelib,
                    str(wheel)], check=True, capture_output=True, text=True)
    return venv


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(UQH_SHARED_DATA=str(SHARED_DATA), UQH_CACHE_DIR=str(tmp / "cache"), HOME=str(tmp / "home"))
    # the wheel's venv has no llama-server of its own: a user of the wheel points uqh at one (docs/model-client.md)
    with contextlib.suppress(UserError):
        env.setdefault(LLAMA_SERVER_ENV, str(find_llama_server()))
    return env


def _uqh(venv: Path, cwd: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [str(venv / "bin" / "python"), "-m", "uqh.cli", *argv]
    return subprocess.run(cmd, cwd=cwd, env=_env(cwd), capture_output=True, text=True, timeout=timeout)


def test_wheel_has_one_top_level_package_and_every_prompt(wheel):
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
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "uqh = uqh.cli:main" in entry


def test_installed_wheel_imports_from_its_own_site_packages(installed, tmp_path):
    out = subprocess.run([str(installed / "bin" / "python"), "-c", "import uqh, uqh.prompts; "
                          "print(uqh.__file__); print(uqh.prompts.PROMPTS_DIR)"],
                         cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, check=True).stdout
    module_file, prompts_dir = out.split()
    assert str(installed) in module_file and not module_file.startswith(str(ROOT))
    assert Path(prompts_dir, "hotpotqa.txt").is_file()


def test_installed_wheel_runs_and_scores_arithmetic(installed, tmp_path, fake_server):
    with fake_server(lambda req: four_tags("Finish[7]")) as srv:
        run = _uqh(installed, tmp_path, "run", "--domain", "arithmetic", "--tasks", "3", "--model", "openai/fake",
                   "--api-base", srv.base_url, "--out", "runs/arith", "--no-progress")
    assert run.returncode == 0, run.stderr
    episodes = read_episodes(tmp_path / "runs" / "arith")
    assert len(episodes) == 3 and all(ep.steps for ep in episodes)
    score = _uqh(installed, tmp_path, "score", "runs/arith", "--bootstrap", "20", "--format", "json")
    assert score.returncode == 0, score.stderr
    result = json.loads(score.stdout)
    assert result and "rows" in json.dumps(result)


def test_installed_wheel_runs_hotpotqa_on_the_local_model(installed, tmp_path):
    # one step is enough to prove the installed wheel finds its prompts, the GGUF and the server (CI time, #28)
    run = _uqh(installed, tmp_path, "run", "--domain", "hotpotqa", "--tasks", "1", "--model", "local:smollm2",
               "--step-budget", "1", "--max-tokens", "96", "--out", "hq", "--no-progress", timeout=900)
    assert run.returncode == 0, run.stderr
    (ep,) = read_episodes(tmp_path / "hq")
    assert ep.steps or ep.failed_step
    calls = [a.call for s in ep.steps for a in s.attempts] + [a.call for a in ep.failed_step or []]
    assert calls and all(c.usage.completion_tokens for c in calls)  # the local model answered
