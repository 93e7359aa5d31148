"""Start `uqh view`'s server in a thread of the test process (port 0: a free one) and stop it afterwards."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Iterator

from uqh.reports.view.server import ViewServer


@contextlib.contextmanager
def serving(*paths: Path, follow: str = "auto") -> Iterator[ViewServer]:
    server = ViewServer(list(paths), port=0, follow=follow)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    if not server.ready.wait(30):
        raise RuntimeError("the viewer did not start within 30 s")
    try:
        yield server
    finally:
        server.stop()
        thread.join(10)
