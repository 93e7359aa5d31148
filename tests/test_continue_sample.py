"""`uqh continue --sample N --seed S`: a seeded random sample of the censored prefixes (Appendix H.2 samples its
100 prefixes), recorded in the continuation manifest; `--prefixes N` keeps meaning "the first N"."""
from __future__ import annotations

import random

import pytest

from uqh.cli import main as uqh
from uqh.harness import continuation as cont
from uqh.rundir.errors import UserError
from run_files import read_manifest
from test_continuation import Responder, source_run  # noqa: F401  (fixture)


def test_sample_is_seeded_without_replacement_and_in_canonical_order():
    population = [f"ep{i:02d}" for i in range(40)]
    a = cont.sample_prefixes(population, cont.PrefixSample(10, seed=3))
    assert a == cont.sample_prefixes(population, cont.PrefixSample(10, seed=3))  # same seed, same draw
    assert len(a) == len(set(a)) == 10 and a == sorted(a)  # no repeats, canonical order kept
    assert a != population[:10]  # not the first N
    assert a != cont.sample_prefixes(population, cont.PrefixSample(10, seed=4))
    # the documented draw: random.Random(seed).sample over the canonical positions
    assert a == [population[i] for i in sorted(random.Random(3).sample(range(40), 10))]
    assert cont.sample_prefixes(population, cont.PrefixSample(40, seed=3)) == population
    assert cont.sample_prefixes(population, cont.PrefixSample(99, seed=3)) == population  # fewer: all of them
    with pytest.raises(UserError, match="--sample must be at least 1"):
        cont.sample_prefixes(population, cont.PrefixSample(0))


def test_sample_record_states_population_and_drawn():
    assert cont.PrefixSample(100, seed=42).record(145) == {"method": "random", "n": 100, "seed": 42,
                                                          "population": 145, "drawn": 100}
    assert cont.PrefixSample(100, seed=42).record(87)["drawn"] == 87


def test_continue_sample_records_the_draw_and_resumes(source_run, tmp_path, capsys):  # noqa: F811
    src, srv, _ = source_run
    censored = [e for e in cont.load_source(src)[1] if e.stop_reason.value == "max_steps"]
    censored.sort(key=cont.load_source(src)[0].config.episode_sort_key())
    expected = [e.episode_id for e in cont.sample_prefixes(censored, cont.PrefixSample(2, seed=7))]
    out = tmp_path / "cont"
    argv = ["continue", str(src), "--sample", "2", "--seed", "7", "--branches", "1", "--extra-steps", "1",
            "--out", str(out), "--no-progress", "--min-valid", "1", "--bootstrap", "10"]
    assert uqh(argv) == 0
    assert "2 prefixes sampled with seed 7" in capsys.readouterr().out
    c = read_manifest(out).config.continuation
    assert c["prefix_ids"] == expected
    assert c["selection"] == {"method": "random", "n": 2, "seed": 7, "population": 3, "drawn": 2}
    assert {r["messages"][1]["content"] for r in srv.requests}  # branches ran
    srv.requests.clear()
    assert uqh(argv) == 0 and srv.requests == []  # the same command resumes: same draw, nothing left to do
    capsys.readouterr()
    # another draw is another continuation: refused, nothing written
    seed = next(s for s in range(8, 100)
                if [e.episode_id for e in cont.sample_prefixes(censored, cont.PrefixSample(2, seed=s))] != expected)
    before = sorted(p.name for p in out.iterdir())
    assert uqh([a if a != "7" else str(seed) for a in argv]) == 2
    assert "different config" in capsys.readouterr().err and srv.requests == []
    assert sorted(p.name for p in out.iterdir()) == before


def test_prefixes_keeps_meaning_first_n_and_records_no_selection(source_run, tmp_path, capsys):  # noqa: F811
    src, _, _ = source_run
    manifest, episodes = cont.load_source(src)
    first = sorted((e for e in episodes if e.stop_reason.value == "max_steps"), key=manifest.config.episode_sort_key())
    out = tmp_path / "first"
    assert uqh(["continue", str(src), "--prefixes", "2", "--branches", "1", "--extra-steps", "1", "--out", str(out),
                "--no-progress", "--min-valid", "1", "--bootstrap", "10"]) == 0
    c = read_manifest(out).config.continuation
    assert c["prefix_ids"] == [e.episode_id for e in first[:2]]
    assert "selection" not in c  # first-N configs (and hashes) are what they were before --sample existed


@pytest.mark.parametrize("extra, msg", [
    (["--seed", "3"], "--seed only seeds the --sample draw"),
    (["--sample", "0"], "--sample must be at least 1"),
    (["--sample", "2", "--prefixes", "2"], "not allowed with argument"),
])
def test_sample_user_errors_write_nothing(source_run, tmp_path, capsys, extra, msg):  # noqa: F811
    src, srv, _ = source_run
    out = tmp_path / "never"
    with pytest.raises(SystemExit) if "--prefixes" in extra else _no_raise():
        rc = uqh(["continue", str(src), "--out", str(out), "--extra-steps", "1", "--no-progress", *extra])
        assert rc == 2
    assert msg in capsys.readouterr().err
    assert not out.exists() and srv.requests == []


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
