"""The deep-search family as the registry and the server core see it."""

from __future__ import annotations

import dataclasses

from environments.deepsearch.backend import DeepSearchCatalog, get_backend
from environments.deepsearch.env import DeepSearchEnvironment
from environments.deepsearch.expert import DeepSearchExpertPolicy
from environments.registry import Family


@dataclasses.dataclass
class DeepSearchConfig:
    k: int = 3
    max_steps: int = 30


CONFIG = DeepSearchConfig()


def configure(**options) -> DeepSearchConfig:
    """Change ``k`` / ``max_steps`` (corpus and QA files: ``backend.configure_backend``)."""
    for key, value in options.items():
        if not hasattr(CONFIG, key):
            raise TypeError(f"unknown deep-search option {key!r}")
        setattr(CONFIG, key, value)
    return CONFIG


def make_env() -> DeepSearchEnvironment:
    return DeepSearchEnvironment(k=CONFIG.k, max_steps=CONFIG.max_steps)


def make_catalog() -> DeepSearchCatalog:
    """Builds the shared backend (corpus, index, QA set) once, when the server starts."""
    return get_backend().catalog


FAMILY = Family(name="deepsearch", env_factory=make_env, catalog_factory=make_catalog,
                expert=DeepSearchExpertPolicy,
                action_example="<search> capital of France </search>")
