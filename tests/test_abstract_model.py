"""``models.llama.abstract_model``: traced once per config and copied per call. References: a
real initialisation of the same config (its arrays' shapes and dtypes) and a fresh trace."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.models import llama
from agentrl_jax.models.config import ModelConfig

SHAPE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
             num_kv_heads=2, head_dim=8)


def _shapes(model: nnx.Module) -> dict[tuple, tuple]:
    return {path: (tuple(v.shape), jnp.dtype(v.dtype))
            for path, v in nnx.to_flat_state(nnx.state(model))}


def test_the_abstract_model_is_the_real_models_shape():
    cfg = ModelConfig(**SHAPE)
    real = llama.CausalLM(cfg, rngs=nnx.Rngs(0))
    abstract = llama.abstract_model(cfg)
    assert _shapes(abstract) == _shapes(real)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(abstract)))
    assert _shapes(llama.abstract_model(cfg)) == _shapes(llama._trace_abstract(cfg))


def test_each_call_is_its_own_copy_and_the_config_is_the_key():
    cfg = ModelConfig(**SHAPE)
    llama._abstract_split.cache_clear()
    a, b = llama.abstract_model(cfg), llama.abstract_model(cfg)
    assert llama._abstract_split.cache_info().misses == 1  # traced once
    flat_a, flat_b = nnx.to_flat_state(nnx.state(a)), nnx.to_flat_state(nnx.state(b))
    assert all(va is not vb for (_, va), (_, vb) in zip(flat_a, flat_b))
    path, variable = flat_a[0]
    variable.value = jnp.zeros(variable.shape, variable.dtype)  # a caller fills in one copy
    assert isinstance(dict(flat_b)[path].value, jax.ShapeDtypeStruct)
    assert isinstance(dict(nnx.to_flat_state(nnx.state(llama.abstract_model(cfg))))[path].value,
                      jax.ShapeDtypeStruct)
    deeper = ModelConfig(**{**SHAPE, "num_layers": 3})
    assert len(_shapes(llama.abstract_model(deeper))) > len(_shapes(a))


def test_a_config_that_cannot_be_hashed_is_traced_each_time():
    cfg = ModelConfig(**SHAPE, rope_scaling=(("rope_type", "default"), ("unused", [1, 2])))
    llama._abstract_split.cache_clear()
    assert _shapes(llama.abstract_model(cfg)) == _shapes(llama.CausalLM(cfg, rngs=nnx.Rngs(0)))
    assert llama._abstract_split.cache_info().misses == 0
