"""What must never reach a file or a log: API keys and URL credentials, and the one place that masks them.

A key can arrive five ways: the environment, a ``.env`` file, a URL's ``user:password@``, a URL's query string
(``?api_key=...``), and an error body that echoes what it was sent. The first two are known by value
(:func:`known_secrets`: every environment variable whose name says it is a secret, plus the values
:func:`register` was given -- the CLI registers a ``.env`` file's secret-named values, which the environment
may have overridden); the URL parts are masked by shape (:func:`mask_url`). Every text that leaves the process
about a model call goes through :func:`redact` *before* it is cut to length, so that no part of a key survives a
cut through its middle.

It lives in ``rundir`` because it is part of the run directory's contract (nothing secret in it) and every
package that writes or prints needs it.
"""
from __future__ import annotations

import os
import re
import urllib.parse
from typing import Iterable, Mapping

#: Environment variable names whose values are secrets (``OPENAI_API_KEY``, ``HF_TOKEN``, ``DB_PASSWORD`` ...).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
#: Shorter values are not redacted: replacing "1" or "true" everywhere would garble text and hide nothing.
MIN_SECRET_CHARS = 8
#: Placeholders the clients send when a server needs no key: not secrets.
PLACEHOLDERS = frozenset({"sk-no-key", "EMPTY", "dummy"})
MASK = "***"

_registered: set[str] = set()

_USERINFO = re.compile(r"(?<=//)[^/@\s]+@")
_QUERY_VALUE = re.compile(r"(?<=[?&;])([^=&;#\s]+)=([^&;#\s]*)")


def _usable(value: str | None) -> bool:
    return bool(value) and len(value) >= MIN_SECRET_CHARS and value not in PLACEHOLDERS


def register(value: str | None) -> None:
    """Remember ``value`` as a secret for this process (a ``.env`` value, a key passed in code)."""
    if _usable(value):
        _registered.add(value)


def register_names(values: Mapping[str, str | None]) -> None:
    """Register the values of ``values`` (e.g. a parsed ``.env`` file) whose names say they are secrets."""
    for name, value in values.items():
        if SECRET_NAME.search(name):
            register(value)


def known_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret known now, longest first (so that a key containing another is masked whole)."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if SECRET_NAME.search(k) and _usable(v)} | _registered
    return sorted(found, key=len, reverse=True)


def mask_url(text: str) -> str:
    """``text`` with every URL's ``user:password@`` and every query-string value replaced by ``***``."""
    text = _USERINFO.sub(f"{MASK}@", text)
    if "?" in text:
        text = _QUERY_VALUE.sub(lambda m: f"{m.group(1)}={MASK}", text)
    return text


def redact(text: str, extra: Iterable[str | None] = ()) -> str:
    """``text`` without any known secret (nor ``extra`` ones) and with URL credentials masked. Call it before
    cutting a text to length."""
    for secret in sorted({s for s in extra if _usable(s)} | set(known_secrets()), key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return mask_url(text)


def url_credentials(url: str) -> str | None:
    """What in ``url`` would be a credential written to a file -- ``"user:password@"`` or ``"a query string"``
    -- or None when it carries none."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return None
    if "@" in parts.netloc or (not parts.netloc and "@" in url):
        return "credentials (user:password@)"
    if parts.query or parts.fragment:
        return "a query string or fragment (?... / #...), where keys are passed"
    return None
