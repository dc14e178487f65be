"""Engine placement: ragged decode attention, an engine on any device, tensor-parallel engines
and data-parallel replicas with sticky sessions (8 virtual CPU devices, see conftest.py).

References: a float64 NumPy loop for the attention; for the engines, the same tiny model's
greedy continuation computed by a single-device engine with dense attention (itself checked
against the model's own full forward in tests/test_engine.py).
"""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.kernels.decode_attention import (dense_decode_attention, ragged_tiling,
                                                  ragged_decode_attention)
from agentrl_jax.kernels.fused_decode_attention import fused_decode_attention
from tests.rollout_helpers import TINY, make_engine, random_prompt, tiny_model


def attention_reference(q, k, v, lengths):
    """float64 loop: out[b,h] = softmax(q.k/sqrt(d) over s < len_b) . v; zeros when len 0."""
    b_, h_, d = q.shape
    kh = k.shape[1]
    g = h_ // kh
    out = np.zeros((b_, h_, d))
    for b in range(b_):
        for h in range(h_):
            n = int(lengths[b])
            if n == 0:
                continue
            keys = k[b, h // g, :n].astype(np.float64)
            s = keys @ q[b, h].astype(np.float64) / np.sqrt(d)
            p = np.exp(s - s.max())
            out[b, h] = (p / p.sum()) @ v[b, h // g, :n].astype(np.float64)
    return out


@pytest.mark.parametrize("kv_heads,groups,length", [(3, 3, 384), (2, 6, 256)])
def test_ragged_and_dense_decode_attention_match_a_float64_loop(kv_heads, groups, length):
    rng = np.random.default_rng(kv_heads)
    b, d = 5, 32
    q = rng.standard_normal((b, kv_heads * groups, d)).astype(np.float32)
    k = rng.standard_normal((b, kv_heads, length, d)).astype(np.float32)
    v = rng.standard_normal((b, kv_heads, length, d)).astype(np.float32)
    # empty, one key, a block boundary, past a boundary, the whole row
    lengths = np.array([0, 1, 128, 129, length])
    want = attention_reference(q, k, v, lengths)
    args = [jnp.asarray(x) for x in (q, k, v, lengths)]
    dense = np.asarray(dense_decode_attention(*args))
    ragged = np.asarray(ragged_decode_attention(*args, interpret=True))
    np.testing.assert_allclose(dense, want, atol=2e-5)
    np.testing.assert_allclose(ragged, want, atol=2e-5)


def test_ragged_attention_ignores_keys_past_each_rows_length():
    """Garbage (huge values) past a row's length must not change its output: the kernel reads
    only valid blocks and masks the rest of the last one."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, 256, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, 256, 16)).astype(np.float32)
    lengths = jnp.asarray([70, 200])
    clean = np.asarray(ragged_decode_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                               lengths, interpret=True))
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 70:], v2[0, :, 70:] = 1e4, 1e4
    k2[1, :, 200:], v2[1, :, 200:] = -1e4, 1e4
    dirty = np.asarray(ragged_decode_attention(jnp.asarray(q), jnp.asarray(k2), jnp.asarray(v2),
                                               lengths, interpret=True))
    np.testing.assert_allclose(dirty, clean, atol=1e-6)


def rope_reference(x, cos, sin):
    """float64 rotate-half RoPE of ``x [..., Dh]`` with ``cos / sin [Dh]``."""
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


@pytest.mark.parametrize("kv_heads,groups,length,rope", [(3, 3, 384, True), (2, 6, 3072, True),
                                                         (2, 6, 384, False)])
def test_fused_attention_writes_the_new_keys_and_matches_a_float64_loop(kv_heads, groups,
                                                                        length, rope):
    """The fused kernel (one split at 384, three splits of 1024 at 3072) takes each slot's
    stacked q/k/v heads, rotates q and k (RoPE; or takes them rotated), writes the new key /
    value at the slot's position, leaves every other cache entry as it was, and attends over
    positions 0..p (the new key included); a slot at position >= S is idle: output 0, no
    write."""
    rng = np.random.default_rng(kv_heads + length)
    b, d = 6, 32
    h = kv_heads * groups
    qkv = rng.standard_normal((b, h + 2 * kv_heads, d)).astype(np.float32)
    k = rng.standard_normal((b, kv_heads, length, d)).astype(np.float32)
    v = rng.standard_normal((b, kv_heads, length, d)).astype(np.float32)
    # first position, a block boundary, past it, the last position of a split, the row's last
    # position, idle
    positions = np.array([0, 32, 33, length // 3 - 1 if length > 1024 else 200, length - 1,
                          length])
    angles = positions[:, None] * 10000.0 ** (-np.arange(0, d, 2) / d)
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(angles), np.sin(angles)
    q, k_new, v_new = qkv[:, :h], qkv[:, h:h + kv_heads], qkv[:, h + kv_heads:]
    if rope:
        q = rope_reference(q.astype(np.float64), cos[:, None], sin[:, None])
        k_new = rope_reference(k_new.astype(np.float64), cos[:, None], sin[:, None])
    want_k, want_v = k.copy(), v.copy()
    for row, p in enumerate(positions):
        if p < length:
            want_k[row, :, p], want_v[row, :, p] = k_new[row], v_new[row]
    lengths = np.where(positions < length, positions + 1, 0)
    want = attention_reference(q, want_k, want_v, lengths)
    tables = (jnp.asarray(cos, jnp.float32), jnp.asarray(sin, jnp.float32)) if rope else None
    out, got_k, got_v = fused_decode_attention(
        *(jnp.asarray(x) for x in (qkv, k, v, positions)), num_heads=h, rope=tables,
        interpret=True)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5)
    np.testing.assert_allclose(np.asarray(got_k), want_k, rtol=0, atol=2e-6)  # RoPE rounding
    np.testing.assert_array_equal(np.asarray(got_v), want_v)


def test_ragged_tiling_chooses_whole_blocks():
    assert ragged_tiling(384) == (32, 1, 2, 3)  # a short row: one split of 32-key blocks
    assert ragged_tiling(3072) == (64, 3, 4, 2)  # 3 splits of 1024 = 16 blocks each
    assert ragged_tiling(4096) == (64, 4, 4, 2)
    assert ragged_tiling(48) == (16, 1, 2, 3)
    assert ragged_tiling(1000) is None  # dense fallback
    for length in (384, 3072, 4096, 48, 2048 + 1024 * 3):
        t = ragged_tiling(length)
        split = length // t.k_splits
        assert length % t.k_splits == 0 and split % t.block_k == 0 and split >= 16


def _greedy(engine, prompts, max_new=12, session=None):
    sampling = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    futures = [engine.submit(p, sampling, session_id=None if session is None else f"{session}{i}")
               for i, p in enumerate(prompts)]
    return [f.result(timeout=300)[0] for f in futures]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [random_prompt(rng, n) for n in (5, 17, 33, 60)]


@pytest.fixture(scope="module")
def reference(model, prompts):
    engine = make_engine(model, warmup=False, decode_attention="dense")
    try:
        return _greedy(engine, prompts)
    finally:
        engine.close()


def _assert_same(results, reference, atol=2e-4):
    for got, want in zip(results, reference):
        assert got.output_ids == want.output_ids
        np.testing.assert_allclose(got.output_logprobs, want.output_logprobs, atol=atol)


def test_engine_with_ragged_attention_matches_dense(model, prompts, reference):
    engine = make_engine(model, warmup=False, decode_attention="ragged")
    try:
        assert engine.decode_attention == "ragged_interpret"  # the Pallas interpreter on CPU
        _assert_same(_greedy(engine, prompts), reference)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def model_dh32():
    """The fused kernel needs a head dim divisible by 32 (the tiny model's is 16)."""
    return tiny_model(seed=3, cfg=TINY.replace(head_dim=32))


@pytest.mark.parametrize("decode_gemm", ["xla", "merged"])
def test_engine_with_fused_attention_matches_dense(model_dh32, prompts, decode_gemm):
    """Both fused paths: q/k/v projected and rotated in XLA then stacked (``xla``), and the
    merged q/k/v GEMM's output rotated inside the kernel (``merged``)."""
    dense = make_engine(model_dh32, warmup=False, decode_attention="dense")
    try:
        reference = _greedy(dense, prompts)
    finally:
        dense.close()
    engine = make_engine(model_dh32, warmup=False, decode_attention="ragged_fused",
                         decode_gemm=decode_gemm)
    try:
        assert engine.decode_attention == "ragged_fused_interpret"
        _assert_same(_greedy(engine, prompts), reference)
    finally:
        engine.close()


def test_fused_attention_falls_back_to_ragged_for_shapes_its_tiles_miss(model):
    """The tiny model's head dim (16) is not a multiple of 32: the engine compiles the ragged
    kernel instead, and the kernel itself refuses the shape with the same reason."""
    from agentrl_jax.kernels.fused_decode_attention import unsupported_shape

    assert unsupported_shape(4, 2, 16) is not None and unsupported_shape(12, 2, 128) is None
    assert unsupported_shape(34, 2, 64) is not None  # 17 query heads per KV head
    engine = make_engine(model, warmup=False, decode_attention="ragged_fused")
    try:
        assert engine.decode_attention == "ragged_interpret"
    finally:
        engine.close()
    with pytest.raises(ValueError, match="divisible by 32"):
        fused_decode_attention(jnp.zeros((1, 8, 16)), jnp.zeros((1, 2, 32, 16)),
                               jnp.zeros((1, 2, 32, 16)), jnp.zeros((1,), jnp.int32),
                               num_heads=4, interpret=True)


def test_engine_runs_on_the_device_it_is_given(model, prompts, reference):
    device = jax.devices()[5]
    engine = make_engine(model, warmup=False, devices=[device])
    try:
        assert {d for x in jax.tree.leaves(engine.weights.state) for d in x.devices()} == {device}
        assert engine.kv.cache.keys[0].devices() == {device}
        _assert_same(_greedy(engine, prompts), reference)
        assert engine.kv.cache.keys[0].devices() == {device}  # the donated cache stays there
    finally:
        engine.close()


def test_tensor_parallel_engine_matches_one_device(model, prompts, reference):
    devices = jax.devices()[2:4]
    engine = make_engine(model, warmup=False, devices=devices)
    try:
        assert engine.placement.tensor_parallel == 2
        kernel = engine.weights.state["layers"][0]["attn"]["q_proj"]["kernel"].value
        # column-parallel: each device holds half of the q projection's output columns
        assert {s.data.shape for s in kernel.addressable_shards} == {(64, 32)}
        # the cache's 2 KV heads are split over the 2 devices
        assert {s.data.shape for s in engine.kv.cache.keys[0].addressable_shards} == {(8, 1, 128, 16)}
        _assert_same(_greedy(engine, prompts), reference)
    finally:
        engine.close()


def test_replicas_pin_sessions_and_sync_weights_everywhere(model, prompts, reference):
    from agentrl_jax.rollout.engine.replicas import EngineReplicas
    from tests.rollout_helpers import ENGINE_KW
    from agentrl_jax.rollout.engine.engine import EngineConfig

    backend = EngineReplicas(model, EngineConfig(**ENGINE_KW), warmup=False,
                             devices=jax.devices()[:4])
    try:
        assert backend.num_replicas == 4
        assert [r.placement.devices for r in backend.replicas] == [[d] for d in jax.devices()[:4]]

        async def first_turns():
            sampling = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
            return await asyncio.gather(*(backend.generate(p, sampling, session_id=f"ep{i}")
                                          for i, p in enumerate(prompts)))

        results = asyncio.run(first_turns())
        _assert_same(results, reference)
        # four sessions started together: least-loaded placement spreads them over 4 replicas
        pinned = {f"ep{i}": backend.replica_for(f"ep{i}") for i in range(4)}
        assert sorted(pinned.values()) == [0, 1, 2, 3]
        # the second turn of each session returns to its replica and reuses the cached prefix
        before = [r.stats.cached_tokens for r in backend.replicas]

        async def second_turns():
            sampling = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
            return await asyncio.gather(*(
                backend.generate(p + r.output_ids + [7, 8], sampling, session_id=f"ep{i}")
                for i, (p, r) in enumerate(zip(prompts, results))))

        second = asyncio.run(second_turns())
        for i, (p, r) in enumerate(zip(prompts, second)):
            assert r.cached_tokens == len(p) + 12 - 1  # every token but the last one generated
            replica = backend.replicas[pinned[f"ep{i}"]]
            assert replica.stats.cached_tokens - before[pinned[f"ep{i}"]] >= r.cached_tokens

        # new sessions go where the fewest live sessions are, even when nothing is in flight
        # (least-in-flight alone would pin all four to replica 0)
        assert [backend.replica_for(f"idle{i}") for i in range(4)] == [0, 1, 2, 3]
        for i in range(4):
            backend.end_session(f"idle{i}")

        # an ended session loses its pin and its replica's cached row
        replica = backend.replicas[pinned["ep0"]]
        cached_before = replica.load()["cached_slots"]
        backend.end_session("ep0")
        _greedy(replica, prompts[:1])  # runs after the queued end_session
        assert replica.load()["cached_slots"] == cached_before - 1
        assert "ep0" not in backend._sessions

        # new weights reach every replica: all of them now answer like an engine on them
        other = tiny_model(seed=4)
        asyncio.run(backend.update_weights(other, version="7"))
        assert [r.weight_version for r in backend.replicas] == ["7"] * 4
        want = _greedy_on(other, prompts)
        for replica in backend.replicas:
            _assert_same(_greedy(replica, prompts), want)
            leaves = jax.tree.leaves(replica.weights.state)
            assert {d for x in leaves for d in x.devices()} == set(replica.placement.devices)
    finally:
        backend.close()


def test_kv_cache_released_while_idle_comes_back_for_the_next_request(model, prompts,
                                                                      reference):
    """release_kv_cache frees every replica's cache (the bytes of [max_batch, max_length] K and
    V rows of every layer), drops cached prefixes and pins, refuses while a request runs; the
    next request allocates a zero cache and answers exactly as before."""
    from agentrl_jax.rollout.engine.engine import EngineConfig
    from agentrl_jax.rollout.engine.replicas import EngineReplicas
    from tests.rollout_helpers import ENGINE_KW

    backend = EngineReplicas(model, EngineConfig(**ENGINE_KW), warmup=False,
                             devices=jax.devices()[:2])
    try:
        first = backend.replicas[0]
        _assert_same(_greedy(first, prompts, session="a"), reference)
        assert first.load()["cached_slots"] == len(prompts)
        backend.replica_for("pinned")
        c, m = first.config, first.model_config
        row_bytes = c.max_length * m.num_kv_heads * m.head_dim * 4  # float32 K or V, one layer
        expected = 2 * m.num_layers * c.max_batch * row_bytes * backend.num_replicas
        assert asyncio.run(backend.release_kv_cache()) == expected
        assert all(r.kv.cache is None for r in backend.replicas) and not backend._sessions
        assert first.load()["cached_slots"] == 0
        assert asyncio.run(backend.release_kv_cache()) == 0  # nothing left to free
        _assert_same(_greedy(first, prompts), reference)  # a fresh cache, same answers
        assert (first.stats.kv_releases, first.stats.kv_allocations) == (1, 1)
        assert first.kv.cache is not None and backend.replicas[1].kv.cache is None

        # a request submitted before the release: the engine thread queues it first, so the
        # release is refused, and the request finishes normally
        slow = first.submit(prompts[3], SamplingParams(max_new_tokens=40, temperature=0.0,
                                                       ignore_eos=True))
        with pytest.raises(RuntimeError, match="requests are running"):
            first.release_kv_cache_sync()
        assert len(slow.result(timeout=300)[0].output_ids) == 40
        assert first.kv.cache is not None
    finally:
        backend.close()


def _greedy_on(model, prompts):
    engine = make_engine(model, warmup=False)
    try:
        return _greedy(engine, prompts)
    finally:
        engine.close()


def test_engine_device_groups_from_the_config():
    from ml_collections import ConfigDict

    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.runtime.services import engine_device_groups

    cfg = ConfigDict({"rollout": {"engine_replicas": 0, "tensor_parallel": 2}})
    # the default on the CPU backend: one engine (virtual CPU devices share the same cores)
    assert [len(g) for g in engine_device_groups(to_run_config(cfg))] == [2]
    cfg.rollout.engine_replicas = 4  # asked for: 4 groups of 2 of the 8 virtual devices
    groups = engine_device_groups(to_run_config(cfg))
    assert [len(g) for g in groups] == [2] * 4
    assert len({d for g in groups for d in g}) == 8
    cfg.rollout.engine_replicas = 99
    with pytest.raises(ValueError, match="engine_replicas=99"):
        engine_device_groups(to_run_config(cfg))


def test_weights_sharded_over_the_replicas_devices_reach_them_by_one_all_gather(prompts):
    """A learner's FSDP parameters over exactly the replicas' devices: each single-device
    replica gets a whole copy from one compiled all-gather (no host round trip; what
    EngineReplicas.update_weights uses on accelerators), bitwise the learner's values, and an
    engine given its copy keeps those very buffers (no further copy)."""
    from flax import nnx

    from agentrl_jax.rollout.engine.engine import EngineConfig
    from agentrl_jax.rollout.engine.placement import to_state
    from agentrl_jax.rollout.engine.replicas import EngineReplicas, gather_to_replicas
    from agentrl_jax.sharding.mesh import make_mesh
    from agentrl_jax.sharding.rules import state_shardings
    from tests.rollout_helpers import ENGINE_KW

    devices = jax.devices()[:4]
    learner = tiny_model(seed=5)
    state = nnx.state(learner, nnx.Param)
    sharded = jax.device_put(state, state_shardings(state, make_mesh(fsdp=4, devices=devices)))
    assert any(len({s.device for s in x.addressable_shards}) == 4
               and x.addressable_shards[0].data.size < x.size for x in jax.tree.leaves(sharded))
    assert gather_to_replicas(sharded, [[d] for d in devices]) is None  # CPU: transfers
    copies = gather_to_replicas(sharded, [[d] for d in devices], on_cpu=True)
    assert copies is not None and len(copies) == 4
    for device, copy in zip(devices, copies):
        for x, want in zip(jax.tree.leaves(copy), jax.tree.leaves(state), strict=True):
            assert x.devices() == {device} and x.shape == want.shape
            np.testing.assert_array_equal(np.asarray(x), np.asarray(want))
    # not applicable: replicas on other devices, or several devices per replica
    assert gather_to_replicas(sharded, [[d] for d in jax.devices()[4:8]], on_cpu=True) is None
    assert gather_to_replicas(sharded, [devices[:2], devices[2:]], on_cpu=True) is None

    backend = EngineReplicas(tiny_model(seed=0), EngineConfig(**ENGINE_KW), warmup=False,
                             devices=devices)
    try:
        asyncio.run(backend.update_weights(nnx.merge(nnx.graphdef(learner), sharded),
                                           version="3"))
        want = _greedy_on(learner, prompts)
        for replica, device in zip(backend.replicas, devices):
            leaves = jax.tree.leaves(replica.weights.state)
            assert all(x.devices() == {device} for x in leaves)
            _assert_same(_greedy(replica, prompts), want)
        # an engine given its gathered copy keeps those very buffers (no second copy)
        mine = to_state(copies[1], backend.replicas[1].weights.abstract_state)
        backend.replicas[1].update_weights_sync(mine, version="4")
        assert ([x.unsafe_buffer_pointer() for x in jax.tree.leaves(backend.replicas[1].weights.state)]
                == [x.unsafe_buffer_pointer() for x in jax.tree.leaves(mine)])
    finally:
        backend.close()


def test_replicas_keep_equal_first_prompts_together_and_prefill_them_once(model, prompts,
                                                                          reference):
    """Two groups of four sessions with a shared prompt each (GRPO's first turn): each group
    goes to one replica, which prefills its prompt once; answers are the reference's."""
    from agentrl_jax.rollout.engine.engine import EngineConfig
    from agentrl_jax.rollout.engine.replicas import EngineReplicas
    from tests.rollout_helpers import ENGINE_KW

    backend = EngineReplicas(model, EngineConfig(**ENGINE_KW), warmup=False,
                             devices=jax.devices()[:4])
    try:
        sampling = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
        groups = {0: prompts[2], 1: prompts[3]}

        async def first_turns():
            backend.pause()  # one admission pass sees every group member
            tasks = [asyncio.ensure_future(backend.generate(p, sampling, session_id=f"g{g}s{i}"))
                     for g, p in groups.items() for i in range(4)]
            await asyncio.sleep(0.05)
            backend.resume()
            return await asyncio.gather(*tasks)

        results = asyncio.run(first_turns())
        placed = {g: {backend.replica_for(f"g{g}s{i}") for i in range(4)} for g in groups}
        assert all(len(where) == 1 for where in placed.values())
        assert placed[0] != placed[1]
        for g, where in placed.items():
            assert backend.replicas[where.pop()].stats.shared_prompts == 3
        _assert_same(results[:4], [reference[2]] * 4)
        _assert_same(results[4:], [reference[3]] * 4)
    finally:
        backend.close()
