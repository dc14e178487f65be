"""The deep-search families as the registry and the server core see them: ``deepsearch`` (the
``search`` task set: questions that need several searches) and ``deepsearch_lookup`` (the
``lookup`` task set: one search with the question finds the answer), one corpus and index."""

from __future__ import annotations

import dataclasses

import functools

from environments.deepsearch.backend import DeepSearchCatalog, get_backend
from environments.deepsearch.env import DeepSearchEnvironment
from environments.deepsearch.expert import DeepSearchExpertPolicy, DeepSearchLookupExpertPolicy
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


def make_env(task_set: str = "search") -> DeepSearchEnvironment:
    return DeepSearchEnvironment(k=CONFIG.k, max_steps=CONFIG.max_steps,
                                 backend_getter=functools.partial(get_backend, task_set))


def make_catalog(task_set: str = "search") -> DeepSearchCatalog:
    """Builds the shared backend (corpus, index, QA set) once, when the server starts."""
    return get_backend(task_set).catalog


FAMILY = Family(name="deepsearch", env_factory=make_env, catalog_factory=make_catalog,
                expert=DeepSearchExpertPolicy,
                action_example="<search> capital of France </search>")

LOOKUP_FAMILY = Family(name="deepsearch_lookup", env_factory=functools.partial(make_env, "lookup"),
                       catalog_factory=functools.partial(make_catalog, "lookup"),
                       expert=DeepSearchLookupExpertPolicy,
                       action_example="<search> capital of France </search>")
