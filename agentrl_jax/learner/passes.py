"""The learner's jitted forward-only passes (log-probs of padded or packed rows, critic
values), with explicit shardings, each compile announced (``compile_notice.py``), and cached
across learners of the same model / config / mesh (``jit_cache.py``).

    logprob_fn(...)(params, tokens, attention_mask [n, T]) -> (logprobs, entropy) [n, T]
    logprob_fn(..., capacity)(params, tokens, attention_mask, loss_mask [n, T]) -> logprobs
    packed_logprob_fn(...)(params, tokens, segment_ids, positions [R, P]) -> logprobs [R, P]
    packed_logprob_fn(..., capacity)(params, tokens, segment_ids, positions, loss_mask [R, P])

With ``with_options`` each of them takes one more trailing argument, ``option_counts`` (int,
the shape of ``tokens``): per-token option limits (``models/output_tokens.py``).
    value_fn(...)(critic_params, tokens, attention_mask [n, T]) -> values [n, T]

Token alignment: ``logprobs.py``. The builders close over their arguments only (never a
learner: the cache outlives learners).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from agentrl_jax.compile_notice import Announced
from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.critic import values_fn
from agentrl_jax.learner.jit_cache import cached
from agentrl_jax.learner.logprobs import token_logprobs
from agentrl_jax.learner.scored import scored_token_logprobs
from agentrl_jax.learner.train_step import cast_params
from agentrl_jax.sharding.activations import activation_mesh
from agentrl_jax.sharding.rules import batch_sharding


def _length(value: Any) -> int | None:
    """The token axis (last) of the ``tokens`` array in ``value`` (an array or a batch dict)."""
    tokens = value.get("tokens") if isinstance(value, dict) else value
    shape = getattr(tokens, "shape", None)
    return int(shape[-1]) if shape else None


def announced(fn: Any, what: str, key_args: tuple[int, ...] = (1, 2)) -> Announced:
    """``fn`` (jitted; its tokens are argument ``key_args[0]``) with each compile announced as
    ``"compiling <what> for length T"`` (``compile_notice.py``)."""
    return Announced(fn, key_args,
                     lambda args: f"{what} for length {_length(args[key_args[0]])}")


def logprob_fn(graphdef: nnx.GraphDef, mesh: Mesh, shardings: Any, cfg: LearnerConfig,
               params_dtype: str, capacity: int | None = None, with_options: bool = False):
    """Log-probs and entropies of ``[n, T]`` rows (``n`` a multiple of the batch shards).
    ``capacity``: the update's pass, ``(params, tokens, attention_mask, loss_mask) -> logprobs``
    with the LM head only at the scored positions, at most ``capacity`` a row (``scored.py``;
    0 elsewhere; no entropy: the update does not read it). ``with_options``: a trailing
    ``option_counts [n, T]`` argument (module docstring)."""
    key = ("logprobs", graphdef, mesh, params_dtype, cfg.dtype, cfg.logprob_chunk_size,
           cfg.temperature, cfg.use_attention_mask, capacity, with_options)

    def build():
        bs = batch_sharding(mesh, 2)
        options = (bs,) if with_options else ()

        def fn(params, tokens, attention_mask, option_counts=None):
            with activation_mesh(mesh):
                # cast where the shards live, as the update does: the model computes in
                # cfg.dtype anyway (same values), and FSDP gathers half the bytes (bf16)
                return token_logprobs(graphdef, cast_params(params, cfg.dtype), tokens,
                                      attention_mask, chunk_size=cfg.logprob_chunk_size,
                                      temperature=cfg.temperature, with_entropy=True,
                                      use_attention_mask=cfg.use_attention_mask,
                                      option_counts=option_counts)

        def scored(params, tokens, attention_mask, loss_mask, option_counts=None):
            with activation_mesh(mesh):
                return scored_token_logprobs(
                    graphdef, cast_params(params, cfg.dtype), tokens, attention_mask,
                    loss_mask, capacity, chunk_size=cfg.logprob_chunk_size,
                    temperature=cfg.temperature, use_attention_mask=cfg.use_attention_mask,
                    option_counts=option_counts)

        if capacity is None:
            return announced(jax.jit(fn, in_shardings=(shardings, bs, bs) + options,
                                     out_shardings=(bs, bs)), "the log-prob pass")
        return announced(jax.jit(scored, in_shardings=(shardings, bs, bs, bs) + options,
                                 out_shardings=bs),
                         f"the log-prob pass (LM head at {capacity} scored positions a row)",
                         key_args=(1, 2, 3))
    return cached(key, build)


def packed_logprob_fn(graphdef: nnx.GraphDef, mesh: Mesh, shardings: Any, cfg: LearnerConfig,
                      params_dtype: str, capacity: int | None = None,
                      with_options: bool = False):
    """Log-probs of packed ``[R, P]`` rows (segment ids and positions restart per sequence).
    ``capacity``: ``(params, tokens, segment_ids, positions, loss_mask) -> logprobs`` with the
    LM head only at the scored positions, at most ``capacity`` a row (``scored.py``).
    ``with_options``: a trailing ``option_counts [R, P]`` argument (module docstring)."""
    key = ("packed_logprobs", graphdef, mesh, params_dtype, cfg.dtype, cfg.logprob_chunk_size,
           cfg.temperature, capacity, with_options)

    def build():
        bs = batch_sharding(mesh, 2)

        def packed_logprobs(params, tokens, segment_ids, positions, *rest):
            loss_mask = rest[0] if capacity is not None else None
            option_counts = rest[-1] if with_options else None
            with activation_mesh(mesh):  # compute-dtype cast: see logprob_fn
                head = dict(chunk_size=cfg.logprob_chunk_size, temperature=cfg.temperature,
                            segment_ids=segment_ids, positions=positions,
                            option_counts=option_counts)
                compute = cast_params(params, cfg.dtype)
                if capacity is not None:
                    return scored_token_logprobs(graphdef, compute, tokens, None, loss_mask,
                                                 capacity, **head)
                lp, _ = token_logprobs(graphdef, compute, tokens, None, **head)
            return lp

        n_in = (4 if capacity is None else 5) + int(with_options)
        what = "the packed log-prob pass" + (
            f" (LM head at {capacity} scored positions a row)" if capacity is not None else "")
        return announced(jax.jit(packed_logprobs, in_shardings=(shardings,) + (bs,) * (n_in - 1),
                                 out_shardings=bs), what, key_args=tuple(range(1, n_in)))
    return cached(key, build)


def value_fn(critic_graphdef: nnx.GraphDef, mesh: Mesh, critic_shardings: Any,
             use_attention_mask: bool):
    """Critic values of ``[n, T]`` rows (``values[:, t] = V(tokens[:, :t])``)."""
    key = ("values", critic_graphdef, mesh, use_attention_mask)

    def build():
        bs = batch_sharding(mesh, 2)
        fn = functools.partial(values_fn, critic_graphdef, use_attention_mask=use_attention_mask)

        def traced(p, t, a):
            with activation_mesh(mesh):
                return fn(p, t, a)
        return announced(jax.jit(traced, in_shardings=(critic_shardings, bs, bs),
                                 out_shardings=bs), "the value pass")
    return cached(key, build)


__all__ = ["announced", "logprob_fn", "packed_logprob_fn", "value_fn"]
