"""A step in which every episode fails must not stop training.

With the default ``max_staleness=0``, a step whose episodes all failed did no update; the
weights version then stayed one behind the step counter, every later rollout was stamped one
version behind and dropped as stale, and training never updated again. Here the trainer's real
loop (``Trainer.train``: staleness filter, batch assembly, update / weight-sync bookkeeping)
runs against a recording learner and backend and an actor pool whose first rollout fails
entirely (engine errors); the reference is the hand-written sequence of updates and weight
versions.
"""

from __future__ import annotations

import asyncio

from agentrl_jax.agent.actor_pool import TaskRef, summarize
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.config.experiment import base_config
from agentrl_jax.training.rl.task_sampler import TaskSampler
from agentrl_jax.training.rl.trainer import Trainer


class Writer:
    def __init__(self):
        self.rows: list[tuple[int, dict]] = []

    def write(self, step, metrics):
        self.rows.append((step, dict(metrics)))


class RecordingLearner:
    """The learner's interface as the trainer uses it; records every update and save."""

    def __init__(self):
        self.updates: list[int] = []  # rows per update
        self.update_step = 0
        self.writer = Writer()
        self.params: dict = {}
        self.saved: list[int] = []

    def update(self, batch, options=None):
        self.updates.append(int(batch.tokens.shape[0]))
        self.update_step += 1
        return {"actor/pg_loss": 0.0}

    def save(self, extra, step=None, force=False):
        self.saved.append(step)

    def wait(self):
        pass


class RecordingBackend:
    def __init__(self):
        self.versions: list[str] = []

    async def update_weights(self, params=None, *, version=None, **kwargs):
        self.versions.append(version)

    async def sync_weights(self, weights, version):  # as the embedded engine takes them
        await self.update_weights(weights.arrays(), version=str(version))


class FailingPool:
    """Rollouts numbered from 1; those in ``failing`` end every episode with engine_error,
    the others finish with rewards that differ within each group (or are all equal with
    ``flat``)."""

    def __init__(self, failing, flat: bool = False):
        self.failing, self.flat, self.rollouts = failing, flat, 0

    async def collect(self, tasks, n_samples, horizon, policy_version=0, seed=None,
                      progress=None, version_fn=None, lockstep=False):
        self.rollouts += 1
        out = []
        for g, task in enumerate(tasks):
            for i in range(n_samples):
                t = Trajectory(env=task.env, task_id=task.task_id, group_id=g, sample_index=i,
                               horizon=horizon, policy_version=policy_version)
                if self.rollouts in self.failing:
                    t.status, t.error = "engine_error", "engine step failed: top_k out of range"
                else:
                    version = version_fn() if version_fn is not None else policy_version
                    reward = 0.0 if self.flat else float(i)
                    t.append([5, 6, 7], generated=False, turn=-1)
                    t.append([8, 9], generated=True, turn=0, logprobs=[-0.5, -0.5])
                    t.num_turns, t.turn_versions, t.turn_states = 1, [version], ["s"]
                    t.turn_rewards, t.reward, t.status = [reward], reward, "max_turns"
                out.append(t)
        return out, summarize(out, 0.1)


def fake_loop_config(total_steps: int, save_every: int = 100, **train):
    """A config for the trainer's real loop driven by the fakes above: 2 tasks x 2 samples a
    step, no evaluations; ``train`` overrides more ``train.*`` keys."""
    c = base_config()
    c.train.total_steps = total_steps
    c.train.tasks_per_step = c.train.samples_per_task = 2
    c.train.save_every = save_every
    c.train.eval_tasks = 0
    c.train.eval_before = c.train.eval_after = False
    for key, value in train.items():
        c.train[key] = value
    return c


def run_fake_loop(c, workdir, learner, backend, pool) -> None:
    """``Trainer.train`` of config ``c`` in ``workdir`` over 20 BabyAI task ids."""
    trainer = Trainer(c, str(workdir), progress=False)
    sampler = TaskSampler([TaskRef("babyai", str(i)) for i in range(20)], seed=0)
    asyncio.run(trainer.train(learner, backend, pool, sampler, [], 0))


def test_a_step_where_every_episode_failed_leaves_later_steps_training(tmp_path):
    c = fake_loop_config(4)
    assert c.train.max_staleness == 0 and c.rollout.backend == "embedded"
    trainer = Trainer(c, str(tmp_path), progress=False)
    learner, backend, pool = RecordingLearner(), RecordingBackend(), FailingPool(failing={1})
    sampler = TaskSampler([TaskRef("babyai", str(i)) for i in range(20)], seed=0)

    asyncio.run(trainer.train(learner, backend, pool, sampler, [], 0))

    assert pool.rollouts == 4
    assert learner.updates == [4, 4, 4]  # steps 2, 3, 4: every episode trained on
    assert backend.versions == ["2", "3", "4"]  # each update's weights, numbered by step
    assert learner.update_step == 4 and learner.saved == [4]
    rows = {step: m for step, m in learner.writer.rows}
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[1]["rollout/status/engine_error"] == 4 and "actor/pg_loss" not in rows[1]
    for step in (2, 3, 4):  # before the fix: 4 stale episodes dropped, no update, forever
        assert rows[step]["rollout/stale_dropped"] == 0, rows[step]
        assert rows[step]["actor/pg_loss"] == 0.0


def test_config_json_leaves_the_api_key_out(tmp_path):
    c = base_config()
    c.rollout.api_key = "sesame"
    trainer = Trainer(c, str(tmp_path), progress=False)
    trainer.output.write_config()
    text = open(tmp_path / "config.json").read()
    assert "sesame" not in text and '"api_key": "<redacted>"' in text
    assert c.rollout.api_key == "sesame"  # the run itself keeps it


def test_kv_cache_released_before_each_update_when_configured(tmp_path):
    """rollout.release_kv_during_update: the trainer frees the engine's KV cache after each
    rollout and before the learner update, syncs weights, then has the cache allocated again
    for the next rollout; a refused release (a request
    still running) leaves the cache and the step goes on; no release on a step without an
    update, none at all when the key is off."""
    events: list[str] = []

    class Learner(RecordingLearner):
        def update(self, batch, options=None):
            events.append("update")
            return super().update(batch, options)

    class Backend(RecordingBackend):
        async def release_kv_cache(self):
            events.append("release")
            if len(events) > 3:  # the second time: a request still runs; the step goes on
                raise RuntimeError("cannot release the KV cache while requests are running")
            return 3 * 2 ** 29

        async def update_weights(self, params=None, *, version=None, **kwargs):
            events.append("sync")
            await super().update_weights(params, version=version, **kwargs)

        async def resume_kv_cache(self):
            events.append("resume")
            return 0

    for release in (True, False):
        events.clear()
        c = fake_loop_config(3)
        c.rollout.release_kv_during_update = release
        trainer = Trainer(c, str(tmp_path / str(release)), progress=False)
        learner = Learner()
        sampler = TaskSampler([TaskRef("babyai", str(i)) for i in range(20)], seed=0)
        asyncio.run(trainer.train(learner, Backend(), FailingPool(failing={1}), sampler, [], 0))
        rows = {step: m for step, m in learner.writer.rows}
        if release:  # step 1 failed entirely: no update, no release
            assert events == ["release", "update", "sync", "resume"] * 2
            assert "rollout/kv_released_gib" not in rows[1]
            assert [rows[s]["rollout/kv_released_gib"] for s in (2, 3)] == [1.5, 0.0]
        else:
            assert events == ["update", "sync"] * 2
            assert all("rollout/kv_released_gib" not in m for m in rows.values())
