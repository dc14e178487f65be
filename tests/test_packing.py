"""Sequence packing (learner/packing.py), aggregation weights and the packed update.

References: a brute-force check of the packing plan, ``aggregate_loss`` (for the token
weights, in float64 NumPy too), and the learner's padded update path on the same batch (the
packed update must give the same parameters after one optimiser step).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentrl_jax.algorithms import aggregate_loss, aggregation_weights
from agentrl_jax.learner import Learner, LearnerConfig
from agentrl_jax.learner.metrics import behaviour_consistency
from agentrl_jax.learner.packing import pack, plan_packing, segment_layout, unpack
from agentrl_jax.sharding.mesh import make_mesh
from tests.test_learner import TINY, base_state, fresh_model, multiturn_batch, one_device_mesh  # noqa: F401


def test_plan_places_every_sequence_once_without_overlap():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 100, 57)
    plan = plan_packing(lengths, 128, row_multiple=4)
    assert plan.num_rows % 4 == 0
    used = np.zeros((plan.num_rows, 128), np.int32)
    for r, o, n in zip(plan.row, plan.offset, plan.length):
        assert 0 <= o and o + n <= 128
        used[r, o:o + n] += 1
    assert used.max() == 1 and used.sum() == lengths.sum()
    # first-fit decreasing uses at most 11/9 OPT + 1 rows; OPT >= total / 128
    assert len(set(plan.row.tolist())) <= int(11 / 9 * np.ceil(lengths.sum() / 128)) + 1


def test_plan_keeps_each_row_within_the_scored_budget():
    """``scored`` / ``scored_budget``: the scored LM head's capacity as a second room per row;
    a sequence over the budget gets a row of its own; without a budget, the plan is the one
    of lengths alone."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(10, 60, 40)
    scored = rng.integers(0, 13, 40)
    scored[3] = 30  # over the budget: alone in its row
    plain = plan_packing(lengths, 128, row_multiple=2)
    plan = plan_packing(lengths, 128, row_multiple=2, scored=scored, scored_budget=16)
    per_row = np.zeros(plan.num_rows, np.int64)
    used = np.zeros((plan.num_rows, 128), np.int32)
    for i, (r, o, n) in enumerate(zip(plan.row, plan.offset, plan.length)):
        assert 0 <= o and o + n <= 128
        used[r, o:o + n] += 1
        per_row[r] += scored[i]
    assert used.max() == 1 and used.sum() == lengths.sum()
    assert np.sum(plan.row == plan.row[3]) == 1 and per_row[plan.row[3]] == 30
    others = np.delete(np.arange(plan.num_rows), plan.row[3])
    assert per_row[others].max() <= 16
    # the lengths alone pack more scored tokens into some row: the budget changed the plan
    plain_rows = np.bincount(plain.row, weights=scored, minlength=plain.num_rows)
    assert np.delete(plain_rows, plain.row[3]).max() > 16
    # a budget that never binds leaves the plan as it was
    loose = plan_packing(lengths, 128, row_multiple=2, scored=scored, scored_budget=10 ** 6)
    for a, b in ((loose.row, plain.row), (loose.offset, plain.offset)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="scored counts"):
        plan_packing(lengths, 128, scored=scored[:3], scored_budget=16)


def test_pack_unpack_round_trip_and_segments():
    rng = np.random.default_rng(1)
    lengths = np.array([5, 3, 7, 2, 8])
    x = np.zeros((5, 8), np.float32)
    for i, n in enumerate(lengths):
        x[i, :n] = rng.normal(size=n)
    plan = plan_packing(lengths, 10)
    packed = pack(plan, x)
    assert packed.shape == (plan.num_rows, 10)
    np.testing.assert_array_equal(unpack(plan, packed, 8), x)
    seg, pos = segment_layout(plan)
    for i, (r, o, n) in enumerate(zip(plan.row, plan.offset, plan.length)):
        assert (seg[r, o:o + n] == i + 1).all()
        np.testing.assert_array_equal(pos[r, o:o + n], np.arange(n))
    assert (seg == 0).sum() == plan.num_rows * 10 - lengths.sum()
    with pytest.raises(ValueError, match="pack length"):
        plan_packing(np.array([11]), 10)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean",
                                  "seq_mean_token_sum_norm"])
