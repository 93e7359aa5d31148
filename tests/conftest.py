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


# The slowest files (longest first, measured with --durations on 2 cores) are handed out first: under
# `pytest -n auto --dist loadfile` a worker then never ends the run alone with one of them (longest-processing-time
# first). The order changes nothing else: files stay whole and tests do not depend on order.
SLOWEST_FILES = (
    "test_ray_backend.py", "test_readme_first_run.py", "test_cli_run.py", "test_report.py",
    "test_continuation_smoke.py", "test_packaging.py", "test_observation_surprise.py", "test_import_tau2.py",
    "test_tau2_user_logprobs.py", "test_tau2.py", "test_report_html.py", "test_signals.py", "test_cli_errors.py",
    "test_tau2_run.py", "test_presets.py", "test_secrets.py", "test_fault_campaign.py", "test_view.py",
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one and a half workers per core, not one. About a third of the suite's wall time is waiting
    (fake-server latency, signals and kill -9 round trips, Ray start-up), which a spare worker fills. Measured on
    2 cores, the whole suite: 2 workers 421-450 s, 3 workers 313-383 s, 4 workers 350 s (docs/model-client.md)."""
    return max(1, len(os.sched_getaffinity(0)) * 3 // 2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FILES)))  # stable: in-file order kept
