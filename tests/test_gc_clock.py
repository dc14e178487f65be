"""agentrl_common/gc_clock.py: the garbage collector's seconds and collections, any thread, and
the update's metrics built on them (perf/update_gc_s, _gc_full, _thread_cpu_s)."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np

from agentrl_common.gc_clock import GcTotals, gc_totals


def test_a_full_collection_on_another_thread_is_counted_with_its_seconds():
    """A callback after ours sleeps 50 ms inside the collection's start: the clock counts it
    (our "start" is stamped before it runs, our "stop" after the collection), and the full
    collection, run on another thread, is counted once as generation 2."""
    before = gc_totals()  # installs the listener first, so it runs before the sleeper

    def sleeper(phase, info):
        if phase == "start" and info.get("generation") == 2:
            time.sleep(0.05)

    gc.callbacks.append(sleeper)
    try:
        worker = threading.Thread(target=gc.collect, args=(2,))
        worker.start()
        worker.join()
    finally:
        gc.callbacks.remove(sleeper)
    seconds, full = gc_totals().since(before)
    assert full == 1
    assert seconds >= 0.05  # at least the sleep inside it (no upper bound: a loaded box is slow)


def test_since_subtracts_readings():
    a = GcTotals(1.5, (10, 3, 1))
    b = GcTotals(2.25, (14, 4, 3))
    assert b.since(a) == (0.75, 2)


def test_the_update_reports_its_collections_and_cpu_seconds(monkeypatch):
    """A learner update (tiny packed model, CPU) reports the collections during it: a full
    collection forced inside the update counts as at least one; the thread's CPU seconds are
    positive and at most its wall time plus a scheduling slack."""
    from learner_helpers import tiny_batch, tiny_learner

    from agentrl_jax.learner import LearnerConfig, UpdateOptions
    from agentrl_jax.learner.layouts import PackedRows

    cfg = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                        learning_rate=1e-3, micro_batch_size=2, pack_length=96,
                        logprob_batch_size=2, min_length_bucket=32,
                        advantage_estimator="grpo", shuffle=False)
    learner = tiny_learner(cfg)
    learner.token_rows.reserve(16)
    plain = learner.update(tiny_batch(0, 6, 40), UpdateOptions(log=False))
    assert plain["perf/update_gc_s"] >= 0.0 and plain["perf/update_gc_full"] >= 0.0
    assert 0.0 < plain["perf/update_thread_cpu_s"] <= plain["perf/update_time_s"] + 0.05

    real = PackedRows.optimiser_steps

    def with_collection(self, *args, **kwargs):
        gc.collect(2)  # a full collection while the update runs
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PackedRows, "optimiser_steps", with_collection)
    metrics = learner.update(tiny_batch(1, 7, 45), UpdateOptions(log=False))
    assert metrics["perf/update_gc_full"] >= 1.0
    assert metrics["perf/update_gc_s"] > 0.0
    assert np.isfinite(metrics["actor/pg_loss"])


def test_freeze_heap_takes_live_objects_out_of_the_collectors_generations():
    """After ``freeze_heap`` the objects alive before it are in the permanent generation: a
    full collection no longer lists them (``gc.get_objects()``), one made after it is listed."""
    from agentrl_common.gc_clock import freeze_heap

    gc.unfreeze()
    try:
        before = [[i] for i in range(1000)]
        freeze_heap()
        after = [0]
        assert gc.get_freeze_count() >= len(before)
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in tracked for o in before)
        assert id(after) in tracked
    finally:
        gc.unfreeze()


def test_the_training_loop_freezes_the_heap_after_its_first_step(tmp_path, monkeypatch):
    """The trainer's real loop (recording learner, fake pool: tests/test_trainer_failed_step.py)
    freezes the heap once, when the session's first step is done: the first update sees nothing
    frozen, the freeze comes between the first and the second update, and the later updates see
    objects frozen. (The frozen count itself may fall between updates: a frozen object that dies
    leaves the permanent generation, so the test counts the freezes, not the objects.)"""
    import agentrl_jax.training.rl.loop as loop
    from test_trainer_failed_step import (FailingPool, RecordingBackend, RecordingLearner,
                                          fake_loop_config, run_fake_loop)

    class FreezeWatchingLearner(RecordingLearner):
        def __init__(self):
            super().__init__()
            self.frozen: list[int] = []

        def update(self, batch, options=None):
            self.frozen.append(gc.get_freeze_count())
            return super().update(batch, options)

    learner = FreezeWatchingLearner()
    updates_before_each_freeze: list[int] = []
    real_freeze = loop.freeze_heap

    def counting_freeze() -> None:
        updates_before_each_freeze.append(len(learner.frozen))
        real_freeze()

    monkeypatch.setattr(loop, "freeze_heap", counting_freeze)
    gc.unfreeze()
    try:
        run_fake_loop(fake_loop_config(3), tmp_path, learner, RecordingBackend(),
                      FailingPool(failing=set()))
        assert len(learner.frozen) == 3
        assert updates_before_each_freeze == [1]
        assert learner.frozen[0] == 0
        assert learner.frozen[1] > 0 and learner.frozen[2] > 0
    finally:
        gc.unfreeze()
