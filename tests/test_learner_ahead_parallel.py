"""``learner/ahead.py`` compiles the first update's programs side by side: all of them are in
flight at once (a barrier that only opens when every program has started lowering), they are
the programs the first update then runs (a compile listener sees none compiled again), the
update after them gives the same parameters, bit for bit, as one that compiled its own programs,
and a program whose compile fails surfaces its error once the others are done (no thread left
running)."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from agentrl_jax.learner import Learner, UpdateOptions
from agentrl_jax.learner import ahead
from agentrl_jax.learner.ahead import AheadCompile, compile_first_update
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh
from learner_helpers import random_batch, recorded_compiles
from test_learner_ahead import BIG, CFG, MODEL

# a pack length no other test uses, so these programs are not in jit's cache yet
PARALLEL_CFG = CFG.replace(pack_length=136, kl_coef=0.0)
NAMES = ["log-prob pass", "gradient accumulation", "optimiser apply"]


def _learner(cfg=PARALLEL_CFG) -> Learner:
    return Learner(init_model(MODEL, seed=0), cfg, mesh=make_mesh(devices=jax.devices()[:1]))


def _batch():
    return random_batch(0, 6, 30, MODEL.vocab_size, group_size=3, prompt=4)


class _Gated:
    """A jitted function whose ``lower`` first waits at ``barrier``: with one call per party,
    it only opens once every program is being compiled at the same time."""

    def __init__(self, fn, barrier: threading.Barrier):
        self.fn, self.barrier = fn, barrier

    def lower(self, *args):
        self.barrier.wait(timeout=60)  # BrokenBarrierError when compiled one after another
        return self.fn.lower(*args)


class _Failing:
    """A jitted function whose compile fails (``RuntimeError("no such program")``)."""

    def lower(self, *args):
        raise RuntimeError("no such program")


def test_the_programs_compile_side_by_side_and_the_first_update_runs_them(monkeypatch):
    learner = _learner()
    real = ahead.first_update_calls(learner)
    assert [name for name, _, _ in real] == NAMES
    barrier = threading.Barrier(len(real))
    monkeypatch.setattr(ahead, "first_update_calls", lambda *a, **k: [
        (name, _Gated(fn, barrier), args) for name, fn, args in real])
    with recorded_compiles() as names:
        # one thread per program (the default caps them at the CPU count: 2 here)
        timings = compile_first_update(learner, workers=len(real))
        assert list(timings) == NAMES and all(s > 0 for s in timings.values())
        assert BIG <= set(names), names
        names.clear()
        metrics = learner.update(_batch(), UpdateOptions(log=False))
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["batch/packed_rows"] > 0
    assert not BIG & set(names), names


def test_the_update_after_the_side_by_side_compile_matches_one_that_compiled_itself():
    """The same learner and batch three times, jit's caches cleared between: the first update
    compiling its own programs, after the ahead compile one at a time, and side by side."""
    params = []
    for workers in (None, 1, 3):
        jax.clear_caches()
        learner = _learner(PARALLEL_CFG.replace(pack_length=152))
        if workers is not None:
            assert list(compile_first_update(learner, workers=workers)) == NAMES
        learner.update(_batch(), UpdateOptions(log=False))
        params.append([np.asarray(x) for x in jax.tree.leaves(learner.params)])
    assert not all(np.array_equal(a, b) for a, b in
                   zip(params[0], jax.tree.leaves(_learner().params)))  # the update moved them
    for other in params[1:]:
        for a, b in zip(params[0], other):
            np.testing.assert_array_equal(a, b)


def test_a_failing_compile_surfaces_after_the_others_and_leaves_no_thread(monkeypatch):
    learner = _learner(PARALLEL_CFG.replace(pack_length=168))
    real = ahead.first_update_calls(learner)
    failing = [real[0], ("gradient accumulation", _Failing(), real[1][2]), real[2]]
    monkeypatch.setattr(ahead, "first_update_calls", lambda *a, **k: failing)
    before = set(threading.enumerate())
    with recorded_compiles() as names, pytest.raises(RuntimeError, match="no such program"):
        compile_first_update(learner)
    # the other two compiled to the end before the error was raised
    assert {"jit(packed_logprobs)", "jit(apply)"} <= set(names), names
    assert not [t for t in threading.enumerate() if t not in before and t.is_alive()]

    said: list[str] = []
    job = AheadCompile(learner, say=said.append)
    job.wait()
    assert isinstance(job.error, RuntimeError) and job.programs == 0
    assert not job._thread.is_alive()
    assert len(said) == 1 and "failed (RuntimeError('no such program'))" in said[0], said


def test_a_reference_of_another_dtype_compiles_its_own_log_prob_pass_beside_the_others():
    """A bfloat16 reference of float32 parameters: its log-prob pass is a fourth program (in
    the same dtype it is the policy's, compiled once: ``test_learner_ahead.py``)."""
    learner = _learner(CFG.replace(pack_length=184, reference_dtype="bfloat16"))
    with recorded_compiles() as names:
        assert list(compile_first_update(learner, workers=4)) == [
            "log-prob pass", "reference log-prob pass", "gradient accumulation", "optimiser apply"]
        assert names.count("jit(packed_logprobs)") == 2, names
        names.clear()
        learner.update(_batch(), UpdateOptions(log=False))
    assert not BIG & set(names), names
