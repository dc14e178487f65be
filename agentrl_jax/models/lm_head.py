"""The LM head in float32: ``hidden [..., D] -> logits [..., V]`` with the matmul's result kept
in float32 while its operands stay in the compute dtype.

Shared by the learner's log-probabilities and the rollout engine's sampler, so both score
tokens with the same logits (a PPO ratio compares the two).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from agentrl_jax.models.llama import CausalLM
from agentrl_jax.models.output_tokens import restrict_logits

Array = jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def head_logits(h: Array, w: Array, vocab_major: bool) -> Array:
    """LM-head logits in float32 from compute-dtype operands.

    ``h [..., D]`` and ``w`` (``[V, D]`` if ``vocab_major`` (a tied embedding), else
    ``[D, V]``) in the compute dtype; returns ``logits [..., V]`` float32 (the matmul
    accumulates and stores in f32: ``preferred_element_type``).

    Backward: the f32 logits cotangent is rounded to the compute dtype before the two
    gradient matmuls (``dh = g W``, ``dW = g^T h``, f32 accumulation). Without this rule,
    autodiff of an f32-output matmul multiplies the f32 cotangent by an f32 upcast of ``W``,
    i.e. two [tokens x V x D] TF32 GEMMs plus a [V, D] f32 convert per micro-batch chunk (a visible
    share of a 1.5B step: docs/PERFORMANCE.md). The parameter gradients end in the compute
    dtype either way (a cotangent has its primal's dtype), so only the rounding point of the
    logits cotangent moves. In float32 mode this is exactly autodiff's rule.
    """
    spec = "...d,vd->...v" if vocab_major else "...d,dv->...v"
    return jnp.einsum(spec, h, w, preferred_element_type=jnp.float32)


def _head_logits_fwd(h, w, vocab_major):
    return head_logits(h, w, vocab_major), (h, w)


def _head_logits_bwd(vocab_major, res, g):
    h, w = res
    g = g.astype(h.dtype)
    if vocab_major:  # w [V, D]
        dh = jnp.einsum("...v,vd->...d", g, w, preferred_element_type=jnp.float32)
        dw = jnp.einsum("...v,...d->vd", g, h, preferred_element_type=jnp.float32)
    else:  # w [D, V]
        dh = jnp.einsum("...v,dv->...d", g, w, preferred_element_type=jnp.float32)
        dw = jnp.einsum("...d,...v->dv", h, g, preferred_element_type=jnp.float32)
    return dh.astype(h.dtype), dw.astype(w.dtype)


head_logits.defvjp(_head_logits_fwd, _head_logits_bwd)


def lm_head_f32(model: CausalLM) -> Callable[[Array], Array]:
    """``hidden [..., D] -> logits [..., V]`` float32, like ``model.logits`` but with the head
    matmul's result kept in float32 (``preferred_element_type``) instead of being rounded to
    the bf16 compute dtype first: bf16 logits carry ~3 significant digits (a logit of 20 is
    +-0.06), which is visible in PPO ratios. Operands stay in the compute dtype, so the matmul
    (and, through :func:`head_logits`' backward rule, its gradient matmuls) run at bf16 speed;
    in float32 mode this equals ``model.logits``.

    With ``cfg.output_token_ids`` the logits of every other token are -inf
    (``output_tokens.restrict_logits``): this is where the engine's sampler and the learner's
    log-probs (full and scored head, padded and packed rows) get their logits, so a restricted
    policy is restricted identically in both."""
    cfg = model.cfg
    dtype = jnp.dtype(cfg.dtype)

    def fn(h: Array) -> Array:
        h = h.astype(dtype)
        if cfg.tie_word_embeddings:
            logits = head_logits(h, model.embed.embedding[...].astype(dtype), True)
        else:
            logits = head_logits(h, model.lm_head.kernel[...].astype(dtype), False)
        return restrict_logits(logits, cfg.output_token_ids)
    return fn


__all__ = ["head_logits", "lm_head_f32"]
