"""Shared by the learner tests: a tiny model, a one-device learner, a random right-padded
rollout batch, the update's own log-prob pass on a batch, and a recorder of the XLA compiles
that happen while a test runs."""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import numpy as np
from jax._src import monitoring

from agentrl_jax.learner import Learner, LearnerConfig, RolloutBatch
from agentrl_jax.learner.layouts import PaddedRows
from agentrl_jax.learner.update import UpdatePipeline
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh
from agentrl_jax.sharding.placement import process_rows, to_host_tree

#: a one-layer model small enough for many updates in a test
TINY_MODEL = ModelConfig(vocab_size=88, hidden_size=32, intermediate_size=40, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)


def update_logprobs(learner: Learner, batch, which: str = "policy", with_entropy: bool = False,
                    process_local: bool = False):
    """Token-aligned ``logprobs [B, T]`` float32 NumPy (``(logprobs, entropy)`` with
    ``with_entropy``) of ``batch``'s rows under the policy (``which="policy"``, in its dtype)
    or the frozen reference (``"reference"``, in ``config.reference_dtype``), computed the way
    ``Learner.update`` computes its old / reference log-probs: the padded layout of an
    ``UpdatePipeline`` places the batch and runs ``learner.logprob_fn`` over it in chunks of
    ``logprob_batch_size`` rows. ``process_local``: ``batch`` holds this process's rows and the
    result is for those rows (a collective: every process calls it)."""
    rollout = RolloutBatch.from_mapping(batch)
    layout = UpdatePipeline(learner, rollout, process_local).layout
    if not isinstance(layout, PaddedRows):
        raise ValueError("update_logprobs runs the padded layout (pack_length=0)")
    if which == "policy":
        params, dtype = learner.params, str(jax.tree.leaves(learner.params)[0].dtype)
    elif which == "reference":
        params, dtype = learner.ref_params, learner.config.reference_dtype
    else:
        raise ValueError(f"which must be 'policy' or 'reference', got {which!r}")
    lp, ent = layout.forward(learner.logprob_fn(dtype), params, layout.place())
    b, t = rollout.shape
    # token-space rows: this process's rows first (in its block), then padding rows
    lp, ent = (jax.tree.map(process_rows, (lp, ent)) if process_local
               else to_host_tree((lp, ent)))
    lp, ent = lp[:b, :t], ent[:b, :t]
    return (lp, ent) if with_entropy else lp



def tiny_learner(cfg: LearnerConfig, seed: int = 0) -> Learner:
    """A learner of ``TINY_MODEL`` (weights from ``seed``) on the first device."""
    return Learner(init_model(TINY_MODEL, seed=seed), cfg,
                   mesh=make_mesh(fsdp=1, devices=jax.devices()[:1]))


def tiny_batch(seed: int, b: int, t: int, group_size: int = 2) -> RolloutBatch:
    """``random_batch`` for ``TINY_MODEL``: 3 prompt tokens, the first row ``t`` tokens long."""
    return random_batch(seed, b, t, TINY_MODEL.vocab_size, group_size, prompt=3,
                        longest_first=True)


def random_batch(seed: int, b: int, t: int, vocab: int, group_size: int, prompt: int,
                 longest_first: bool = False) -> RolloutBatch:
    """``b`` rows of ``t // 2 .. t`` real tokens (the first row exactly ``t`` when
    ``longest_first``), the first ``prompt`` positions unscored, groups of ``group_size``
    consecutive rows, random rewards and sampler log-probs."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(t // 2, t + 1, b)
    if longest_first:
        lens[0] = t
    attn = (np.arange(t)[None] < lens[:, None]).astype(np.int32)
    loss = attn * (np.arange(t)[None] >= prompt)
    return RolloutBatch.from_mapping({
        "tokens": rng.integers(1, vocab, (b, t)).astype(np.int32) * attn,
        "attention_mask": attn, "loss_mask": loss.astype(np.float32),
        "rollout_logprobs": (-rng.random((b, t)) * loss).astype(np.float32),
        "group_id": np.arange(b) // group_size, "reward": rng.random(b).astype(np.float32)})


@contextlib.contextmanager
def recorded_compiles() -> Iterator[list[str]]:
    """The names of the programs XLA compiles inside the block (``jit(name)``), in order."""
    names: list[str] = []

    def listen(event, _secs, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(kw.get("fun_name", ""))
    monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        monitoring.unregister_event_duration_listener(listen)
