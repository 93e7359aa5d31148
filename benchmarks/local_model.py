"""The embedded local model (``local:smollm2``): uqh's throughput against raw llama.cpp and the old path.

    .venv/bin/python benchmarks/local_model.py [--tasks 20] [--readme-tasks 3]
        [--rows readme,readme-1s,readme-2t,many,raw,raw-nogrammar,raw-other,old] [--other-server PATH]
        [--prompts PROMPTS.json] [--merge EARLIER.json] [--out benchmarks/results/local_model.md]

In one run, on the same HotpotQA tasks (first-step prompts of the first ``--tasks`` tasks):

- ``raw llama-server``: the native servers as uqh starts them for ``--concurrency 4`` (one single-threaded
  process per core, the 4 slots split between them) with no harness: each task's first-step prompt sent straight
  over HTTP, 4 in flight, spread evenly, with the request body uqh sends (top-5 logprobs, the four-tag grammar,
  the run's temperature and max_tokens). Its completion tokens/s are the limit;
- ``raw llama-server, no grammar``: the same requests without the grammar (the grammar's cost on this path);
- ``raw other llama-server``: the same requests (with the grammar) to the binary ``--other-server`` names (e.g. one
  built from another llama.cpp), same flags, same thread count -- two builds compared on the same prompts;
- ``uqh README job``: ``uqh run --domain hotpotqa --model local:smollm2 --tasks 3`` (the README's first run, its
  default concurrency), as a user gets it (one single-threaded server process per core); ``readme-1s`` with one
  server process (``UQH_LLAMA_SERVERS=1``: what uqh did before); ``readme-2t`` with one server of 2 threads
  (``UQH_LLAMA_THREADS=2``: OpenMP's own wait policy); the harness sharing the cores;
- ``uqh 20 tasks -c 4``: ``uqh run --domain hotpotqa --tasks 20 --concurrency 4``;
- ``old path``: the README job on llama-cpp-python's Python server (``--logits_all true``, one request at a
  time, one process; uqh's concurrency 2 as before), the same harness otherwise. Needs ``llama_cpp`` importable
  (setup.sh no longer installs it; the row is skipped without it).

Each row: wall time (server start included), model calls, completion tokens, calls/s and completion tokens/s;
ratios against the old path and against raw llama.cpp. Measured, not asserted: the machine's load moves the
absolute numbers, the ratios within one run are what to compare. ``--rows``/``--merge`` measure rows in separate
runs and put them in one table (the results file then says so: such ratios compare different loads).
The raw rows need the ``many`` run's first-step prompts: they are written to ``--prompts`` when ``many`` runs, and
read from it when it does not.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DRIVER = """
import os, sys
from uqh.harness.model import llama_server
old = sys.argv[1] == "old"
if old:  # llama-cpp-python's Python server, as uqh ran it before the native server
    def old_command(self):
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf), "--model_alias", self.alias,
                "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx), "--logits_all", "true",
                "--seed", str(self.seed), "--verbose", "false"]
    llama_server.LocalModelServer.command = old_command
    llama_server.LocalModelServer.environment = lambda self: dict(os.environ)
