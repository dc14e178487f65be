"""``learner.offload_optimizer_state``: the AdamW state in pinned host memory (offload.py).

The independent reference is the same learner without offload (its whole ``tx.update`` on the
device, in one jitted program). The offloaded update is a host loop: optax's clip over the whole
gradient tree in one jitted call, then optax's own AdamW in one jitted call per parameter leaf;
XLA compiles these programs differently from the fused one (e.g. it rewrites
``m / bias_correction`` into a multiply by the reciprocal in one of them), so they agree to
float32 rounding, not bit for bit:

* one optimiser step from the same state: parameters and moments agree to 1e-6 of each
  leaf's largest entry (measured, packed: parameters within 3.7e-9, moments equal);
* after several steps, AdamW amplifies those ulps where a gradient is ~0 (its first steps move
  a weight by ~lr * sign(grad)): single entries are bounded by 0.1 * lr and the mean difference
  must be tiny -- the criterion tests/test_learner.py applies to sharded-vs-single-device runs
  (measured after 3 packed steps: entries within 6.0e-8, mean 3.0e-10; the padded run with a
  critic on 2 devices, after 4 steps: within 2.5e-8, mean 2.8e-10).

A resumed offloaded run, by contrast, runs the very same programs on the very same numbers, so
checkpoint -> restore -> next step must equal the uninterrupted offloaded run exactly.

Tiny random model, 1 or 2 of the 8 virtual CPU devices (tests/conftest.py); JAX's CPU backend
has the ``pinned_host`` memory kind.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentrl_jax.learner import Learner, LearnerConfig, offload
from agentrl_jax.learner.optim import make_optimizer, optimizer_parts, optimizer_step_count
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh
from agentrl_jax.training.preflight.validate import config_problems
from experiments import smoke

TINY = ModelConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8)
LR = 1e-3
# the 7B experiment's path: packed rows (experiments/babyai.py:paper_scale_7b: pack_length=4096);
# one optimiser step per update, so that update 1 is a single step from the same state
PACKED = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                       learning_rate=LR, weight_decay=0.01,
                       micro_batch_size=2, mini_batches=1, pack_length=64, min_length_bucket=32,
                       logprob_chunk_size=16, ratio_source="recompute")
# the padded path with a PPO critic (GAE): two optimiser states offloaded, two mini-batches
PADDED = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                       learning_rate=LR, weight_decay=0.01,
                       micro_batch_size=2, mini_batches=2, min_length_bucket=32,
                       logprob_chunk_size=16, advantage_estimator="gae",
                       critic_learning_rate=LR)
# metrics that are timings (differ run to run)
_TIMES = ("perf/",)
# metrics after several steps: the sharded-vs-single-device criterion of tests/test_learner.py
# (rtol 1e-4, atol 1e-6), with rtol tightened to 1e-5. The atol matters for losses that are
# sums of +-terms of size ~1 and so nearly 0: measured, actor/pg_loss 2.168e-6 vs 2.138e-6
# (3e-8 apart) at step 2 of the packed run; every other metric within 5e-7 relative.
STEPS_METRICS = dict(rtol=1e-5, atol=1e-6)


def batch(seed: int, rows: int = 6, length: int = 24) -> dict[str, np.ndarray]:
    """Right-padded rows: a 3-token prompt, then generated tokens up to a random length."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(length // 2, length + 1, rows)
    attn = (np.arange(length)[None] < lens[:, None]).astype(np.int32)
    loss = attn.astype(np.float32)
    loss[:, :3] = 0
    tokens = rng.integers(0, TINY.vocab_size, (rows, length)).astype(np.int32) * attn
    return {"tokens": tokens, "attention_mask": attn, "loss_mask": loss,
            "rollout_logprobs": (-rng.random((rows, length)) * 3 * loss).astype(np.float32),
            "group_id": np.arange(rows) // 2, "reward": rng.random(rows).astype(np.float32)}


@pytest.fixture(scope="module")
def initial_state():
    graphdef, state = nnx.split(init_model(TINY, seed=0))
    return graphdef, jax.tree.map(np.asarray, state)


def model(initial_state):
    graphdef, state = initial_state
    return nnx.merge(graphdef, jax.tree.map(jnp.asarray, state))


def host(tree):
    """NumPy copies of the leaves, fetched through device-memory copies: ``device_get`` of a
    pinned-host array keeps a host view of its buffer on the array, and the next update, which
    donates the optimiser state, then fails on GPU ("Donation requested for buffer with
    external reference", seen on an H200)."""
    return [np.asarray(jax.device_get(jax.device_put(x, x.sharding.with_memory_kind("device"))))
            for x in jax.tree.leaves(tree)]


def kinds(tree) -> set[str]:
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree)}


