"""The worked examples of docs/architecture.md are the example plugin's files, verbatim (tests/plugins/uqh-guess,
which tests/test_plugins.py installs and runs), and the in-code registration still works."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from uqh.cli import main
from scoring_fixtures import synthetic_run

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
PLUGIN = Path(__file__).resolve().parent / "plugins" / "uqh-guess" / "uqh_guess"


def _block(section: str) -> str:
    text = DOC.read_text()
    part = text[text.index(section):]
    return re.search(r"```python\n(.*?)```", part, re.S).group(1)


@pytest.mark.parametrize("section,file", [("## How to add a domain", "domain.py"),
                                          ("## How to add a predictor and a metric", "signals.py")])
def test_the_documented_examples_are_the_example_plugin(section, file):
    assert _block(section) == (PLUGIN / file).read_text()


def test_predictor_and_metric_registered_in_code_reach_the_score_output(tmp_path, capsys):
    from uqh.scoring.registry import register_metric, register_predictor, unregister_metric, unregister_predictor

    run = synthetic_run(tmp_path / "run", n=30)
    namespace: dict = {}
    exec(compile(_block("## How to add a predictor and a metric"), "docs/architecture.md", "exec"), namespace)
    register_predictor(namespace["LAST_TOKEN_PROB"])
    register_metric(namespace["ACCURACY_AT_HALF"])
    try:
        assert main(["score", str(run), "--bootstrap", "20", "--format", "json"]) == 0
        res = json.loads(capsys.readouterr().out)
        preds = {r["predictor"] for r in res["rows"]}
        assert "last_token_prob" in preds
        metrics = {m["metric"] for r in res["rows"] for m in r["metrics"]}
        assert "acc50" in metrics
    finally:
        unregister_predictor("last_token_prob")
        unregister_metric("acc50")
