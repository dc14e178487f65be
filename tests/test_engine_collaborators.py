"""The engine's collaborators alone, on hand-computed cases: the scheduler's slot assignment
and queue order (host only, no device), the per-slot output buffers against a NumPy loop, the
inbox's admission checks and hand-over, recovery after a failed step, and the weights' swap
(version, merged copy)."""

from __future__ import annotations

import concurrent.futures
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.models.llama import abstract_model
from agentrl_jax.rollout.contract import (BackendUnavailableError, InvalidRequestError,
                                          OverloadedError, RolloutError, SamplingParams)
from agentrl_jax.rollout.engine.compiled import ACT, CNT, POS, REM, TOK, EngineFunctions
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.failures import FailurePolicy
from agentrl_jax.rollout.engine.inbox import EngineInbox
from agentrl_jax.rollout.engine.requests import (DECODE, FORK_WAIT, PREFILL, EngineStats,
                                                 Request, Seq)
from agentrl_jax.rollout.engine.scheduler import Scheduler
from agentrl_jax.rollout.engine.slot_buffers import SlotBuffers
from agentrl_jax.rollout.engine.weights import EngineWeights, next_version
from tests.rollout_helpers import TINY, tiny_model


def _request(rid: str, ids: list[int], n: int = 1, session: str | None = None) -> Request:
    req = Request(rid, ids, SamplingParams(n=n, max_new_tokens=4), session,
                  concurrent.futures.Future(), seed=1)
    req.seqs = [Seq(req, i, [0]) for i in range(n)]
    return req


def _scheduler(max_batch: int, max_queue: int = 8, **config: Any) -> Scheduler:
    """A real scheduler with no device (nothing here launches a device call)."""
    c = EngineConfig(max_batch=max_batch, max_length=64, max_queue=max_queue, **config)
    functions = EngineFunctions(decode=None, prefill=None, copy_rows=None, merge=None)
    weights = types.SimpleNamespace(state=None, leaves=None, merged=None, version="0")
    kv = types.SimpleNamespace(cache=None, released=False)
    return Scheduler(c, functions, weights, kv, EngineInbox(max_queue), EngineStats(), None,
                     TINY.vocab_size, packed_prefill=False)


def _submit(s: Scheduler, *requests: Request) -> None:
    for req in requests:
        s.inbox.submit(req)
    commands, incoming, _ = s.inbox.wait_for_work(lambda: s.busy)
    assert commands == [] and incoming == list(requests)
    s.enqueue(incoming)


def test_admission_assigns_slots_in_order_and_keeps_the_queue_order() -> None:
    """3 slots; A (n=1), B (n=2), C (n=1) arrive in that order: A takes slot 0, B slots 1 and 2
    (its second sample waits to copy the first's row), C waits (no slot left) and so does D
    behind it even though D would fit nowhere either; the waiting count follows."""
    s = _scheduler(max_batch=3, share_prompts=False)
    a, b, c, d = (_request("A", [1, 2, 3]), _request("B", [4, 5, 6, 7], n=2),
                  _request("C", [8, 9]), _request("D", [10, 11]))
    _submit(s, a, b, c, d)
    assert s.inbox.num_waiting == 4
    s.admit()
    assert [seq.slot for seq in a.seqs + b.seqs] == [0, 1, 2]
    assert [seq.state for seq in a.seqs + b.seqs] == [PREFILL, PREFILL, FORK_WAIT]
    assert b.seqs[0].forks == [b.seqs[1]]
    assert s.prefill_queue == [a.seqs[0], b.seqs[0]]
    assert list(s.waiting) == [c, d] and s.inbox.num_waiting == 2
    assert s.slot_seq == {0: a.seqs[0], 1: b.seqs[0], 2: b.seqs[1]}
    assert s.load() == {"running": 3, "free_slots": 0, "cached_slots": 0}
    # the prefill stats: A's 2 and B's 3 prompt tokens before the last, and one last token per
    # sample (fed by the first decode step); B's second sample reuses 3 of its 4 tokens
    assert (s.stats.prefill_tokens, s.stats.cached_tokens, s.stats.prompt_tokens) == (
        2 + 3 + 3, 3, 3 + 8)


