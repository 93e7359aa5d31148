"""Typed results and the METRICS / PREDICTORS registries.

- The typed pipeline gives exactly the numbers of the dict-returning pipeline it replaced (golden records
  written by that code, tests/data/scoring_pre_typed.json, generator tests/data/make_scoring_pre_typed.py).
- A predictor or a diagnostic metric registered at runtime -- one entry, no other code touched -- shows up in
  ``score_run``, the CLI table, JSON and CSV, and the report.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from uqh.cli import main
from uqh.rundir.errors import UserError
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import LogprobRow, Step
from uqh.scoring.diagnostics import trajectory_scalar
from uqh.scoring.pipeline import ScoreOptions, score_run
from uqh.scoring.registry import (
    METRICS,
    PREDICTORS,
    Metric,
    MetricKey,
    Predictor,
    get_predictor,
    register_metric,
    register_predictor,
    unregister_metric,
    unregister_predictor,
)
from uqh.scoring.results import RunScores
from uqh.scoring.rules import parse_score
from uqh.scoring.streams import build_sample, load_run
from uqh.scoring.tps import tps
from uqh.scoring.weights import trajectory_weights
from scoring_fixtures import synthetic_run

GOLDEN = Path(__file__).parent / "data" / "scoring_pre_typed.json"


@pytest.fixture(scope="module")
def syn(tmp_path_factory):
    return synthetic_run(tmp_path_factory.mktemp("typed") / "syn", n=40, censored=6, parse_errors=3, seed=7)


# ------------------------------------------------------------------------------------------ numbers unchanged


def _golden_configs(run):
    """The golden records predate the label conventions (issue 15): they were computed with the base rate and Platt
    trained on the complete trajectories only, which ``labels="complete"`` must keep bit for bit; ``exclude`` has
    no censored trajectory, so its default (working) labels are the same."""
    cens = [e for e, s in zip(run.episode_ids, run.stop_reason) if s == "max_steps"]
    q = {e: (k + 1) / 10 for k, e in enumerate(cens)}
    return {
        "exclude": dict(censoring="exclude", fixed_rank=True),
        "simple": dict(censoring="simple", labels="complete"),
        "exact": dict(censoring="exact", q_z=q, labels="complete"),
        "uniform": dict(censoring="simple", weights="uniform", scores=(parse_score("log"), parse_score("beta:1,3")),
                        labels="complete"),
    }


def _typed_number(res: RunScores, table, predictor, calibration, metric, score, field):
    if table == "counts":
        return getattr(res.counts, field)
    if table == "calibration":
        d = next(d for d in res.calibration if d.predictor == predictor)
        return getattr(d.split_a if calibration == "split_A" else d.split_b, field)
    if table == "fixed_rank":
        row = next(r for r in res.fixed_rank if r.predictor == predictor and r.transform == calibration)
        return row.value(metric, score)
    if table.startswith("auq:"):
        row = next(r for r in res.auq if r.predictor == predictor and r.calibration == calibration
                   and r.aggregator == table[len("auq:"):])
        return getattr(row.estimate(metric, score), field)
    row = res.row(predictor, calibration)
    if metric is None:
        return getattr(row, field)
    if field.startswith("vs_raw."):
        return getattr(row.get(metric, score).vs_raw, field[len("vs_raw."):])
    return getattr(row.estimate(metric, score), field)


def test_numbers_equal_the_pre_typed_pipeline(syn):
    golden = json.loads(GOLDEN.read_text())
    cols = golden["columns"]
    run = load_run(syn)
    results = {name: score_run(run, ScoreOptions(n_bootstrap=golden["bootstrap"], seed=golden["seed"],
                                                 predictors=tuple(golden["predictors"]), **kw))
               for name, kw in _golden_configs(run).items()}
    checked = 0
    for rec in golden["records"]:
        r = dict(zip(cols, rec))
        got = _typed_number(results[r["options"]], r["table"], r["predictor"], r["calibration"], r["metric"],
                            r["score"], r["field"])
        want = r["number"]
        if isinstance(want, float) and math.isnan(want):
            assert got is None, r  # missing is None in the typed results, never NaN
        else:
            # same arrays, same resamples; the last bits move with the numpy/scipy release (seen: numpy 2.4.6) and
            # with the tie rule, which rounds the scalars to 12 significant digits instead of 12 decimals (values
            # move by < 1e-12 relative; diagnostics.tie_rounded)
            assert got == want or math.isclose(got, want, rel_tol=1e-11, abs_tol=1e-14), r
        checked += 1
    assert checked > 1000 and {dict(zip(cols, x))["options"] for x in golden["records"]} == set(results)


def test_json_round_trip_and_cli_json_is_the_model_dump(syn, capsys):
    assert main(["score", str(syn), "--json", "--bootstrap", "10", "--predictor", "verbal,base_rate",
                 "--censoring", "simple", "--fixed-rank"]) == 0
    out = capsys.readouterr().out
    res = RunScores.model_validate_json(out)
    assert RunScores.model_validate_json(res.model_dump_json()) == res
    assert json.loads(out) == json.loads(res.model_dump_json())
    assert [k.header for k in res.metric_keys()][:5] == ["AUROC↑", "AUPRC↑", "AURC↓", "T-ECE↓", "T-Brier↓"]
    assert MetricKey("delta_practice", "beta(2,4)").header == "Δ_practice β(2,4)"  # a difference: no arrow
    assert res.fixed_rank and {r.predictor for r in res.fixed_rank} == {"verbal"}  # constants have no Appendix E


# ------------------------------------------------------------------------------------------ registries


def last_token_prob(step: Step, row: LogprobRow | None) -> float:
    """Toy predictor: probability of the last generated token of the step."""
    if row is None or not row.tokens:
        return float("nan")
    return math.exp(row.tokens[-1].logprob)


@pytest.fixture
def toy_predictor():
    p = register_predictor(Predictor("last_token_prob", "Last token probability", last_token_prob))
    try:
        yield p
    finally:
        unregister_predictor(p.name)
    assert "last_token_prob" not in PREDICTORS


def test_a_registered_predictor_is_scored_tabled_and_exported(toy_predictor, syn, capsys):
    run = load_run(syn)
    reader = RunDir.open(syn)
    last = {(r.episode_id, r.t): math.exp(r.tokens[-1].logprob) for r in reader.sidecar() if r.accepted}
    expected = [last[(e, t)] for e, a, b in zip(run.episode_ids, run.offsets[:-1], run.offsets[1:])
                for t in range(1, b - a + 1)]
    np.testing.assert_allclose(run.streams["last_token_prob"], expected, rtol=0, atol=1e-15)

    res = score_run(run, ScoreOptions(n_bootstrap=0, auq=False))
    assert [r.calibration for r in res.rows if r.predictor == "last_token_prob"] == ["raw", "platt"]
    assert res.rows[-1].predictor == "base_rate"  # constants stay last
    s = build_sample(run, "last_token_prob")
    w = trajectory_weights(s.offsets, "linear-front", s.horizon)
    want = float(np.mean(tps(s.values, s.offsets, s.y, parse_score("log"), w)))
    assert res.row("last_token_prob", "raw").value("tps", "log") == pytest.approx(want, abs=1e-12)
    assert any(d.predictor == "last_token_prob" for d in res.calibration)

    assert main(["score", str(syn), "--bootstrap", "0", "--predictor", "last_token_prob", "--fixed-rank"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("last_token_prob ")]
    assert len(rows) >= 2  # its raw and Platt rows (the terminal table names predictors by registry name)
    assert "Fixed-rank analysis (Appendix E): last_token_prob" in out
    assert main(["score", str(syn), "--format", "csv", "--bootstrap", "0", "--predictor", "last_token_prob"]) == 0
    recs = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["predictor"] for r in recs} == {"last_token_prob"} and {r["table"] for r in recs} == {"predictors", "auq"}


def test_a_registered_predictor_reaches_the_report(toy_predictor, tmp_path):
    from report_fixtures import tau2_like
    from uqh.reports.report.write_report import ReportOptions, build_report

    res = build_report([tau2_like(tmp_path / "t2")], tmp_path / "out", ReportOptions(n_bootstrap=5, max_traces=2))
    rows = list(csv.DictReader((res.out_dir / "transparency__t2.csv").open()))
    assert "Last token probability (raw)" in [r["Predictor"] for r in rows]
    assert '"key":"last_token_prob","label":"Last token probability"' in res.html.read_text()  # trace explorer


def test_unregistered_predictor_is_a_user_error(syn, capsys):
    with pytest.raises(UserError, match="unknown predictor 'last_token_prob'"):
        get_predictor("last_token_prob")
    assert main(["score", str(syn), "--predictor", "last_token_prob"]) == 2
    assert "unknown predictor" in capsys.readouterr().err


def mean_scalar(c: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Toy diagnostic: the (resample-weighted) mean of the trajectory scalar."""
    return weights @ c / weights.sum(axis=1)


