"""The engine's KV cache checked against its device's free memory before it is allocated
(``rollout/engine/kv_memory.py``): the bytes per device against a hand count
(``2 x layers x slots x kv_heads x max_length x head_dim x itemsize``, split over the KV heads
by a tensor-parallel sharding), the refusal's message, and an engine that refuses to start when
its device reports too little free memory (8 virtual CPU devices, see conftest.py)."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout.engine import kv_memory
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.forward import HEAD_MAJOR, SEQ_MAJOR
from agentrl_jax.rollout.engine.kv_memory import (KVCacheDoesNotFit, KVCacheMemory, check_kv_fits,
                                                  free_device_bytes, kv_bytes_per_device)
from agentrl_jax.rollout.engine.placement import EnginePlacement
from tests.rollout_helpers import TINY, make_engine

#: SmolLM2-135M's attention shape (30 layers, 3 KV heads of 64), bf16 KV
SMOLLM2_KV = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                         dtype="bfloat16")


def _hand_count(cfg: ModelConfig, slots: int, length: int, itemsize: int, split: int = 1) -> int:
    return 2 * cfg.num_layers * slots * (cfg.num_kv_heads // split) * length * cfg.head_dim \
        * itemsize


@pytest.mark.parametrize("layout", [HEAD_MAJOR, SEQ_MAJOR])
def test_bytes_per_device_match_the_hand_count(layout):
    config = EngineConfig(max_batch=8, max_length=128, kv_layout=layout)
    one = EnginePlacement(jax.devices()[:1]).cache_sharding(TINY.num_kv_heads, layout)
    assert kv_bytes_per_device(config, TINY, one) == _hand_count(TINY, 8, 128, 4)
    # two devices split TINY's two KV heads: half the cache on each
    two = EnginePlacement(jax.devices()[:2]).cache_sharding(TINY.num_kv_heads, layout)
    assert kv_bytes_per_device(config, TINY, two) == _hand_count(TINY, 8, 128, 4, split=2)


def test_the_textcraft_lane_that_ran_out_of_memory():
    """256 slots x 4,096 tokens of SmolLM2-135M in bf16: 24,159,191,040 bytes (22.5 GiB), the
    size XLA reported for the engine's arguments when four lanes shared an 80 GB H100."""
    config = EngineConfig(max_batch=256, max_length=4096)
    sharding = EnginePlacement(jax.devices()[:1]).cache_sharding(3, HEAD_MAJOR)
    kv = kv_bytes_per_device(config, SMOLLM2_KV, sharding)
    assert kv == _hand_count(SMOLLM2_KV, 256, 4096, 2) == 24_159_191_040
    limit = int(0.225 * 80e9)
    with pytest.raises(KVCacheDoesNotFit, match=r"needs 22\.5 GiB .*\(256 slots x 4096 tokens\)"):
        check_kv_fits(kv, (limit - 300 * 2**20, limit), config, "cuda:0")
    check_kv_fits(kv, (int(0.225 * 141e9), int(0.225 * 141e9)), config, "cuda:0")  # an H200


def test_check_passes_at_the_boundary_and_without_statistics():
    config = EngineConfig(max_batch=2, max_length=64)
    check_kv_fits(1000, (1000, 4000), config, "cuda:0")
    check_kv_fits(10**12, None, config, "cpu:0")
    with pytest.raises(KVCacheDoesNotFit, match=r"rollout\.max_batch.*--per-gpu"):
        check_kv_fits(1001, (1000, 4000), config, "cuda:0")


@dataclasses.dataclass
class _FakeDevice:
    stats: dict | None

    def memory_stats(self):
        return self.stats


def test_free_bytes_of_the_tightest_device():
    devices = [_FakeDevice({"bytes_limit": 100, "bytes_in_use": 30}),
               _FakeDevice({"bytes_limit": 80, "bytes_in_use": 20}),
               _FakeDevice({"bytes_limit": 200})]
    assert free_device_bytes(devices) == (60, 80)
    assert free_device_bytes(devices + [_FakeDevice(None)]) is None
    assert free_device_bytes([_FakeDevice({"bytes_in_use": 5})]) is None
    assert free_device_bytes(jax.devices()[:1]) is None  # the CPU backend reports no limit


def test_an_engine_refuses_to_start_without_room(monkeypatch):
    monkeypatch.setattr(kv_memory, "free_device_bytes", lambda devices: (1024, 4096))
    with pytest.raises(KVCacheDoesNotFit, match=r"8 slots x 128 tokens"):
        make_engine(warmup=False)
    monkeypatch.setattr(kv_memory, "free_device_bytes", lambda devices: None)
    config = EngineConfig(max_batch=2, max_length=64)
    sharding = EnginePlacement(jax.devices()[:1]).cache_sharding(TINY.num_kv_heads, HEAD_MAJOR)
    memory = KVCacheMemory(config, TINY, sharding)
    assert memory.release() == _hand_count(TINY, 2, 64, 4)


def test_the_inference_server_refuses_with_one_line(monkeypatch):
    """``python -m agentrl_jax.rollout.servers.server`` exits with the refusal's line (its own
    flags named) before it serves anything."""
    from agentrl_jax.rollout.servers.server import main

    monkeypatch.setattr(kv_memory, "free_device_bytes", lambda devices: (2**20, 2**30))
    with pytest.raises(SystemExit, match=r"^error: the engine's KV cache needs .*--max-batch"):
        main(["--model", "smollm2", "--max-batch", "4", "--max-length", "512"])
