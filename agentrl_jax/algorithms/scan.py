"""Reverse linear recurrences ``x_t = a_t * x_{t+1} + b_t`` along the time axis.

Three interchangeable implementations (all jit-able, static shapes, time = last axis):

* ``"scan"``: ``lax.scan`` over time (O(T) sequential steps; what Tunix does).
* ``"associative"``: ``lax.associative_scan`` with the affine-map combine
  ``(a1, b1) o (a2, b2) = (a1*a2, a2*b1 + b2)`` (O(log T) depth).
* ``"blocked"``: only for the *masked discounted suffix sum*
  ``S_t = x_t + d^{e_t} * S_{t+1}`` (``a_t`` is a power of one constant ``d``; with
  ``e_t = mask_t`` this is exactly the recurrence of GAE and REINFORCE++ in
  multi-turn form). Two-level blocked scan: the time axis is cut into chunks of
  ``L`` tokens; inside a chunk every output is an independent dot product

      S_t = sum_{s >= t in chunk} d^(E_t - E_s) x_s + d^(E_t) * carry_chunk,
      E_t = sum_{k >= t in chunk} e_k  (integer, exact)

  computed as a masked broadcast-reduce over an ``[L, L]`` triangle (no sequential
  dependency, no per-step kernel). The per-chunk summaries
  ``(y_c = S_start_of_chunk_without_carry, k_c = E_0)`` form the same recurrence
  one level up, ``X_c = y_c + d^{k_c} X_{c+1}``, solved recursively (one level is
  enough up to ``T = L * direct_max``). Because the exponents are exact integer
  counts, weights ``d^(E_t - E_s) <= 1`` are computed without cancellation; at the
  first level, when ``L*|log d| <= 60``, the weight factorises as
  ``d^(E_t) * d^(-E_s)`` so there is no per-pair ``exp``.
  On GPU this is a handful of fused elementwise / row-reduce kernels that each
  stream the [B, T] arrays once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array

#: clamp for ``log(d)`` when ``d == 0`` (``exp(n * -1e4) == 0`` for ``n >= 1``).
_LOG_ZERO = -1.0e4
#: factorise ``d^(E_t - E_s) = d^E_t * d^-E_s`` when ``L * |log d|`` is at most this.
_FACTORISE_MAX_EXPONENT = 60.0


def _affine_combine(left, right):
    # left is earlier in scan order (for reverse=True: later in time).
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


def reverse_linear_recurrence(a: Array, b: Array, *, method: str = "associative") -> Array:
    """Solve ``x_t = a_t * x_{t+1} + b_t`` with ``x_T = 0`` along the last axis.

    ``a``, ``b``: ``[..., T]`` (broadcastable to each other). Returns ``x [..., T]``.
    ``method``: ``"associative"`` (``lax.associative_scan``, reverse) or ``"scan"``
    (``lax.scan`` over time).
    """
    a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    if method == "associative":
        _, x = lax.associative_scan(_affine_combine, (a, b), reverse=True, axis=a.ndim - 1)
        return x
    if method == "scan":
        aT = jnp.moveaxis(a, -1, 0)
        bT = jnp.moveaxis(b, -1, 0)

        def step(x, ab):
            a_t, b_t = ab
            x = a_t * x + b_t
            return x, x

        _, xs = lax.scan(step, jnp.zeros(a.shape[:-1], a.dtype), (aT, bT), reverse=True)
        return jnp.moveaxis(xs, 0, -1)
    raise ValueError(f"unknown recurrence method {method!r} (associative | scan)")


def _log_discount(discount) -> tuple[Array | float, bool, float | None]:
    """``(log d clamped, is_static, |log d| or None)``."""
    if isinstance(discount, (int, float)):
        d = float(discount)
        if d < 0:
            raise ValueError("discount must be >= 0")
        logd = math.log(d) if d > 0 else _LOG_ZERO
        return max(logd, _LOG_ZERO), True, abs(max(logd, _LOG_ZERO))
    d = jnp.asarray(discount, jnp.float32)
    logd = jnp.where(d > 0, jnp.log(jnp.maximum(d, 1e-38)), _LOG_ZERO)
    return jnp.maximum(logd, _LOG_ZERO), False, None


def _suffix_counts(e: Array) -> Array:
    """``E[..., t] = sum_{s >= t} e[..., s]`` along the last axis via an ``[L, L]``
    masked reduce (one fused reduction, exact for small integers)."""
    L = e.shape[-1]
    tri = jnp.arange(L)[None, :] >= jnp.arange(L)[:, None]  # [t, s]: s >= t
    return jnp.sum(jnp.where(tri, e[..., None, :], 0.0), axis=-1)


def _pow_suffix_sum(x: Array, e: Array, logd, L: int, direct_max: int, factorise_ok: bool) -> Array:
    """``S_t = x_t + exp(e_t * logd) * S_{t+1}``, ``S_T = 0``.

    ``x [K, B, n]`` (K stacked right-hand sides sharing the coefficients),
    ``e [B, n]`` non-negative integer-valued float exponents.
    """
    K, B, n = x.shape
    if n <= direct_max:
        Lc, C = n, 1
    else:
        Lc = L
        C = -(-n // Lc)
    pad = C * Lc - n
    if pad:
        x = jnp.pad(x, ((0, 0), (0, 0), (0, pad)))
        e = jnp.pad(e, ((0, 0), (0, pad)))
    xs = x.reshape(K, B, C, Lc)
    es = e.reshape(B, C, Lc)
    E = _suffix_counts(es)  # [B, C, Lc] (inclusive): coefficient exponent from t to chunk end
    tri = jnp.arange(Lc)[None, :] >= jnp.arange(Lc)[:, None]  # [t, s]
    # E_t - E_s = sum_{k in [t, s)} e_k = exponent of prod_{k=t}^{s-1} a_k, but E is
    # inclusive of its own position: prod_{k=t}^{s-1} a_k = d^(E_t - E_s).
    if factorise_ok:
        p = jnp.exp(E * logd)  # d^E_t  (<= 1)
        q = jnp.exp(-E * logd)  # d^-E_s (<= d^-L, bounded by the caller's check)
        inner = jnp.sum(jnp.where(tri, (q[None] * xs)[..., None, :], 0.0), axis=-1)
        S_loc = p[None] * inner
    else:
        diff = E[..., :, None] - E[..., None, :]  # [B, C, t, s]
        w = jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0) * logd), 0.0)
        S_loc = jnp.sum(w[None] * xs[..., None, :], axis=-1)
    if C > 1:
        y = S_loc[..., 0]  # [K, B, C] chunk-start value without carry
        k = E[..., 0]  # [B, C] exponent of the whole chunk's coefficient product
        X = _pow_suffix_sum(y, k, logd, L, direct_max, factorise_ok=False)  # value at chunk starts
        carry = jnp.concatenate([X[..., 1:], jnp.zeros_like(X[..., :1])], axis=-1)  # X_{c+1}
        S_loc = S_loc + jnp.exp(E * logd)[None] * carry[..., None]
    S = S_loc.reshape(K, B, C * Lc)
    return S[..., :n] if pad else S


def masked_discounted_suffix_sum(
    x: Array,
    loss_mask: Array,
    discount,
    *,
    method: str = "blocked",
    chunk: int = 32,
    direct_max: int = 256,
) -> Array:
    """``S_t = x_t + (discount if mask_t else 1) * S_{t+1}``, ``S_T = 0``.

    Equivalently ``S_t = sum_{s >= t} discount^{n(t, s)} x_s`` with ``n(t, s)`` the
    number of generated (mask 1) tokens in ``[t, s)``: the discount applies per
    generated token and observation / padding tokens pass the running sum through
    unchanged (the multi-turn rule).

    ``x``: ``[B, T]`` or ``[K, B, T]`` (K right-hand sides sharing the mask);
    ``loss_mask [B, T]``. ``method``: ``"blocked"`` (default, see module doc),
    ``"associative"`` or ``"scan"``. ``chunk``: chunk length of the blocked scan;
    sequences of at most ``direct_max`` tokens are done as a single chunk.
    """
    x = jnp.asarray(x, jnp.float32)
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
    m = (jnp.asarray(loss_mask) != 0).astype(jnp.float32)
    if method in ("associative", "scan"):
        a = jnp.where(m > 0, jnp.asarray(discount, jnp.float32), 1.0)
        out = reverse_linear_recurrence(jnp.broadcast_to(a, x.shape), x, method=method)
    elif method == "blocked":
        logd, static, abslog = _log_discount(discount)
        n = x.shape[-1]
        first_L = n if n <= direct_max else chunk
        factorise_ok = static and first_L * abslog <= _FACTORISE_MAX_EXPONENT
        out = _pow_suffix_sum(x, m, logd, chunk, direct_max, factorise_ok)
    else:
        raise ValueError(f"unknown method {method!r} (blocked | associative | scan)")
    return out[0] if squeeze else out
