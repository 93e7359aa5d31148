"""A stop signal reaching a worker process at any moment of its life stops it quietly: it never raises inside an
asyncio task (a worker printed a ~40-line ``Interrupted: SIGTERM`` traceback before the parent's one line when the
parent's SIGTERM landed while its client was being built), and the episodes, started after it, are cancelled at
once (issue 42)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import asyncio, os, signal, time
    from uqh.harness import interrupts
    from uqh.harness.backends.event_loop import run_cancellable
    from uqh.harness.backends.workers import worker_stop_signals

    async def episodes():
        await asyncio.sleep(60)

    async def main():
        os.kill(os.getpid(), signal.SIGTERM)  # while the client is built: no event-loop stop callback yet
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        await run_cancellable(episodes())  # cancelled at once: the signal came first
        return time.monotonic() - t0

    with worker_stop_signals():
        os.kill(os.getpid(), signal.SIGTERM)  # and before the event loop: recorded, not raised
        waited = asyncio.run(main())
    print("stopped by", interrupts.signal_name(interrupts.requested()), "episodes cancelled", waited < 30)
""")


def test_a_stop_signal_before_or_between_the_loops_callbacks_never_raises_in_a_worker():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stderr == "" and done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped by SIGTERM episodes cancelled True"
