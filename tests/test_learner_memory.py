"""The learner's memory on CPU is bounded by design: a SmolLM2-135M-shaped step, compile only.

Model: SmolLM2-135M's exact shape (30 layers, hidden 576, FFN 1536, 9 heads / 3 KV heads of
64, vocabulary 49152, tied embeddings), random (abstract) parameters. Learner config: the
README main job's (float32, remat, KL and entropy terms) with ``micro_batch_size=4``; one
mini-batch of 4 rows x 2048 tokens. ``memory_analysis()`` of the compiled step gives the
buffers XLA allocates: arguments (parameters, AdamW moments, mini-batch), outputs (the
updated parameters and moments, aliased to the donated arguments) and temporaries. The
footprint is ``temp + argument + output - alias`` (outputs aliased to donated arguments
counted once).

Before (commit 14a4f50, same shapes, measured with the same harness on that tree):
temporaries 62.5 GiB, footprint 64.0 GiB (``micro_batch_size=1``: 16.2 / 17.7 GiB). XLA's
CPU attention materialises ``[B, H, T, T]`` float32 scores, probabilities and their
cotangents (0.56 GiB each per layer at B = 4), and ``jax.checkpoint``'s remat has no effect on
XLA:CPU (it removes the optimisation barriers that keep the recomputation in the backward
pass), so every layer's attention tensors stay live until its backward pass. The README's
CPU run (4 rows padded to 8 x 2048) asked for 134,136,529,152 bytes (124.9 GiB).

After: chunked attention (``[B, H, 128, 128]`` blocks), the layer stack as a scanned
``jax.checkpoint`` (only the 30 layer inputs ``[B, T, D]`` are saved), one row per
forward/backward pass on CPU and log-prob chunks of at most 32 MiB of logits: temporaries
1.71 GiB, footprint 3.22 GiB (of which 1.5 GiB are the parameters and AdamW moments). The
bounds below (temporaries 2.5 GiB, footprint 4 GiB) leave room for compiler changes while
staying an order of magnitude under the old numbers and well under the 8 GB that the README's
whole CPU run may use.

One compile of the train step (the slow part) is shared by the tests of this module.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.logprobs import token_logprobs
from agentrl_jax.learner.optim import make_optimizer
from agentrl_jax.learner.train_step import make_train_step
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import abstract_model
from agentrl_jax.sharding.mesh import make_mesh
from agentrl_jax.sharding.rules import state_shardings

GiB = 2**30
SMOLLM2_135M = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                           num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                           tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
                           max_position_embeddings=8192)
ROWS, LENGTH = 4, 2048
CONFIG = LearnerConfig(dtype="float32", remat=True, micro_batch_size=4, kl_coef=0.001,
                       entropy_coef=0.001)
KEYS = ("advantages", "attention_mask", "loss_mask", "old_logprobs", "ref_logprobs", "tokens")

MAX_STEP_TEMP = 2.5 * GiB
MAX_STEP_FOOTPRINT = 4.0 * GiB
MAX_LOGPROB_FOOTPRINT = 1.5 * GiB


def footprint(analysis) -> int:
    return (analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes - analysis.alias_size_in_bytes)


@pytest.fixture(scope="module")
def policy():
    """What ``Learner.__init__`` builds for this model and config, abstractly (no weights):
    graphdef, parameter and AdamW-state shapes and their shardings on one CPU device."""
    cfg = SMOLLM2_135M.replace(dtype=CONFIG.dtype, remat=CONFIG.remat,
                               remat_policy=CONFIG.remat_policy,
                               attention_impl=CONFIG.attention_impl)
    graphdef, params = nnx.split(abstract_model(cfg), nnx.Param)
    mesh = make_mesh(devices=jax.devices()[:1])
    tx, _ = make_optimizer(CONFIG)
    opt_state = jax.eval_shape(tx.init, params)
    return dict(graphdef=graphdef, params=params, opt_state=opt_state, tx=tx, mesh=mesh,
                param_shardings=state_shardings(params, mesh),
                opt_shardings=state_shardings(opt_state, mesh))


@pytest.fixture(scope="module")
def step_memory(policy):
    step = make_train_step(config=CONFIG, mesh=policy["mesh"],
                           policy_graphdef=policy["graphdef"], policy_tx=policy["tx"],
                           policy_shardings=policy["param_shardings"],
                           policy_opt_shardings=policy["opt_shardings"], batch_keys=KEYS)
    shape = (ROWS // CONFIG.micro_batch_size, CONFIG.micro_batch_size, LENGTH)
    minibatch = {k: jax.ShapeDtypeStruct(shape, jnp.int32 if k in ("tokens", "attention_mask")
                                         else jnp.float32) for k in KEYS}
    compiled = step.lower(policy["params"], policy["opt_state"], None, None, minibatch).compile()
    return compiled.memory_analysis()


def test_train_step_memory_is_bounded(step_memory):
    m = step_memory
    params_and_moments = 3 * SMOLLM2_135M.num_parameters * 4  # f32 weights, mu, nu
    assert m.argument_size_in_bytes >= params_and_moments  # the analysis sees the real state
    assert m.temp_size_in_bytes < MAX_STEP_TEMP, m
    assert footprint(m) < MAX_STEP_FOOTPRINT, m


def test_logprob_pass_memory_is_bounded(policy):
    """The forward-only pass (old / reference log-probs + entropy) of 4 x 2048 tokens."""
    graphdef = policy["graphdef"]

    def fn(params, tokens, attention_mask):
        return token_logprobs(graphdef, params, tokens, attention_mask,
                              chunk_size=CONFIG.logprob_chunk_size, with_entropy=True)
    rows = jax.ShapeDtypeStruct((ROWS, LENGTH), jnp.int32)
    m = jax.jit(fn).lower(policy["params"], rows, rows).compile().memory_analysis()
    assert footprint(m) < MAX_LOGPROB_FOOTPRINT, m
