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
