"""Host-side bookkeeping of the engine's KV-cache slots and the per-session prefix cache.

Each of the ``max_batch`` slots owns one row ``[max_length, K, Dh]`` of every layer's KV cache.
A slot is

* busy   -- a sequence is prefilling or decoding in it;
* cached -- idle, but its row still holds valid KV for ``tokens`` of a session (an episode); the
  session's next turn, whose prompt extends those tokens, reuses the row and prefills only the
  new suffix;
* free   -- holds nothing useful.

Cached slots are kept in LRU order and are evicted (become the new request's slot) only when no
free slot is left, so idle sessions keep their prefix as long as the pool is not needed.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np


@dataclasses.dataclass
class CachedPrefix:
    session_id: str
    tokens: np.ndarray  # int32 ids whose KV is valid in rows 0..len-1 of the slot


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


class SlotTable:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() gives slot 0 first
        self._cached: collections.OrderedDict[int, CachedPrefix] = collections.OrderedDict()
        self._session_slot: dict[str, int] = {}
        self.evictions = 0

    @property
    def available(self) -> int:
        """Slots a new sequence can take now (free + evictable cached)."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        """A free slot, else the least recently used cached one (its prefix is dropped)."""
        if self._free:
            return self._free.pop()
        if not self._cached:
            raise RuntimeError("no slot available")
        slot, prefix = self._cached.popitem(last=False)
        self._session_slot.pop(prefix.session_id, None)
        self.evictions += 1
        return slot

    def acquire_for_session(self, session_id: str | None, input_ids: np.ndarray,
                            max_reuse: int) -> tuple[int, int]:
        """A slot for a request of ``session_id`` and how many leading prompt tokens already
        have valid KV in it (at most ``max_reuse``). Falls back to ``acquire()`` (reuse 0)."""
        if session_id is not None:
            slot = self._session_slot.get(session_id)
            if slot is not None and slot in self._cached:
                prefix = self._cached.pop(slot)
                del self._session_slot[session_id]
                reuse = min(common_prefix_length(prefix.tokens, input_ids), max_reuse)
                return slot, reuse
        return self.acquire(), 0

    def release(self, slot: int, session_id: str | None = None,
                tokens: np.ndarray | None = None) -> None:
        """Give a slot back; with a session and tokens its KV row is kept for reuse."""
        if session_id is not None and tokens is not None and len(tokens) > 0:
            old = self._session_slot.get(session_id)
            if old is not None and old in self._cached:  # an older prefix of the same session
                del self._cached[old]
                self._free.append(old)
            self._cached[slot] = CachedPrefix(session_id, np.asarray(tokens, np.int32))
            self._session_slot[session_id] = slot
        else:
            self._free.append(slot)

    def flush(self) -> int:
        """Drop every cached prefix (e.g. after a weight update). Returns how many."""
        n = len(self._cached)
        self._free.extend(self._cached.keys())
        self._cached.clear()
        self._session_slot.clear()
        return n

    def forget_session(self, session_id: str) -> None:
        slot = self._session_slot.pop(session_id, None)
        if slot is not None and slot in self._cached:
            del self._cached[slot]
            self._free.append(slot)


__all__ = ["SlotTable", "CachedPrefix", "common_prefix_length"]
