"""The registry of environment families.

A family is a name plus two factories: one making ``TextEnvironment`` instances, one making the
family's ``TaskCatalog``. Families are registered lazily by module path ("module:attribute"), so
importing this registry never imports minigrid, a JVM bridge or a browser driver; the module is
imported on the first ``get_family(name)``.

A family module exposes a ``Family`` object, conventionally as ``FAMILY`` in
``environments/<name>/family.py``. Names that are not registered explicitly fall back to that
convention, so a new family works without editing this file; adding it to ``_LAZY`` below makes it
show up in ``family_names()``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from environments.core.base import TaskCatalog, TextEnvironment


@dataclasses.dataclass(frozen=True)
class Family:
    """What the server core needs to serve a family.

    name: the family name (also the server module ``environments.<name>``).
    env_factory: makes one fresh ``TextEnvironment`` (may block: a JVM, a browser).
    catalog_factory: makes the family's ``TaskCatalog`` (called once per server).
    inline: the family's ``reset``/``step``/``close`` are cheap (well under a millisecond) and
      never block, so the server calls them on the event loop instead of a thread pool. Handing
      work to a thread costs more than a BabyAI or TextCraft step itself.
    """

    name: str
    env_factory: Callable[[], TextEnvironment]
    catalog_factory: Callable[[], TaskCatalog]
    inline: bool = False


# name -> "module:attribute" of a Family object, imported on first use.
_LAZY: dict[str, str] = {
    "babyai": "environments.babyai.family:FAMILY",
    "textcraft": "environments.textcraft.family:FAMILY",
    "scienceworld": "environments.scienceworld.family:FAMILY",
    "miniwob": "environments.miniwob.family:FAMILY",
    "deepsearch": "environments.deepsearch.family:FAMILY",
}
_LOADED: dict[str, Family] = {}


def register_family(
    name: str,
    env_factory: Callable[[], TextEnvironment],
    catalog_factory: Callable[[], TaskCatalog],
    *,
    inline: bool = False,
) -> Family:
    """Register (or replace) a family from its two factories and return it."""
    family = Family(name=name, env_factory=env_factory, catalog_factory=catalog_factory, inline=inline)
    _LOADED[name] = family
    return family


def register_lazy(name: str, target: str) -> None:
    """Register a family by the path ``"package.module:ATTRIBUTE"`` of its ``Family`` object."""
    if ":" not in target:
        raise ValueError(f"expected 'module:attribute', got {target!r}")
    _LAZY[name] = target
    _LOADED.pop(name, None)


def family_names() -> list[str]:
    """All registered family names (whether or not their dependencies are installed)."""
    return sorted(set(_LAZY) | set(_LOADED))


def get_family(name: str) -> Family:
    """The family ``name``, importing its module on first use.

    Raises ``KeyError`` for an unknown name and ``ImportError`` when the family's module or its
    dependencies cannot be imported.
    """
    if name in _LOADED:
        return _LOADED[name]
    target = _LAZY.get(name, f"environments.{name}.family:FAMILY")
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if name not in _LAZY and error.name in (module_name, f"environments.{name}"):
            raise KeyError(f"unknown environment family {name!r}; known: {family_names()}") from None
        raise
    family = getattr(module, attribute)
    if not isinstance(family, Family):
        raise TypeError(f"{target} is a {type(family).__name__}, expected registry.Family")
    _LOADED[name] = family
    return family