def test_aggregation_weights_reproduce_every_mode(mode):
    rng = np.random.default_rng(2)
    m = (rng.random((6, 11)) > 0.5).astype(np.float32)
    m[3] = 0  # a fully masked row counts as no sequence
    loss = rng.normal(size=(6, 11))
    w = aggregation_weights(m, mode)
    # float64 reference written from the definitions
    rows = [b for b in range(6) if m[b].any()]
    if mode == "token_mean":
        ref = (loss * m).sum() / m.sum()
    elif mode == "seq_mean_token_sum":
        ref = sum((loss[b] * m[b]).sum() for b in rows) / len(rows)
    elif mode == "seq_mean_token_mean":
        ref = sum((loss[b] * m[b]).sum() / m[b].sum() for b in rows) / len(rows)
    else:
        ref = sum((loss[b] * m[b]).sum() for b in rows) / len(rows) / 11
    assert (loss * w).sum() == pytest.approx(ref, rel=1e-6)
    assert float(aggregate_loss(loss.astype(np.float32), m, mode)) == pytest.approx(ref, rel=1e-5)
    # split into micro-batches, the weighted sums add up to the whole
    assert sum((loss[s] * w[s]).sum() for s in (slice(0, 2), slice(2, 6))) == pytest.approx(ref)


