"""``train.task_sampling`` (training/rl/task_sampler.py): the permutation's draws as committed
before learnability existed; learnability against a NumPy simulation of levels solved with
probability 0, 0.5 and 1 (the hand-computed share of the 0.5 level, fewer flat groups than the
permutation), its moving average by hand, determinism, the checkpoint round trip and the
config check."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ml_collections import ConfigDict

from agentrl_jax.agent.actor_pool import TaskRef
from agentrl_jax.training.config.experiment import base_config
from agentrl_jax.training.config.sections import TrainConfig
from agentrl_jax.training.preflight.validate import ConfigError, check_config
from agentrl_jax.training.rl.stop_policy import Checkpoints
from agentrl_jax.training.rl.task_sampler import (PRIOR, SAMPLINGS, LearnabilitySampler,
                                                  TaskSampler, make_task_sampler, task_level)

#: the config's defaults of train.learnability_ema / _eps (named once, in TrainConfig)
RATE, EPS = TrainConfig().learnability_ema, TrainConfig().learnability_eps


def _mixed_tasks() -> list[TaskRef]:
    return ([TaskRef("babyai", f"L{lv}/seed={s}") for s in range(3) for lv in range(2)]
            + [TaskRef("textcraft", f"g{i}") for i in range(3)])


def test_permutation_draws_are_the_committed_ones():
    # computed with the sampler of commit 2701ce8 (before train.task_sampling existed)
    sampler = make_task_sampler(_mixed_tasks(), 11, "permutation", {"cursor": 1})
    got = [(t.env[0], t.task_id) for t in sampler.next(9) + sampler.next(5)]
    assert got == [('t', 'g0'), ('b', 'L1/seed=0'), ('t', 'g1'), ('b', 'L0/seed=2'),
                   ('t', 'g2'), ('b', 'L1/seed=2'), ('t', 'g2'), ('b', 'L0/seed=1'),
                   ('t', 'g1'), ('b', 'L0/seed=0'), ('t', 'g0'), ('b', 'L1/seed=2'),
                   ('t', 'g1'), ('b', 'L1/seed=1')]
    assert sampler.cursor == 15 and type(sampler) is TaskSampler
    assert sampler.state() == {"cursor": 15}  # what checkpoints held before: nothing else
    assert not sampler.observes


def test_levels_of_the_families_task_ids():
    assert task_level("BabyAI-ActionObjDoor-v0/seed=0") == "BabyAI-ActionObjDoor-v0"
    assert task_level("boil/var=3") == "boil"  # ScienceWorld: the task
    assert task_level("click-button/seed=12") == "click-button"  # MiniWoB: the task
    assert task_level("dark_oak_sign") == "dark_oak_sign"  # TextCraft: each goal its own
    assert task_level("a/b/c") == "a"  # before the first "/"


def _episodes(env: str, task_id: str, scores, status: str = "done", shaping: float = 0.0):
    return [{"env": env, "task_id": task_id, "status": status, "reward": r + shaping,
             "shaping": shaping, "success": r > 0} for r in scores]


def test_the_moving_average_by_hand():
    tasks = [TaskRef("e", f"A/seed={i}") for i in range(4)] + [TaskRef("e", "B/seed=0")]
    sampler = LearnabilitySampler(tasks, seed=0, rate=0.25, eps=0.05)
    episodes = (_episodes("e", "A/seed=1", [1, 1, 1, 0, 0, 0, 0, 0])
                + _episodes("e", "A/seed=2", [0.0], status="env_error")  # left out
                + _episodes("e", "B/seed=0", [0.0, 0.0], shaping=0.1))  # shaped, unsolved
    sampler.observe(episodes)
    # A: 0.75 * 0.5 + 0.25 * 3/8; B: 0.75 * 0.5 + 0.25 * 0
    assert sampler.estimates["e"] == {"A": 0.46875, "B": 0.375}
    w = sampler.weights("e")  # levels sorted: A, B
    np.testing.assert_allclose(w, [0.46875 * 0.53125 + 0.05, 0.375 * 0.625 + 0.05])
    sampler.observe([])  # a step without finished episodes changes nothing
    assert sampler.estimates["e"] == {"A": 0.46875, "B": 0.375}


def _simulate(sampler: TaskSampler, probs: dict[str, float], steps: int, warmup: int,
              group: int = 8, seed: int = 0) -> tuple[dict[str, float], float]:
    """Steps of one task each, groups of ``group`` samples scoring 1 with the level's
    probability; the share of each level drawn after ``warmup`` and of flat groups."""
    rng = np.random.default_rng(seed)
    drawn, flat = {lv: 0 for lv in probs}, 0
    for step in range(steps):
        (task,) = sampler.next(1)
        level = task_level(task.task_id)
        scores = (rng.random(group) < probs[level]).astype(float)
        sampler.observe(_episodes(task.env, task.task_id, scores))
        if step >= warmup:
            drawn[level] += 1
            flat += int(scores.min() == scores.max())
    n = steps - warmup
    return {lv: c / n for lv, c in drawn.items()}, flat / n


def test_learnability_draws_the_half_solved_level_at_the_hand_computed_share():
    probs = {"never": 0.0, "half": 0.5, "always": 1.0}
    tasks = [TaskRef("babyai", f"{lv}/seed={s}") for lv in probs for s in range(5)]
    eps = 0.05
    learn = make_task_sampler(tasks, 3, "learnability", rate=0.25, eps=eps)
    shares, flat = _simulate(learn, probs, steps=4300, warmup=300)
    # after the warm-up p = 0 and 1 (weights eps), p ~ 0.5 (0.25 + eps): the 0.5 level's share
    expected = (0.25 + eps) / (0.25 + 3 * eps)  # 0.75
    assert abs(shares["half"] - expected) < 0.03, shares
    assert abs(shares["never"] - shares["always"]) < 0.04
    assert learn.estimates["babyai"]["never"] < 1e-3 < 1 - 1e-3 < learn.estimates["babyai"][
        "always"]
    # flat groups: every group of a 0 / 1 level, 2 / 2^8 of the 0.5 level's
    flat_half = 2 / 2 ** 8
    assert abs(flat - ((1 - expected) + expected * flat_half)) < 0.03
    perm_shares, perm_flat = _simulate(TaskSampler(tasks, seed=3), probs, 4300, 300)
    assert abs(perm_shares["half"] - 1 / 3) < 0.01  # a permutation of 15 tasks, 5 per level
    assert abs(perm_flat - (2 + flat_half) / 3) < 0.02
    assert flat < perm_flat - 0.3


def test_a_step_draws_levels_without_replacement_and_environments_in_turn():
    tasks = ([TaskRef("a", f"L{lv}/seed={s}") for lv in range(3) for s in range(4)]
             + [TaskRef("b", f"g{i}") for i in range(2)])
    sampler = LearnabilitySampler(tasks, seed=1, rate=RATE, eps=0.05)
    sampler.observe(_episodes("a", "L0/seed=0", [0.0] * 8) * 6)  # L0 unlikely, not excluded
    for _ in range(5):
        step = sampler.next(6)
        assert [t.env for t in step] == ["a", "b"] * 3
        assert sorted(task_level(t.task_id) for t in step if t.env == "a") == ["L0", "L1", "L2"]
        assert {t.task_id for t in step if t.env == "b"} == {"g0", "g1"}  # 3 draws, 2 goals
        assert sampler.last_draw["train/task_levels"] == 5.0  # 3 levels of a, 2 goals of b
    # within a level: each of its 4 tasks once per pass (5 steps drew each level 5 times)
    assert sampler.level_draws["a"] == {"L0": 5, "L1": 5, "L2": 5}
    # the largest weight's share: b's two goals are still at the prior (1/2 each)
    assert sampler.last_draw["train/task_level_max_share"] == 0.5


def test_a_level_takes_its_tasks_in_a_permutation_per_pass():
    tasks = [TaskRef("a", f"L/seed={s}") for s in range(5)]
    sampler = LearnabilitySampler(tasks, seed=4, rate=RATE, eps=EPS)
    ids = [t.task_id for t in sampler.next(10)]
    assert sorted(ids[:5]) == sorted(ids[5:]) == sorted(t.task_id for t in tasks)
    order = np.random.default_rng([4, 0, 0, 0]).permutation(5)
    assert ids[:5] == [tasks[int(i)].task_id for i in order]


def _run(sampler: TaskSampler, steps: int, seed: int = 0) -> list[TaskRef]:
    rng, out = np.random.default_rng(seed), []
    for _ in range(steps):
        tasks = sampler.next(4)
        out += tasks
        sampler.observe([e for t in tasks for e in _episodes(
            t.env, t.task_id, (rng.random(8) < 0.3).astype(float))])
    return out


def _levels_tasks() -> list[TaskRef]:
    return ([TaskRef("babyai", f"L{lv}/seed={s}") for lv in range(6) for s in range(3)]
            + [TaskRef("textcraft", f"g{i}") for i in range(4)])


def test_learnability_is_deterministic_for_a_seed_and_state():
    a = _run(make_task_sampler(_levels_tasks(), 7, "learnability", rate=RATE, eps=EPS), 30)
    b = _run(make_task_sampler(_levels_tasks(), 7, "learnability", rate=RATE, eps=EPS), 30)
    c = _run(make_task_sampler(_levels_tasks(), 8, "learnability", rate=RATE, eps=EPS), 30)
    assert a == b and a != c


def test_the_checkpoint_round_trip_gives_the_same_next_draws():
    tasks = _levels_tasks()
    sampler = make_task_sampler(tasks, 7, "learnability", rate=0.3, eps=0.02)
    _run(sampler, 12)
    saves = []

    class Learner:
        def save(self, extra, step=None, force=False):
            saves.append(json.loads(json.dumps(extra)))  # the checkpoint's JSON

    state = sampler.state()
    Checkpoints(lambda *a, **k: None).save(Learner(), 12, state["cursor"], 1.0, sampler=state)
    saved = saves[0]
    assert saved["cursor"] == sampler.cursor == 48 and saved["step"] == 12
    assert saved["task_sampler"]["estimates"] == sampler.estimates
    resumed = make_task_sampler(tasks, 7, "learnability", saved, rate=0.3, eps=0.02)
    assert _run(resumed, 10, seed=1) == _run(sampler, 10, seed=1)
    assert resumed.estimates == sampler.estimates
    # an old checkpoint (only a cursor): the permutation resumes exactly, learnability at priors
    old = make_task_sampler(tasks, 7, "permutation", {"step": 3, "cursor": 5})
    assert old.next(9) == TaskSampler(tasks, seed=7, cursor=5).next(9)
    fresh = make_task_sampler(tasks, 7, "learnability", {"step": 3, "cursor": 5},
                              rate=RATE, eps=EPS)
    assert fresh.cursor == 5 and fresh.estimates == {"babyai": {}, "textcraft": {}}
    assert all(w == PRIOR * (1 - PRIOR) + 0.05 for w in fresh.weights("babyai"))


def test_a_rewind_draws_the_same_tasks_again_and_keeps_what_was_observed():
    sampler = make_task_sampler(_levels_tasks(), 2, "learnability", rate=RATE, eps=EPS)
    _run(sampler, 3)
    position = sampler.position()
    first = sampler.next(4)
    sampler.observe(_episodes("babyai", "L0/seed=0", [1.0] * 8))  # the step before's results
    estimates = json.loads(json.dumps(sampler.estimates))
    sampler.rewind(position)
    assert sampler.estimates == estimates and sampler.cursor == position["cursor"]
    state = sampler.state(position)  # what a checkpoint of that step holds
    assert state["cursor"] == position["cursor"]
    assert state["task_sampler"]["level_draws"] == position["level_draws"]
    again = make_task_sampler(_levels_tasks(), 2, "learnability", state, rate=RATE, eps=EPS)
    assert again.next(4) == sampler.next(4)
    assert len(first) == 4


def test_the_settings_are_checked():
    assert TrainConfig().task_sampling == "permutation"
    config = base_config()
    names = TrainConfig.__dataclass_fields__["task_sampling"].metadata["choices"]
    assert tuple(names) == SAMPLINGS
    for key, bad in (("task_sampling", "curriculum"), ("learnability_ema", 0.0),
                     ("learnability_eps", 0.0)):
        c = ConfigDict(config.to_dict())
        c.train = ConfigDict({**config.train.to_dict(), key: bad})
        with pytest.raises(ConfigError, match=f"train.{key}"):
            check_config(c)
    with pytest.raises(ValueError, match="unknown task sampling"):
        make_task_sampler(_levels_tasks(), 0, "curriculum")


def test_the_training_loop_observes_checkpoints_and_logs_the_sampler(tmp_path):
    """``Trainer.train``'s real loop with fakes (tests/test_trainer_failed_step.py): every
    episode scores 0, so each level's estimate after ``k`` observed steps is 0.5 * 0.75^k; the
    checkpoint of step ``k`` holds it with cursor 2k; every step's metrics row says what the
    draw did."""
    import asyncio

    from agentrl_jax.training.rl.trainer import Trainer
    from tests.test_trainer_failed_step import (FailingPool, RecordingBackend,
                                                RecordingLearner, fake_loop_config)

    class Learner(RecordingLearner):
        extras: list[dict] = []

        def save(self, extra, step=None, force=False):
            super().save(extra, step, force)
            self.extras.append(json.loads(json.dumps(extra)))

    c = fake_loop_config(3, save_every=1, task_sampling="learnability")
    tasks = [TaskRef("babyai", f"{lv}/seed={s}") for lv in "AB" for s in range(3)]
    trainer = Trainer(c, str(tmp_path), progress=False)
    sampler = make_task_sampler(tasks, 0, c.train.task_sampling, rate=c.train.learnability_ema,
                                eps=c.train.learnability_eps)
    learner = Learner()
    asyncio.run(trainer.train(learner, RecordingBackend(), FailingPool(set(), flat=True),
                              sampler, [], 0))
    assert learner.saved == [1, 2, 3]
    for k, extra in enumerate(learner.extras, start=1):
        assert extra["cursor"] == 2 * k
        p = 0.5 * 0.75 ** k  # both levels drawn every step (2 tasks, 2 levels, no repeat)
        assert extra["task_sampler"]["estimates"] == {"babyai": {"A": p, "B": p}}
    rows = dict(learner.writer.rows)
    assert sorted(rows) == [1, 2, 3]
    assert all(rows[s]["train/task_levels"] == 2.0 for s in rows)
    assert all(rows[s]["train/task_level_max_share"] == 0.5 for s in rows)
