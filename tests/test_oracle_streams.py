"""The oracle-streams demonstration (benchmarks/oracle_streams.py): its simulated q_t is the truth it claims, its
streams are the transformations it names, and TPS ranks the truthful stream first on a small run."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("oracle_streams", ROOT / "benchmarks" / "oracle_streams.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_simulated_q_t_is_calibrated_at_every_step(bench):
    q, offsets, y, t = bench.simulate(40_000, np.random.default_rng(3))
    y_step = np.repeat(y, np.diff(offsets))
    assert t.min() == 0 and t.max() == bench.N_DRAWS - 1 and np.all(t[offsets[:-1]] == 0)
    edges = np.linspace(0, 1, 6)
    for lo, hi in zip(edges[:-1], edges[1:]):  # E[Y | q in bin] = mean q in bin, within 4 SE
        m = (q >= lo) & (q < hi) if hi < 1 else (q >= lo)
        se = np.sqrt(np.mean(q[m] * (1 - q[m])) / m.sum())
        assert abs(y_step[m].mean() - q[m].mean()) < 4 * se


def test_streams_are_what_they_are_called(bench):
    rng = np.random.default_rng(1)
    q, offsets, y, t = bench.simulate(500, rng)
    s = bench.streams(q, offsets, t, rng)
    assert np.array_equal(s["truthful"], q)
    assert np.allclose(s["squashed"] - 0.5, 0.3 * (q - 0.5))
    inner = (q > 0) & (q < 1) & (q != 0.5)
    assert np.all(np.abs(s["over-confident"][inner] - 0.5) > np.abs(q[inner] - 0.5))
    assert np.all(np.abs(s["under-confident"][inner] - 0.5) < np.abs(q[inner] - 0.5))
    for step in np.unique(t):  # same values per step index, other order
        assert np.array_equal(np.sort(s["shuffled"][t == step]), np.sort(q[t == step]))
    later = np.flatnonzero(t > 0)
    assert np.array_equal(s["stale"][later], q[later - 1]) and np.array_equal(s["stale"][t == 0], q[t == 0])
    assert len(np.unique(s["binned"])) <= 10


def test_the_demonstration_writes_its_table_with_tps_ranking_truth_first(bench, tmp_path, monkeypatch):
    out = tmp_path / "o.md"
    monkeypatch.setattr("sys.argv", ["oracle_streams", "--episodes", "3000", "--bootstrap", "30", "--out", str(out)])
    bench.main()
    text = out.read_text()
    summary = text.split("## Summary")[1]
    tps_lines = [line.split("|") for line in summary.splitlines() if line.startswith("| TPS_")]
    assert len(tps_lines) == 5
    assert all(cells[4].strip() == "0" for cells in tps_lines)  # no stream beats the truthful one under TPS
