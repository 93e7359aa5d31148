"""The domain registry: the domains installed as ``uqh.domains`` entry points (uqh's own are declared in
pyproject.toml the same way, see :mod:`uqh.rundir.entry_points`) and those registered in code with
``@register_domain``. Listing reads names only; a domain's module is imported when the domain is first asked for.
A new domain is one module or folder plus one entry point."""
from __future__ import annotations

from uqh.rundir import entry_points
from uqh.rundir.errors import UserError

from uqh.domains.base import Domain

ENTRY_POINT_GROUP = "uqh.domains"

#: Domains loaded or registered in code, by name.
_REGISTRY: dict[str, type[Domain]] = {}


def register_domain(name: str):
    """Class decorator: ``name`` is the domain's ``--domain`` value (a domain made in code, or a plugin's class
    whose entry point has the same name)."""
    def deco(cls: type[Domain]) -> type[Domain]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def unregister_domain(name: str) -> None:
    _REGISTRY.pop(name, None)


def domain_names() -> list[str]:
    """Every installed or registered domain, without importing any."""
    return sorted(set(entry_points.active(ENTRY_POINT_GROUP)) | set(_REGISTRY))


def get_domain_class(name: str) -> type[Domain]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    ext = entry_points.active(ENTRY_POINT_GROUP).get(name)
    if ext is None:
        raise UserError(f"unknown domain {name!r}; choose one of: {', '.join(domain_names())}")
    cls = entry_points.load(ext)
    if not (isinstance(cls, type) and issubclass(cls, Domain)):
        raise UserError(f"the domain entry point {name!r} (from {ext.source}) is not a uqh Domain class: {ext.value}")
    if getattr(cls, "name", None) != name:  # a plugin's class may skip @register_domain
        cls.name = name
    _REGISTRY[name] = cls
    return cls
