"""Embedded-engine slot sizing (``training.runtime.services.engine_slots``), hand-computed cases."""

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.config.sections import RunConfig
from agentrl_jax.training.runtime.services import engine_slots, max_episodes_per_round

# SmolLM2-135M's attention shape: 30 layers, 3 KV heads of 64
SMOL = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                   num_heads=9, num_kv_heads=3, head_dim=64)
PER_SLOT_F32 = 2 * 30 * 3 * 64 * 4096 * 4  # 188,743,680 bytes at max_context 4096


def _config(max_batch=64, max_concurrency=64, max_context=4096) -> RunConfig:
    c = base_config()
    c.rollout.max_batch, c.rollout.max_concurrency = max_batch, max_concurrency
    c.rollout.max_context = max_context
    return to_run_config(c)


def test_accelerator_slots_are_batch_capped_by_concurrency():
    assert engine_slots(_config(), SMOL, backend="gpu") == 64
    assert engine_slots(_config(max_concurrency=16), SMOL, backend="gpu") == 16
    assert engine_slots(_config(max_batch=8), SMOL, backend="tpu") == 8


def test_cpu_kv_cache_fits_a_sixth_of_host_ram():
    ram = 24 * 2**30
    want = ram // 6 // PER_SLOT_F32  # 22
    assert want == 22
    assert engine_slots(_config(), SMOL, host_ram_bytes=ram, backend="cpu") == want
    # bf16 KV: half the bytes per slot
    assert ram // 6 // (PER_SLOT_F32 // 2) == 45
    assert engine_slots(_config(), SMOL, "bfloat16", host_ram_bytes=ram, backend="cpu") == 45
    # plenty of RAM: the configured slots
    assert engine_slots(_config(), SMOL, host_ram_bytes=512 * 2**30, backend="cpu") == 64
    # never below one slot
    assert engine_slots(_config(), SMOL, host_ram_bytes=2**20, backend="cpu") == 1


def test_slots_capped_by_the_episodes_a_round_can_have():
    c = base_config()
    c.train.tasks_per_step, c.train.samples_per_task = 2, 2
    c.train.eval_tasks, c.train.eval_samples = 4, 1
    c.env.names = "babyai"
    assert max_episodes_per_round(to_run_config(c)) == 4
    assert engine_slots(to_run_config(c), SMOL, backend="gpu") == 4
    c.env.names = "babyai,textcraft"  # eval tasks per family: 2 x 4
    assert max_episodes_per_round(to_run_config(c)) == 8
    c.train.tasks_per_step = 16  # 16 x 2 = 32 training episodes
    assert engine_slots(to_run_config(c), SMOL, backend="gpu") == 32
