"""Benchmarks. Each module registers its domains with ``@register_domain``; heavy imports stay inside functions
so that listing domains is cheap."""
from __future__ import annotations

import importlib
import pkgutil

from rundir.errors import UserError

from .base import Domain

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
    for mod in pkgutil.iter_modules(__path__):
        if mod.name != "base":
            importlib.import_module(f"{__name__}.{mod.name}")
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