def assert_one_step_close(got, want):
    """One optimiser step apart from rounding: every entry within 1e-6 relative."""
    for x, y in zip(got, want, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6 * max(np.abs(y).max(), 1e-30))


def assert_steps_close(got, want):
    """Several steps: entries within 0.1 * lr (sign flips of ~0 gradients), mean tiny."""
    for x, y in zip(got, want, strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=0.1 * LR)
        assert np.abs(x - y).mean() < 1e-8


def assert_metrics_equal(got, want, rtol: float, atol: float):
    assert set(got) == set(want)
    for key in sorted(want):
        if not key.startswith(_TIMES):
            np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol, err_msg=key)


def run(learner: Learner, batches, save_after: int | None = None) -> dict:
    """Updates on ``batches``; host copies of params / opt_state after each, the memory kinds
    of the optimiser state after init and after each update."""
    out = {"params": [], "opt": [], "metrics": [], "kinds": [kinds(learner.opt_state)]}
    for i, b in enumerate(batches):
        out["metrics"].append(learner.update(b))
        out["params"].append(host(learner.params))
        out["opt"].append(host(learner.opt_state))
        out["kinds"].append(kinds(learner.opt_state))
        if save_after == i:
            learner.save({"cursor": i + 1})  # async; the next update donates the state
    return out


# ----------------------------------------------------------------- packed path (7B config's)
@pytest.fixture(scope="module")
def packed(initial_state, tmp_path_factory):
    mesh = make_mesh(devices=jax.devices()[:1])
    batches = [batch(s) for s in (1, 2, 3)]
    ckpt = str(tmp_path_factory.mktemp("offload_ckpt"))
    ref = Learner(model(initial_state), PACKED, mesh=mesh)
    off = Learner(model(initial_state), PACKED.replace(offload_optimizer_state=True), mesh=mesh,
                  checkpoint_dir=ckpt)
    result = {"ref": run(ref, batches), "off": run(off, batches, save_after=1),
              "batches": batches, "ckpt": ckpt, "mesh": mesh}
    off.close()
    return result


def test_packed_first_step_matches_no_offload(packed):
    ref, off = packed["ref"], packed["off"]
    assert_metrics_equal(off["metrics"][0], ref["metrics"][0], rtol=1e-6, atol=1e-9)
    assert_one_step_close(off["params"][0], ref["params"][0])
    assert_one_step_close(off["opt"][0], ref["opt"][0])


def test_packed_steps_match_no_offload(packed):
    ref, off = packed["ref"], packed["off"]
    for step in (1, 2):
        assert_metrics_equal(off["metrics"][step], ref["metrics"][step], **STEPS_METRICS)
        assert_steps_close(off["params"][step], ref["params"][step])
    assert off["metrics"][2]["learner/optimizer_step"] == 3


def test_opt_state_stays_in_pinned_host_memory(packed):
    assert all(k == {"pinned_host"} for k in packed["off"]["kinds"])  # after init and each step
    assert all(k == {"device"} for k in packed["ref"]["kinds"])


def test_checkpoint_resume_continues_exactly(packed, initial_state):
    off = packed["off"]
    resumed = Learner(model(initial_state), PACKED.replace(offload_optimizer_state=True),
                      mesh=packed["mesh"], checkpoint_dir=packed["ckpt"])
    assert resumed.restore_latest() == {"cursor": 2}
    assert kinds(resumed.opt_state) == {"pinned_host"}
    # the saved state is the one before the update that followed the (async) save
    for x, y in zip(host(resumed.opt_state), off["opt"][1], strict=True):
        np.testing.assert_array_equal(x, y)
    metrics = resumed.update(packed["batches"][2])
    assert kinds(resumed.opt_state) == {"pinned_host"}
    for got, want in ((host(resumed.params), off["params"][2]),
                      (host(resumed.opt_state), off["opt"][2])):
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
    assert_metrics_equal(metrics, off["metrics"][2], rtol=0, atol=0)
    resumed.close()


