"""A logit prior written into a random model's weights: chosen tokens start ``advantage``
nats above the rest of the vocabulary, in every state, with no change to the network or the
sampler.

Why: a tiny random model over a 49k-token vocabulary has near-uniform logits (std ~0.16), so
at sampling temperature 1 nearly every reply is one of ~49k tokens that no parser reads, and
RL can only raise the few tokens it happened to sample. When the action format is one letter
(``rollout.parser = "choice"``), giving the 26 letters a head start makes the untrained policy
pick among the letters (still at random among them, and most letters name no listed option)
the way a pretrained model does; which letter to give in which state is left to RL. It is an
initialisation, like any other: the learner trains every weight it touches.

How (the network has no output bias, so the prior lives in one residual channel ``c``):

- ``embed[v, c] = level`` for every token ``v``, and the attention and MLP output projections
  write nothing into channel ``c`` (``o_proj[:, c] = down_proj[:, c] = 0``), so the residual
  stream carries ``x[..., c] = level`` at every position;
- after the final RMSNorm that channel is ``h_c = g_c * level / rms(x)``; its mean
  ``h_c_bar`` is measured by one forward pass over the chosen tokens themselves (a fixed probe
  that depends on nothing but the model and the tokens);
- ``lm_head[c, :] = 0`` except ``lm_head[c, v] = advantage / h_c_bar`` for the chosen tokens,
  so ``logit_v = h . lm_head[:, v]`` gains about ``advantage`` for those tokens only (up to how
  much ``rms(x)`` moves between states: tests/test_token_prior.py measures it on chat prompts).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.models.llama import CausalLM

PRIOR_CHANNEL = 0  # the residual channel that carries the prior
PRIOR_LEVEL = 0.1  # its constant value in the residual stream (other channels: ~0.02 each)


def letter_token_ids(tokenizer, letters: str) -> list[int]:
    """The token id of each character of ``letters`` (each must encode to exactly one token,
    with no special tokens added)."""
    if not letters:
        raise ValueError("token prior: no letters given")
    ids = []
    for letter in letters:
        encoded = tokenizer.encode(letter, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"token prior: {letter!r} is {len(encoded)} tokens for this "
                             "tokenizer, not one")
        ids.append(int(encoded[0]))
    if len(set(ids)) != len(ids):
        raise ValueError(f"token prior: {letters!r} repeats a token")
    return ids


def _replace(param, value: jax.Array) -> None:
    """Write ``value`` into an nnx parameter, keeping the parameter's placement."""
    old = param[...]
    param[...] = jax.device_put(value.astype(old.dtype), old.sharding)


def add_token_prior(model: CausalLM, token_ids: Sequence[int], advantage: float) -> float:
    """Give ``token_ids`` a logit head start of about ``advantage`` nats over every other
    token, in place (the module docstring has the construction). Returns the expected
    normalised value ``h_c_bar`` of the prior channel that the output weights were scaled by.

    Needs an untied output layer (with tied embeddings the channel would move every token's
    logit alike)."""
    cfg = model.cfg
    if cfg.tie_word_embeddings:
        raise ValueError("token prior: needs an untied output layer (tie_word_embeddings=False)")
    if advantage <= 0:
        raise ValueError(f"token prior: advantage must be > 0 (got {advantage})")
    ids = np.asarray(list(token_ids), dtype=np.int32)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= cfg.vocab_size:
        raise ValueError(f"token prior: token ids must lie in [0, {cfg.vocab_size})")
    c = PRIOR_CHANNEL
    embedding = model.embed.embedding[...].astype(jnp.float32)
    _replace(model.embed.embedding, embedding.at[:, c].set(PRIOR_LEVEL))
    for layer in model.layers:
        _replace(layer.attn.o_proj.kernel, layer.attn.o_proj.kernel[...].at[:, c].set(0.0))
        _replace(layer.mlp.down_proj.kernel, layer.mlp.down_proj.kernel[...].at[:, c].set(0.0))
    hidden = model(jnp.asarray(ids)[None, :], compute_logits=False).hidden  # [1, n, D]
    expected_h = float(jnp.mean(hidden[0, :, c].astype(jnp.float32)))
    head_row = jnp.zeros((cfg.vocab_size,), jnp.float32).at[ids].set(advantage / expected_h)
    _replace(model.lm_head.kernel, model.lm_head.kernel[...].at[c, :].set(head_row))
    return expected_h


__all__ = ["PRIOR_CHANNEL", "PRIOR_LEVEL", "add_token_prior", "letter_token_ids"]
