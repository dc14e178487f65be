"""Attention-input sharding constraints under ``activation_mesh`` (8 virtual CPU devices)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from agentrl_jax.sharding.activations import (activation_mesh, attention_spec,
                                              constrain_attention_inputs)
from agentrl_jax.sharding.mesh import make_mesh


def test_attention_spec_layouts():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert attention_spec(mesh, 8, 12, 2) == P(("data", "fsdp"), None, "tensor", None)
    # tensor does not divide the KV heads: heads replicated (q/k/v must match for cuDNN)
    assert attention_spec(mesh, 8, 12, 3) == P(("data", "fsdp"), None, None, None)
    # batch not divisible by data x fsdp = 4: no constraint
    assert attention_spec(mesh, 6, 12, 2) is None
    fsdp_only = make_mesh(data=1, fsdp=8, tensor=1)
    assert attention_spec(fsdp_only, 8, 4, 2) == P(("fsdp",), None, None, None)


def test_constraint_sets_common_sharding_and_keeps_values():
    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((4, 8, 4, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((4, 8, 2, 16)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((4, 8, 2, 16)), jnp.float32)

    def f(q, k, v):
        with activation_mesh(mesh):
            return constrain_attention_inputs(q, k, v)

    outs = jax.jit(f)(q, k, v)
    for o, x in zip(outs, (q, k, v)):
        np.testing.assert_array_equal(np.asarray(o), np.asarray(x))
        assert o.sharding.spec[0] in ("fsdp", ("fsdp",)) and o.sharding.spec[2] == "tensor"
    # outside the context: identity, no constraint
    assert constrain_attention_inputs(q, k, v)[0] is q
