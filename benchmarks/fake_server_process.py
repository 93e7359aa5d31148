"""A fake OpenAI-compatible server in another process, for benchmarks (its CPU is not the measured process's).

``argv`` is the server's command line; it must print ``READY <base_url>`` once it listens (as
``tests/fake_openai_server.py --port 0`` does). ``take_answered()`` returns the times the server answered
completions since the last call (``GET /_answered``), so rates are measured by the server's clock.

Run as a script, it is the fault server of ``benchmarks/fault_campaign.py``: the scripted arithmetic agent and
GPA judge of ``tests/judge_fixtures.py`` (so every answer is a deterministic function of the request), with a
fault of ``tests/fake_openai_server.py`` (chosen at random from ``--faults``) served instead of the answer at
``--fault-rate`` of the chat requests, drawn from ``--seed``::

    python benchmarks/fake_server_process.py --port 0 --faults 500,reset --fault-rate 0.2   # prints READY URL

``GET /_stats`` gives ``{"requests": N, "faults": {fault: count}}`` (what the server saw, by its own count).
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path


class FakeServerProcess:
    def __init__(self, argv: list[str]):
        self.argv = list(argv)
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> "FakeServerProcess":
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"fake server did not start: {line!r}")
        self.base_url = line.split(" ", 1)[1]
        return self

    def take_answered(self) -> list[float]:
        """The times the server answered completions since the last call (it forgets them)."""
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/_answered", timeout=30) as r:
            return json.loads(r.read())["answered_at"]

    def stats(self) -> dict:
        """``GET /_stats`` of a server started as this script: requests seen and faults served."""
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/_stats", timeout=30) as r:
            return json.loads(r.read())

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)


def serve_forever(responder, latency_s: float) -> int:
    """The server side of a benchmark's ``--serve`` mode: answer with ``responder`` after ``latency_s`` until
    interrupted, having printed ``READY <base_url>``."""
    from fake_openai_server import FakeOpenAIServer

    srv = FakeOpenAIServer(responder, latency_s=latency_s, record_requests=False).start()
    print(f"READY {srv.base_url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


class RandomFaults(list):
    """Stands in for the server's fault queue: never empty, each ``pop`` a fault from ``kinds`` with probability
    ``rate`` (else None: normal service), from a seeded generator."""

    def __init__(self, kinds: list[str], rate: float, seed: int):
        super().__init__()
        self.kinds, self.rate, self.rng = list(kinds), rate, random.Random(seed)

    def __len__(self) -> int:
        return 1

    def pop(self, index: int = -1) -> str | None:  # noqa: ARG002 - the server pops the head
        return self.rng.choice(self.kinds) if self.kinds and self.rng.random() < self.rate else None


class RandomLength:
    """An int drawn anew each time it is used as one (the server multiplies a string by its echo padding)."""

    def __init__(self, low: int, high: int, seed: int):
        self.low, self.high, self.rng = low, high, random.Random(seed)

    def __index__(self) -> int:
        return self.rng.randint(self.low, self.high)


def agent_or_judge(body: dict) -> str:
    """The GPA judge for judge requests (their system prompt names the judge), else the arithmetic agent."""
    from judge_fixtures import agent, judge

    system = str((body.get("messages") or [{}])[0].get("content", ""))
    return judge(body) if "judge" in system else agent(body)


def serve_with_faults(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root), str(root / "tests")]
    import asyncio
    import socket

    from aiohttp import web
    from fake_openai_server import FAULTS, FakeOpenAIServer

    p = argparse.ArgumentParser(description="the fault server of benchmarks/fault_campaign.py")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    p.add_argument("--faults", default="", help=f"comma-separated faults to play, of: {', '.join(FAULTS)}")
    p.add_argument("--fault-rate", type=float, default=0.0, help="fraction of chat requests given a fault")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault draws")
    p.add_argument("--timeout-sleep", type=float, default=3.0, help="seconds the 'timeout' fault waits")
    p.add_argument("--echo-padding", type=int, default=None,
                   help="characters before the key an 'echo_key' fault echoes (default: 0-300 at random, so the key "
                        "lies wholly inside a 300-character cut, or across it)")
    args = p.parse_args(argv)
    kinds = [f for f in args.faults.split(",") if f]
    unknown = [f for f in kinds if f not in FAULTS]
    if unknown:
        print(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    srv = FakeOpenAIServer(agent_or_judge, latency_s=args.latency, record_requests=False,
                           timeout_sleep_s=args.timeout_sleep)
    srv.faults = RandomFaults(kinds, args.fault_rate, args.seed)
    srv.echo_padding = args.echo_padding if args.echo_padding is not None else RandomLength(0, 300, args.seed)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"requests": srv.n_requests, "faults": Counter(srv.faults_served)})

    async def serve() -> None:
        app = srv.make_app()
        app.router.add_get("/_stats", stats)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", args.port))
        sock.listen(4096)
        await web.SockSite(runner, sock).start()
        print(f"READY http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(serve_with_faults())