def test_a_finished_session_keeps_its_row_for_its_next_turn() -> None:
    """A session's finished sequence leaves its KV row cached; the session's next request,
    whose prompt extends the cached tokens, takes the same slot and prefills only the new
    suffix; another request takes a free slot first, the cached one only when none is free."""
    s = _scheduler(max_batch=2)
    first = _request("t1", [1, 2, 3, 4], session="ep")
    _submit(s, first)
    s.admit()
    seq = first.seqs[0]
    seq.cursor = seq.kv_len = 3
    s.prefill_queue.remove(seq)  # (as run_prefill does once a prompt is prefilled)
    s.prefill_done(seq)  # now decoding
    assert seq.state == DECODE and s.buffers.ints[0, ACT] == 1
    s.buffers.out_len[0] = 2
    s.buffers.out_tok[0, :2] = [5, 6]
    s.buffers.ints[0, POS] = 5  # (positions 0..4 hold KV: the prompt and the first output)
    s.finish(seq, "length", None)
    assert first.future.done() or s.deliveries == [first]
    s.deliver()
    assert first.future.result()[0].output_ids == [5, 6]
    assert s.load() == {"running": 0, "free_slots": 1, "cached_slots": 1}
    other, second = _request("x", [9, 9, 9]), _request("t2", [1, 2, 3, 4, 5, 6, 7], session="ep")
    _submit(s, other, second)
    s.admit()
    assert other.seqs[0].slot == 1  # the free slot, not the session's
    assert second.seqs[0].slot == 0 and second.seqs[0].cached_tokens == 5
    assert second.seqs[0].cursor == 5 and s.prefill_queue == [other.seqs[0], second.seqs[0]]


def test_a_failing_request_leaves_its_slots_and_queues() -> None:
    s = _scheduler(max_batch=2)
    a, b = _request("A", [1, 2, 3], n=2), _request("B", [4, 5])
    _submit(s, a, b)
    s.admit()
    assert s.isolated(a, lambda: 1 / 0) is False
    with pytest.raises(Exception, match="request 'A' failed in the engine.*ZeroDivisionError"):
        a.future.result(0)
    assert not s.inbox.is_running("A") and s.inbox.is_running("B")
    assert s.prefill_queue == [] and s.slot_seq == {}
    s.admit()  # B now gets a slot
    assert b.seqs[0].slot is not None and s.inbox.num_waiting == 0


def test_recover_fails_every_request_and_resets() -> None:
    s = _scheduler(max_batch=2)
    a, b = _request("A", [1, 2, 3]), _request("B", [4, 5], n=2)
    _submit(s, a, b)
    s.admit()

    class NoMemory:
        def reset(self) -> None:
            raise MemoryError("out of memory")

    FailurePolicy(s.inbox, s, NoMemory()).recover(RuntimeError("device lost"))
    for req in (a, b):
        with pytest.raises(RolloutError, match="engine step failed: RuntimeError: device lost"):
            req.future.result(0)
    assert not s.busy and s.inbox.num_waiting == 0 and s.slots.num_free == 2
    assert "cannot reallocate the KV cache" in s.inbox.error
    with pytest.raises(BackendUnavailableError, match="engine failed"):
        s.inbox.submit(_request("C", [1, 2]))


def test_slot_buffers_record_matches_a_loop() -> None:
    rng = np.random.default_rng(0)
    B, K = 5, 4
    buffers = SlotBuffers(B, 32, 2)
    buffers.ints[:, POS] = [3, 7, 0, 2, 9]
    buffers.ints[:, REM] = 10
    valid = np.zeros((K, B), bool)
    valid[:, 0] = True  # 4 steps
    valid[:2, 1] = True  # finished after 2
    valid[:1, 3] = True  # 1 step; slots 2 and 4 idle
    toks = rng.integers(0, 100, (K, B)).astype(np.int32)
    lps, raws = rng.normal(size=(2, K, B)).astype(np.float32)
    active, n, last = buffers.record(toks, lps, raws, valid, K)
    assert active.tolist() == [0, 1, 3] and n.tolist() == [4, 2, 1]
    assert last.tolist() == [toks[3, 0], toks[1, 1], toks[0, 3]]
    for slot, count in zip([0, 1, 3], [4, 2, 1]):
        ids, lp, raw = buffers.output(slot)
        assert ids == toks[:count, slot].tolist()
        np.testing.assert_array_equal(lp, lps[:count, slot])
        np.testing.assert_array_equal(raw, raws[:count, slot])
    assert buffers.ints[:, POS].tolist() == [7, 9, 0, 3, 9]
    assert buffers.ints[:, REM].tolist() == [6, 8, 10, 9, 10]
    assert buffers.ints[:, CNT].tolist() == [4, 2, 0, 1, 0]
    assert buffers.ints[[0, 1, 3], TOK].tolist() == last.tolist()
    assert buffers.record(toks, lps, raws, np.zeros((K, B), bool), K) is None


