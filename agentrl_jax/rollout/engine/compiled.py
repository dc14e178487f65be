"""The engine's jitted device functions: fused multi-step decode, chunked prefill, row copy.

The per-slot decode state travels as two packed arrays (one host-to-device copy per call):
``ints [B, STOP + max_stop_ids]`` with the columns below and ``floats [B, 3]`` (temperature,
top-p, min-p).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.models.lm_head import lm_head_f32
from agentrl_jax.models.output_tokens import limit_to_options, option_ranks
from agentrl_jax.rollout.engine.forward import (DECODE_GEMM, DENSE, FLASH_IN_CACHE,
                                                FLASH_IN_CACHE_INTERPRET, HEAD_MAJOR, forward,
                                                map_cache, merge_projections)
from agentrl_jax.kernels.prefill_attention import unsupported_prefill_shape
from agentrl_jax.rollout.engine.prefill_plan import split_rows
from agentrl_jax.rollout.engine.sampling import sample_tokens

# Columns of the packed per-slot int32 array: last token, its position, active flag, tokens
# left, top-k, sampled-token counter, PRNG key (2 words), sample index, option limit (0: none;
# ``models/output_tokens.py``), stop ids (the rest).
TOK, POS, ACT, REM, TOPK, CNT, KEY0, KEY1, IDX, OPT, STOP = range(11)
# Columns of the packed float32 array.
TEMP, TOPP, MINP = range(3)
#: the decode call's loop: ``while`` stops as soon as its condition fails (a data-dependent
#: ``lax.while_loop``: XLA:GPU reads the condition on the host every iteration); ``fixed`` runs
#: ``decode_steps`` iterations (a trip count XLA knows) whose steps after the condition fails
#: change nothing, so both return the same valid outputs, step count and cache
DECODE_LOOPS = ("while", "fixed")


@dataclasses.dataclass
class EngineFunctions:
    """The compiled device functions one engine calls (signatures at
    :func:`compiled_functions`). Owns nothing but the references: the compilations are cached
    per model structure and engine shape by ``compiled_functions``; the engine may wrap them
    (``compile_notice.Announced``), and a probe may replace one."""

    decode: Callable
    prefill: Callable
    copy_rows: Callable
    merge: Callable


@functools.lru_cache(maxsize=16)
def compiled_functions(graphdef: Any, state_treedef: Any, max_batch: int, max_length: int,
                       decode_steps: int,
                       max_stop_ids: int, kv_layout: str, decode_attention: str = DENSE,
                       decode_gemm: str = "xla", one_pass_sampler: bool = False,
                       prefill_attention: str = DENSE, decode_loop: str = "while"
                       ) -> tuple[Callable, Callable, Callable, Callable]:
    """The jitted ``decode`` / ``prefill`` / ``copy_rows`` / ``merge`` functions for one model
    structure and engine shape (cached, so engines of the same shape share compilations; jit
    itself keys on the inputs' devices, so replicas on different devices compile their own
    executables).

    ``decode((leaves, merged), cache, ints [B, C], floats [B, 3], num_steps, exit_on_finish,
    mode)`` -> ``(cache, (tokens, logprobs, raw logprobs, valid) each [decode_steps, B], steps)``;
    ``prefill(leaves, cache, rows [R * (2T + 1)], T, kv_len)`` -> cache: ``rows`` a
    ``prefill_plan.PrefillRows`` array (the tokens ``[R, T]``, the positions ``[R, T]`` and the
    rows' slot ids ``[R]`` in one host array: one transfer, one GIL hand-off, where three
    arrays took three); static ``T`` and ``kv_len`` (the rows' first ``kv_len`` positions are
    read and written);
    ``leaves``: the served ``nnx.State``'s leaves (``jax.tree.leaves``, a tuple), rebuilt
    inside with ``state_treedef`` (``jax.tree.structure`` of that state): a tuple of arrays
    crosses the jit boundary in C++, where an ``nnx.State`` is flattened by Python on every
    call (docs/PERFORMANCE.md, "The weights as leaves"). ``copy_rows(cache, pairs [2, N])``
    -> cache: row ``pairs[0, i]``'s KV copied to row ``pairs[1, i]`` (one host array, as the
    prefill's; rows ``>= B`` are dropped);
    ``merge(state)`` -> ``merged``: the q/k/v and gate/up weights concatenated
    (``forward.merge_projections``; None for ``decode_gemm="xla"``), built by the engine once per
    weight version and passed to every decode call. ``decode_gemm``: one of
    :data:`DECODE_GEMM` (the decode call only); ``one_pass_sampler``: ``sample_tokens``'s
    ``one_pass`` (the engine turns it on for GPUs); ``prefill_attention``: the prefill call's
    attention (``forward.forward``: ``dense``, ``flash`` or ``flash_interpret`` on the gathered
    rows; ``flash_in_cache`` (/ ``_interpret``) on the rows where they are in the cache, with no
    gather or write-back, where the kernel's tiles cover the call's shape, else dense on the
    gathered rows); ``decode_loop``: one of :data:`DECODE_LOOPS`."""
    if decode_gemm not in DECODE_GEMM:
        raise ValueError(f"decode_gemm must be one of {DECODE_GEMM}, got {decode_gemm!r}")
    if decode_loop not in DECODE_LOOPS:
        raise ValueError(f"decode_loop must be one of {DECODE_LOOPS}, got {decode_loop!r}")
    B, S, K, M = max_batch, max_length, decode_steps, max_stop_ids

    def decode(weights, cache, ints, floats, num_steps, exit_on_finish, mode):
        leaves, merged = weights
        model = nnx.merge(graphdef, jax.tree.unflatten(state_treedef, leaves))
        # the learner's LM head: compute-dtype operands, float32 logits (bf16-rounded logits
        # would put ~0.06 of noise on a logit of 20 and skew the PPO ratio)
        head = lm_head_f32(model)
        top_k, keys = ints[:, TOPK], jax.lax.bitcast_convert_type(ints[:, KEY0:KEY1 + 1],
                                                                   jnp.uint32)
        sample_index, stop_ids = ints[:, IDX], ints[:, STOP:STOP + M]
        option_ids = model.cfg.option_token_ids  # per-slot option limits (SamplingParams)
        ranks = (None if option_ids is None
                 else option_ranks(option_ids, model.cfg.vocab_size))  # [V], a constant
        temperature, top_p, min_p = floats[:, TEMP], floats[:, TOPP], floats[:, MINP]
        outputs = (jnp.zeros((K, B), jnp.int32), jnp.zeros((K, B), jnp.float32),
                   jnp.zeros((K, B), jnp.float32), jnp.zeros((K, B), jnp.bool_))
        carry = (jnp.int32(0), cache, ints[:, TOK], ints[:, POS], ints[:, ACT] > 0,
                 ints[:, REM], ints[:, CNT], jnp.bool_(False), outputs)

        def cond(c):
            i, _, _, _, active, _, _, finished_any, _ = c
            return (i < num_steps) & jnp.any(active) & ~(exit_on_finish & finished_any)

        def body(c):
            return step_at(c[0], c, c[4])

        def fixed_body(c):
            # a step runs while the while loop's condition would still hold (once false it
            # stays false: the count stops, slots only finish); after that every slot idles
            go = cond(c)
            stepped = step_at(c[0], c, c[4] & go)
            return (c[0] + go.astype(jnp.int32),) + stepped[1:]

        def step_at(i, c, active):
            """One decode step of the slots ``active`` [B], its outputs written at row ``i``
            (an idle slot's: token 0, not valid)."""
            _, cache, tokens, positions, _, remaining, counter, finished_any, outs = c
            pos_in = jnp.where(active, positions, S)  # idle rows write nothing (position S)
            hidden, cache = forward(model, tokens[:, None], pos_in[:, None], cache,
                                    decode_attention, merged)
            logits = head(hidden[:, 0])
            if ranks is not None:  # the first option_count option tokens (0: no limit)
                logits = limit_to_options(logits, ranks, ints[:, OPT])
            tok, lp, lp_raw = sample_tokens(logits, temperature, top_k, top_p, min_p, keys,
                                            sample_index, counter, mode,
                                            one_pass=one_pass_sampler)
            tok = jnp.where(active, tok, 0)
            step = active.astype(jnp.int32)
            remaining = remaining - step
            is_stop = jnp.any(tok[:, None] == stop_ids, axis=-1)
            done = active & (is_stop | (remaining <= 0))
            o_tok, o_lp, o_raw, o_valid = outs
            outs = (o_tok.at[i].set(tok), o_lp.at[i].set(lp), o_raw.at[i].set(lp_raw),
                    o_valid.at[i].set(active))
            return (i + 1, cache, jnp.where(active, tok, tokens), positions + step,
                    c[4] & ~done, remaining, counter + step, finished_any | jnp.any(done), outs)

        if decode_loop == "fixed":  # a counter from 0 below a constant: XLA knows the count
            final = jax.lax.while_loop(lambda kc: kc[0] < K,
                                       lambda kc: (kc[0] + 1, fixed_body(kc[1])),
                                       (jnp.int32(0), carry))[1]
        else:
            final = jax.lax.while_loop(cond, body, carry)
        steps, cache, outs = final[0], final[1], final[8]
        return cache, outs, steps

    seq_axis = 2 if kv_layout == HEAD_MAJOR else 1  # [B, K, S, Dh] or [B, S, K, Dh]

    def prefill(leaves, cache, rows, chunk, kv_len):
        model = nnx.merge(graphdef, jax.tree.unflatten(state_treedef, leaves))
        slot_ids, tokens, positions = split_rows(rows, chunk)
        if prefill_attention in (FLASH_IN_CACHE, FLASH_IN_CACHE_INTERPRET) and \
                unsupported_prefill_shape(tokens.shape[1], max_length, model.cfg.head_dim) is None:
            # the rows stay in the cache: keys / values written at (slot, position), the
            # kernel reads each row at its slot (unused rows: slot max_batch, dropped)
            _, cache = forward(model, tokens, positions, cache,
                               prefill_attention=prefill_attention, slots=slot_ids)
            return cache
        # Only the first kv_len positions of the rows are gathered, attended over and written
        # back: the caller picks kv_len > every real position (padding positions are
        # max_length: dropped), so later positions are neither read nor changed.
        # rows slot_ids, positions 0..kv_len-1 of a [B, K, S, Dh] or [B, S, K, Dh] array
        index = (slot_ids,) + (slice(None),) * (seq_axis - 1) + (slice(0, kv_len),)

        def rows(x):
            return jax.lax.slice_in_dim(jnp.take(x, slot_ids, axis=0, mode="clip"), 0, kv_len,
                                        axis=seq_axis)

        gathered = (DENSE if prefill_attention in (FLASH_IN_CACHE, FLASH_IN_CACHE_INTERPRET)
                    else prefill_attention)
        _, sub = forward(model, tokens, positions, map_cache(rows, cache),
                         prefill_attention=gathered)

        def put(x, new):
            return x.at[index].set(new, mode="drop")

        return type(cache)(keys=tuple(put(k, n) for k, n in zip(cache.keys, sub.keys)),
                           values=tuple(put(v, n) for v, n in zip(cache.values, sub.values)))

    def copy_rows(cache, pairs):
        src, dst = pairs[0], pairs[1]
        return map_cache(lambda x: x.at[dst].set(jnp.take(x, src, axis=0, mode="clip"),
                                                 mode="drop"), cache)

    options = ({"xla_gpu_enable_triton_gemm": False} if decode_gemm == "merged_cublas"
               else None)
    def merge(state):
        return merge_projections(nnx.merge(graphdef, state))

    return (jax.jit(decode, donate_argnums=(1,), static_argnums=(6,), compiler_options=options),
            jax.jit(prefill, donate_argnums=(1,), static_argnums=(3, 4)),
            jax.jit(copy_rows, donate_argnums=(0,)),
            (lambda state: None) if decode_gemm == "xla" else jax.jit(merge))


__all__ = ["DECODE_LOOPS", "EngineFunctions", "compiled_functions", "TOK", "POS", "ACT", "REM",
           "TOPK", "CNT", "KEY0", "KEY1", "IDX", "STOP", "TEMP", "TOPP", "MINP"]