# ----------------------------------------------------------------- padded path, critic, FSDP
def test_padded_path_with_critic_and_fsdp_matches_no_offload(initial_state):
    mesh = make_mesh(fsdp=2, devices=jax.devices()[:2])
    batches = [batch(s) for s in (4, 5)]
    ref = run(Learner(model(initial_state), PADDED, mesh=mesh), batches)
    learner = Learner(model(initial_state), PADDED.replace(offload_optimizer_state=True),
                      mesh=mesh)
    off = run(learner, batches)
    assert all(k == {"pinned_host"} for k in off["kinds"])
    assert kinds(learner.critic_opt_state) == {"pinned_host"}
    # the moments keep the parameters' FSDP sharding, in host memory
    mu = learner.opt_state[1][0].mu["layers"][0]["mlp"]["up_proj"]["kernel"][...]
    param = learner.params["layers"][0]["mlp"]["up_proj"]["kernel"][...]
    assert mu.sharding.spec == param.sharding.spec and mu.sharding.memory_kind == "pinned_host"
    for step in (0, 1):  # two mini-batches per update: several steps from the first update on
        assert_metrics_equal(off["metrics"][step], ref["metrics"][step], **STEPS_METRICS)
        assert_steps_close(off["params"][step], ref["params"][step])
        assert_steps_close(off["opt"][step], ref["opt"][step])
    assert off["metrics"][1]["learner/optimizer_step"] == 4


def test_update_waits_for_the_async_save_before_donating(initial_state, tmp_path,
                                                         monkeypatch):
    """save -> update at once: the update donates the pinned-host state, which the async save
    may still reference (fails on GPU); the learner waits for the save first."""
    learner = Learner(model(initial_state), PACKED.replace(offload_optimizer_state=True),
                      mesh=make_mesh(devices=jax.devices()[:1]), checkpoint_dir=str(tmp_path))
    alive_at_wait = []
    real_wait = learner.checkpointer.wait

    def wait():  # the state must not have been donated yet
        alive_at_wait.append(not any(x.is_deleted() for x in jax.tree.leaves(learner.opt_state)))
        real_wait()
    monkeypatch.setattr(learner.checkpointer, "wait", wait)
    learner.save({"cursor": 0})
    learner.update(batch(1))
    assert alive_at_wait and all(alive_at_wait)
    learner.close()


def test_step_after_a_save_or_restore_donates_fresh_copies(initial_state, tmp_path):
    """Orbax may keep references to the pinned-host buffers it saved or restored, and donating
    them fails on GPU even after the save finished (seen on an H100): after a save or a
    restore, the next step gets copies (new buffers, same values, same memory); other steps
    donate the state as it is."""
    learner = Learner(model(initial_state), PACKED.replace(offload_optimizer_state=True),
                      mesh=make_mesh(devices=jax.devices()[:1]), checkpoint_dir=str(tmp_path))

    def pointers():
        return [x.unsafe_buffer_pointer() for x in jax.tree.leaves(learner.opt_state)]

    learner.before_donating_opt_state()  # nothing saved yet: no copy
    before = pointers()
    assert pointers() == before
    learner.save({"cursor": 0})
    saved = host(learner.opt_state)
    learner.before_donating_opt_state()
    after = pointers()
    assert all(a != b for a, b in zip(after, before))
    assert all(np.array_equal(x, y) for x, y in zip(host(learner.opt_state), saved))
    assert kinds(learner.opt_state) == {"pinned_host"}
    learner.before_donating_opt_state()  # copied once per save
    assert pointers() == after
    learner.update(batch(1))
    learner.wait()
    learner.restore_latest()
    restored = pointers()
    learner.before_donating_opt_state()
    assert all(a != b for a, b in zip(pointers(), restored))
    learner.update(batch(2))  # runs on the copies
    learner.close()


# ----------------------------------------------------------------- the per-leaf host loop
def _spec(shape: tuple[int, ...]) -> P:
    """Matrices split over ``x`` on their first axis; vectors and scalars replicated."""
    return P("x", None) if len(shape) == 2 else P()


