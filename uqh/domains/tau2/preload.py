"""Imported by a worker fork server (``Domain.worker_preload``): tau2 and the three domain DBs, loaded once, so each
forked worker starts with them instead of paying ~1 s of imports and a DB parse of its own."""
from __future__ import annotations

from uqh.domains.tau2.access import Tau2
from uqh.domains.tau2.shared_db import shared_db

Tau2.load()
for _domain in ("airline", "retail", "telecom"):
    shared_db(_domain)
