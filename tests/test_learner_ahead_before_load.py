"""The first update's programs compiled before the model loads: ``policy.abstract_learner``
describes, from the run config alone, the learner ``load_learner`` then builds
(``AbstractLearner.differences`` is empty), the programs compiled from that description are the
ones the loaded learner's first update runs (a compile listener sees none compiled again), and
a description that does not fit the loaded learner is caught and compiled again
(``AheadCompile.for_loaded``)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentrl_jax.learner import Learner, UpdateOptions
from agentrl_jax.learner.ahead import AheadCompile, compile_first_update
from agentrl_jax.learner.shapes import AbstractLearner
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh
from agentrl_jax.training.config.experiment import to_run_config
from agentrl_jax.training.runtime.policy import (abstract_learner, load_learner, load_policy,
                                                 policy_config)
from experiments.smoke import smoke
from learner_helpers import random_batch, recorded_compiles
from test_learner_ahead import BIG, CFG, MODEL

# the reference has the parameters' dtype: its log-prob pass is the policy's program
NAMES = ["log-prob pass", "gradient accumulation", "optimiser apply"]


def _run_config(**learner):
    """The smoke run (a tiny random model, SmolLM2's tokenizer) with packed rows and a KL
    reference."""
    c = smoke()
    c.rollout.max_context = 256
    c.learner.pack_length = 256
    c.learner.kl_coef = 0.05
    c.learner.kl_in_reward = False
    for key, value in learner.items():
        setattr(c.learner, key, value)
    return to_run_config(c)


def test_the_config_describes_the_learner_the_run_loads_and_its_first_update_compiles_nothing():
    cfg = _run_config()
    described = abstract_learner(cfg)
    with recorded_compiles() as names:
        assert list(compile_first_update(described)) == NAMES
        assert BIG <= set(names), names
        names.clear()
        learner, model, _, _ = load_learner(cfg)
        assert described.differences(learner) == []
        batch = random_batch(0, 6, 30, model.cfg.vocab_size, group_size=3, prompt=4)
        metrics = learner.update(batch, UpdateOptions(log=False))
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["batch/packed_rows"] > 0
    assert not BIG & set(names), names


@pytest.mark.parametrize("model", ["random", "restricted"])
def test_the_policy_config_is_the_loaded_policys(model):
    c = smoke()
    if model == "restricted":
        c.model.output_tokens = ("A", "B", "C")
    cfg = to_run_config(c)
    loaded = load_policy(cfg)[0].cfg
    assert policy_config(cfg) == loaded
    assert bool(loaded.output_token_ids) == (model == "restricted")


def test_the_pretrained_policy_config_is_read_without_the_weights():
    from agentrl_jax.models.pretrained import load_pretrained

    c = smoke()
    c.model.random_init = {}
    c.model.dtype = "bfloat16"
    cfg = to_run_config(c)
    assert policy_config(cfg) == load_pretrained(cfg.model.name, dtype="bfloat16").config


def test_a_description_that_does_not_fit_the_loaded_learner_is_compiled_again():
    mesh = make_mesh(devices=jax.devices()[:1])
    cfg = CFG.replace(pack_length=200)
    learner = Learner(init_model(MODEL, seed=0), cfg, mesh=mesh)
    fits = AbstractLearner(MODEL, cfg, mesh)
    wrong = AbstractLearner(MODEL.replace(num_layers=2), cfg.replace(kl_coef=0.0), mesh)
    assert fits.differences(learner) == []
    assert wrong.differences(learner) == ["graph", "learner config", "parameters",
                                          "optimiser state", "reference"]
    said: list[str] = []
    first = AheadCompile(fits, say=said.append)
    assert first.for_loaded(learner) is first and said == []
    first.wait()
    assert len(said) == 1 and said[0].startswith("train step compiled ahead of time: 3 programs")
    said.clear()
    job = AheadCompile(wrong, say=said.append)
    again = job.for_loaded(learner)
    assert again is not job and again.described is learner
    assert said == ["the train step compiled ahead of the model load is not the loaded "
                    "learner's (graph, learner config, parameters, optimiser state, reference "
                    "differ); compiling it again"]
    job.wait()
    again.wait()
    with recorded_compiles() as names:
        learner.update(random_batch(0, 6, 30, MODEL.vocab_size, group_size=3, prompt=4),
                       UpdateOptions(log=False))
    assert not BIG & set(names), names


def test_the_trainer_compiles_from_the_config_what_its_loaded_learner_runs(tmp_path):
    """The trainer's compile before the model load (``Trainer._compile_before_load``) reserves
    the scored-head capacity the trainer then reserves on the loaded learner, so the loaded
    learner matches the description and the compile is kept."""
    from agentrl_jax.training.rl.schedule import scored_tokens_bound
    from agentrl_jax.training.rl.trainer import Trainer

    trainer = Trainer(_run_config(), str(tmp_path), progress=False)
    said: list[str] = []
    job = trainer._compile_before_load(said.append)
    assert isinstance(job.described, AbstractLearner)
    learner = load_learner(trainer.config)[0]
    learner.scored_capacity.reserve(
        scored_tokens_bound(trainer.schedule, trainer.config.rollout.max_new_tokens))
    assert job.for_loaded(learner) is job
    job.wait()
    assert job.error is None and len(said) == 1, said
    assert said[0].startswith("train step compiled ahead of time: 3 programs in ")
    assert said[0].endswith("beside the model load, the engine's start-up and the first "
                            "rollout)")
