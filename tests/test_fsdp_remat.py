"""FSDP under per-layer remat: the learner's compiled micro-batch step keeps the batch split.

With ``jax.checkpoint`` around each layer (the GPU default, ``remat_impl="checkpoint"``) the
Shardy partitioner once lost the batch split in the backward pass: every device recomputed and
differentiated the whole micro-batch against hidden-sharded weights and all-reduced partial
sums (docs/PERFORMANCE.md, the 7B step's memory). Reference: the same step compiled without
remat on the same 4-device FSDP mesh (8 virtual CPU devices, conftest.py), which splits the
batch and all-gathers the weights. Compile only: nothing runs.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.optim import make_optimizer
from agentrl_jax.learner.packed_step import PackedSteps
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.sharding.mesh import make_mesh
from agentrl_jax.sharding.rules import batch_sharding, state_shardings

ROWS, LENGTH = 4, 96  # one micro-batch: 384 tokens, 96 per device on fsdp=4
SHAPE = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
             num_kv_heads=2, head_dim=64, attention_bias=True, tie_word_embeddings=False)
KEYS = ("advantages", "is_weights", "loss_mask", "loss_weights", "old_logprobs", "positions",
        "segment_ids", "tokens")


def compiled_step_text(remat: bool, remat_impl: str | None) -> str:
    """HLO of the learner's micro-batch step (forward, backward, gradient accumulation)."""
    mesh = make_mesh(fsdp=4, devices=jax.devices()[:4])
    lcfg = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="bfloat16", remat=remat,
                         micro_batch_size=ROWS,
                         pack_length=LENGTH, mesh=dict(fsdp=4))
    mcfg = ModelConfig(**SHAPE).replace(dtype="bfloat16", remat=remat, remat_impl=remat_impl,
                                        attention_impl="chunked")
    graphdef, params = nnx.split(nnx.eval_shape(lambda: CausalLM(mcfg, nnx.Rngs(0))), nnx.Param)
    param_shardings = state_shardings(params, mesh)
    tx, _ = make_optimizer(lcfg)
    opt = jax.eval_shape(tx.init, params)
    steps = PackedSteps(config=lcfg, mesh=mesh, graphdef=graphdef, tx=tx,
                        param_shardings=param_shardings,
                        opt_shardings=state_shardings(opt, mesh), batch_keys=tuple(sorted(KEYS)))

    def abstract(tree, shardings, dtype=None):
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, dtype or x.dtype,
                                                              sharding=s), tree, shardings)

    rows = batch_sharding(mesh, 2)
    micro = {k: jax.ShapeDtypeStruct((ROWS, LENGTH), jnp.int32 if k in
                                     ("positions", "segment_ids", "tokens") else jnp.float32,
                                     sharding=rows) for k in KEYS}
    replicated = NamedSharding(mesh, P())
    aparams = abstract(params, param_shardings)
    metrics = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32,
                                                          sharding=replicated),
                           jax.eval_shape(steps.metric_shapes, aparams, micro))
    lowered = steps.accumulate.lower(aparams, abstract(params, param_shardings, jnp.float32),
                                     metrics, micro,
                                     jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated))
    return lowered.compile().as_text()


def dot_shapes(hlo: str) -> list[list[int]]:
    return [[int(d) for d in dims.split(",")]
            for dims in re.findall(r"= \w+\[([\d,]+)\]\S* dot\(", hlo)]


def count(hlo: str, op: str) -> int:
    return len(re.findall(rf" {op}\(", hlo))


@pytest.fixture(scope="module")
def without_remat() -> str:
    return compiled_step_text(remat=False, remat_impl=None)


@pytest.mark.parametrize("remat_impl", ["checkpoint", "scan"])
def test_remat_keeps_the_fsdp_batch_split(without_remat, remat_impl):
    with_remat = compiled_step_text(remat=True, remat_impl=remat_impl)
    whole = ROWS * LENGTH
    # the reference splits the batch: its dots see a quarter of the micro-batch's tokens
    assert any(whole // 4 in shape for shape in dot_shapes(without_remat))
    assert not any(whole in shape for shape in dot_shapes(without_remat))
    # ... and so does the remat step, forward, recomputation and backward alike
    assert not [shape for shape in dot_shapes(with_remat) if whole in shape]
    assert count(with_remat, "all-reduce") <= count(without_remat, "all-reduce") + 1
    assert count(with_remat, "all-gather") >= count(without_remat, "all-gather")
