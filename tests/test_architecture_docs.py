"""The worked examples of docs/architecture.md run as written: a new domain, a new predictor, a new metric."""
from __future__ import annotations

import json
import re
from pathlib import Path


from uqh.cli import main
from scoring_fixtures import synthetic_run

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def _block(section: str) -> str:
    text = DOC.read_text()
    part = text[text.index(section):]
    return re.search(r"```python\n(.*?)```", part, re.S).group(1)


def test_domain_example_runs_end_to_end(tmp_path, monkeypatch, fake_server):
    import uqh.domains.base
    import uqh.domains.registry

    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "guess.txt").write_text("Guess the number. Use Guess[n].")
    monkeypatch.setattr(uqh.domains.base, "PROMPTS_DIR", tmp_path / "prompts")
    uqh.domains.registry._load_all()
    exec(compile(_block("## How to add a domain"), "docs/architecture.md", "exec"), {"__name__": "uqh.domains.registry.guess"})
    try:
        def answer(req):
            last = req["messages"][-1]["content"]
            guess = 50 if "Higher" not in last and "Lower" not in last else (75 if "Higher" in last else 25)
            return (f"<think>t</think><action>Guess[{guess}]</action><confidence>0.5</confidence>"
                    "<explanation>e</explanation>")

        with fake_server(answer) as srv:
            out = tmp_path / "run"
            rc = main(["run", "--domain", "guess", "-D", "n_tasks=3", "--tasks", "3", "--model", "openai/fake",
                       "--api-base", srv.base_url, "--out", str(out), "--no-progress"])
        assert rc == 0
        from uqh.rundir import RunDir

        run = RunDir.open(out)
        assert run.manifest.config.domain_options == {"n_tasks": 3} and len(run.episodes()) == 3
        assert main(["run", "--domain", "guess", "-D", "n_tasks=0", "--tasks", "1", "--model", "openai/fake",
                     "--api-base", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "bad")]) == 2
        assert not (tmp_path / "bad").exists()
    finally:
        uqh.domains.registry._REGISTRY.pop("guess", None)


def test_predictor_and_metric_examples_reach_the_score_output(tmp_path, capsys):
    from uqh.scoring.registry import unregister_metric, unregister_predictor

    run = synthetic_run(tmp_path / "run", n=30)
    exec(compile(_block("## How to add a predictor"), "docs/architecture.md", "exec"), {})
    exec(compile(_block("## How to add a metric"), "docs/architecture.md", "exec"), {})
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