from uqh.cli import main
sys.exit(main(sys.argv[2:]))
"""


@dataclass
class Row:
    label: str
    wall_s: float
    calls: int
    completion_tokens: int
    prompt_tokens: int
    scored_note: str = ""

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s


def run_uqh(label: str, out_dir: Path, tasks: int, *, old: bool = False, concurrency: int | None = None,
            env: dict[str, str] | None = None) -> Row:
    """One ``uqh run`` in a child process (the servers are its children, as for a user), with ``env`` added to
    its environment; tokens from the run dir."""
    from uqh.rundir import RunDir

    argv = ["run", "--domain", "hotpotqa", "--model", "local:smollm2", "--tasks", str(tasks), "--out", str(out_dir),
            "--no-progress"]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", DRIVER, "old" if old else "new", *argv], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{label}: uqh run failed ({done.returncode}): {done.stderr[-2000:]}")
    episodes = RunDir.open(out_dir).episodes()
    calls = [a.call for e in episodes for s in e.steps for a in s.attempts]
    calls += [a.call for e in episodes for a in (e.failed_step or [])]
    stops = {}
    for e in episodes:
        stops[e.stop_reason] = stops.get(e.stop_reason, 0) + 1
    row = Row(label, wall, len(calls), sum(c.usage.completion_tokens or 0 for c in calls),
              sum(c.usage.prompt_tokens or 0 for c in calls),
              scored_note=", ".join(f"{k}={v}" for k, v in sorted(stops.items())))
    print(f"{label}: {wall:.1f} s, {row.calls} calls, {row.completion_tokens} completion tokens "
          f"({row.tokens_per_s:.1f}/s); {row.scored_note}", file=sys.stderr, flush=True)
    return row


def first_step_prompts(run_dir: Path) -> tuple[list[list[dict]], dict]:
    """The first-step messages of every episode of ``run_dir`` and the run's decoding settings."""
    from uqh.rundir import RunDir

    rd = RunDir.open(run_dir)
    manifest = rd.manifest
    prompts = [[{"role": "system", "content": manifest.system_prompt}, {"role": "user", "content": e.task_prompt}]
               for e in rd.episodes()]
    return prompts, manifest.config.decoding.model_dump()


