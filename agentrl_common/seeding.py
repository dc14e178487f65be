"""Per-episode and per-turn sampling seeds, in pure Python.

``derive_seed(*parts)`` maps a tuple of non-negative integers (run seed, task group, sample,
turn...) to a 63-bit seed: distinct tuples give unrelated seeds, the same tuple the same seed.
It is NumPy's ``SeedSequence`` hashing (``np.random.SeedSequence(parts).generate_state(2,
np.uint32)``, the two words joined high-first, the top bit cleared), written out here so that
actor workers compute seeds without importing NumPy or JAX; the seeds are bit-for-bit those of
NumPy's implementation.

The hashing (O'Neill's seed_seq design as NumPy implements it), with all arithmetic modulo 2^32:

* the entropy is the concatenation of each part's 32-bit words, least significant first
  (``0`` is one word ``0``);
* a pool of 4 words: word ``i`` is ``hashmix(entropy[i])`` (``0`` past the end); then every pool
  word is mixed with ``hashmix`` of every other, then with ``hashmix`` of each entropy word past
  the fourth; ``hashmix(v) = h(v XOR c) ...`` with a running multiplier constant ``c``;
* output word ``k`` is the pool word ``k mod 4`` hashed once more with a second running constant.
"""

from __future__ import annotations

_MASK32 = 0xFFFFFFFF
_POOL_SIZE = 4
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_MULT_L = 0xCA01F9DD
_MIX_MULT_R = 0x4973F715
_XSHIFT = 16


def _words(part: int) -> list[int]:
    """``part`` as 32-bit words, least significant first (``0`` -> ``[0]``)."""
    if isinstance(part, bool) or not isinstance(part, int):
        try:
            part = int(part.__index__())  # NumPy integers
        except AttributeError:
            raise TypeError(f"seed parts must be integers, got {part!r}") from None
    if part < 0:
        raise ValueError(f"seed parts must be non-negative, got {part}")
    if part == 0:
        return [0]
    words = []
    while part:
        words.append(part & _MASK32)
        part >>= 32
    return words


def _mix(x: int, y: int) -> int:
    result = (_MIX_MULT_L * x - _MIX_MULT_R * y) & _MASK32
    return result ^ (result >> _XSHIFT)


def _pool(entropy: list[int]) -> list[int]:
    """The 4-word pool of ``SeedSequence.mix_entropy``."""
    hash_const = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal hash_const
        value ^= hash_const
        hash_const = (hash_const * _MULT_A) & _MASK32
        value = (value * hash_const) & _MASK32
        return value ^ (value >> _XSHIFT)

    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = _mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL_SIZE, len(entropy)):
        for dst in range(_POOL_SIZE):
            pool[dst] = _mix(pool[dst], hashmix(entropy[src]))
    return pool


def generate_state(parts: tuple[int, ...] | list[int], n_words: int) -> list[int]:
    """``np.random.SeedSequence(list(parts)).generate_state(n_words, np.uint32)`` as ints."""
    entropy = [w for part in parts for w in _words(part)]
    pool = _pool(entropy)
    hash_const = _INIT_B
    state = []
    for k in range(n_words):
        value = pool[k % _POOL_SIZE] ^ hash_const
        hash_const = (hash_const * _MULT_B) & _MASK32
        value = (value * hash_const) & _MASK32
        state.append(value ^ (value >> _XSHIFT))
    return state


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from a tuple of non-negative integers (``SeedSequence`` hashing): distinct
    tuples give unrelated seeds, the same tuple the same seed. Used to give every (run seed,
    task group, sample, turn) its own random stream."""
    high, low = generate_state(parts, 2)
    return ((high << 32) | low) & ((1 << 63) - 1)


__all__ = ["derive_seed", "generate_state"]
