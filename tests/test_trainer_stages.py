"""The trainer's collaborators and the loop's stages on their own, against hand-computed cases:
the stop policy's decisions on a fake clock and step counts, SIGTERM's cancelling of the work in
flight, the checkpoints' saves, the batch stage's selection and counts, the update stage's
step without episodes, the bookkeeping stage's record and line, the evaluator's schedule."""

from __future__ import annotations

import asyncio
import math

import pytest

from agentrl_jax.agent.actor_pool import TaskRef, summarize
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.outputs.progress import OFF, ProgressSettings
from agentrl_jax.training.outputs.run_output import RunOutput
from agentrl_jax.training.rl.failed_steps import RunFailure
from agentrl_jax.training.rl.schedule import HorizonSchedule
from agentrl_jax.training.rl.stages import (BatchSettings, RolloutResult, record_step,
                                            select_batch, step_line)
from agentrl_jax.training.rl.stop_policy import Checkpoints, StopPolicy
from agentrl_jax.training.rl.trainer_eval import Evaluator
from agentrl_jax.training.rl.update_stage import LearnerUpdate


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _batch_settings(**given) -> BatchSettings:
    """Every batch setting explicit (``BatchSettings`` has no defaults): a run with no staleness
    allowance, flat groups kept, an episode-level estimator, pad id 0 and no history window,
    with ``given`` replacing any of them."""
    return BatchSettings(**{**dict(max_staleness=0, skip_flat_groups=False, turn_level=False,
                                   pad_id=0, episode_estimator=None, advantage_settings={}),
                            **given})


def _train(**keys):
    c = base_config()
    for key, value in keys.items():
        c.train[key] = value
    return to_run_config(c).train


def _policy(clock: FakeClock, said: list[str], **keys) -> StopPolicy:
    return StopPolicy(_train(**keys), said.append, clock=clock)


# ---------------------------------------------------------------------------- stop policy
def test_the_time_budget_counts_earlier_sessions_and_only_the_loop():
    clock, said = FakeClock(100.0), []
    stop = _policy(clock, said, total_steps=10, max_seconds=60.0)
    stop.trained_seconds_before = 25.0  # from the checkpoint this session resumes
    assert stop.train_seconds() == 25.0  # the loop has not started: nothing more counts
    clock.now = 130.0  # set-up and the opening evaluation: not training
    stop.start_clock()
    clock.now = 160.0
    assert stop.train_seconds() == 55.0 and not stop.out_of_time()  # 25 + 30 <= 60
    clock.now = 165.5
    assert stop.train_seconds() == 60.5 and stop.out_of_time()  # 25 + 35.5 > 60
    stop.stop_clock()  # the final evaluation is not training
    clock.now = 500.0
    assert stop.train_seconds() == 60.5
    # no budget: never out of time
    unlimited = _policy(FakeClock(0.0), [], total_steps=10, max_seconds=0.0)
    unlimited.start_clock()
    unlimited.clock.now = 1e9
    assert not unlimited.out_of_time()


def test_a_budget_spent_by_earlier_sessions_runs_no_step():
    said: list[str] = []
    stop = _policy(FakeClock(), said, total_steps=10, max_seconds=60.0)
    stop.trained_seconds_before = 60.0
    assert stop.budget_spent_before(4, 10) and stop.stopped == "time_budget"
    assert said == ["time budget of 60 s already spent (60 s of training up to step 4); no "
                    "more training (a larger train.max_seconds trains on)"]
    # steps left but budget left too; budget spent but no step left; no budget at all
    assert not _policy(FakeClock(), [], total_steps=10, max_seconds=61.0
                       ).budget_spent_before(4, 10)
    done = _policy(FakeClock(), [], total_steps=10, max_seconds=60.0)
    done.trained_seconds_before = 99.0
    assert not done.budget_spent_before(10, 10) and done.stopped == "total_steps"
    unlimited = _policy(FakeClock(), [], total_steps=10, max_seconds=0.0)
    unlimited.trained_seconds_before = 1e6
    assert not unlimited.budget_spent_before(0, 10)


