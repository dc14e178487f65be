"""The ScienceWorld family as the registry and the server core see it.

Options (set by ``python -m environments.scienceworld`` flags, or ``configure()`` in-process):
pool size (simulators), worlds per JVM, step limit, valid actions at every step, simplifications, task subset.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from environments.scienceworld.expert import ScienceWorldExpertPolicy
from environments.registry import Family
from environments.scienceworld.catalog import ScienceWorldCatalog
from environments.scienceworld.env import ScienceWorldEnvironment
from environments.scienceworld.pool import (DEFAULT_MAX_WAITING, DEFAULT_POOL_SIZE,
                                            DEFAULT_WORLDS_PER_JVM, configure_pool)


@dataclasses.dataclass
class ScienceWorldConfig:
    pool_size: int = DEFAULT_POOL_SIZE
    max_waiting: int = DEFAULT_MAX_WAITING
    worlds_per_jvm: int = DEFAULT_WORLDS_PER_JVM
    max_steps: int = 100
    valid_actions_each_step: bool = False
    simplifications: str = ""
    tasks: Sequence[str] | None = None


CONFIG = ScienceWorldConfig()


def configure(**options) -> ScienceWorldConfig:
    """Change the family's options (before the server creates instances)."""
    for key, value in options.items():
        if not hasattr(CONFIG, key):
            raise TypeError(f"unknown ScienceWorld option {key!r}")
        setattr(CONFIG, key, value)
    configure_pool(CONFIG.pool_size, CONFIG.max_waiting, CONFIG.worlds_per_jvm)
    return CONFIG


def make_env() -> ScienceWorldEnvironment:
    """A new instance; cheap (the JVM is borrowed on reset)."""
    return ScienceWorldEnvironment(
        max_steps=CONFIG.max_steps,
        valid_actions_each_step=CONFIG.valid_actions_each_step,
        simplifications=CONFIG.simplifications,
    )


def make_catalog() -> ScienceWorldCatalog:
    return ScienceWorldCatalog(CONFIG.tasks)


FAMILY = Family(name="scienceworld", env_factory=make_env, catalog_factory=make_catalog,
                expert=ScienceWorldExpertPolicy, action_example="look around")
