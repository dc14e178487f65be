"""BM25 retrieval over a passage corpus with ``bm25s`` (built once, shared by every session)."""

from __future__ import annotations

import threading
from typing import Sequence

from environments.deepsearch.corpus import Passage


class BM25Retriever:
    """Lucene-style BM25 (k1=1.5, b=0.75) over ``passage.contents``, English stopwords, no stemming.

    ``search`` is thread-safe: queries are serialised by a lock (each is short next to a step's
    HTTP round trip: docs/PERFORMANCE.md).
    """

    def __init__(self, passages: Sequence[Passage]) -> None:
        import bm25s

        self._bm25s = bm25s
        self.passages = list(passages)
        tokens = bm25s.tokenize([p.contents for p in self.passages], stopwords="en", show_progress=False)
        self._index = bm25s.BM25()
        self._index.index(tokens, show_progress=False)
        self._vocab = self._index.vocab_dict
        self._lock = threading.Lock()

    def search(self, query: str, k: int = 3) -> list[tuple[Passage, float]]:
        """The top ``k`` passages for ``query`` with their scores (fewer if few passages match)."""
        words = self._bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        words = [w for w in words if w in self._vocab]
        if not words or k <= 0:
            return []
        k = min(k, len(self.passages))
        with self._lock:
            ids, scores = self._index.retrieve([words], k=k, show_progress=False, n_threads=1)
        return [(self.passages[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]

    def search_many(self, queries: Sequence[str], k: int = 3) -> list[list[str]]:
        """The titles (ids for untitled passages) of the top ``k`` passages of each query, as
        ``search`` ranks them, for many queries in one batch (task-set building)."""
        tokenized = self._bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        known = [[w for w in words if w in self._vocab] for words in tokenized]
        results: list[list[str]] = [[] for _ in known]
        asked = [i for i, words in enumerate(known) if words]
        if not asked or k <= 0:
            return results
        k = min(k, len(self.passages))
        with self._lock:
            ids, scores = self._index.retrieve([known[i] for i in asked], k=k, show_progress=False, n_threads=1)
        for row, i in enumerate(asked):
            results[i] = [self.passages[int(j)].title or self.passages[int(j)].id for j, s in zip(ids[row], scores[row]) if s > 0]
        return results