def run_raw(prompts: list[list[dict]], decoding: dict, *, parallel: int, grammar: bool = True,
            binary: Path | None = None, label: str | None = None) -> Row:
    """The prompts straight to the llama-server processes uqh would start for ``parallel`` concurrent requests,
    ``parallel`` in flight, prompt i to process i mod n, the request body uqh sends (``grammar``: with the
    four-tag grammar; ``binary``: that llama-server instead of the one uqh finds)."""
    from uqh.harness.model import llama_server
    from uqh.harness.model.transports import grammar_text

    n = llama_server.server_count(parallel)
    servers = [llama_server.LocalModelServer(llama_server.find_gguf("local:smollm2"), parallel=-(-parallel // n), binary=binary)
               for _ in range(n)]
    grammar_body = {"grammar": grammar_text()} if grammar else {}

    def call(i_messages: tuple[int, list[dict]]) -> tuple[int, int]:
        i, messages = i_messages
        server = servers[i % n]
        body = {"model": server.alias, "messages": messages, "temperature": decoding["temperature"],
                "top_p": decoding["top_p"], "max_tokens": decoding["max_tokens"], "seed": decoding["seed"] + i,
                "logprobs": True, "top_logprobs": decoding["top_logprobs"], **grammar_body}
        req = urllib.request.Request(server.base_url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            usage = json.loads(r.read())["usage"]
        return usage["completion_tokens"], usage["prompt_tokens"]

    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(server)
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            got = list(pool.map(call, enumerate(prompts)))
    wall = time.perf_counter() - t0
    row = Row(label or f"raw llama-server ({n} x 1 thread), {parallel} in flight", wall, len(got), sum(c for c, _ in got), sum(p for _, p in got))
    print(f"{row.label}: {wall:.1f} s, {row.completion_tokens} completion tokens ({row.tokens_per_s:.1f}/s)",
          file=sys.stderr, flush=True)
    return row


def render(rows: dict[str, Row], args: argparse.Namespace, load: tuple[float, float, float]) -> str:
    old, raw = rows.get("old"), rows.get("raw")
    lines = [
        "# The embedded local model: uqh vs raw llama.cpp vs the old path",
        "",
        f"`benchmarks/local_model.py` on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; load average before the run {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}. "
        "SmolLM2-135M-Instruct Q4_1, HotpotQA, top-5 logprobs, the four-tag grammar. Wall time includes the server "
        "start.",
        "",
        "| row | wall s | calls | completion tokens | calls/s | completion tok/s | vs old path (wall) | "
        "tok/s vs raw | stop reasons |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for key, row in rows.items():
        speedup = f"{old.wall_s / row.wall_s:.1f}x faster" if old and key.startswith("readme") else ""
        vs_raw = f"{row.tokens_per_s / raw.tokens_per_s:.0%}" if raw else ""
        lines.append(
            f"| {row.label} | {row.wall_s:.1f} | {row.calls} | {row.completion_tokens} | {row.calls_per_s:.2f} | "
            f"{row.tokens_per_s:.1f} | {speedup} | {vs_raw} | {row.scored_note} |"
        )
    return "\n".join(lines) + "\n"


ROWS = ("readme", "readme-1s", "readme-2t", "many", "raw", "raw-nogrammar", "raw-other", "old")


def measure(key: str, args: argparse.Namespace, tmp: Path) -> Row | None:
    """One row of the table (``raw`` needs the ``many`` run's directory for its prompts)."""
    from uqh.harness.model import llama_server

    n = args.readme_tasks
    if key == "readme":
        return run_uqh(f"uqh README job ({n} tasks), {llama_server.server_count(4)} servers x 1 thread", tmp / "readme", n)
    if key == "readme-1s":
        return run_uqh(f"uqh README job ({n} tasks), 1 server x 1 thread", tmp / "readme1s", n,
                       env={llama_server.LLAMA_SERVERS_ENV: "1"})
    if key == "readme-2t":
        return run_uqh(f"uqh README job ({n} tasks), 1 server x 2 threads", tmp / "readme2", n,
                       env={llama_server.LLAMA_THREADS_ENV: "2"})
    if key == "many":
        return run_uqh(f"uqh {args.tasks} tasks, --concurrency 4", tmp / "many", args.tasks, concurrency=4)
    if key.startswith("raw"):
        if (tmp / "many").exists():
            prompts, decoding = first_step_prompts(tmp / "many")
            args.prompts.write_text(json.dumps({"prompts": prompts, "decoding": decoding}))
        else:
            saved = json.loads(args.prompts.read_text())
            prompts, decoding = saved["prompts"], saved["decoding"]
        if key == "raw":
            return run_raw(prompts, decoding, parallel=4)
        if key == "raw-nogrammar":
            return run_raw(prompts, decoding, parallel=4, grammar=False,
                           label="raw llama-server, 4 in flight, no grammar")
        return run_raw(prompts, decoding, parallel=4, binary=args.other_server,
                       label="raw other llama-server (--other-server), 4 in flight")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("old path skipped: llama_cpp (llama-cpp-python) is not installed", file=sys.stderr)
        return None
    return run_uqh(f"old path: README job ({n} tasks) on llama-cpp-python's server", tmp / "old", n, old=True,
                   concurrency=2, env={llama_server.LLAMA_SERVERS_ENV: "1"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--readme-tasks", type=int, default=3)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    parser.add_argument("--other-server", type=Path, help="the llama-server binary of the raw-other row")
    parser.add_argument("--prompts", type=Path, default=Path(tempfile.gettempdir()) / "uqh-bench-local-prompts.json",
                        help="the many run's first-step prompts: written when many runs, read by raw rows otherwise")
    parser.add_argument("--merge", type=Path, help="rows measured earlier (the JSON this script writes) to add")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "local_model.md")
    args = parser.parse_args()
    keys = [k for k in args.rows.split(",") if k]
    if any(k not in ROWS for k in keys):
        parser.error(f"--rows: a subset of {','.join(ROWS)}")
    if any(k.startswith("raw") for k in keys) and "many" not in keys and not args.prompts.is_file():
        parser.error("--rows: the raw rows need many's prompts: add many, or --prompts a file an earlier run wrote")
    if "raw-other" in keys and not (args.other_server and os.access(args.other_server, os.X_OK)):
        parser.error("--rows raw-other needs --other-server, an executable llama-server")
    load = os.getloadavg()
    rows: dict[str, Row] = {}
    if args.merge:
        rows.update({k: Row(**v) for k, v in json.loads(args.merge.read_text()).items()})
    with tempfile.TemporaryDirectory(prefix="uqh-bench-local-") as tmp:
        for key in keys:
            row = measure(key, args, Path(tmp))
            if row is not None:
                rows[key] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({k: vars(r) for k, r in rows.items()}, indent=1) + "\n")
    text = render(rows, args, load)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
