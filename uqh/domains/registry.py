"""The domain registry. Each module of :data:`DOMAIN_MODULES` registers its domains with ``@register_domain``;
heavy imports stay inside functions so that listing domains is cheap. A new domain is one module plus one entry
here."""
from __future__ import annotations

import importlib

from uqh.rundir.errors import UserError

from uqh.domains.base import Domain

#: The modules that register domains (imported on the first lookup).
DOMAIN_MODULES = (
    "uqh.domains.arithmetic",
    "uqh.domains.urn",
    "uqh.domains.qa.strategyqa",
    "uqh.domains.qa.hotpotqa",
    "uqh.domains.tau2.domain",
    "uqh.domains.webshop",
)

_REGISTRY: dict[str, type[Domain]] = {}
_loaded = False


def register_domain(name: str):
    def deco(cls: type[Domain]) -> type[Domain]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for name in DOMAIN_MODULES:
        importlib.import_module(name)
    _loaded = True


def domain_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get_domain_class(name: str) -> type[Domain]:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown domain {name!r}; choose one of: {', '.join(domain_names())}") from None
