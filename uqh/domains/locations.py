"""Where the domains keep caches (built indexes, frozen goal lists): ``$UQH_CACHE_DIR``, else ``.cache/uqh`` of
a source checkout, else the user's cache directory (``$XDG_CACHE_HOME/uqh`` or ``~/.cache/uqh``) -- never inside an
installed package."""
from __future__ import annotations

import os
from pathlib import Path

#: The directory holding the ``uqh`` package: a source checkout's root when it has the project's pyproject.toml.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def is_source_checkout() -> bool:
    return (SOURCE_ROOT / "pyproject.toml").is_file()


def cache_root() -> Path:
    env = os.environ.get("UQH_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if is_source_checkout():
        return SOURCE_ROOT / ".cache" / "uqh"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uqh"
