"""A package outside uqh adds a domain, an agent, a predictor and a metric through entry points, and `uqh run`, `uqh score`
and `uqh list` use them (tests/plugins/uqh-guess). Without the package installed, none of them exists."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGIN = Path(__file__).resolve().parent / "plugins" / "uqh-guess"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """The example plugin installed (wheel built by pip) into a folder of its own."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = tmp / "src"
    shutil.copytree(PLUGIN, src)  # the build writes beside its sources: never into the repository
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(src)], check=True, capture_output=True, timeout=600)
    return site


def uqh(*args: str, site: Path | None, cwd: Path) -> subprocess.CompletedProcess:
    path = [str(site)] if site else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(REPO)]))
    return subprocess.run([sys.executable, "-m", "uqh.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def answer(req: dict) -> str:
    """Halves the interval after each "Higher."/"Lower." (secret of guess-1 is 38, of guess-2 is 75)."""
    lo, hi = 1, 100
    for m in req["messages"]:
        if m["role"] == "assistant":
            n = int(m["content"].split("Guess[")[1].split("]")[0])
        elif m["role"] == "user" and ("Higher" in m["content"] or "Lower" in m["content"]):
            lo, hi = (n + 1, hi) if "Higher" in m["content"] else (lo, n - 1)
    return (f"<think>bisect</think><action>Guess[{(lo + hi) // 2}]</action><confidence>0.7</confidence>"
            "<explanation>e</explanation>")


def test_a_plugin_domain_predictor_and_metric_run_and_score(plugin_site, fake_server, tmp_path):
    listed = json.loads(uqh("list", "--format", "json", site=plugin_site, cwd=tmp_path).stdout)
    guess = next(r for r in listed["domains"] if r["name"] == "guess")
    assert guess["source"] == "uqh-guess 0.1.0" and guess["entry_point"] == "uqh_guess.domain:GuessDomain"
    assert {r["name"]: r["source"] for r in listed["predictors"]}["last_token_prob"] == "uqh-guess 0.1.0"
    assert {r["name"]: r["source"] for r in listed["predictors"]}["verbal"].startswith("uqh ")
    assert {r["name"]: r["source"] for r in listed["metrics"]}["acc50"] == "uqh-guess 0.1.0"
    assert {r["name"]: r["source"] for r in listed["agents"]}["brief"] == "uqh-guess 0.1.0"

    out = tmp_path / "run"
    with fake_server(answer) as srv:
        done = uqh("run", "--domain", "guess", "-D", "n_tasks=3", "--tasks", "3", "--model", "openai/fake",
                   "--api-base", srv.base_url, "--out", str(out), "--no-progress", "--agent", "brief",
                   site=plugin_site, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["info"]["display_name"] == "Guess-the-number" and manifest["config"]["agent"] == "brief"
    prompt = manifest["system_prompt"]
    assert prompt.startswith("You are guessing a secret whole number")  # the plugin's own file
    assert prompt.endswith("Keep every <think> to one sentence.\n")  # and its agent's
    assert all(r["messages"][0]["content"] == prompt for r in srv.requests)
    scored = uqh("score", str(out), "--predictor", "verbal,last_token_prob", "--format", "json", "--bootstrap", "20",
                 site=plugin_site, cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr
    rows = json.loads(scored.stdout)["rows"]
    row = next(r for r in rows if r["predictor"] == "last_token_prob" and r["calibration"] == "raw")
    assert row["n_used"] == 3 and "acc50" in json.dumps(row)


def test_without_the_plugin_its_entries_do_not_exist(tmp_path):
    done = uqh("run", "--domain", "guess", "--tasks", "1", "--model", "openai/fake", "--api-base",
               "http://127.0.0.1:9/v1", "--out", str(tmp_path / "run"), site=None, cwd=tmp_path)
    assert done.returncode == 2 and "unknown domain 'guess'" in done.stderr and not (tmp_path / "run").exists()
    assert "last_token_prob" not in uqh("list", "predictors", site=None, cwd=tmp_path).stdout
    done = uqh("run", "--domain", "arithmetic", "--agent", "brief", "--tasks", "1", "--model", "openai/fake",
               "--api-base", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "run"), site=None, cwd=tmp_path)
    assert done.returncode == 2 and "unknown --agent 'brief'" in done.stderr and not (tmp_path / "run").exists()


def test_a_plugin_metric_that_is_not_a_computed_diagnostic_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "site" / "uqh_bad-0.1.dist-info"
    bad.mkdir(parents=True)
    (bad / "METADATA").write_text("Metadata-Version: 2.1\nName: uqh-bad\nVersion: 0.1\n")
    (bad / "entry_points.txt").write_text("[uqh.metrics]\nbad = uqh.scoring.registry:TPS\n")
    done = uqh("list", "metrics", site=tmp_path / "site", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("uqh list: error: the uqh.metrics entry point 'bad' (from uqh-bad 0.1) gave str, "
                                   "not a Metric")


def test_a_stale_build_of_uqh_on_the_path_does_not_hide_the_installed_entry_points(tmp_path):
    """`pip wheel .` in a checkout leaves a uqh.egg-info there; from that working directory (first on sys.path) it
    used to stand for uqh, and if it predates the entry points no built-in domain existed."""
    stale = tmp_path / "stale"
    (stale / "uqh.egg-info").mkdir(parents=True)
    (stale / "uqh.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: uqh\nVersion: 0.0.1\n")
    (stale / "uqh.egg-info" / "entry_points.txt").write_text("[console_scripts]\nuqh = uqh.cli:main\n")
    done = uqh("list", "domains", site=stale, cwd=stale)
    assert done.returncode == 0, done.stderr
    assert "arithmetic" in done.stdout and "uqh 0.1.0" in done.stdout
