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
  counts, the weights ``d^(E_t - E_s) <= 1`` of every output are exact and each
  output only sums its own ``s >= t`` terms (no cancellation). The factorised
  matmul form needs ``L*|log d| <= 60`` (finite ``d^-E``) and a static ``d``; otherwise
  (and at the carry levels, where exponents are large) the weights are formed
  pairwise, ``[B, C, L, L]`` (small at the carry levels).
  On GPU the first level is two skinny fp32 GEMMs plus elementwise kernels that
  stream the ``[B, T]`` arrays once; the carry level works on ``[B, T/L]``.
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


_HI = lax.Precision.HIGHEST  # full fp32 dots (no TF32 / bf16 passes)


def _upper(L: int) -> Array:
    """``U[s, t] = 1 if s >= t`` (float32 ``[L, L]``): ``(x @ U)[t] = sum_{s >= t} x[s]``."""
    return (jnp.arange(L)[:, None] >= jnp.arange(L)[None, :]).astype(jnp.float32)


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
    U = _upper(Lc)
    # E_t = sum_{s >= t in chunk} e_s: a [B*C, L] @ [L, L] matmul (exact: small integers).
    # prod_{k=t}^{s-1} a_k = d^(E_t - E_s) for s >= t.
    E = jnp.einsum("bcs,st->bct", es, U, precision=_HI)
    if factorise_ok:
        # d^(E_t - E_s) = d^E_t * d^-E_s: the whole chunk scan is one matmul with U.
        p = jnp.exp(E * logd)  # d^E_t  (<= 1)
        q = jnp.exp(-E * logd)  # d^-E_s (<= d^-L, finite by the caller's check)
        S_loc = p[None] * jnp.einsum("kbcs,st->kbct", q[None] * xs, U, precision=_HI)
    else:
        # exact pairwise weights (any d, any exponents); materialises [B, C, L, L]
        tri = U.T.astype(bool)  # [t, s]: s >= t
        diff = E[..., :, None] - E[..., None, :]  # [B, C, t, s]
        w = jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0) * logd), 0.0)
        S_loc = jnp.einsum("bcts,kbcs->kbct", w, xs, precision=_HI)
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
    chunk: int = 64,
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
        if static and n <= direct_max and n * abslog > _FACTORISE_MAX_EXPONENT:
            direct_max = chunk  # too long for one factorised chunk: cut it
        first_L = n if n <= direct_max else chunk
        factorise_ok = static and first_L * abslog <= _FACTORISE_MAX_EXPONENT
        out = _pow_suffix_sum(x, m, logd, chunk, direct_max, factorise_ok)
    else:
        raise ValueError(f"unknown method {method!r} (blocked | associative | scan)")
    return out[0] if squeeze else out
