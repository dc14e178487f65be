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

from agentrl_jax.rollout.engine.prefill_plan import copy_blocks


_EMPTY = np.zeros((0,), np.int32)


@dataclasses.dataclass
class CachedPrefix:
    """The ids whose KV is valid in rows ``0 .. len - 1`` of a slot: ``head`` then ``tail``
    (int32 ``[h]`` and ``[t]``). A finished turn keeps its prompt's array as ``head`` (shared,
    not copied) and its few output ids as ``tail``, so finishing copies no prompt."""

    session_id: str
    head: np.ndarray
    tail: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY)

    @property
    def tokens(self) -> np.ndarray:
        """``head`` then ``tail``, int32 ``[h + t]`` (a new array when ``tail`` is not empty)."""
        return join_blocks(self.head, self.tail) if len(self.tail) else self.head

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def shared_length(self, ids: np.ndarray) -> int:
        """``common_prefix_length(self.tokens, ids)`` without joining ``head`` and ``tail``."""
        n = common_prefix_length(self.head, ids)
        if n < len(self.head) or not len(self.tail):
            return n
        return n + common_prefix_length(self.tail, ids[n:])


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def session_prefix(ids: np.ndarray, out_ids: list[int], kv_len: int
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    """The ids whose KV a finished turn's slot row holds, ``min(kv_len, L + len(out))`` of the
    prompt ``ids`` (int32 ``[L]``) then ``out_ids``, as two int32 arrays for ``SlotTable.release``:
    a slice of ``ids`` (not copied: the prompt's array made once at admission) and the output
    ids past it (``None`` when the KV ends inside the prompt)."""
    if kv_len <= len(ids):
        return ids[:kv_len], None
    return ids, np.asarray(out_ids[:kv_len - len(ids)], np.int32)


def join_blocks(head: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """``concatenate((head, tail))`` int32, copied in blocks that keep the GIL
    (``prefill_plan.copy_blocks``)."""
    tokens = np.empty((len(head) + len(tail),), np.int32)
    copy_blocks(tokens, head)
    tokens[len(head):] = tail
    return tokens


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
                reuse = min(prefix.shared_length(input_ids), max_reuse)
                return slot, reuse
        return self.acquire(), 0

    def release(self, slot: int, session_id: str | None = None,
                tokens: np.ndarray | None = None, tail: np.ndarray | None = None) -> None:
        """Give a slot back; with a session and tokens its KV row is kept for reuse: the ids
        whose KV it holds are ``tokens`` then ``tail`` (int32 arrays, kept as they are)."""
        tail = _EMPTY if tail is None else np.asarray(tail, np.int32)
        if session_id is not None and tokens is not None and len(tokens) + len(tail) > 0:
            old = self._session_slot.get(session_id)
            if old is not None and old in self._cached:  # an older prefix of the same session
                del self._cached[old]
                self._free.append(old)
            self._cached[slot] = CachedPrefix(session_id, np.asarray(tokens, np.int32), tail)
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


__all__ = ["SlotTable", "CachedPrefix", "common_prefix_length", "session_prefix", "join_blocks"]