def test_save_cadence_and_the_stop_after_a_step():
    said: list[str] = []
    stop = _policy(FakeClock(), said, total_steps=7, save_every=3, max_seconds=10.0)
    due = [s for s in range(1, 8) if stop.save_due(s, out_of_time=False)]
    assert due == [3, 6, 7]  # every save_every steps and the last one
    assert stop.save_due(2, out_of_time=True)  # the budget ends the loop: saved
    assert not stop.stop_after(2, out_of_time=False) and stop.stopped == "total_steps"
    assert stop.stop_after(2, out_of_time=True) and stop.stopped == "time_budget"
    assert said == ["time budget of 10 s reached after step 2; stopping"]
    lines: list[str] = []
    flat = _policy(FakeClock(), lines, total_steps=7, save_every=3)  # a flat held-out curve
    assert not flat.stop_after(2, out_of_time=False, plateau=None) and not lines
    assert flat.stop_after(2, out_of_time=False, plateau="why") and flat.stopped == "plateau"
    assert lines == ["held-out curve flat after step 2: why; stopping (train.stop_on_plateau)"]
    assert flat.save_due(2, out_of_time=False, plateau=True)  # saved, off the cadence
    term = _policy(FakeClock(), [], total_steps=7)
    term.terminate_requested = True
    assert term.stop_after(1, out_of_time=False) and term.stopped == "total_steps"  # set later


def test_sigterm_cancels_the_tracked_work_once_and_says_so():
    said: list[str] = []
    stop = _policy(FakeClock(), said, total_steps=5)
    stop.step_done = 3

    async def scenario():
        slow = asyncio.ensure_future(asyncio.sleep(60))
        untracked = asyncio.ensure_future(asyncio.sleep(60))
        stop.track(slow)

        async def evaluation():
            await asyncio.sleep(60)

        async def signal_soon():
            await asyncio.sleep(0.01)
            stop.on_sigterm()
            stop.on_sigterm()  # a second SIGTERM changes nothing

        asyncio.ensure_future(signal_soon())
        finished = await stop.cancellable(evaluation())
        await asyncio.gather(slow, return_exceptions=True)
        cancelled = slow.cancelled(), untracked.cancelled()
        untracked.cancel()
        return finished, cancelled

    finished, cancelled = asyncio.run(scenario())
    assert finished is False and cancelled == (True, False)
    assert stop.terminate_requested
    assert said == ["SIGTERM: stopping at a safe point (3 steps done; the rollout or "
                    "evaluation in flight is cancelled, an update in progress finishes, then "
                    "a checkpoint if the last step has none)"]


def test_work_cancelled_without_sigterm_is_not_swallowed():
    stop = _policy(FakeClock(), [], total_steps=5)

    async def scenario():
        async def cancelled_inside():
            raise asyncio.CancelledError

        return await stop.cancellable(cancelled_inside())

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())


def test_a_nonfinite_update_stops_before_its_weights_go_anywhere():
    StopPolicy.check_update(3, {"actor/pg_loss": 0.5, "learner/params_finite": 1.0}, 2, "/w")
    with pytest.raises(RunFailure) as failure:
        StopPolicy.check_update(3, {"actor/pg_loss": math.nan, "actor/grad_norm": 1.0,
                                    "learner/params_finite": 0.0}, 2, "/w")
    assert str(failure.value) == (
        "stopped at step 3: the update went non-finite (actor/pg_loss=nan, parameters); "
        "nothing was saved after the checkpoint of step 2; once a setting is changed (e.g. a "
        "smaller learner.learning_rate), the same command resumes from it (workdir /w)")