def test_a_registered_diagnostic_is_computed_bootstrapped_and_shown(syn, capsys):
    register_metric(Metric("mean_c", "mean trajectory scalar", "mean C", None, "diagnostic", compute=mean_scalar))
    try:
        run = load_run(syn)
        res = score_run(run, ScoreOptions(predictors=("verbal",), n_bootstrap=20))
        s = build_sample(run, "verbal")
        c = trajectory_scalar(s.values, s.offsets, trajectory_weights(s.offsets, "linear-front", s.horizon))
        e = res.row("verbal", "raw").estimate("mean_c")
        assert e.value == pytest.approx(c.mean(), abs=1e-12) and e.ci_low < e.value < e.ci_high
        assert res.row("verbal", "platt").get("mean_c").vs_raw is not None
        assert all(r.get("mean_c") is not None for r in res.auq)  # AUQ rows use every diagnostic
        assert MetricKey("mean_c") in res.metric_keys()
        assert main(["score", str(syn), "--bootstrap", "0", "--predictor", "verbal"]) == 0
        assert "mean C" in capsys.readouterr().out
        assert main(["score", str(syn), "--format", "csv", "--bootstrap", "0", "--predictor", "verbal"]) == 0
        assert "mean_c" in {r["metric"] for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    finally:
        unregister_metric("mean_c")
    assert "mean_c" not in METRICS


def test_registration_rejects_bad_entries():
    before = set(PREDICTORS)
    with pytest.raises(ValueError, match="already registered"):
        register_predictor(Predictor("verbal", "again", last_token_prob))
    with pytest.raises(ValueError, match="exactly one"):
        Predictor("x", "x")
    with pytest.raises(ValueError, match="exactly one"):
        Predictor("x", "x", last_token_prob, constant=lambda y: 0.5)
    with pytest.raises(ValueError, match="compute"):
        register_metric(Metric("auroc2", "x", "x", True, "diagnostic"))
    with pytest.raises(ValueError, match="already registered"):
        register_metric(Metric("auroc", "x", "x", True, "diagnostic", compute=mean_scalar))
    assert set(PREDICTORS) == before  # nothing half-registered
    assert {"verbal", "token_prob", "token_entropy", "action_prob", "action_entropy", "sc_mode_freq", "sc_agreement",
            "p_true", "truth", "base_rate"} <= before


def test_lazy_public_api_resolves():
    import uqh.scoring as scoring

    for name in scoring.__all__:
        assert getattr(scoring, name) is not None, name
    assert scoring.score_run is score_run and scoring.PREDICTORS is PREDICTORS


#: import orders a user's session can take before touching the public API
IMPORT_ORDERS = {
    "submodules first": "import uqh.scoring.tps, uqh.scoring.pipeline, uqh.scoring.calibration, uqh.scoring.labels; "
                        "import uqh.scoring",
    "names first": "import uqh.scoring as scoring; [getattr(scoring, n) for n in scoring.__all__]; "
                   "import uqh.scoring.tps, uqh.scoring.pipeline",
    "from-import of the module": "from uqh.scoring.tps import tps as t0; from uqh.scoring import tps as t1; "
                                 "import uqh.scoring",
    "every submodule after the package": "import uqh.scoring, pkgutil, importlib; "
                                         "[importlib.import_module('uqh.scoring.' + m.name) "
                                         "for m in pkgutil.iter_modules(uqh.scoring.__path__)]",
}

CHECK_PUBLIC_NAMES = """
import importlib, types
import numpy as np
import uqh.scoring as scoring
for name, module in scoring._EXPORTS.items():
    got = getattr(scoring, name)
    assert not isinstance(got, types.ModuleType), name
    assert got is getattr(importlib.import_module(module), name), name
from uqh.scoring import tps, parse_score
values, offsets = np.array([0.8, 0.6, 0.3]), np.array([0, 2, 3])
w = scoring.trajectory_weights(offsets)
out = scoring.tps(values, offsets, np.array([1.0, 0.0]), scoring.parse_score("log"), w)
assert np.allclose(out, [2 / 3 * np.log(0.8) + 1 / 3 * np.log(0.6), np.log(0.7)]), out
from uqh.scoring.tps import per_trajectory_sum  # the submodule itself stays importable
assert importlib.import_module("uqh.scoring.tps").tps is scoring.tps
print("ok")
"""


@pytest.mark.parametrize("order", IMPORT_ORDERS.values(), ids=IMPORT_ORDERS.keys())
def test_public_names_stay_callable_in_any_import_order(order):
    """``uqh.scoring.tps`` is the function even after the submodule ``uqh/scoring/tps.py`` was imported (issue 15, item 5)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", order + "\n" + CHECK_PUBLIC_NAMES], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_predictor_registered_after_loading_asks_to_reload(syn):
    run = load_run(syn)
    register_predictor(Predictor("late", "Late", last_token_prob))
    try:
        with pytest.raises(ValueError, match="registered after"):
            build_sample(run, "late")
    finally:
        unregister_predictor("late")
