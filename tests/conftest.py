"""Shared pytest fixtures.

``fake_server`` is a factory for :class:`FakeOpenAIServer` (see tests/fake_openai_server.py)::

    def test_x(fake_server):
        with fake_server(lambda req: "<think>..</think>...", faults=["429"]) as srv:
            ... srv.base_url, srv.requests ...

Servers created through the factory are stopped at teardown even if a test forgets to.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
# Subprocesses started by tests (`python -m uqh.cli ...` in a temporary cwd) import this checkout's packages,
# not whatever an editable install points at.
_REPO = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, os.environ.get("PYTHONPATH")) if p)

from fake_openai_server import FakeOpenAIServer  # noqa: E402


@pytest.fixture
def fake_server():
    """Factory with the signature of ``FakeOpenAIServer(responder=None, *, latency_s, faults, logprobs, ...)``."""
    created: list[FakeOpenAIServer] = []

    def factory(*args, **kwargs) -> FakeOpenAIServer:
        srv = FakeOpenAIServer(*args, **kwargs)
        created.append(srv)
        return srv

    yield factory
    for srv in created:
        srv.stop()