def test_checkpoints_save_the_cursor_and_the_seconds_and_name_the_way_on():
    saves = []

    class Learner:
        def save(self, extra, step=None, force=False):
            saves.append((dict(extra), step, force))

    said: list[str] = []
    checkpoints = Checkpoints(lambda message, end="\n": said.append(message))
    assert checkpoints.resume_hint() == "the same command starts it again"
    checkpoints.restored(0)  # a new run
    assert checkpoints.saved_step is None and not checkpoints.saved_this_session
    checkpoints.restored(4)
    assert checkpoints.resume_hint() == "the same command resumes from the checkpoint of step 4"
    checkpoints.save(Learner(), 6, cursor=12, train_seconds=81.23456)
    assert saves == [({"step": 6, "cursor": 12, "train_seconds": 81.235}, 6, True)]
    assert checkpoints.saved_step == 6 and checkpoints.saved_this_session
    assert said[0] == "saving checkpoint step 6 ..."


# ---------------------------------------------------------------------------- batch stage
def _episode(group: int, reward: float, versions=(3,), status="max_turns", generated=True,
             turn_rewards=None) -> Trajectory:
    t = Trajectory(env="babyai", task_id=f"t{group}", group_id=group, sample_index=0,
                   horizon=5, policy_version=versions[0])
    t.append([5, 6], generated=False, turn=-1)
    if generated:
        t.append([7, 8, 9], generated=True, turn=0, logprobs=[-0.1] * 3)
    t.num_turns, t.turn_versions = len(versions), list(versions)
    t.turn_states = ["s"] * len(versions)
    t.turn_rewards = list(turn_rewards) if turn_rewards is not None else [reward]
    t.reward, t.status = reward, status
    return t


def test_the_batch_stage_drops_and_counts_as_a_hand_count_says():
    # step 4 (0-based), max_staleness 1: versions >= 3 are fresh
    episodes = [
        _episode(0, 1.0), _episode(0, 0.0),                     # group 0: informative
        _episode(1, 1.0), _episode(1, 1.0),                     # group 1: flat
        _episode(2, 0.0, versions=(2, 3)),                      # stale (oldest turn 2), mixed
        _episode(2, 1.0, status="engine_error"),                # error
        _episode(3, 0.0, generated=False, status="context_limit"),  # nothing generated
        _episode(3, 0.0, versions=(3, 4)),                      # mixed, fresh; group 3 flat
    ]
    rollout = RolloutResult(step=4, horizon=7, trajectories=episodes,
                            stats=summarize(episodes, 2.0))
    schedule = HorizonSchedule(phases=(5, 7), steps_per_phase=3)
    settings = _batch_settings(max_staleness=1, skip_flat_groups=True)
    batch = select_batch(rollout, settings, schedule)
    assert [(t.group_id, t.reward) for t in batch.episodes] == [(0, 1.0), (0, 0.0)]
    assert (batch.usable, batch.trainable, batch.stale, batch.flat_groups, batch.mixed) == (
        5, 2, 1, 2, 2)
    assert list(batch.metrics)[:5] == ["train/horizon", "train/phase", "rollout/stale_dropped",
                                       "rollout/mixed_version_episodes",
                                       "rollout/flat_groups_skipped"]
    assert batch.metrics["train/horizon"] == 7.0 and batch.metrics["train/phase"] == 1.0
    assert batch.metrics["rollout/stale_dropped"] == 1.0
    assert batch.metrics["rollout/status/engine_error"] == 1.0
    # flat groups kept when not skipped: the usable episodes are the batch
    kept = select_batch(rollout, _batch_settings(max_staleness=1), schedule)
    assert (kept.usable, kept.trainable, kept.flat_groups) == (5, 5, 0)
    # a turn-level estimator keeps a group of equal episode rewards with a turn reward
    turn = [_episode(0, 1.0, turn_rewards=[0.0]), _episode(0, 1.0, turn_rewards=[1.0])]
    level = select_batch(RolloutResult(0, 5, turn, summarize(turn, 1.0)),
                         _batch_settings(skip_flat_groups=True, turn_level=True), schedule)
    assert level.trainable == 2 and level.flat_groups == 0


