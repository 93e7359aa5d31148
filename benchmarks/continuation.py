"""Continuation-branch throughput with and without prompt (prefix KV) caching on the local llama.cpp model.

    .venv/bin/python benchmarks/continuation.py [--branches 4] [--prefix-steps 6] [--max-tokens 8]
        [--no-ram-cache-run] [--out benchmarks/results/continuation.md]

A continuation branch's first call sends the whole recorded prefix conversation (rebuilt from the record by
``uqh.harness.episode.loop.build_messages``; no model call is made *for* the prefix). All M branches of a prefix send the
same prompt, so a server that caches prompts evaluates the prefix once. llama-server keeps the KV state of each
slot's last request and reuses the longest common token prefix (``cache_prompt``); with 2 slots it routes a
request to the idle slot whose cache is most similar (issue #28: before, llama-cpp-python's ``--cache true`` RAM
cache played that part). Measured here, in one process, on two prefixes
(A, B) of ``--prefix-steps`` recorded steps with ~400-character observations, ``--branches`` first-step calls
per prefix (distinct branch seeds, ``--max-tokens`` tokens with top-5 logprobs):

- ``interleaved`` (baseline): A, B, A, B, ... -- consecutive calls share only the system prompt, so the prefix is
  re-evaluated every call (no caching);
- ``grouped``: A, A, ..., B, B, ... -- how ``uqh continue`` queues branches; all but the first call of each
  prefix reuse the cached prefix;
- ``interleaved + 2 slots``: the interleaved order against a server with ``--parallel 2``.

Reported: seconds, branch calls per second, and the speed-up over the baseline. Timing depends on the machine's
load (2 shared cores here); numbers are measured, never asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import uqh  # noqa: E402,F401 - sets the litellm env before litellm is imported
from uqh.prompts import PROMPTS_DIR  # noqa: E402
from uqh.rundir.schema import Attempt, CallRecord, DecodingConfig, Step  # noqa: E402

FILLER = (
    "The calculator log shows intermediate values computed so far, with carried digits and partial sums "
    "listed in order. Each line repeats the operands, the operator and the result, so that the agent can "
    "check its previous arithmetic before it commits to a final answer. "
)


def make_prefix(task: str, z: int) -> tuple[str, list[Step]]:
    steps = []
    for t in range(1, z + 1):
        raw = (
            f"<think>Step {t} for {task}: compute the next partial result carefully.</think>\n"
            f"<action>Calc[{t} * 17 + {t}]</action>\n<confidence>0.{40 + t}</confidence>\n"
            f"<explanation>Partial progress on {task}.</explanation>"
        )
        obs = (f"Result: {t * 18}. " + FILLER * 3)[:400]
        steps.append(
            Step(t=t, think="", action=f"Calc[{t} * 17 + {t}]", verbal_confidence=0.4, explanation="e",
                 observation=obs, attempts=[Attempt(attempt=0, raw_text=raw, call=CallRecord(model="m"))])
        )
    return f"Question: What is the value for {task}?", steps


async def timed_calls(client, prompts: list[tuple[list[dict], int]]) -> tuple[float, int]:
    t0 = time.perf_counter()
    prompt_tokens = 0
    for i, (messages, seed) in enumerate(prompts):
        t1 = time.perf_counter()
        c = await client.complete(messages, seed=seed)
        prompt_tokens += c.call.usage.prompt_tokens or 0
        print(f"  call {i + 1}/{len(prompts)}: {time.perf_counter() - t1:.1f} s, "
              f"{c.call.usage.prompt_tokens} prompt tokens", file=sys.stderr, flush=True)
    return time.perf_counter() - t0, prompt_tokens


def run_mode(server_cache: bool, orders: dict[str, list[str]], messages: dict[str, list[dict]], branches: int,
             max_tokens: int) -> dict[str, tuple[float, int, int]]:
    from uqh.harness.continuation import branch_seed
    from uqh.harness.model.llama_server import LOCAL_MODELS, LocalModelServer, find_gguf
    from uqh.harness.model.client import make_model_client

    spec = LOCAL_MODELS["local:smollm2"]
    # llama-server keeps each slot's last prompt; with 2 slots it sends A and B to the slot that cached each
    srv = LocalModelServer(find_gguf("local:smollm2"), alias=spec.alias, parallel=2 if server_cache else 1)
    srv.start()
    results = {}
    try:
        t0 = time.perf_counter()
        srv.wait_ready()
        print(f"server ready after {time.perf_counter() - t0:.0f} s (2 slots: {server_cache})", file=sys.stderr,
              flush=True)
        decoding = DecodingConfig(max_tokens=max_tokens, temperature=0.2, logprobs=True, top_logprobs=5)

        async def main():
            client = make_model_client(srv.litellm_model, api_base=srv.base_url, decoding=decoding)
            try:
                # warm-up on an unrelated short prompt (loads weights, leaves no useful prefix in the KV state)
                await client.complete([{"role": "user", "content": "Say hi."}], seed=1)
                for name, order in orders.items():
                    print(name, file=sys.stderr, flush=True)
                    counters = {k: 0 for k in messages}
                    prompts = []
                    for key in order:
                        prompts.append((messages[key], branch_seed(42, key, counters[key])))
                        counters[key] += 1
                    secs, ptoks = await timed_calls(client, prompts)
                    results[name] = (secs, len(prompts), ptoks)
                    await client.complete([{"role": "user", "content": "Say hi."}], seed=2)  # reset KV state
            finally:
                await client.aclose()

        asyncio.run(main())
    finally:
        srv.stop()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--branches", type=int, default=4)
    ap.add_argument("--prefix-steps", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--no-ram-cache-run", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "continuation.md"))
    args = ap.parse_args()

    from uqh.harness.episode.loop import build_messages

    system = (PROMPTS_DIR / "arithmetic.txt").read_text()
    messages = {}
    for key in ("arith-A#0", "arith-B#0"):
        task_prompt, steps = make_prefix(key, args.prefix_steps)
        messages[key] = build_messages(system, task_prompt, steps)
    m = args.branches
    orders = {
        "interleaved (no caching, baseline)": ["arith-A#0", "arith-B#0"] * m,
        "grouped (prefix KV reuse)": ["arith-A#0"] * m + ["arith-B#0"] * m,
    }
    t0 = time.perf_counter()
    res = run_mode(False, orders, messages, m, args.max_tokens)
    if not args.no_ram_cache_run:
        ram = run_mode(True, {"interleaved + 2 server slots (--parallel 2)": orders["interleaved (no caching, baseline)"]},
                       messages, m, args.max_tokens)
        res.update(ram)
    total = time.perf_counter() - t0
    base_secs, base_n, _ = res["interleaved (no caching, baseline)"]
    base_rate = base_n / base_secs
    lines = [
        "# Continuation branch throughput: prompt caching on the local llama.cpp model",
        "",
        f"`benchmarks/continuation.py --branches {m} --prefix-steps {args.prefix_steps} --max-tokens {args.max_tokens}`"
        f" on {platform.machine()} / Python {platform.python_version()}, SmolLM2-135M-Instruct Q4_1 via "
        f"llama-server (native, 1 thread), top-5 logprobs; 2 prefixes x {m} branch first-step calls per mode; "
        f"wall time {total:.0f} s; load average at the end {os.getloadavg()[0]:.1f} (shared machine). Prompt tokens per call ~{res['grouped (prefix KV reuse)'][2] // (2 * m)}.",
        "",
        "| mode | calls | seconds | branch calls/s | speed-up vs baseline |",
        "|---|---|---|---|---|",
    ]
    for name, (secs, n, _) in res.items():
        rate = n / secs
        lines.append(f"| {name} | {n} | {secs:.1f} | {rate:.2f} | {rate / base_rate:.2f}x |")
    lines += [
        "",
        "No call is ever made to regenerate the prefix itself: a naive re-rollout of a Z-step prefix would cost "
        "Z + K calls per branch instead of K (here Z = "
        f"{args.prefix_steps}, so {args.prefix_steps + 1}x the calls for K = 1).",
        "`uqh continue` queues the branches of one prefix back to back, which is the `grouped` order; with "
        "concurrency > 1, llama-server's slots (one per `--concurrency`) each keep their last prompt and a request "
        "goes to the idle slot whose cache shares the longest prefix, which keeps the benefit when requests of "
        "different prefixes interleave (the `2 server slots` row).",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
