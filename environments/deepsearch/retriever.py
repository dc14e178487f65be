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