def test_an_update_without_episodes_moves_the_version_and_the_learner_step_on():
    class Learner:
        update_step = 4

    episodes = [_episode(0, 0.0, status="engine_error")]
    batch = select_batch(RolloutResult(4, 5, episodes, summarize(episodes, 1.0)),
                         _batch_settings(), HorizonSchedule.fixed(5))
    learner = Learner()
    stage = LearnerUpdate(learner, None, lambda *a, **k: None, settings=_batch_settings())
    stop = _policy(FakeClock(), [], total_steps=9)
    result = asyncio.run(stage.run(batch, stop, Checkpoints(print), "/w"))
    assert (result.step, result.updated, result.weights_version, result.metrics) == (
        4, False, 5, {})
    assert learner.update_step == 5


# ---------------------------------------------------------------------------- bookkeeping
def test_the_bookkeeping_record_and_line():
    episodes = [_episode(0, 1.0), _episode(0, 0.0), _episode(1, 0.0, status="env_error")]
    stats = summarize(episodes, 3.0)
    batch = select_batch(RolloutResult(2, 6, episodes, stats), _batch_settings(),
                         HorizonSchedule.fixed(6))
    record = record_step(batch, {"rollout/kv_released_gib": 1.5, "actor/pg_loss": -0.25,
                                 "perf/weight_sync_s": 0.5}, seconds=12.34)
    assert (record.step, record.horizon, record.seconds) == (3, 6, 12.34)
    assert record.rollout is stats
    keys = list(record.metrics)
    assert keys[:len(batch.metrics)] == list(batch.metrics)  # the batch's metrics first
    assert keys[len(batch.metrics):] == ["rollout/kv_released_gib", "actor/pg_loss",
                                         "perf/weight_sync_s", "train/step_seconds"]
    assert record.metrics["train/step_seconds"] == 12.34
    # 2 finished episodes: mean reward 0.5, success 0/2, 1 turn, 6 generated tokens, 1 dropped
    assert step_line(record, 10) == ("[step 3/10] horizon=6 reward=0.500 success=0.00 "
                                     "turns=1.0 tokens=6 dropped=1 pg_loss=-0.2500 (12.3 s)")
    no_update = record_step(batch, {}, seconds=1.0)
    assert step_line(no_update, 10).endswith("dropped=1 no update (1.0 s)")
    # a real non-finite loss is still shown as it is (the run stops on it: nonfinite.py)
    nan_loss = record_step(batch, {"actor/pg_loss": float("nan")}, seconds=1.0)
    assert step_line(nan_loss, 10).endswith("pg_loss=nan (1.0 s)")


# ---------------------------------------------------------------------------- evaluator
def test_the_evaluator_schedule():
    c = base_config()
    c.train.eval_every, c.train.eval_before, c.train.eval_after = 4, True, True
    cfg = to_run_config(c)
    output = RunOutput(cfg, "/tmp/unused")
    evaluator = Evaluator(cfg, output, ProgressSettings(OFF, 30.0))
    tasks = [TaskRef("babyai", "a")]
    assert evaluator.due_before(0, tasks) and not evaluator.due_before(3, tasks)
    assert not evaluator.due_before(0, [])
    assert [s for s in range(1, 13) if evaluator.due_after_step(s, tasks)] == [4, 8, 12]
    assert evaluator.due_at_end(12, tasks)
    evaluator.evals.append((12, None))  # the last step was evaluated already
    assert not evaluator.due_at_end(12, tasks) and evaluator.due_at_end(13, tasks)
    c.train.eval_after = False
    quiet = Evaluator(to_run_config(c), output, ProgressSettings(OFF, 30.0))
    assert not quiet.due_at_end(12, tasks)
    again = Evaluator(to_run_config(c), output, ProgressSettings(OFF, 30.0), eval_again=True)
    assert again.due_at_end(12, tasks)
