"""No secret in any file or log: a canary key passed every way a key can arrive -- the environment, ``.env``, a
URL's ``user:password@``, a URL's query string, and an error body that echoes it -- is found in no file a command
wrote (run directory with its lock, judge directory, report directory) and in neither stdout nor stderr with -v.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_openai_server import FakeOpenAIServer
from judge_fixtures import judge
from test_runner import solver
from uqh.cli import main
from uqh.harness.model.call_errors import error_line
from uqh.harness.store import lock
from uqh.rundir import secrets

REPO = Path(__file__).resolve().parent.parent
ENV_KEY = "sk-CANARYenv0123456789abcdef"
DOTENV_KEY = "sk-CANARYdotenv0123456789abc"
USERINFO_PASSWORD = "CANARYuserinfo0123456789"
QUERY_KEY = "CANARYquery0123456789abcd"
CANARY = "CANARY"  # every canary carries it: not even a piece of one may appear


def _uqh(cwd: Path, env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uqh.cli", "-v", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240, check=False)


def _files_with_canary(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]


ONE_CANARY = "CANARYone0123456789xyzw"  # one canary, passed every way the CLI accepts a URL
#: Every shape of a credential in a URL: userinfo, a malformed userinfo (a "/" in the password, no scheme), ";"
#: path parameters, a query string, a fragment.
URL_SHAPES = {
    "userinfo": f"http://u:{ONE_CANARY}@127.0.0.1:9/v1",
    "userinfo with a slash": f"http://u:pa/{ONE_CANARY}@127.0.0.1:9/v1",
    "malformed": f"u:pa/{ONE_CANARY}@127.0.0.1",
    "path parameter": f"http://127.0.0.1:9/v1;api_key={ONE_CANARY}",
    "query": f"http://127.0.0.1:9/v1?api_key={ONE_CANARY}",
    "fragment": f"http://127.0.0.1:9/v1#{ONE_CANARY}",
}
RUN = ["run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/fake", "--out", "{tmp}/run"]
QA = ["run", "--domain", "hotpotqa", "--tasks", "1", "--model", "openai/fake", "--api-base", "http://127.0.0.1:9/v1",
      "--out", "{tmp}/run"]
#: Every way the CLI takes a URL: {url} is the URL, {file} a file holding it.
URL_WAYS = {
    "run --api-base": [*RUN, "--api-base", "{url}"],
    "run --endpoints": [*RUN, "--endpoints", "{file}"],
    "run --user-api-base": [*RUN, "--api-base", "http://127.0.0.1:9/v1", "--user-model", "openai/u",
                            "--user-api-base", "{url}"],
    "run --es-url": [*QA, "--retrieval", "es", "--es-index", "x", "--es-url", "{url}"],
    "run -D es_url=": [*QA, "-D", "es_url={url}"],
    "continue --api-base": ["continue", "{tmp}/missing", "--out", "{tmp}/run", "--api-base", "{url}"],
    "continue --endpoints": ["continue", "{tmp}/missing", "--out", "{tmp}/run", "--endpoints", "{file}"],
    "judge --api-base": ["judge", "{tmp}/missing", "--judge-model", "openai/judge", "--out", "{tmp}/run",
                         "--api-base", "{url}"],
    "probe --api-base": ["probe", "{tmp}/missing", "--probe", "p_true", "--model", "openai/p", "--out", "{tmp}/run",
                         "--api-base", "{url}"],
    "index --es-url": ["index", "--domain", "hotpotqa", "--backend", "es", "--es-index", "x", "--es-url", "{url}"],
}


@pytest.mark.parametrize("way", URL_WAYS)
@pytest.mark.parametrize("shape", URL_SHAPES)
def test_a_key_in_a_url_is_refused_masked_and_nothing_written(way, shape, tmp_path, capsys, monkeypatch):
    """Every credential-bearing part of a URL, every way the CLI takes one: refused in one line that shows the URL
    masked, before anything is written."""
    monkeypatch.chdir(tmp_path)
    given = tmp_path / "given"
    given.mkdir()
    (given / "endpoints.txt").write_text(URL_SHAPES[shape] + "\n")
    subst = {"{tmp}": str(tmp_path), "{url}": URL_SHAPES[shape], "{file}": str(given / "endpoints.txt")}
    argv = []
    for a in URL_WAYS[way]:
        for k, v in subst.items():
            a = a.replace(k, v)
        argv.append(a)
    code = main(["-v", *argv])
    out, err = capsys.readouterr()
    if shape == "fragment" and "{file}" in URL_WAYS[way]:  # in an endpoints file "#" starts a comment: not a URL
        assert CANARY not in out + err  # part: the rest is a usable URL (the run goes on, to an unreachable server)
        assert _files_with_canary(tmp_path) == [str(given / "endpoints.txt")]
        return
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "***" in err and CANARY not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given"]


@pytest.mark.parametrize("url,masked", [
    ("http://u:pw12345678@h:1/v1", "http://***@h:1/v1"),
    ("http://h:1/v1?api_key=K1234567&x=2", "http://h:1/v1?api_key=***&x=***"),
    ("http://h:1/v1;api_key=K1234567", "http://h:1/v1;api_key=***"),
    ("http://h:1/v1;K1234567", "http://h:1/v1;***"),
    ("http://h:1/v1#K1234567", "http://h:1/v1#***"),
    ("http://u:pa/ss1234567@h:1/v1", "http://***@h:1/v1"),
    ("u:pa/ss1234567@h", "***@h"),
    ("http://h:1/v1", "http://h:1/v1"),
])
def test_urls_are_masked_by_shape(url, masked):
    assert secrets.mask_url(f"--api-base {url} --out r") == f"--api-base {masked} --out r"
    assert (secrets.url_credentials(url) is None) == (url == masked)


def test_a_canary_key_reaches_no_file_and_no_output(tmp_path):
    (tmp_path / ".env").write_text(f"OPENAI_API_KEY={DOTENV_KEY}\n")
    base_env = {k: v for k, v in os.environ.items() if "API_KEY" not in k}
    base_env["PYTHONPATH"] = str(REPO)
    with_env_key = {**base_env, "OPENAI_API_KEY": ENV_KEY}
    outputs: list[str] = []

    def uqh(env: dict, *argv: str) -> subprocess.CompletedProcess:
        done = _uqh(tmp_path, env, *argv)
        outputs.extend([done.stdout, done.stderr])
        return done

    with FakeOpenAIServer(solver, faults=["echo_key", "echo_key"], echo_padding=256) as agent_srv:
        # the agent run: the environment's key, echoed by the server in two error bodies (logged with -v) where
        # it straddles the 300-character cut of an error line
        done = uqh(with_env_key, "run", "--domain", "arithmetic", "--tasks", "2", "--model", "openai/fake",
                   "--api-base", agent_srv.base_url, "--out", "run", "--no-progress")
        assert done.returncode == 0, done.stderr
        assert agent_srv.faults_served == ["echo_key", "echo_key"]
        assert "rejected Bearer ***" in done.stderr  # the retry was logged, the key masked
    with FakeOpenAIServer(judge, faults=["echo_key"], echo_padding=256) as judge_srv:
        # the judge: no key in the environment, so the one in .env is sent (and echoed back)
        done = uqh(base_env, "judge", "run", "--judge-model", "openai/judge", "--api-base", judge_srv.base_url,
                   "--out", "judged", "--metrics", "PQ", "--no-progress")
        assert done.returncode == 0, done.stderr
        assert judge_srv.faults_served == ["echo_key"] and "rejected Bearer ***" in done.stderr
    done = uqh(with_env_key, "report", "run", "--out", "report")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "writer.lock").exists() and (tmp_path / "judged").is_dir()
    assert (tmp_path / "report").is_dir()
    assert _files_with_canary(tmp_path) == [str(tmp_path / ".env")]
    assert [o for o in outputs if CANARY in o] == []


def test_a_key_cut_through_by_the_length_limit_leaves_no_piece(monkeypatch):
    """Redact first, then cut: a key straddling the 300-character cut of an error line is masked whole."""
    monkeypatch.setenv("SOME_PROVIDER_API_KEY", ENV_KEY)
    line = error_line(RuntimeError("x" * 290 + ENV_KEY + " tail"))
    assert CANARY not in line and "***" in line


def test_dotenv_values_overridden_by_the_environment_are_still_redacted(monkeypatch):
    monkeypatch.setattr(secrets, "_registered", set())
    secrets.register_names({"OPENAI_API_KEY": DOTENV_KEY, "DATA_DIR": "/some/long/path/name"})
    assert secrets.redact(f"got {DOTENV_KEY} in /some/long/path/name") == "got *** in /some/long/path/name"


def test_the_lock_records_the_command_line_without_url_credentials(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["uqh", "run", "--api-base", f"http://h:1/v1?key={QUERY_KEY}",
                                      "--user-api-base", f"http://a:{USERINFO_PASSWORD}@h/v1"])
    assert CANARY not in lock._command_line()


def test_litellm_debug_goes_to_stderr_through_uqh_logging_not_to_stdout(capfd):
    """With -v, litellm's own handler printed ~1,300 DEBUG lines with whole prompts to stdout."""
    from uqh.cli import console_log
    from uqh.harness.model.client import make_model_client
    from uqh.rundir.schema import DecodingConfig

    console_log.configure(verbose=True)
    try:
        with FakeOpenAIServer() as srv:
            client = make_model_client("openai/fake", api_base=srv.base_url, decoding=DecodingConfig(), direct=False)
            asyncio.run(client.complete([{"role": "user", "content": "PROMPT-MARKER"}]))
    finally:
        console_log.configure(verbose=False)
    out, err = capfd.readouterr()
    assert out == ""
    assert "PROMPT-MARKER" not in err  # litellm's DEBUG stays off unless LITELLM_LOG asks for it
