"""A resumed run's engine and the learner's donated buffers.

On resume the embedded engine is built from the restored policy. ``learner.policy_model()``
holds the learner's own parameter arrays and the engine keeps them as they are, so the first
update, which donates those buffers, deletes the engine's weights; with ``max_staleness >= 1``
that update runs while a rollout decodes. Proven here on CPU (the engine fails with "Array has
been deleted"), and the trainer's ``engine_policy(..., overlap=True)`` gives the engine its own
copy: it keeps decoding with the pre-update weights, token for token.
"""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.learner import Learner
from agentrl_jax.rollout.contract import RolloutError, SamplingParams
from agentrl_jax.training.runtime.policy import engine_policy
from rollout_helpers import make_engine, random_prompt, reference_greedy, tiny_model
from test_learner import BASE, multiturn_batch

GREEDY = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)


def _buffers(tree) -> set[int]:
    """Addresses of every device buffer of ``tree``'s arrays."""
    return {shard.data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)
            for shard in x.addressable_shards}


def _generate(engine, prompt):
    return asyncio.run(engine.generate(prompt, GREEDY))


def test_engine_on_the_learners_arrays_loses_them_and_engine_policy_copies():
    model = tiny_model(seed=4)
    learner = Learner(model, BASE)
    # host copies taken from device copies: a host view of a CPU buffer itself would hold a
    # reference that keeps XLA from donating it
    before = jax.tree.map(lambda x: np.asarray(jnp.copy(x)), learner.params)
    shared = make_engine(learner.policy_model(), warmup=False)  # the old resume path
    own = make_engine(engine_policy(learner, overlap=True), warmup=False)  # the fixed one
    try:
        # the old path: the engine holds (some of) the learner's buffers themselves
        assert _buffers(shared.weights.state) & _buffers(learner.params)
        # the fix: none of them; without overlap the arrays themselves (no second copy)
        assert not _buffers(own.weights.state) & _buffers(learner.params)
        assert _buffers(engine_policy(learner, overlap=False)) == _buffers(learner.params)

        learner.update(multiturn_batch(1))  # donates learner.params (an overlapped update)
        after = jax.tree.map(np.asarray, jax.device_get(learner.params))
        assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                            jax.tree.leaves(after)))
        prompt = random_prompt(np.random.default_rng(0), 9)
        assert any(x.is_deleted() for x in jax.tree.leaves(shared.weights.state))
        with pytest.raises(RolloutError, match="deleted"):
            _generate(shared, prompt)
        # the engine with its own copy still decodes, with the restored (pre-update) weights
        assert not any(x.is_deleted() for x in jax.tree.leaves(own.weights.state))
        model_before = tiny_model(seed=4)
        nnx.update(model_before, jax.tree.map(np.asarray, before))
        assert _generate(own, prompt).output_ids == reference_greedy(model_before, prompt, 5)
    finally:
        shared.close()
        own.close()
