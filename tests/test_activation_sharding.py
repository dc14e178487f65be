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


def test_batch_sharded_constraint():
    from agentrl_jax.sharding.activations import constrain_batch_sharded

    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    x = jnp.arange(8 * 3 * 6, dtype=jnp.float32).reshape(8, 3, 6)

    def f(x):
        with activation_mesh(mesh):
            return constrain_batch_sharded(x), constrain_batch_sharded(x, tensor_last=True)

    plain, tp = jax.jit(f)(x)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(x))
    spec = tuple(plain.sharding.spec) + (None,) * 3  # trailing Nones may be dropped
    assert spec[0] == ("data", "fsdp") and spec[1:3] == (None, None)
    assert tuple(tp.sharding.spec)[2] == "tensor"


def _collective_shapes(hlo: str) -> list[tuple[str, tuple[int, ...]]]:
    import re

    out = []
    for m in re.finditer(r"= \(?(\w+)\[([\d,]*)\][^=]*? (all-reduce|all-gather|reduce-scatter)"
                         r"(?:-start)?\(", hlo):
        dims = tuple(int(d) for d in m.group(2).split(",") if d)
        out.append((m.group(3), dims))
    return out


def test_fsdp_train_step_gathers_weights_not_activations():
    """On an fsdp=2 mesh the compiled PPO step must move *weights* (all-gather) and gradients,
    never per-token activations ``[micro_batch, T, D | F | H*Dh]``: without the activation
    constraints XLA split the contraction dimension and all-reduced activations per matmul."""
    from flax import nnx

    from agentrl_jax.learner import Learner, LearnerConfig
    from agentrl_jax.learner.train_step import minibatch_sharding
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import CausalLM

    cfg = ModelConfig(vocab_size=256, hidden_size=96, intermediate_size=160, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=24, model_type="qwen2",
                      tie_word_embeddings=True, attention_bias=True)
    mesh = make_mesh(devices=jax.devices()[:2], data=1, fsdp=2, tensor=1)
    mb, T = 4, 64
    learner = Learner(CausalLM(cfg, nnx.Rngs(0)), LearnerConfig(kl_coef=0.0, entropy_coef=0.0,
                                                                dtype="float32", remat=False,
                      micro_batch_size=mb, min_length_bucket=T), mesh=mesh)
    shape = (2, mb, T)
    batch = {"tokens": np.zeros(shape, np.int32), "attention_mask": np.ones(shape, np.int32),
             "loss_mask": np.ones(shape, np.float32), "old_logprobs": np.zeros(shape, np.float32),
             "advantages": np.ones(shape, np.float32)}
    sh = minibatch_sharding(mesh)
    batch = {k: jax.device_put(v, sh) for k, v in batch.items()}
    step = learner.train_step(tuple(sorted(batch)), True, False)
    hlo = step.lower(learner.params, learner.opt_state, None, None, batch).compile().as_text()
    shapes = _collective_shapes(hlo)
    activation_widths = {cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim,
                         cfg.num_kv_heads * cfg.head_dim}
    bad = [(op, d) for op, d in shapes
           if len(d) == 3 and d[:2] in ((mb, T), (mb // 2, T)) and d[2] in activation_widths]
    assert not bad, f"activation collectives in the FSDP step: {bad}"
    # and the weights are gathered: an [D, F] MLP kernel appears whole in an all-gather
    assert ("all-gather", (cfg.hidden_size, cfg.intermediate_size)) in shapes, shapes
