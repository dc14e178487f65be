"""``agentrl_common.seeding.derive_seed``: pure Python, and bit-for-bit the seeds the actor pool
drew before (``np.random.SeedSequence`` hashing), so runs keep their random streams."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from agentrl_common.seeding import derive_seed, generate_state

#: derive_seed's outputs when it was ``SeedSequence(parts).generate_state(2, uint32)`` joined
#: high word first, top bit cleared (computed with NumPy before the move)
GOLDEN = {
    (0,): 3527577169254209511,
    (1,): 7883430198869069541,
    (42, 0, 0): 5572090422728994413,
    (42, 0, 1): 8145377254068079085,
    (42, 1, 0): 5074805490833011743,
    (7, 3): 5663826687842732348,
    (2147483647, 5, 9, 11): 1205641477623789861,
    (123456789012, 0): 6241111463889697716,
}


@pytest.mark.parametrize("parts,seed", sorted(GOLDEN.items()))
def test_seeds_are_the_ones_drawn_before(parts, seed):
    assert derive_seed(*parts) == seed


def test_state_matches_numpy_seed_sequence():
    """Random tuples (small ints, 32-bit words, ints wider than 64 bits, more than four words
    of entropy) against NumPy's implementation, several output words."""
    rng = random.Random(0)
    cases = [(), (0, 0, 0, 0), (2**64 + 5, 3, 1, 2, 9, 8, 7, 6)]
    for _ in range(300):
        cases.append(tuple(rng.choice([rng.randrange(2**32), rng.randrange(2**70),
                                       rng.randrange(100)]) for _ in range(rng.randrange(9))))
    for parts in cases:
        want = np.random.SeedSequence(list(parts)).generate_state(5, np.uint32)
        assert generate_state(parts, 5) == [int(w) for w in want], parts
        words = np.random.SeedSequence(list(parts)).generate_state(2, np.uint32)
        assert derive_seed(*parts) == ((int(words[0]) << 32) | int(words[1])) & (2**63 - 1)


def test_numpy_integers_are_accepted_and_bad_parts_refused():
    assert derive_seed(np.int64(42), np.uint32(1), 0) == GOLDEN[(42, 1, 0)]
    with pytest.raises(ValueError, match="non-negative"):
        derive_seed(3, -1)
    with pytest.raises(TypeError, match="integers"):
        derive_seed(1.5)


def test_actor_pool_imports_neither_jax_nor_numpy():
    """An actor worker imports the actor pool, its episodes and worker loop: no JAX (seconds of
    start-up and a device client per worker), no NumPy either."""
    code = ("import sys, agentrl_jax.agent.actor_pool, agentrl_jax.agent.episode, "
            "agentrl_jax.agent.workers; print(sorted(m for m in ('jax', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