def test_behaviour_consistency_reports_the_first_step_ratio():
    mask = np.array([[0, 1, 1, 0]], np.float32)
    rollout = np.array([[0.0, -1.0, -2.0, -9.0]])
    learner = np.array([[0.0, -1.0 + np.log(1.2), -2.0 - np.log(2.0), 5.0]])
    m = behaviour_consistency(rollout, learner, mask)
    assert m["rollout/behaviour_ratio_max"] == pytest.approx(1.2)
    assert m["rollout/behaviour_ratio_min"] == pytest.approx(0.5)
    assert m["rollout/logprob_abs_diff_max"] == pytest.approx(np.log(2.0))
    assert m["rollout/behaviour_ratio_outside_10pct"] == pytest.approx(1.0)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_packed_update_equals_the_padded_update(base_state, agg):  # noqa: F811
    """One optimiser step on packed rows (segment-masked attention, restarted positions, token
    weights, micro-batches of packed rows) gives the parameters of the padded path."""
    batch = multiturn_batch(5, batch=6, length=30)
    # adam_eps=1: the first Adam step is ~ lr * g / (|g| + 1), linear in the gradient, so the
    # parameters compare the gradients (with eps=1e-8 it is lr * sign(g): float summation noise
    # on a near-zero gradient could flip a sign)
    common = dict(dtype="float32", remat=False, learning_rate=0.1, adam_eps=1.0,
                  min_length_bucket=32,
                  logprob_chunk_size=12, kl_coef=0.01, entropy_coef=0.01,
                  ratio_source="recompute", loss_agg_mode=agg, shuffle=False)
    mesh = one_device_mesh()
    padded = Learner(fresh_model(base_state), LearnerConfig(micro_batch_size=2, **common),
                     mesh=mesh)
    packed = Learner(fresh_model(base_state),
                     LearnerConfig(micro_batch_size=1, pack_length=48, **common), mesh=mesh)
    m_pad = padded.update(batch)
    m_pack = packed.update(batch)
    assert m_pack["batch/packed_rows"] < 6  # rows were really packed
    for a, b in zip(jax.tree.leaves(padded.params), jax.tree.leaves(packed.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=1e-4)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert m_pack[key] == pytest.approx(m_pad[key], rel=1e-4, abs=1e-6), key
    # same parameters sampled the (here: recomputed) logprobs: the first-step ratio is 1
    assert m_pack["actor/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert m_pack["actor/ratio_min"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("axes", [{"data": 2, "fsdp": 2}, {"fsdp": 2, "tensor": 2}])
def test_pallas_attention_is_split_over_the_mesh(axes):
    """Under an activation mesh the Pallas kernel runs per device on its rows (and heads): the
    compiled forward + backward gathers nothing (the unsplit kernel, opaque to XLA's
    partitioner, had q / k / v / segment ids all-gathered onto every device), and values and
    gradients equal the kernel on the whole batch."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from agentrl_jax.kernels.flash_attention import pallas_causal_attention
    from agentrl_jax.models.sharded_attention import sharded_pallas_causal_attention
    from agentrl_jax.sharding.activations import activation_mesh

    mesh = make_mesh(data=axes.get("data", 1), fsdp=axes["fsdp"], tensor=axes.get("tensor", 1),
                     devices=jax.devices()[:4])
    rng = np.random.default_rng(1)
    b, t, h, kh, d = 4, 64, 4, 2, 16
    q = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, t, kh, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, t, kh, d)), jnp.float32)
    seg = jnp.asarray([[1] * 20 + [2] * 30 + [3] * 14, [1] * 64, [1] * 40 + [2] * 24,
                       [1] * 8 + [2] * 56], jnp.int32)
    rows = NamedSharding(mesh, P(("data", "fsdp")))

    def loss(fn, q, k, v, seg):
        with activation_mesh(mesh):
            return jnp.sum(fn(q, k, v, seg, interpret=True) ** 2)

    def grads(fn):
        return jax.jit(jax.grad(lambda *x: loss(fn, *x), argnums=(0, 1, 2)),
                       in_shardings=(rows,) * 4)

    compiled = grads(sharded_pallas_causal_attention).lower(q, k, v, seg).compile().as_text()
    assert "all-gather" not in compiled
    whole = grads(pallas_causal_attention)
    assert "all-gather" in whole.lower(q, k, v, seg).compile().as_text()  # what was fixed
    for a, c in zip(grads(sharded_pallas_causal_attention)(q, k, v, seg), whole(q, k, v, seg)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=1e-5, rtol=1e-5)
    with activation_mesh(mesh):
        out = jax.jit(lambda *x: sharded_pallas_causal_attention(*x, interpret=True),
                      in_shardings=(rows,) * 4)(q, k, v, seg)
    np.testing.assert_allclose(np.asarray(out),
                               np.asarray(pallas_causal_attention(q, k, v, seg, interpret=True)),
                               atol=1e-6)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 (virtual) devices")
@pytest.mark.parametrize("impl", ["pallas", "pallas_segments"])
def test_packed_update_with_pallas_attention_on_fsdp_equals_one_device(base_state,  # noqa: F811
                                                                       impl):
    """The learner's packed update with a Pallas kernel (JAX's ``mha`` or our block-skipping
    ``segment_attention``; interpreter on CPU) inside shard_map and per-layer remat, FSDP over
    4 devices, gives the parameters of the blockwise-attention update on one device."""
    batch = multiturn_batch(5, batch=8, length=30)
    common = dict(dtype="float32", remat=True, learning_rate=0.1, adam_eps=1.0,
                  kl_coef=0.0, entropy_coef=0.0, min_length_bucket=32, logprob_chunk_size=12,
                  ratio_source="recompute",
                  shuffle=False, pack_length=64, micro_batch_size=4)
    one = Learner(fresh_model(base_state), LearnerConfig(attention_impl="chunked", **common),
                  mesh=one_device_mesh())
    fsdp = Learner(fresh_model(base_state), LearnerConfig(attention_impl=impl, **common),
                   mesh=make_mesh(fsdp=4, devices=jax.devices()[:4]))
    m_one, m_fsdp = one.update(batch), fsdp.update(batch)
    assert m_fsdp["batch/packed_rows"] == 4  # 8 sequences in 4 packed rows, one per device
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(fsdp.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=1e-4)
    assert m_fsdp["actor/pg_loss"] == pytest.approx(m_one["actor/pg_loss"], rel=1e-4, abs=1e-6)


def test_pallas_attention_matches_chunked_on_packed_rows():
    """The GPU kernel (Pallas interpreter on CPU) against the pure-JAX blockwise attention:
    GQA heads, three packed segments per row, values and gradients."""
    import jax.numpy as jnp

    from agentrl_jax.models.attention import chunked_causal_attention
    from agentrl_jax.kernels.flash_attention import pallas_causal_attention

    rng = np.random.default_rng(0)
    b, t, h, kh, d = 2, 64, 4, 2, 16
    q = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, t, kh, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, t, kh, d)), jnp.float32)
    seg = jnp.asarray([[1] * 20 + [2] * 30 + [3] * 14, [1] * 64], jnp.int32)

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v) ** 2)

    pallas = lambda q, k, v: pallas_causal_attention(q, k, v, seg, interpret=True)  # noqa: E731
    chunked = lambda q, k, v: chunked_causal_attention(q, k, v, segment_ids=seg,  # noqa: E731
                                                       block_size=16)
    np.testing.assert_allclose(pallas(q, k, v), chunked(q, k, v), atol=2e-6)
    for a, c in zip(jax.grad(lambda *x: loss(pallas, *x), argnums=(0, 1, 2))(q, k, v),
                    jax.grad(lambda *x: loss(chunked, *x), argnums=(0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(a, c, atol=2e-5, rtol=1e-5)
