"""What must never reach a file or a log: API keys and URL credentials, and the one place that masks them.

A key can arrive these ways: the environment, a ``.env`` file, a URL's ``user:password@`` (also a malformed one
without a scheme, ``u:pa/ss@host``), its ``;`` path parameters, its query string (``?api_key=...``) or fragment,
and an error body that echoes what it was sent. The first two are known by value
(:func:`known_secrets`: every environment variable whose name says it is a secret, plus the values
:func:`register` was given -- the CLI registers a ``.env`` file's secret-named values, which the environment
may have overridden); the URL parts are masked by shape (:func:`mask_url`), and a URL that carries any of them is refused before it
could be recorded (:func:`url_credentials`). Every text that leaves the process
about a model call goes through :func:`redact` *before* it is cut to length, so that no part of a key survives a
cut through its middle.

It lives in ``rundir`` because it is part of the run directory's contract (nothing secret in it) and every
package that writes or prints needs it.
"""
from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

#: Environment variable names whose values are secrets (``OPENAI_API_KEY``, ``HF_TOKEN``, ``DB_PASSWORD`` ...).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
#: Shorter values are not redacted: replacing "1" or "true" everywhere would garble text and hide nothing.
MIN_SECRET_CHARS = 8
#: Placeholders the clients send when a server needs no key: not secrets.
PLACEHOLDERS = frozenset({"sk-no-key", "EMPTY", "dummy"})
MASK = "***"

_registered: set[str] = set()

#: A URL in free text: ``scheme://...`` or ``//...`` up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"(?:\b[A-Za-z][A-Za-z0-9+.-]*:)?//[^\s\"'<>`]+")
#: ``user:password@host`` without a scheme (a malformed URL): a colon before an ``@``, no space between.
_BARE_USERINFO = re.compile(r"(?<![\w/@*:.-])[^\s\"'<>`/@:]+:(?!//)[^\s\"'<>`@]*@(?=[\w\[])")
_SCHEME = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*:)?(?://)?")


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


def _mask_pairs(text: str, sep: str) -> str:
    """``k=v<sep>k2`` -> ``k=***<sep>***``: every value masked, the names kept (they say what was passed)."""
    return sep.join(f"{k}={MASK}" if eq else MASK for k, eq, _ in (p.partition("=") for p in text.split(sep)) if k or eq)


def mask_one_url(url: str) -> str:
    """``url`` with each credential-bearing part masked: ``user:password@`` (up to the last ``@``, so a password
    with a ``/`` in it is masked whole), ``;`` path parameters, query values and the fragment.
    ``http://u:p@h:1/v1;key=K?api_key=K2&x=1#K3`` -> ``http://***@h:1/v1;key=***?api_key=***&x=***#***``."""
    scheme = _SCHEME.match(url).group(0)
    rest, fragment = url[len(scheme):], None
    if "#" in rest:
        rest, fragment = rest.split("#", 1)
    rest, has_query, query = rest.partition("?")
    if "@" in rest:
        rest = f"{MASK}@" + rest.rsplit("@", 1)[1]
    head, has_params, params = rest.partition(";")
    out = scheme + head
    if has_params:
        out += ";" + _mask_pairs(params.replace("/", ";"), ";")
    if has_query:
        out += "?" + _mask_pairs(query.replace(";", "&"), "&")
    if fragment is not None:
        out += "#" + (MASK if fragment else "")
    return out


def mask_url(text: str) -> str:
    """``text`` with every URL in it masked by :func:`mask_one_url`, and any ``user:password@host`` without a
    scheme masked too."""
    text = _URL_IN_TEXT.sub(lambda m: mask_one_url(m.group(0)), text)
    return _BARE_USERINFO.sub(f"{MASK}@", text)


def redact(text: str, extra: Iterable[str | None] = ()) -> str:
    """``text`` without any known secret (nor ``extra`` ones) and with URL credentials masked. Call it before
    cutting a text to length."""
    for secret in sorted({s for s in extra if _usable(s)} | set(known_secrets()), key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return mask_url(text)


def url_credentials(url: str) -> str | None:
    """What in ``url`` would be a credential written to a file -- userinfo (``user:password@``, also a malformed
    one), ``;`` path parameters, a query string or a fragment -- or None when it carries none."""
    scheme = _SCHEME.match(url).group(0)
    rest = url[len(scheme):]
    before_query = re.split(r"[?#]", rest, maxsplit=1)[0]
    if "@" in before_query:
        return "credentials (user:password@)"
    if ";" in before_query:
        return "path parameters (;...), where keys are passed"
    if "?" in rest or "#" in rest:
        return "a query string or fragment (?... / #...), where keys are passed"
    return None
