"""The README's first run, exactly as printed there, ends in a score table with TPS numbers (issue #28); and the
first job runs from a copy of the repository that has nothing beside it (issue #39).

The two commands are read from the README's "Run (offline, on the embedded default model)" block, so the README
and this test cannot drift apart; only ``runs/demo`` is replaced by a temporary directory.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from run_files import read_episodes, read_manifest
from uqh.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def readme_first_run() -> tuple[list[str], list[str]]:
    """The ``uqh run`` and ``uqh score`` argument lists of the README's first-run block."""
    text = README.read_text()
    block = text[text.index("## Run (offline, on the embedded default model)"):]
    block = block[block.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    commands = [shlex.split(line)[1:] for line in block.strip().splitlines() if line.startswith(".venv/bin/uqh ")]
    run = next(c for c in commands if c[0] == "run")
    score = next(c for c in commands if c[0] == "score")
    return run, score


def test_readme_first_run_block_is_found():
    run, score = readme_first_run()
    assert "--model" in run and run[run.index("--model") + 1] == "local:smollm2"
    assert "runs/demo" in run and "runs/demo" in score


@pytest.mark.smoke
def test_readme_first_run_scores_tps(tmp_path, capsys):
    run, score = readme_first_run()
    out = str(tmp_path / "demo")
    swap = lambda args: [out if a == "runs/demo" else a for a in args]  # noqa: E731
    assert main([*swap(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main([*swap(score), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    verbal = next(r for r in doc["rows"] if r["predictor"] == "verbal" and r["calibration"] == "raw")
    assert verbal["n_used"] > 0, doc["counts"]
    tps = {m["score"]: m["estimate"]["value"] for m in verbal["metrics"] if m["metric"] == "tps"}
    assert tps, "no TPS value in the score output"
    assert all(isinstance(v, float) and math.isfinite(v) for v in tps.values()), tps


@pytest.fixture(scope="module")
def repository_copy(tmp_path_factory) -> Path:
    """The repository's files (tracked and new, as a clone would have them) in a folder with no sibling: no
    ``shared/`` data folder next to it, nothing outside it."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    copy = tmp_path_factory.mktemp("clone") / "uqh"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    assert sorted(p.name for p in copy.parent.iterdir()) == ["uqh"]
    return copy


@pytest.mark.smoke
@pytest.mark.parametrize("domain", ["hotpotqa", "strategyqa", "webshop"])
def test_the_first_job_runs_from_a_copy_with_nothing_beside_it(repository_copy, tmp_path, domain):
    """``uqh run --domain D --model local:smollm2 --tasks 1 --step-budget 3`` with the copy's code, from another
    directory, ``HF_HUB_OFFLINE=1``, no variable pointing at data: its questions come from the copy's package."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    env.update(PYTHONPATH=str(repository_copy), HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1",
               LITELLM_LOCAL_MODEL_COST_MAP="True")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([sys.executable, "-m", "uqh.cli", "run", "--domain", domain, "--model", "local:smollm2",
                          "--tasks", "1", "--step-budget", "3", "--out", "run", "--no-progress"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    (episode,) = read_episodes(elsewhere / "run")
    assert episode.steps or episode.failed_step
    info = read_manifest(elsewhere / "run").info
    facts = info["webshop"] if domain == "webshop" else info
    data_file = Path(facts["catalog_file"] if domain == "webshop" else facts["data_files"][0])
    assert facts["data_source"] == "packaged" and data_file.is_relative_to(repository_copy / "uqh" / "domains")
