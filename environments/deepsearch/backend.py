"""The process-wide search backends: corpus, BM25 index and QA set, built once and shared.

Every deep-search session of a server process uses the same ``SearchBackend`` per task set (the
index takes seconds and ~100 MB for the default corpus; the backends of both task sets share
one). ``configure_backend()`` chooses the corpus / QA files before the first use;
``get_backend(task_set)`` builds it on first call (thread-safe).

Built-in task sets over the built-in corpus (``TASK_SETS``):

* ``"search"`` (the ``deepsearch`` family): questions that one search with the question does not
  answer (``search_qa.py``), cached on disk after the first build (``task_cache.py``);
* ``"lookup"`` (the ``deepsearch_lookup`` family): the article's first sentence as the question
  (``qa.py``; one search with the question finds the answer).

User QA files (``--qa`` ...) replace the built-in set of either family.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from environments.core.base import InvalidTaskError, TaskCatalog
from environments.deepsearch.corpus import CorpusError, Passage, load_jsonl_corpus, load_wiki_summaries, wiki_summaries_path
from environments.deepsearch.qa import SPLITS, QAItem, build_wiki_qa, check_unique_ids, load_jsonl_qa
from environments.deepsearch.retriever import BM25Retriever
from environments.deepsearch.search_qa import SEARCH_DEV_MODULUS, SEARCH_FILTER_K, SEARCH_TEST_MODULUS, build_search_qa
from environments.deepsearch.task_cache import cache_path, load_or_build

log = logging.getLogger("environments.deepsearch")


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    """corpus: a JSONL corpus (None = the built-in Wikipedia summaries).
    qa: JSONL QA files, each split by its records' ``"split"`` field or by hash (train / dev / test).
    qa_train / qa_test: JSONL QA files whose every record is train / test.
    With no QA file, the built-in QA set is derived from the built-in corpus."""

    corpus: str | None = None
    qa: tuple[str, ...] = ()
    qa_train: tuple[str, ...] = ()
    qa_test: tuple[str, ...] = ()


class DeepSearchCatalog(TaskCatalog):
    """Train / dev / test QA ids in file (or corpus) order (dev: questions held out of training
    for ablations and recipe choices; empty for user files that name no dev question)."""

    splits = SPLITS

    def __init__(self, items: Sequence[QAItem]) -> None:
        self._ids = {split: tuple(i.id for i in items if i.split == split) for split in self.splits}

    def task_ids(self, split: str) -> Sequence[str]:
        if split not in self._ids:
            raise InvalidTaskError(f"unknown split {split!r}; deep search has {list(self.splits)}")
        return self._ids[split]


#: the build arguments of the built-in ``search`` task set (part of its cache key)
SEARCH_PARAMS = {"k": SEARCH_FILTER_K, "modulus": SEARCH_TEST_MODULUS, "dev_modulus": SEARCH_DEV_MODULUS}


def _search_items(passages: Sequence[Passage], retriever: BM25Retriever) -> list[QAItem]:
    params = SEARCH_PARAMS
    items, built = load_or_build("search", wiki_summaries_path(), params, lambda: build_search_qa(passages, retriever, **params))
    log.info("deep search: the search task set %s", "built and cached" if built else "read from its cache")
    return items


#: built-in task set name -> ``build(passages, retriever) -> items`` (over the built-in corpus)
TASK_SETS: dict[str, Callable[[Sequence[Passage], BM25Retriever], list[QAItem]]] = {
    "search": _search_items,
    "lookup": lambda passages, retriever: build_wiki_qa(passages),
}


class SearchBackend:
    """Corpus + index + QA set of one server process and task set (``TASK_SETS``).

    ``shared``: ``(passages, retriever)`` already built for ``config.corpus`` (another task
    set's), else they are built here."""

    def __init__(self, config: BackendConfig = BackendConfig(), task_set: str = "search",
                 shared: tuple[list[Passage], BM25Retriever] | None = None) -> None:
        if task_set not in TASK_SETS:
            raise ValueError(f"unknown deep-search task set {task_set!r}; known: {sorted(TASK_SETS)}")
        start = time.perf_counter()
        self.config = config
        self.task_set = task_set
        if shared is None:
            passages = load_jsonl_corpus(config.corpus) if config.corpus else load_wiki_summaries()
            shared = (passages, BM25Retriever(passages))
        self.passages, self.retriever = shared
        items: list[QAItem] = []
        for path in config.qa:
            items += load_jsonl_qa(path)
        for path in config.qa_train:
            items += load_jsonl_qa(path, split="train")
        for path in config.qa_test:
            items += load_jsonl_qa(path, split="test")
        if not items:
            if config.corpus:
                raise CorpusError("a custom corpus needs QA files (--qa, --qa-train or --qa-test)")
            items = TASK_SETS[task_set](self.passages, self.retriever)
        check_unique_ids(items)
        self.items = {item.id: item for item in items}
        self.by_title = {p.title: p for p in self.passages if p.title}
        self.catalog = DeepSearchCatalog(items)
        self.build_seconds = time.perf_counter() - start
        log.info(
            "deep search backend (%s): %d passages, %d questions (%d train / %d dev / %d test), built in %.2f s",
            task_set, len(self.passages), len(items), len(self.catalog.task_ids("train")), len(self.catalog.task_ids("dev")),
            len(self.catalog.task_ids("test")),
            self.build_seconds,
        )  # fmt: skip

    def question(self, task_id: str) -> QAItem:
        try:
            return self.items[task_id]
        except (KeyError, TypeError):
            raise InvalidTaskError(f"unknown deep-search task id {task_id!r}") from None


_CONFIG = BackendConfig()
_BACKENDS: dict[str, SearchBackend] = {}
_LOCK = threading.Lock()


def configure_backend(
    corpus: str | Path | None = None,
    qa: Sequence[str | Path] = (),
    qa_train: Sequence[str | Path] = (),
    qa_test: Sequence[str | Path] = (),
) -> None:
    """Choose the corpus and QA files; drops the backends already built."""
    global _CONFIG
    with _LOCK:
        _CONFIG = BackendConfig(
            corpus=None if corpus is None else str(corpus),
            qa=tuple(map(str, qa)),
            qa_train=tuple(map(str, qa_train)),
            qa_test=tuple(map(str, qa_test)),
        )
        _BACKENDS.clear()


def get_backend(task_set: str = "search") -> SearchBackend:
    """The shared backend of ``task_set``, built on first use (with the corpus and index of
    another task set's backend when one is built)."""
    with _LOCK:
        if task_set not in _BACKENDS:
            other = next(iter(_BACKENDS.values()), None)
            shared = (other.passages, other.retriever) if other is not None else None
            _BACKENDS[task_set] = SearchBackend(_CONFIG, task_set, shared)
        return _BACKENDS[task_set]


def prepare_search_task_set(config: BackendConfig, say: Callable[[str], None],
                            build: Callable[[], object] | None = None) -> bool:
    """Build the built-in ``search`` task set into its cache unless it is there already (True
    when it built). Run by the launcher before it starts ``deepsearch`` servers (the family's
    ``prepare``): the first build takes a minute or two, longer than a server may take to
    start, and here the user is told what the wait is. Nothing to do (False) for user QA files
    or a custom corpus (``config``), which have no built-in set, or when the cache file exists
    (a file that cannot be read back is rebuilt by the server, with a warning).
    ``build``: what builds and caches it (default: a fresh backend of the ``search`` set)."""
    if config.corpus or config.qa or config.qa_train or config.qa_test:
        return False
    path = cache_path("search", wiki_summaries_path(), SEARCH_PARAMS)
    if path.exists():
        return False
    say(f"deepsearch: building its search task set once (first use: a minute or two; cached in "
        f"{path.parent} for later runs)")
    start = time.perf_counter()
    (build or (lambda: SearchBackend(BackendConfig(), "search")))()
    say(f"deepsearch: search task set built in {time.perf_counter() - start:.0f} s")
    return True


if __name__ == "__main__":  # build (or check) the cached search task set ahead of a run
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    built = get_backend("search")
    print(f"{len(built.items)} questions ({len(built.catalog.task_ids('test'))} test), ready in {built.build_seconds:.1f} s")
