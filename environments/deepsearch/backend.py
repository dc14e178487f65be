"""The process-wide search backend: corpus, BM25 index and QA set, built once and shared.

Every deep-search session of a server process uses the same ``SearchBackend`` (the index takes
seconds and ~100 MB for the default corpus). ``configure()`` chooses the corpus / QA files before
the first use; ``get_backend()`` builds it on first call (thread-safe).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Sequence

from environments.core.base import InvalidTaskError, TaskCatalog
from environments.deepsearch.corpus import CorpusError, Passage, load_jsonl_corpus, load_wiki_summaries
from environments.deepsearch.qa import QAItem, build_wiki_qa, check_unique_ids, load_jsonl_qa
from environments.deepsearch.retriever import BM25Retriever

log = logging.getLogger("environments.deepsearch")


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    """corpus: a JSONL corpus (None = the built-in Wikipedia summaries).
    qa: JSONL QA files, each split by its records' ``"split"`` field or by hash.
    qa_train / qa_test: JSONL QA files whose every record is train / test.
    With no QA file, the built-in QA set is derived from the built-in corpus."""

    corpus: str | None = None
    qa: tuple[str, ...] = ()
    qa_train: tuple[str, ...] = ()
    qa_test: tuple[str, ...] = ()


class DeepSearchCatalog(TaskCatalog):
    """Train / test QA ids in file (or corpus) order."""

    def __init__(self, items: Sequence[QAItem]) -> None:
        self._ids = {split: tuple(i.id for i in items if i.split == split) for split in self.splits}

    def task_ids(self, split: str) -> Sequence[str]:
        if split not in self._ids:
            raise InvalidTaskError(f"unknown split {split!r}; deep search has {list(self.splits)}")
        return self._ids[split]


class SearchBackend:
    """Corpus + index + QA set of one server process."""

    def __init__(self, config: BackendConfig = BackendConfig()) -> None:
        start = time.perf_counter()
        self.config = config
        self.passages: list[Passage] = load_jsonl_corpus(config.corpus) if config.corpus else load_wiki_summaries()
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
            items = build_wiki_qa(self.passages)
        check_unique_ids(items)
        self.items = {item.id: item for item in items}
        self.catalog = DeepSearchCatalog(items)
        self.retriever = BM25Retriever(self.passages)
        self.build_seconds = time.perf_counter() - start
        log.info(
            "deep search backend: %d passages, %d questions (%d train / %d test), built in %.2f s",
            len(self.passages), len(items), len(self.catalog.task_ids("train")), len(self.catalog.task_ids("test")),
            self.build_seconds,
        )  # fmt: skip

    def question(self, task_id: str) -> QAItem:
        try:
            return self.items[task_id]
        except (KeyError, TypeError):
            raise InvalidTaskError(f"unknown deep-search task id {task_id!r}") from None


_CONFIG = BackendConfig()
_BACKEND: SearchBackend | None = None
_LOCK = threading.Lock()


def configure_backend(
    corpus: str | Path | None = None,
    qa: Sequence[str | Path] = (),
    qa_train: Sequence[str | Path] = (),
    qa_test: Sequence[str | Path] = (),
) -> None:
    """Choose the corpus and QA files; drops an already built backend."""
    global _CONFIG, _BACKEND
    with _LOCK:
        _CONFIG = BackendConfig(
            corpus=None if corpus is None else str(corpus),
            qa=tuple(map(str, qa)),
            qa_train=tuple(map(str, qa_train)),
            qa_test=tuple(map(str, qa_test)),
        )
        _BACKEND = None


def get_backend() -> SearchBackend:
    """The shared backend, built on first use."""
    global _BACKEND
    with _LOCK:
        if _BACKEND is None:
            _BACKEND = SearchBackend(_CONFIG)
        return _BACKEND
