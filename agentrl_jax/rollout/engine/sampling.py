"""Token sampling fused into the jitted decode step.

Every function here is traced inside the engine's jitted decode loop; all per-slot parameters are
arrays ``[B]`` so one compiled step serves any mix of greedy and sampled requests (the static
``mode`` only removes work no row needs).

Randomness is stateless and per request: the key of slot ``b`` at its ``c``-th generated token is
``fold_in(fold_in(key_b, sample_index_b), c)`` where ``key_b`` comes from the request seed, so a
seeded request samples the same tokens whatever else shares the batch.

Logprobs: ``logprob`` is ``log_softmax(logits / T)[token]`` (the tempered distribution, before
top-k / top-p / min-p truncation) and ``logprob_raw`` is ``log_softmax(logits)[token]``; for greedy
slots (T == 0) both are the raw value.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _filter_logits(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array
                   ) -> jax.Array:
    """Mask (to -inf) the logits outside top-k / top-p (nucleus) / min-p, per row.

    scaled [B, V] tempered logits; top_k [B] int (<= 0: off); top_p [B] in (0, 1]; min_p [B].
    The kept set always contains the most likely token. Ties at the threshold are all kept.
    """
    v = scaled.shape[-1]
    sorted_desc = -jnp.sort(-scaled, axis=-1)  # [B, V]
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    cum_before = jnp.cumsum(probs, axis=-1) - probs
    keep = (cum_before < top_p[:, None]) | (top_p[:, None] >= 1.0)  # exact no-op at top_p=1
    rank = jnp.arange(v)[None, :]
    keep &= (top_k[:, None] <= 0) | (rank < top_k[:, None])
    keep &= probs >= min_p[:, None] * probs[:, :1]
    keep = keep.at[:, 0].set(True)
    threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1)  # smallest kept logit
    return jnp.where(scaled >= threshold[:, None], scaled, -jnp.inf)


def logsumexp_and_argmax(lse_of: jax.Array, argmax_of: jax.Array
                         ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(logsumexp(lse_of), max(argmax_of), argmax(argmax_of))`` over the last axis of two
    ``[B, V]`` arrays in ONE pass (a single variadic reduction: the logits are read once, where
    ``jax.nn.logsumexp`` + ``jnp.argmax`` read them three times -- max, sum of exponentials,
    argmax; the LM head's float32 logits are 155 MB at Qwen2.5-1.5B's vocabulary x 256 rows).

    The running state per row is ``(m, s, best, index)`` with ``s = sum exp(x - m)``; two
    states combine as ``m = max(m1, m2)``, ``s = s1 e^(m1 - m) + s2 e^(m2 - m)`` (a factor
    of 1 where ``m_i == m``, so empty states at -inf stay finite), and the larger ``best``
    with its index (the smaller index on ties, as ``jnp.argmax``). ``lse_of`` -inf entries
    add nothing; a row of all -inf gives -inf."""
    def combine(a, b):
        m1, s1, best1, i1 = a
        m2, s2, best2, i2 = b
        m = jnp.maximum(m1, m2)
        s = (s1 * jnp.where(m1 == m, 1.0, jnp.exp(m1 - m))
             + s2 * jnp.where(m2 == m, 1.0, jnp.exp(m2 - m)))
        take2 = (best2 > best1) | ((best2 == best1) & (i2 < i1))
        return m, s, jnp.where(take2, best2, best1), jnp.where(take2, i2, i1)

    lse_of = lse_of.astype(jnp.float32)
    argmax_of = argmax_of.astype(jnp.float32)
    index = jax.lax.broadcasted_iota(jnp.int32, lse_of.shape, lse_of.ndim - 1)
    init = (jnp.float32(-jnp.inf), jnp.float32(0.0), jnp.float32(-jnp.inf),
            jnp.int32(np.iinfo(np.int32).max))
    m, s, best, idx = jax.lax.reduce((lse_of, jnp.ones_like(lse_of), argmax_of, index), init,
                                     combine, (lse_of.ndim - 1,))
    return m + jnp.log(s), best, idx


