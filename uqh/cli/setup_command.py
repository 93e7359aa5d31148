"""`uqh setup local`: build llama-server and fetch the GGUF of the default offline model into the user's cache."""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=["local"],
                   help="local: the files --model local:smollm2 needs -- llama.cpp's llama-server, built from the "
                        "llama.cpp source in the llama-cpp-python sdist (needs cmake, ninja and a C++ compiler; "
                        "pip install 'uqh[local]' brings cmake and ninja), and the SmolLM2 GGUF; into $UQH_CACHE_DIR "
                        "(default ~/.cache/uqh). Skips what is there; an interrupted setup resumes")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="parallel compile jobs (default: the usable cores)")


def _progress(line: str) -> None:
    print(f"uqh setup: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from uqh.harness.model.llama_build import setup_local
    from uqh.harness.model.local_files import LOCAL_MODELS
    from uqh.rundir.errors import UserError

    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    model = next(iter(LOCAL_MODELS))
    result = setup_local(model, progress=_progress, jobs=args.jobs)
    state = f"set up now: {', '.join(result.done)}" if result.done else "already set up, nothing to do"
    print(f"{model} is ready ({state})")
    print(f"  model file   {result.gguf} ({result.gguf.stat().st_size / 1e6:.1f} MB)")
    print(f"  llama-server {result.server}")
    return 0