def test_inbox_refuses_a_full_queue_a_running_rid_and_a_closed_engine() -> None:
    inbox = EngineInbox(max_queue=2)
    inbox.submit(_request("a", [1]))
    with pytest.raises(InvalidRequestError, match="already running"):
        inbox.submit(_request("a", [1]))
    inbox.submit(_request("b", [1]))
    with pytest.raises(OverloadedError, match="max_queue=2"):
        inbox.submit(_request("c", [1]))
    inbox.dequeued()
    inbox.submit(_request("c", [1]))
    assert inbox.running_ids() == ["a", "b", "c"]
    done = inbox.command(lambda: 42)
    commands, incoming, _ = inbox.wait_for_work(lambda: False)
    assert [r.rid for r in incoming] == ["a", "b", "c"] and commands[0][1] is done
    inbox.finished("b")
    assert inbox.running_ids() == ["a", "c"]
    assert inbox.close() and not inbox.close()
    assert inbox.wait_for_work(lambda: True) is None
    with pytest.raises(BackendUnavailableError, match="closed"):
        inbox.submit(_request("d", [1]))
    assert inbox.command(lambda: 0, quiet_when_closed=True) is None


def test_next_version() -> None:
    assert [next_version("0", None), next_version("7", None), next_version("7", "v2"),
            next_version("v2", None), next_version("3", 10)] == ["1", "8", "v2", "1", "10"]


def test_weights_swap_replaces_the_state_and_rebuilds_the_merged_copy() -> None:
    """``swap`` serves the new state, deletes the old merged copy before building the new one
    (one merge per swap), bumps the version; ``release_merged`` / ``ensure_merged`` free and
    rebuild it."""
    merges: list[Any] = []

    def merge(state: Any) -> jax.Array:
        merges.append(state)
        return jnp.ones((4,), jnp.float32) * len(merges)

    _, abstract_state = nnx.split(abstract_model(TINY))
    shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                             abstract_state)
    weights = EngineWeights(tiny_model(0), abstract_state, shardings, TINY, None, merge)
    assert weights.version == "0" and len(merges) == 1
    old_merged = weights.merged
    new_state = weights.prepare(tiny_model(1))
    old_leaves = weights.leaves
    assert weights.swap(new_state) == "1" and weights.state is new_state
    # the compiled calls take the leaves: they follow the swap, the same arrays, in tree order
    assert len(weights.leaves) == len(old_leaves) and all(
        a is b for a, b in zip(weights.leaves, jax.tree.leaves(new_state)))
    assert not any(a is b for a, b in zip(weights.leaves, old_leaves))
    with pytest.raises(ValueError, match="structure"):  # leaves in the wrong places: refused
        weights.swap({"not": jnp.zeros(())})
    assert weights.state is new_state
    assert old_merged.is_deleted() and merges[-1] is new_state
    np.testing.assert_array_equal(weights.merged, np.full((4,), 2.0))
    assert weights.release_merged() == 16 and weights.merged is None
    assert weights.swap(new_state, "v9") == "v9" and len(merges) == 2  # released: not rebuilt
    assert weights.ensure_merged() == 16 and len(merges) == 3
    with pytest.raises(ValueError, match="num_layers: 2 != 3"):
        weights.check_compatible(TINY.replace(num_layers=3))


def test_new_scheduling_settings_reach_the_scheduler_and_shapes_stay() -> None:
    """``engine.config = ...`` (benchmarks/speed/rollout_profile.py switches variants so)
    reaches the scheduler and the inbox; a compiled-in shape cannot change."""
    import dataclasses

    from tests.rollout_helpers import make_engine

    engine = make_engine(warmup=False, share_prompts=True, max_queue=5)
    try:
        engine.config = dataclasses.replace(engine.config, share_prompts=False, max_queue=7)
        assert engine.scheduler.config is engine.config
        assert not engine.scheduler.config.share_prompts and engine.inbox.max_queue == 7
        with pytest.raises(ValueError, match="max_batch"):
            engine.config = dataclasses.replace(engine.config, max_batch=99)
        assert engine.scheduler.config is engine.config and engine.config.max_batch != 99
    finally:
        engine.close()