def logsumexp_and_argmax_separate(lse_of: jax.Array, argmax_of: jax.Array
                                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """What :func:`logsumexp_and_argmax` returns, as XLA's separate reductions (the CPU
    engine's choice)."""
    argmax = jnp.argmax(argmax_of, axis=-1).astype(jnp.int32)
    top = jnp.take_along_axis(argmax_of, argmax[:, None], axis=-1)[:, 0]
    return jax.nn.logsumexp(lse_of.astype(jnp.float32), axis=-1), top, argmax


GREEDY, SAMPLE, SAMPLE_FILTERED = 0, 1, 2  # static sampling modes (one compile each)


def sampling_mode(temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
                  min_p: np.ndarray) -> int:
    """The cheapest static mode that serves every row (host-side, NumPy)."""
    sampled = temperature > 0.0
    if not sampled.any():
        return GREEDY
    if ((top_k > 0) | (top_p < 1.0) | (min_p > 0.0))[sampled].any():
        return SAMPLE_FILTERED
    return SAMPLE


def sample_tokens(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                  min_p: jax.Array, keys: jax.Array, sample_index: jax.Array, counter: jax.Array,
                  mode: int = SAMPLE_FILTERED, one_pass: bool = False
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sample one token per row.

    logits [B, V] float32; temperature [B] (0 = greedy); keys [B, 2] uint32 raw threefry keys;
    sample_index, counter [B] int32. Returns ``(tokens [B] int32, logprob [B], logprob_raw [B])``.

    ``mode`` is static: ``GREEDY`` (argmax only: every row must be greedy), ``SAMPLE`` (Gumbel
    noise; no row truncates), ``SAMPLE_FILTERED`` (also top-k / top-p / min-p, which sorts the
    vocabulary). The engine picks the cheapest mode for the rows of each call, so the decode
    step has no data-dependent control flow (on GPUs a ``lax.cond`` syncs with the host).
    Rows are independent: the result of a row does not depend on the mode chosen for the call.
    ``one_pass`` (static): the log-sum-exps and argmaxes as :func:`logsumexp_and_argmax`, one
    read of the logits per pair (the engine's choice on GPUs, where it shortens the decode
    step); off, XLA's separate reductions (on CPUs the variadic reduction is slower, so CPUs
    keep them; ``benchmarks/contenders/sampler_reduction.py``, docs/PERFORMANCE.md, "Decode step: fused
    attention + cache write, one-pass sampler").
    """
    logits = logits.astype(jnp.float32)
    greedy = temperature <= 0.0
    lse_and_argmax = logsumexp_and_argmax if one_pass else logsumexp_and_argmax_separate
    logprob_raw_all, top, argmax = lse_and_argmax(logits, logits)
    if mode == GREEDY:
        logprob_raw = top - logprob_raw_all  # the argmax token's logit is the row's maximum
        return argmax, logprob_raw, logprob_raw
    safe_t = jnp.where(greedy, 1.0, temperature)
    scaled = logits / safe_t[:, None]
    filtered = _filter_logits(scaled, top_k, top_p, min_p) if mode == SAMPLE_FILTERED else scaled

    def noise(key, idx, c):
        key = jax.random.fold_in(jax.random.fold_in(key, idx), c)
        return jax.random.gumbel(key, (logits.shape[-1],), jnp.float32)

    gumbel = jax.vmap(noise)(keys, sample_index, counter)
    scaled_lse, _, drawn = lse_and_argmax(scaled, filtered + gumbel)
    tokens = jnp.where(greedy, argmax, drawn)
    picked_raw = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    picked_scaled = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
    logprob_raw = picked_raw - logprob_raw_all
    logprob_t = picked_scaled - scaled_lse
    logprob = jnp.where(greedy, logprob_raw, logprob_t)
    return tokens, logprob, logprob_raw


def seed_to_key(seed: int) -> tuple[int, int]:
    """The raw threefry key ``jax.random.PRNGKey(seed)`` as two uint32 words (host-side)."""
    seed &= (1 << 64) - 1
    return (seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF


__all__ = ["sample_tokens", "logsumexp_and_argmax", "logsumexp_and_argmax_separate",
           "sampling_mode", "seed_to_key", "GREEDY", "SAMPLE", "SAMPLE_FILTERED"]