def _synthetic(mesh, seed: int):
    """A parameter tree with repeated leaf shapes (matrices FSDP-sharded over ``x``, vectors
    replicated): ``(params, grads, shardings)``; gradients large enough that the clip acts."""
    shapes = {"embed": (16, 8), "layers": [{"w": (8, 12), "u": (8, 12), "norm": (8,),
                                             "bias": (12,)} for _ in range(3)],
              "head": (8, 16)}
    rng = np.random.default_rng(seed)
    is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, _spec(s)), shapes, is_leaf=is_shape)

    def make(scale):
        return jax.tree.map(lambda s, sh: jax.device_put(
            (rng.standard_normal(s) * scale).astype(np.float32), sh), shapes, shardings,
            is_leaf=is_shape)
    return make(1.0), [make(10.0) for _ in range(2)], shardings


def test_update_is_a_host_loop_of_per_leaf_calls():
    """LeafwiseUpdate on a synthetic tree: one leaf_step call per parameter leaf per step,
    one executable per distinct (shape, sharding), every leaf updated; the result is
    tx.update's (clip + AdamW + weight-decay mask + step count) within one-step rounding."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    config = LearnerConfig(learning_rate=LR, weight_decay=0.01, grad_clip=1.0,
                           offload_optimizer_state=True)
    params, grads, p_sh = _synthetic(mesh, seed=0)
    tx, _ = make_optimizer(config)
    dev_sh = jax.tree.map(lambda x: NamedSharding(mesh, _spec(x.shape)),
                          jax.eval_shape(tx.init, params))
    host_sh = offload.host_shardings(dev_sh)
    parts = optimizer_parts(config)
    ref = offload.make_update_fn(tx, None, p_sh, dev_sh)
    off = offload.make_update_fn(tx, parts, p_sh, host_sh)
    assert isinstance(off, offload.LeafwiseUpdate)

    def copy(tree):  # new buffers in the same shardings (the updates donate theirs)
        return jax.tree.map(lambda x: jax.device_put(np.asarray(x), x.sharding), tree)
    ref_state = offload.init_opt_state(tx, None, params, dev_sh)
    off_state = offload.init_opt_state(tx, parts, params, host_sh)
    ref_params, off_params = copy(params), copy(params)
    n_leaves = len(jax.tree.leaves(params))
    for step, g in enumerate(grads):
        before = host(off_params)
        ref_params, ref_state, ref_norm = ref(ref_params, ref_state, copy(g))
        off_params, off_state, off_norm = off(off_params, off_state, copy(g))
        assert off.leaf_calls == (step + 1) * n_leaves
        assert all(not np.array_equal(x, y) for x, y in zip(host(off_params), before))
        assert kinds(off_state) == {"pinned_host"} and kinds(off_params) == {"device"}
        assert float(off_norm) > config.grad_clip  # the clip acted
        np.testing.assert_allclose(float(off_norm), float(ref_norm), rtol=1e-6)
        assert_one_step_close(host(off_params), host(ref_params))
        assert_one_step_close(host(off_state), host(ref_state))
    assert optimizer_step_count(off_state) == 2
    # 5 distinct (shape, sharding): (16, 8), (8, 12), (8, 16) over x; (8,), (12,) replicated
    distinct = {(x.shape, x.dtype, x.sharding) for x in jax.tree.leaves(params)}
    assert len(distinct) == 5 and len(off._steps) <= len(distinct)
    assert off.executables() <= len(distinct)


# ----------------------------------------------------------------- errors and validation
def test_backend_without_pinned_host_is_refused(initial_state, monkeypatch):
    monkeypatch.setattr(offload, "host_memory_kinds", lambda mesh: {"gpu:0": ["device"]})
    with pytest.raises(ValueError, match="offload_optimizer_state.*pinned_host"):
        Learner(model(initial_state), PACKED.replace(offload_optimizer_state=True),
                mesh=make_mesh(devices=jax.devices()[:1]))


def test_config_validation():
    assert not LearnerConfig().offload_optimizer_state
    assert LearnerConfig.from_dict({"offload_optimizer_state": True}).offload_optimizer_state
    with pytest.raises(ValueError, match="offload_optimizer_state: must be True or False"):
        LearnerConfig(offload_optimizer_state="false")
    for value, ok in (("yes", False), (1, False), (True, True), (False, True)):
        c = smoke.get_config().to_dict()  # (the ConfigDict itself refuses a str for a bool)
        c["learner"]["offload_optimizer_state"] = value
        bad = [p for p in config_problems(c) if p.startswith("learner.offload_optimizer_state:")]
        assert bool(bad) != ok, (value, bad)
