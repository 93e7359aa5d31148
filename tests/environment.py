"""What a test needs from the machine (a browser, a tmpfs mount, root's file permissions).

Where it is missing the test is skipped on a developer's machine, but fails under CI (``CI`` set): CI's setup
installs or provides all of it, so a skip there would hide a test that never ran.
"""
from __future__ import annotations

import os

import pytest


def unavailable(reason: str, *, allow_module_level: bool = False) -> None:
    """Skip (or, under CI, fail) the calling test because the machine lacks what it needs."""
    if os.environ.get("CI"):
        pytest.fail(f"CI lacks what this test needs: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


def slowdown() -> float:
    """How much slower than a quiet machine this one runs now: the 1-minute load average per usable core, at
    least 1. A wall-clock bound in a test (how soon a stop must take effect) is multiplied by it, so that a CI or
    laptop machine at load 10-15 on 2 cores does not fail a bound that a quiet one meets; a run that ignored the
    stop would still overrun it many times over."""
    return max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)))


def scaled(seconds: float) -> float:
    """``seconds`` on a quiet machine, as a bound on this one now (see :func:`slowdown`)."""
    return seconds * slowdown()
