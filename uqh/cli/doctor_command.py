"""`uqh doctor`: what this installation has, and whether the offline first job can run (exit 0) or not (exit 1,
with what is missing and the fix on stderr)."""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-speed", action="store_true",
                   help="skip the tokens/s line (it starts llama-server and generates a few dozen tokens)")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def render(d) -> list[str]:
    """The report's lines (a :class:`uqh.harness.doctor.Diagnosis`); API keys by name only."""
    lines = [f"local model ({d.model})",
             f"  model file    {d.gguf.path} ({d.gguf.detail})" if d.gguf.path else f"  model file    missing: {d.gguf.detail}",
             f"  llama-server  {d.server.path} ({d.server.detail})" if d.server.path
             else f"  llama-server  missing: {d.server.detail}"]
    if d.speed is None:
        lines.append("  speed         not measured")
    elif isinstance(d.speed, str):
        lines.append(f"  speed         failed: {d.speed}")
    else:
        lines.append(f"  speed         {d.speed.tokens_per_s:.1f} tokens/s ({d.speed.tokens} tokens generated, "
                     f"{d.speed.threads} thread{'s' if d.speed.threads > 1 else ''})")
    total = sum(size for _, size in d.data)
    lines.append(f"packaged data ({len(d.data)} files, {_size(total)})" if d.data else "packaged data")
    lines += [f"  {path}  {_size(size)}" for path, size in d.data] or ["  none packaged"]
    lines.append("extras")
    for extra in d.extras:
        state = ("installed" if extra.installed else f"missing {', '.join(extra.missing)}: {extra.pip_command}"
                 ) if extra.installed is not None else "not declared by this uqh"
        lines.append(f"  {extra.name:<6} {state}")
    lines.append("API keys (names only)")
    lines += [f"  {name:<20} {'set' if is_set else 'not set'}" for name, is_set in d.keys]
    return lines


def run(args: argparse.Namespace) -> int:
    from uqh.harness.doctor import diagnose

    diagnosis = diagnose(speed=not args.no_speed)
    print("\n".join(render(diagnosis)), flush=True)
    if diagnosis.ready:
        print(f"uqh doctor: ready: uqh run --model {diagnosis.model} runs offline on the packaged data")
        return 0
    print(f"uqh doctor: not ready for the offline first job: {'; '.join(diagnosis.problems)}", file=sys.stderr)
    return 1
