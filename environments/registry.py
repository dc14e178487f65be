"""The registry of environment families.

A family is a name plus two factories: one making ``TextEnvironment`` instances, one making the
family's ``TaskCatalog``; and all else that is keyed by a family's name: its expert policy (and
named variants of it) for behaviour cloning, its example action for the ``action`` prompt style. ``FAMILIES`` (an ``agentrl_common.registry.Registry``) is the one list of
them: config validation reads ``FAMILIES.names()``, the server command ``python -m
environments.<name>`` reads ``get_family(name)``.

Families are registered lazily by module path ("module:attribute") at the end of this file, so
importing the registry never imports minigrid, a JVM bridge or a browser driver; a family's module
is imported on the first ``get_family(name)``. A family module exposes a ``Family`` object,
conventionally as ``FAMILY`` in ``environments/<name>/family.py``; adding a family is that folder
plus one ``FAMILIES.register_lazy(...)`` line below (docs/EXTENDING.md). ``register_family``
registers one in-process (tests, notebooks).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Callable, Mapping, Sequence

from agentrl_common.registry import Registry
from environments.core.base import ExpertPolicy, TaskCatalog, TextEnvironment


@dataclasses.dataclass(frozen=True)
class Family:
    """What the server core needs to serve a family.

    name: the family name (also the server module ``environments.<name>``).
    env_factory: makes one fresh ``TextEnvironment`` (may block: a JVM, a browser).
    catalog_factory: makes the family's ``TaskCatalog`` (called once per server).
    inline: the family's ``reset``/``step``/``close`` are cheap (well under a millisecond) and
      never block, so the server calls them on the event loop instead of a thread pool. Handing
      work to a thread costs more than a BabyAI or TextCraft step itself.
    reuse_instances: an instance can play any task after a ``reset`` and is expensive to start
      (a browser), so the server keeps closed sessions' instances for the next ``/create``
      (``environments/core/spares.py``) instead of closing them.
    expert: ``factory(task_id) -> ExpertPolicy``, the family's expert for recording
      behaviour-cloning episodes (``launch/record_experts.py``), or None; it must import its
      simulator only when called (the family module stays light).
    expert_variants: other experts of the family by name, each ``"<name>_<variant>"``
      (``babyai_macro``).
    action_example: one action of the family, shown by the ``action`` prompt style (small models
      copy the example, so it must be an action of this family); None: no example.
    prepare: ``prepare(server_args, say)``, a one-time build the launcher runs in its own
      process before it starts the family's servers (a server start is given ~2 minutes; a
      first build that may take longer, deep search's cached task set, goes here, announced
      through ``say(line)``); given the servers' extra arguments; None: nothing to prepare.
    """

    name: str
    env_factory: Callable[[], TextEnvironment]
    catalog_factory: Callable[[], TaskCatalog]
    inline: bool = False
    reuse_instances: bool = False
    expert: Callable[[str], ExpertPolicy] | None = None
    expert_variants: Mapping[str, Callable[[str], ExpertPolicy]] = dataclasses.field(
        default_factory=dict)
    action_example: str | None = None
    prepare: Callable[[Sequence[str], Callable[[str], None]], None] | None = None

    def __post_init__(self) -> None:
        bad = [v for v in self.expert_variants if not v.startswith(self.name + "_")]
        if bad:
            raise ValueError(f"expert variants of family {self.name!r} are named "
                             f"'{self.name}_<variant>' (got {bad})")
        object.__setattr__(self, "expert_variants", types.MappingProxyType(
            dict(self.expert_variants)))

    def experts(self) -> dict[str, Callable[[str], ExpertPolicy]]:
        """Every expert of the family by name: its own under the family name, then the
        variants."""
        own = {self.name: self.expert} if self.expert is not None else {}
        return {**own, **self.expert_variants}


#: every environment family, by name; lazy entries point at ``environments.<name>.family:FAMILY``
FAMILIES: Registry[Family] = Registry("environment family", expected=Family)


def register_family(
    name: str,
    env_factory: Callable[[], TextEnvironment],
    catalog_factory: Callable[[], TaskCatalog],
    *,
    inline: bool = False,
    replace: bool = False,
    **extras,
) -> Family:
    """Register a family from its two factories (in this process) and return it; ``extras``:
    the other ``Family`` fields (``expert``, ``action_example``, ...).

    A name that is already registered raises ``DuplicateNameError`` unless ``replace=True``.
    """
    family = Family(name=name, env_factory=env_factory, catalog_factory=catalog_factory,
                    inline=inline, **extras)
    FAMILIES.register(name, family, replace=replace)
    return family


def family_names() -> list[str]:
    """All registered family names (whether or not their dependencies are installed)."""
    return FAMILIES.names()


def get_family(name: str) -> Family:
    """The family ``name``, importing its module on first use.

    Raises ``UnknownNameError`` (a ``ValueError`` listing the known names, with a did-you-mean)
    for an unregistered name, ``ImportError`` when the family's module or its dependencies cannot
    be imported, ``TypeError`` when the registered object is not a ``Family``.
    """
    family = FAMILIES.get(name)
    if family.name != name:
        raise ValueError(f"environment family {name!r} is registered with a Family named {family.name!r}")
    return family


FAMILIES.register_lazy("babyai", "environments.babyai.family:FAMILY")
FAMILIES.register_lazy("textcraft", "environments.textcraft.family:FAMILY")
FAMILIES.register_lazy("scienceworld", "environments.scienceworld.family:FAMILY")
FAMILIES.register_lazy("miniwob", "environments.miniwob.family:FAMILY")
FAMILIES.register_lazy("deepsearch", "environments.deepsearch.family:FAMILY")
FAMILIES.register_lazy("deepsearch_lookup", "environments.deepsearch.family:LOOKUP_FAMILY")
