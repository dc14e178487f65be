"""``learner/ahead.py``: the packed update's log-prob pass, gradient accumulation and optimiser
apply compiled ahead of time from abstract values are the programs the first real update runs
(it compiles none of them again), for a learner with a KL reference and truncated importance
weights; an update that is not packed is left alone."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentrl_jax.learner import Learner, LearnerConfig, RolloutBatch, UpdateOptions
from agentrl_jax.learner.ahead import AheadCompile, compile_first_update, first_update_keys
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh
from learner_helpers import random_batch, recorded_compiles

# shapes no other test uses, so none of these programs is in jit's cache yet
MODEL = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16)
CFG = LearnerConfig(entropy_coef=0.0, dtype="float32", remat=False, learning_rate=1e-3,
                    micro_batch_size=2,
                    pack_length=80, logprob_batch_size=3, logprob_chunk_size=16,
                    kl_coef=0.05, kl_in_reward=False, tis_cap=2.0,
                    advantage_estimator="grpo")
BIG = {"jit(packed_logprobs)", "jit(accumulate)", "jit(apply)"}  # passes.py, packed_step.py


def _batch(seed: int = 0, b: int = 6, t: int = 30) -> RolloutBatch:
    return random_batch(seed, b, t, MODEL.vocab_size, group_size=3, prompt=4)


@pytest.fixture
def compiled_names():
    with recorded_compiles() as names:
        yield names


@pytest.mark.parametrize("fsdp", [1, 4], ids=["one_device", "fsdp4"])
def test_the_first_update_compiles_none_of_the_programs_compiled_ahead(compiled_names, fsdp):
    if len(jax.devices()) < fsdp:
        pytest.skip(f"needs {fsdp} (virtual) devices")
    # micro- and log-prob batches divisible by the 4 batch shards; other shapes than the
    # one-device case, so its compiles are not reused
    cfg = CFG if fsdp == 1 else CFG.replace(micro_batch_size=4, logprob_batch_size=4)
    learner = Learner(init_model(MODEL, seed=0), cfg,
                      mesh=make_mesh(fsdp=fsdp, devices=jax.devices()[:fsdp]))
    keys = first_update_keys(learner)
    assert keys == ("advantages", "is_weights", "loss_mask", "loss_weights", "old_logprobs",
                    "positions", "ref_logprobs", "segment_ids", "tokens")
    # policy and reference log-prob passes (float32 both: one program, compiled once),
    # accumulate, apply
    assert list(compile_first_update(learner)) == [
        "log-prob pass", "gradient accumulation", "optimiser apply"]
    ahead = set(compiled_names)
    assert BIG <= ahead, ahead
    compiled_names.clear()
    metrics = learner.update(_batch(b=8), UpdateOptions(log=False))
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["batch/packed_rows"] > 0
    assert metrics["rollout/tis_weight_mean"] > 0  # the importance weights were trained with
    assert not BIG & set(compiled_names), compiled_names


def test_background_compile_waits_and_unpacked_updates_are_left_alone():
    unpacked = Learner(init_model(MODEL, seed=0), CFG.replace(pack_length=0),
                       mesh=make_mesh(devices=jax.devices()[:1]))
    assert first_update_keys(unpacked) is None and compile_first_update(unpacked) == {}
    said: list[str] = []
    job = AheadCompile(unpacked, say=said.append)
    job.wait()
    assert job.programs == 0 and job.error is None and said == []


def test_the_training_loop_waits_for_the_ahead_compile_before_its_first_update():
    import asyncio

    from agentrl_jax.training.rl.stages import BatchSettings
    from agentrl_jax.training.rl.update_stage import LearnerUpdate

    order: list[str] = []

    class Ahead:
        def wait(self):
            order.append("wait")

    class StubLearner:
        def update(self, batch, options):
            order.append("update")
            return {"batch": batch}

    stage = LearnerUpdate(StubLearner(), None, lambda *args, **kwargs: None,
                          settings=BatchSettings(max_staleness=0, skip_flat_groups=False,
                                                 turn_level=False, pad_id=0,
                                                 episode_estimator=None, advantage_settings={}),
                          ahead=Ahead())
    assert asyncio.run(stage.update_learner("b1", False)) == {"batch": "b1"}
    asyncio.run(stage.update_learner("b2", False))
    assert order == ["wait", "update", "update"] and stage.ahead_compile is None


def test_an_update_of_several_micro_batches_compiles_the_accumulation_once(compiled_names):
    """The first micro-batch's metric sums are placed as ``accumulate`` returns them, so the
    later micro-batches reuse its program (uncommitted zeros once compiled it twice)."""
    learner = Learner(init_model(MODEL, seed=0), CFG.replace(pack_length=64),
                      mesh=make_mesh(devices=jax.devices()[:1]))
    metrics = learner.update(_batch(b=12), UpdateOptions(log=False))
    rows_per_step = metrics["batch/packed_rows"] / CFG.mini_batches
    assert rows_per_step > CFG.micro_batch_size  # two micro-batches or more per step
    assert compiled_names.count("jit(accumulate)") == 1, compiled_names


def _turn_batch(b: int = 8, t: int = 40, scored: int = 6, seed: int = 0) -> RolloutBatch:
    """``b`` trajectories of ``t`` tokens whose last ``scored`` tokens carry the loss (an
    agent's short action after a long observation)."""
    rng = np.random.default_rng(seed)
    loss = np.zeros((b, t), np.float32)
    loss[:, t - scored:] = 1.0
    return RolloutBatch.from_mapping({
        "tokens": rng.integers(1, MODEL.vocab_size, (b, t)).astype(np.int32),
        "attention_mask": np.ones((b, t), np.int32), "loss_mask": loss,
        "rollout_logprobs": (-rng.random((b, t)) * loss).astype(np.float32),
        "group_id": np.arange(b) // 4, "reward": rng.random(b).astype(np.float32)})


def test_the_scored_lm_head_first_update_runs_the_programs_compiled_ahead(compiled_names):
    """Packed rows of 128 tokens would hold three 40-token trajectories of 6 scored tokens
    each (18 > the 16 compiled ahead: the first update compiled a 32 bucket of the log-prob
    pass and the train step). The pack plan keeps each row within the capacity instead."""
    cfg = CFG.replace(pack_length=128, kl_coef=0.0, micro_batch_size=2, logprob_batch_size=2,
                      scored_capacity_min=16)
    assert cfg.scored_lm_head
    learner = Learner(init_model(MODEL, seed=0), cfg, mesh=make_mesh(devices=jax.devices()[:1]))
    assert list(compile_first_update(learner)) == [
        "log-prob pass", "gradient accumulation", "optimiser apply"]
    assert BIG <= set(compiled_names), compiled_names
    compiled_names.clear()
    metrics = learner.update(_turn_batch(), UpdateOptions(log=False))
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["batch/packed_rows"] > 0
    assert not BIG & set(compiled_names), compiled_names
    assert learner.scored_capacity.value == 16


def test_the_log_prob_pass_tail_shape_is_compiled_ahead(compiled_names):
    """Log-prob calls of 4 rows with micro-batches of 2: the pass ends in a tail call of 2 rows
    (``token_space.logprob_call_rows``), a second shape of the packed log-prob program, which
    is compiled ahead with the first, so the first update with a tail compiles neither."""
    cfg = CFG.replace(micro_batch_size=2, logprob_batch_size=4, pack_length=72)
    learner = Learner(init_model(MODEL, seed=0), cfg, mesh=make_mesh(devices=jax.devices()[:1]))
    # policy and reference passes at 4 and 2 rows (float32 both: two programs, each compiled
    # once), accumulate, apply
    assert list(compile_first_update(learner)) == [
        "log-prob pass", "log-prob pass (tail calls)", "gradient accumulation", "optimiser apply"]
    assert compiled_names.count("jit(packed_logprobs)") == 2, compiled_names
    compiled_names.clear()
    metrics = learner.update(_batch(b=16), UpdateOptions(log=False))
    assert metrics["learner/logprob_rows_padded"] % 4 == 2  # a tail call of 2 rows ran
    assert not BIG & set(compiled_names), compiled_names
