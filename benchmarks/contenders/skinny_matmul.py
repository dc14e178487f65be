"""A Pallas (Triton) matmul for the decode step's skinny GEMMs: ``x [M, K] @ w [K, N]``.

At decode, ``M`` is the engine's batch (256 slots) and ``w`` a projection's weights, so the
GEMM is on the edge of memory-bound: each weight byte should be read from HBM once, by as many
programs as keep every SM busy. XLA's autotuner picks from a fixed set of tilings and, at
``M = 256``, its choice for Qwen2.5-1.5B's merged gate/up projection runs at ~40% of the
bandwidth roofline (docs/PERFORMANCE.md). This kernel (a benchmark
contender, not part of the library) exposes the tiling so ``benchmarks/contenders/decode_gemm.py`` can sweep it against XLA and cuBLAS on the same shapes. The engine
does not use it: cuBLAS beat it on every decode GEMM but SmolLM2's gate/up
(docs/PERFORMANCE.md, "Decode GEMMs"), so the engine's default is cuBLAS on merged weights.

Grid ``(N / block_n, M / block_m, splits)``: program ``(j, i, s)`` computes the
``[block_m, block_n]`` output tile ``(i, j)`` over the ``s``-th of ``splits`` equal slices of
``K`` (``block_k`` columns per loop step, float32 accumulation). With ``splits > 1`` the
partial tiles ``[splits, M, N]`` (float32) are summed in XLA.

    out[m, n] = sum_k x[m, k] * w[k, n]          (float32 accumulate, ``out_dtype`` result)
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


class MatmulTiling(NamedTuple):
    """``block_m x block_n`` output tiles, ``block_k`` per loop step, ``splits`` K slices,
    Triton ``num_warps`` / ``num_stages``."""

    block_m: int
    block_n: int
    block_k: int
    splits: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def fits(self, m: int, k: int, n: int) -> bool:
        """Whether this tiling divides the problem exactly (the kernel has no edge masking)."""
        return (m % self.block_m == 0 and n % self.block_n == 0
                and k % (self.splits * self.block_k) == 0)


def _kernel(x_ref, w_ref, o_ref, *, block_k: int, steps: int):
    """One ``[block_m, block_n]`` tile over one K slice: ``x_ref [block_m, K/splits]``,
    ``w_ref [K/splits, block_n]``, ``o_ref [block_m, block_n]``."""
    from jax.experimental import pallas as pl

    def body(step, acc):
        cols = pl.ds(pl.multiple_of(step * block_k, block_k), block_k)
        return acc + jnp.dot(x_ref[:, cols], w_ref[cols, :],
                             preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, steps, body,
                            jnp.zeros((x_ref.shape[0], w_ref.shape[1]), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("tiling", "out_dtype", "interpret"))
def skinny_matmul(x: jax.Array, w: jax.Array, tiling: MatmulTiling,
                  out_dtype: jnp.dtype | None = None, interpret: bool = False) -> jax.Array:
    """``x [M, K] @ w [K, N] -> [M, N]`` (``out_dtype``, default ``x.dtype``) with ``tiling``;
    ``ValueError`` when the tiling does not divide the shapes."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    (m, k), (k2, n) = x.shape, w.shape
    if k != k2:
        raise ValueError(f"contracting dims differ: x {x.shape}, w {w.shape}")
    if not tiling.fits(m, k, n):
        raise ValueError(f"tiling {tiling} does not divide M={m}, K={k}, N={n}")
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    bm, bn, sk = tiling.block_m, tiling.block_n, tiling.splits
    k_slice = k // sk
    partial_dtype = out_dtype if sk == 1 else jnp.float32
    out = pl.pallas_call(
        functools.partial(_kernel, block_k=tiling.block_k, steps=k_slice // tiling.block_k),
        grid=(n // bn, m // bm, sk),
        in_specs=[pl.BlockSpec((bm, k_slice), lambda j, i, s: (i, s)),
                  pl.BlockSpec((k_slice, bn), lambda j, i, s: (s, j))],
        out_specs=pl.BlockSpec((None, bm, bn), lambda j, i, s: (s, i, j)),
        out_shape=jax.ShapeDtypeStruct((sk, m, n), partial_dtype),
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps,
                                             num_stages=tiling.num_stages),
        interpret=interpret,
        name="skinny_matmul",
    )(x, w)
    return out[0] if sk == 1 else out.sum(axis=0).astype(out_dtype)


__all__ = ["MatmulTiling", "skinny_matmul"]
