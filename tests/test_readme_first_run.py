"""The README's first run, exactly as printed there, ends in a score table with TPS numbers (issue #28).

The two commands are read from the README's "Run (offline, on the embedded default model)" block, so the README
and this test cannot drift apart; only ``runs/demo`` is replaced by a temporary directory.
"""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from uqh.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


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
