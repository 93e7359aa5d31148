"""A fake OpenAI-compatible server in another process, for benchmarks (its CPU is not the measured process's).

``argv`` is the server's command line; it must print ``READY <base_url>`` once it listens (as
``tests/fake_openai_server.py --port 0`` does). ``take_answered()`` returns the times the server answered
completions since the last call (``GET /_answered``), so rates are measured by the server's clock.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request


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
