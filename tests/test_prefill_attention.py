"""Prefill attention (``kernels/prefill_attention.py``): the dense einsums and the flash
kernel (Pallas interpreter on CPU) against a float64 NumPy loop, the kernel's key-block bound,
and an engine whose prefill runs the kernel against one whose prefill runs dense attention
(greedy tokens and log-probs; that engine is itself checked against the model's own forward in
tests/test_engine.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.engine_config import PREFILL_ATTENTION, EngineConfig
from agentrl_jax.kernels.prefill_attention import (dense_prefill_attention,
                                                          flash_prefill_attention,
                                                          flash_prefill_attention_in_cache,
                                                          unsupported_prefill_shape)
from tests.rollout_helpers import make_engine, random_prompt, tiny_model


def prefill_reference(q, k, v, positions):
    """float64 loop: token t of row r at position p < S attends to keys 0..p; padding (p >= S)
    gets zeros (the flash kernel's output there; the dense one's is never used either)."""
    rows, t_len, heads, d = q.shape
    kv_heads, s_len = k.shape[1], k.shape[2]
    g = heads // kv_heads
    out = np.zeros(q.shape)
    for r in range(rows):
        for t in range(t_len):
            p = int(positions[r, t])
            if p >= s_len:
                continue
            for h in range(heads):
                keys = k[r, h // g, :p + 1].astype(np.float64)
                s = keys @ q[r, t, h].astype(np.float64) / np.sqrt(d)
                w = np.exp(s - s.max())
                out[r, t, h] = (w / w.sum()) @ v[r, h // g, :p + 1].astype(np.float64)
    return out


def _inputs(rng, rows, t_len, heads, kv_heads, d, s_len):
    q = rng.standard_normal((rows, t_len, heads, d)).astype(np.float32)
    k = rng.standard_normal((rows, kv_heads, s_len, d)).astype(np.float32)
    v = rng.standard_normal((rows, kv_heads, s_len, d)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("kv_heads,groups,d,s_len", [(2, 3, 32, 320), (1, 4, 16, 256)])
def test_dense_and_flash_prefill_attention_match_a_float64_loop(kv_heads, groups, d, s_len):
    rng = np.random.default_rng(kv_heads)
    rows, t_len = 4, 128
    q, k, v = _inputs(rng, rows, t_len, kv_heads * groups, kv_heads, d, s_len)
    positions = np.full((rows, t_len), 10_000, np.int32)  # padding: past the row
    positions[0, :100] = np.arange(100)  # a first chunk; its second query block is part padding
    positions[1] = np.arange(150, 150 + t_len)  # a later chunk, across key-block boundaries
    positions[2, :5] = np.arange(s_len - 5, s_len)  # the row's last positions
    positions[2, 5:20] = s_len  # the first position past the row: padding
    # row 3: all padding (an unused row of the call)
    want = prefill_reference(q, k, v, positions)
    args = [jnp.asarray(x) for x in (q, k, v, positions)]
    dense = np.asarray(dense_prefill_attention(*args))
    flash = np.asarray(flash_prefill_attention(*args, interpret=True))
    real = positions < s_len
    np.testing.assert_allclose(dense[real], want[real], atol=2e-5)
    np.testing.assert_allclose(flash, want, atol=2e-5)
    assert not flash[3].any() and not flash[2, 5:].any()  # padding sees no keys: zeros


def test_flash_prefill_reads_no_key_past_its_queries_positions():
    """Keys after every query's position are replaced by huge values (and NaN in the block
    past the last one visited): the output must not change, so they were masked or never read."""
    rng = np.random.default_rng(7)
    q, k, v = _inputs(rng, 2, 64, 4, 2, 32, 256)
    positions = np.stack([np.arange(64), np.arange(40, 104)]).astype(np.int32)
    clean = np.asarray(flash_prefill_attention(*map(jnp.asarray, (q, k, v, positions)),
                                               interpret=True))
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 64:], v2[0, :, 64:] = 1e4, 1e4  # row 0 sees 0..63: one 64-key block
    k2[1, :, 104:128], v2[1, :, 104:128] = 1e4, 1e4  # masked inside its last block
    k2[1, :, 128:], v2[1, :, 128:] = np.nan, np.nan  # blocks past the last: never read
    dirty = np.asarray(flash_prefill_attention(*map(jnp.asarray, (q, k2, v2, positions)),
                                               interpret=True))
    np.testing.assert_array_equal(dirty, clean)
    np.testing.assert_allclose(clean, prefill_reference(q, k, v, positions), atol=2e-5)


def test_flash_prefill_in_cache_reads_each_row_at_its_slot():
    """Rows 0-3 of the call are slots 4, 1, (none: 6 >= 6 slots) and 2 of a 6-slot cache whose
    other slots hold NaN: the output equals the float64 loop over each slot's row, and the
    unused row reads nothing (zeros)."""
    rng = np.random.default_rng(11)
    rows, t_len, kv_heads, groups, d, s_len = 4, 64, 2, 2, 32, 192
    q, k_rows, v_rows = _inputs(rng, rows, t_len, kv_heads * groups, kv_heads, d, s_len)
    slots = np.array([4, 1, 6, 2], np.int32)
    cache_k = np.full((6, kv_heads, s_len, d), np.nan, np.float32)
    cache_v = np.full((6, kv_heads, s_len, d), np.nan, np.float32)
    for r, slot in enumerate(slots):
        if slot < 6:
            cache_k[slot], cache_v[slot] = k_rows[r], v_rows[r]
    positions = np.full((rows, t_len), 10_000, np.int32)
    positions[0] = np.arange(t_len)
    positions[1, :40] = np.arange(100, 140)
    positions[2] = np.arange(t_len)  # its slot is out of range: unused, reads nothing
    positions[3, :3] = np.arange(s_len - 3, s_len)
    got = np.asarray(flash_prefill_attention_in_cache(
        *map(jnp.asarray, (q, cache_k, cache_v, slots, positions)), interpret=True))
    want = prefill_reference(q, k_rows, v_rows, positions)
    want[2] = 0.0
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_unsupported_shapes_are_named():
    assert unsupported_prefill_shape(256, 3072, 64) is None
    assert "chunk" in unsupported_prefill_shape(16, 3072, 64)
    assert "KV length" in unsupported_prefill_shape(64, 100, 64)
    assert "head dim" in unsupported_prefill_shape(64, 512, 48)
    with pytest.raises(ValueError, match="chunk divisible by 64"):
        x = jnp.zeros((1, 16, 2, 16))
        flash_prefill_attention(x, jnp.zeros((1, 1, 64, 16)), jnp.zeros((1, 1, 64, 16)),
                                jnp.zeros((1, 16), jnp.int32), interpret=True)


def test_prefill_attention_config():
    import dataclasses

    from agentrl_jax.training.config.rollout_section import RolloutConfig

    field = next(f for f in dataclasses.fields(RolloutConfig) if f.name == "prefill_attention")
    assert tuple(field.metadata["choices"]) == PREFILL_ATTENTION  # the run config's names
    assert EngineConfig().resolved_prefill_attention("gpu") == "flash_in_cache"
    assert EngineConfig().resolved_prefill_attention("cpu") == "dense"
    assert EngineConfig(prefill_attention="dense").resolved_prefill_attention("gpu") == "dense"
    assert EngineConfig(prefill_attention="flash_in_cache").resolved_prefill_attention(
        "cpu") == "flash_in_cache"
    with pytest.raises(ValueError, match="prefill_attention"):
        EngineConfig(prefill_attention="pallas")


def test_resolve_prefill_attention_falls_back_where_the_kernel_cannot_run():
    """The engine's choice from config, platform, tensor parallelism and model shape: auto is
    the in-place kernel on a GPU; packed rows it cannot tile fall back to the gathered kernel;
    the seq-major cache or a tensor-parallel group fall back to dense; interpreter forms off
    GPUs."""
    import dataclasses

    from agentrl_jax.rollout.engine.attention_choice import resolve_prefill_attention
    from tests.rollout_helpers import TINY

    auto = EngineConfig(max_length=256)
    assert resolve_prefill_attention(auto, TINY, "gpu", 1) == "flash_in_cache"
    assert resolve_prefill_attention(auto, TINY, "cpu", 1) == "dense"
    assert resolve_prefill_attention(EngineConfig(max_length=256, prefill_attention="flash"),
                                     TINY, "cpu", 1) == "flash_interpret"
    in_cache = EngineConfig(max_length=256, prefill_attention="flash_in_cache")
    assert resolve_prefill_attention(in_cache, TINY, "cpu", 1) == "flash_in_cache_interpret"
    assert resolve_prefill_attention(in_cache, TINY, "gpu", 2) == "dense"
    assert resolve_prefill_attention(dataclasses.replace(in_cache, kv_layout="bskd"), TINY,
                                     "gpu", 1) == "dense"
    # a whole row of 200 keys is no multiple of 16: the packed call cannot tile it
    assert resolve_prefill_attention(dataclasses.replace(in_cache, max_length=200), TINY,
                                     "gpu", 1) == "flash"
    assert resolve_prefill_attention(EngineConfig(max_length=256, prefill_attention="dense"),
                                     TINY, "gpu", 1) == "dense"


def _greedy(engine, prompts, session_prefix=None, max_new=10):
    sampling = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    futures = [engine.submit(p, sampling, session_id=None if session_prefix is None
                             else f"{session_prefix}{i}") for i, p in enumerate(prompts)]
    return [f.result(timeout=300)[0] for f in futures]


def _two_turns(engine, first, extra):
    """Turn 1, then turn 2 of the same sessions (prompt = turn 1 + its output + ``extra``):
    the second prefill starts at a cursor past 0 (the cached prefix)."""
    turn1 = _greedy(engine, first, session_prefix="s")
    second = [p + list(r.output_ids) + e for p, r, e in zip(first, turn1, extra)]
    return turn1 + _greedy(engine, second, session_prefix="s")


def test_engine_with_flash_prefill_matches_dense():
    model = tiny_model(seed=5)
    rng = np.random.default_rng(1)
    first = [random_prompt(rng, n) for n in (5, 40, 70)]  # 70: two chunks of 64
    extra = [random_prompt(rng, n) for n in (30, 9, 12)]
    kw = dict(warmup=False, prefill_chunks=(64,), prefill_tokens=128)
    results = {}
    for impl in ("dense", "flash", "flash_in_cache"):
        engine = make_engine(model, prefill_attention=impl, prefill_kv_buckets=(64,), **kw)
        try:
            assert engine.prefill_attention == {"dense": "dense", "flash": "flash_interpret",
                                                "flash_in_cache": "flash_in_cache_interpret"}[impl]
            # rows read in place need no KV buckets: one prefill shape per chunk
            assert engine.config.kv_buckets == ((128,) if impl == "flash_in_cache" else (64, 128))
            results[impl] = _two_turns(engine, first, extra)
            assert engine.stats.cached_tokens > 0  # the second turns reused their prefixes
        finally:
            engine.close()
    for impl in ("flash", "flash_in_cache"):
        for got, want in zip(results[impl], results["dense"]):
            assert got.output_ids == want.output_ids
            np.testing.assert_allclose(got.output_logprobs, want.output_logprobs, atol=2e-4)


class _Seq:
    def __init__(self, name, cursor, prompt_len):
        self.name, self.cursor, self.prompt_len = name, cursor, prompt_len


def test_plan_packed_cuts_sequences_into_consecutive_rows():
    """Hand-computed: a (prefill 0..68 = 69 tokens), b (cursor 300, 90 left), c (20 left) into
    rows of 64 with buckets (1, 4, 16): a -> 64 + 5, b -> 64 + 26, c -> 20: five rows, bucket 16."""
    from agentrl_jax.rollout.engine.prefill_plan import plan_packed

    a, b, c = _Seq("a", 0, 70), _Seq("b", 300, 391), _Seq("c", 10, 31)
    chunk, rows, pieces = plan_packed([a, b, c], 64, (1, 4, 16))
    assert (chunk, rows) == (64, 16)
    assert [(s.name, start, n) for s, start, n in pieces] == [
        ("a", 0, 64), ("a", 64, 5), ("b", 300, 64), ("b", 364, 26), ("c", 10, 20)]
    # the largest bucket caps the rows: a long prompt fills it, the rest waits for a later call
    long = _Seq("long", 0, 1000)
    chunk, rows, pieces = plan_packed([long, c], 64, (1, 4))
    assert rows == 4 and [(start, n) for _, start, n in pieces] == [
        (0, 64), (64, 64), (128, 64), (192, 64)]
    assert plan_packed([c], 64, (1, 4, 16))[1] == 1  # one short piece: the smallest bucket


def test_plan_chunked_picks_the_bucket_that_prefills_most():
    """Hand-computed: buckets (64 x 8 rows, 256 x 2 rows); three 200-token prompts: 64 x 8 takes
    3 x 64 = 192 tokens, 256 x 2 takes 2 x 200 = 400: the second, one row per sequence."""
    from agentrl_jax.rollout.engine.prefill_plan import plan_chunked

    queue = [_Seq(str(i), 0, 201) for i in range(3)]
    chunk, rows, pieces = plan_chunked(queue, [(64, 8), (256, 2)])
    assert (chunk, rows) == (256, 2)
    assert [(s.name, start, n) for s, start, n in pieces] == [("0", 0, 200), ("1", 0, 200)]


def test_packed_prefill_shapes_and_row_buckets():
    c = EngineConfig(max_batch=256, max_length=3072, prefill_tokens=4096, prefill_chunks=(64,),
                     prefill_kv_buckets=())
    assert c.packed_row_buckets() == (4, 16, 64)
    assert c.prefill_shapes(packed=True) == [(64, 4, 3072), (64, 16, 3072), (64, 64, 3072)]
