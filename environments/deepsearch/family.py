"""The deep-search families as the registry and the server core see them: ``deepsearch`` (the
``search`` task set: questions that need several searches) and ``deepsearch_lookup`` (the
``lookup`` task set: one search with the question finds the answer), one corpus and index."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Callable, Sequence

from environments.deepsearch.backend import (BackendConfig, DeepSearchCatalog, get_backend,
                                             prepare_search_task_set)
from environments.deepsearch.env import (EVIDENCE_ARTICLES, DeepSearchEnvironment,
                                         check_evidence_articles, check_evidence_reward)
from environments.deepsearch.expert import DeepSearchExpertPolicy, DeepSearchLookupExpertPolicy
from environments.registry import Family


@dataclasses.dataclass
class DeepSearchConfig:
    """The server's episode options (``--k``, ``--max-steps``, ``--evidence-reward``,
    ``--evidence-articles``)."""

    k: int = 3
    max_steps: int = 30
    evidence_reward: float = 0.0  # training-only bonus for reaching the path articles (env.py)
    evidence_articles: str = "path"  # which path articles earn it: all, or the answer's own


CONFIG = DeepSearchConfig()


def configure(**options) -> DeepSearchConfig:
    """Change ``k`` / ``max_steps`` / ``evidence_reward`` / ``evidence_articles`` (corpus and
    QA files: ``backend.configure_backend``); ``ValueError`` for an evidence reward outside
    [0, 1] or unknown evidence articles."""
    for key, value in options.items():
        if not hasattr(CONFIG, key):
            raise TypeError(f"unknown deep-search option {key!r}")
        if key == "evidence_reward":
            value = check_evidence_reward(value)
        if key == "evidence_articles":
            value = check_evidence_articles(value)
        setattr(CONFIG, key, value)
    return CONFIG


def evidence_reward_arg(text: str) -> float:
    """``--evidence-reward``'s value: a number in [0, 1] (an argparse error otherwise)."""
    try:
        return check_evidence_reward(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} ({text!r})") from None


def parse_family_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The deep-search options of a server command line (``python -m environments.deepsearch
    --help``) and the rest (the server core's options)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--qa", action="append", default=[])
    parser.add_argument("--qa-train", action="append", default=[])
    parser.add_argument("--qa-test", action="append", default=[])
    parser.add_argument("--k", type=int, default=CONFIG.k)
    parser.add_argument("--max-steps", type=int, default=CONFIG.max_steps)
    parser.add_argument("--evidence-reward", type=evidence_reward_arg,
                        default=CONFIG.evidence_reward)
    parser.add_argument("--evidence-articles", choices=EVIDENCE_ARTICLES,
                        default=CONFIG.evidence_articles)
    return parser.parse_known_args(list(argv))


def prepare(server_args: Sequence[str], say: Callable[[str], None]) -> None:
    """The ``deepsearch`` family's ``prepare``: build the cached ``search`` task set before the
    servers start, unless ``server_args`` name user QA files / a corpus or it is cached."""
    args, _ = parse_family_args(server_args)
    prepare_search_task_set(BackendConfig(corpus=args.corpus, qa=tuple(args.qa),
                                          qa_train=tuple(args.qa_train),
                                          qa_test=tuple(args.qa_test)), say)


def make_env(task_set: str = "search") -> DeepSearchEnvironment:
    return DeepSearchEnvironment(k=CONFIG.k, max_steps=CONFIG.max_steps,
                                 backend_getter=functools.partial(get_backend, task_set),
                                 evidence_reward=CONFIG.evidence_reward,
                                 evidence_articles=CONFIG.evidence_articles)


def make_catalog(task_set: str = "search") -> DeepSearchCatalog:
    """Builds the shared backend (corpus, index, QA set) once, when the server starts."""
    return get_backend(task_set).catalog


FAMILY = Family(name="deepsearch", env_factory=make_env, catalog_factory=make_catalog,
                expert=DeepSearchExpertPolicy, prepare=prepare,
                action_example="<search> capital of France </search>")

LOOKUP_FAMILY = Family(name="deepsearch_lookup", env_factory=functools.partial(make_env, "lookup"),
                       catalog_factory=functools.partial(make_catalog, "lookup"),
                       expert=DeepSearchLookupExpertPolicy,
                       action_example="<search> capital of France </search>")
