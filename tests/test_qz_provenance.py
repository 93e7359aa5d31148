"""A q_Z file applies only to the run it was estimated from: episode ids repeat across runs (``t0#0`` in every run
of the same tasks), so `uqh score` / `uqh report` check the source recorded by the continuation run beside it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from uqh.harness import continuation as cont
from uqh.cli import main as uqh
from uqh.harness.store.writer import RunStore
from uqh.rundir.qz_file import QzRecord, qz_for_runs, write_qz_file
from uqh.rundir.schema import Attempt, CallRecord, Episode, RunConfig, Step, StopReason
from run_files import read_manifest

Z = 2


def _episodes() -> list[Episode]:
    def step(t, action="Calc[1+1]"):
        return Step(t=t, think="", action=action, verbal_confidence=0.4 + 0.1 * t, explanation="e",
                    observation="Result: 2", attempts=[Attempt(attempt=0, raw_text="x", call=CallRecord(model="m"))])

    censored = [Episode(episode_id=f"t{i}#0", task_id=f"t{i}", stop_reason=StopReason.max_steps, n_steps=Z,
                        step_budget=Z, task_prompt="q", steps=[step(1), step(2)]) for i in range(3)]
    clean = [Episode(episode_id=f"c{i}#0", task_id=f"c{i}", stop_reason=StopReason.clean, outcome=i % 2, n_steps=2,
                     step_budget=Z, task_prompt="q", steps=[step(1), step(2, "Finish[2]")]) for i in range(4)]
    return censored + clean


def _run(run_dir: Path, seed: int) -> Path:
    config = RunConfig(domain="arithmetic", task_ids=[f"t{i}" for i in range(3)] + [f"c{i}" for i in range(4)],
                       model="openai/m", step_budget=Z, prompt_sha256="x", package_version="0",
                       decoding={"seed": seed})
    with RunStore.open_or_create(run_dir, config, system_prompt="sys") as store:
        for ep in _episodes():
            store.append_episode(ep, [])
    return run_dir


@pytest.fixture
def runs(tmp_path):
    """Runs a and b of the same tasks (same episode ids, other seed) and a continuation of a with its qz.jsonl."""
    a, b = _run(tmp_path / "a", seed=1), _run(tmp_path / "b", seed=2)
    cont_dir = tmp_path / "a-cont"
    cfg = cont.continuation_config(read_manifest(a), a, _episodes()[:3], branches=4, extra_steps=1)
    with RunStore.open_or_create(cont_dir, cfg, system_prompt="sys"):
        pass
    write_qz_file(cont_dir / "qz.jsonl", [QzRecord(episode_id=f"t{i}#0", q_hat_z=0.25 * (i + 1), n_valid=4,
                                                   method="mc") for i in range(3)])
    return a, b, cont_dir / "qz.jsonl"


def _score(*args) -> list[str]:
    return ["score", *map(str, args), "--censoring", "exact", "--predictor", "verbal", "--calibration", "none",
            "--score", "log", "--bootstrap", "0", "--format", "json"]


def test_score_refuses_the_q_z_file_of_another_run_in_one_line(runs, capsys):
    a, b, qz = runs
    assert uqh([*_score(b), "--q-z", str(qz)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("uqh score: error: q_Z file ")
    assert f"estimates run {a.resolve()}" in err and str(b) in err
    assert uqh([*_score(a), "--q-z", str(qz)]) == 0


def test_score_of_two_runs_gives_the_q_z_to_its_own_run_only(runs, capsys):
    a, b, qz = runs
    assert uqh([*_score(a, b), "--q-z", str(qz), "--missing-qz", "exclude"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_dir = {Path(r["run_dir"]).name: r for r in out}
    # b's censored prefixes are not covered by a's estimates: they are left out (--missing-qz exclude), not given a's q_Z
    assert (by_dir["a"]["counts"]["censored"], by_dir["a"]["counts"]["excluded_no_qz"]) == (3, 0)
    assert (by_dir["b"]["counts"]["censored"], by_dir["b"]["counts"]["excluded_no_qz"]) == (0, 3)
    assert uqh([*_score(a, b), "--q-z", str(qz), "--missing-qz", "exclude", "--pooled"]) == 0
    pooled = json.loads(capsys.readouterr().out)[2]["counts"]  # ids prefixed per run: a's q_Z reaches a's only
    assert (pooled["censored"], pooled["excluded_no_qz"]) == (3, 3)


def test_a_q_z_file_without_its_continuation_manifest_cannot_be_checked_and_applies(runs, tmp_path):
    a, b, qz = runs
    loose = tmp_path / "loose.jsonl"
    shutil.copy(qz, loose)
    per_run = qz_for_runs([loose], [(a, "hash-a"), (b, "hash-b")])
    assert per_run[0] == per_run[1] == {"t0#0": 0.25, "t1#0": 0.5, "t2#0": 0.75}


def test_qz_for_runs_assigns_each_file_to_the_run_with_its_source_hash(runs):
    a, b, qz = runs
    ha, hb = read_manifest(a).config_hash, read_manifest(b).config_hash
    assert ha != hb
    assert qz_for_runs([qz], [(a, ha), (b, hb)]) == [{"t0#0": 0.25, "t1#0": 0.5, "t2#0": 0.75}, {}]


def test_report_scores_exact_censoring_only_for_the_run_the_q_z_file_belongs_to(runs):
    from uqh.reports.termination_tables import open_audited_run as load_run
    from uqh.reports.scoring_calls import ReportOptions, score_runs

    a, b, qz = runs
    scored = score_runs([load_run(a), load_run(b)], ReportOptions(n_bootstrap=0, q_z_files=(qz,)))
    by_dir = {s.run.path.name: s.results for s in scored}
    assert by_dir["a"].exact is not None and by_dir["a"].exact_missing == 0
    assert by_dir["b"].exact is None and by_dir["b"].exact_missing == 3
