"""The Learner in a real 2-process JAX run (2 processes x 4 CPU devices = one 8-device mesh).

Two worker processes (this file run as a script) call ``jax.distributed.initialize`` on a
local coordinator with gloo CPU collectives, build the same tiny float32 model and run two
``Learner.update`` steps on each mesh, twice: (a) every process passes the global batch;
(b) each process passes only its own rows (``process_local=True``; the two halves have
different lengths, so the length bucket must be agreed across processes). Each writes its
parameters (``to_host``) and metrics to an .npz. The pytest process runs the same two steps
single-process on an 8-device mesh of the same shape and compares.

Tolerances: parameters and loss metrics within 1e-5 (float32). The configuration uses
``adam_eps=1e-5`` so that AdamW's first steps (update ~ lr * g / (|g| + eps)) do not amplify
float32 reduction-order noise on near-zero gradients into sign flips of size ``lr``
(see tests/test_learner.py); with ``lr=1e-3`` any real difference in the gradients (e.g. a
process training on its own rows only) still moves parameters by ~1e-3.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from multiprocess_harness import Workers, free_port, init_worker, worker_env

# the module's 2-process runs are long (a shared fixture; docs/PERFORMANCE.md): integration suite
pytestmark = pytest.mark.slow

N_PROC = 2
MESHES = {"data2xfsdp4": dict(data=2, fsdp=4, tensor=1),
          "fsdp4xtensor2": dict(data=1, fsdp=4, tensor=2)}
MODES = ("global", "local")
LOSS_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/total_loss",
             "actor/grad_norm", "actor/num_tokens", "actor/ref_kl", "advantages/mean",
             "advantages/std", "reward/mean", "rollout/logprob_abs_diff_mean",
             "response_length/mean", "sequence_length/max", "batch/rows",
             "batch/padded_rows", "batch/padded_length", "batch/generated_tokens")
ROWS, LENGTH, GROUP = 12, 40, 3  # 4 groups of 3; process p holds rows [6p, 6p + 6)
WORKER_TIMEOUT_S = 300  # several times a worker's run alone: margin for a loaded machine (hangs)


def tiny_model():
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import init_model
    return init_model(ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16),
                      seed=0)


def config():
    from agentrl_jax.learner import LearnerConfig
    return LearnerConfig(dtype="float32", remat=False, learning_rate=1e-3, adam_eps=1e-5,
                         micro_batch_size=8, min_length_bucket=32, logprob_chunk_size=12,
                         kl_coef=0.01, entropy_coef=0.01, ratio_source="recompute")


def make_batch(seed: int) -> dict[str, np.ndarray]:
    """A global right-padded multi-turn batch [12, 40]: the first half's rows reach 40
    tokens (length bucket 64), the second half's at most 30 (bucket 32 on its own)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 512, (ROWS, LENGTH)).astype(np.int32)
    lens = np.concatenate([rng.integers(20, LENGTH + 1, ROWS // 2),
                           rng.integers(10, 31, ROWS // 2)])
    lens[0] = LENGTH
    attn = (np.arange(LENGTH)[None] < lens[:, None]).astype(np.int32)
    loss = np.zeros((ROWS, LENGTH), np.float32)
    for b in range(ROWS):
        t, gen = int(rng.integers(2, 5)), True
        while t < lens[b]:
            span = int(rng.integers(2, 6))
            if gen:
                loss[b, t:min(t + span, lens[b])] = 1
            t, gen = t + span, not gen
    return {"tokens": tokens * attn, "attention_mask": attn, "loss_mask": loss,
            "rollout_logprobs": (-rng.random((ROWS, LENGTH)) * 6 * loss).astype(np.float32),
            "group_id": np.arange(ROWS) // GROUP, "reward": rng.random(ROWS).astype(np.float32)}


def local_half(batch: dict[str, np.ndarray], process: int) -> dict[str, np.ndarray]:
    """Process ``process``'s rows, trimmed to their own longest row."""
    rows = slice(process * ROWS // N_PROC, (process + 1) * ROWS // N_PROC)
    width = int(batch["attention_mask"][rows].sum(-1).max())
    return {k: (v[rows, :width] if v.ndim == 2 else v[rows]) for k, v in batch.items()}


def run_steps(mesh_shape: dict[str, int], process_local: bool = False, process: int = 0):
    """Two updates; returns ``(learner, host params leaves, [metrics per step])``."""
    import jax
    from agentrl_jax.learner import Learner, UpdateOptions
    from agentrl_jax.sharding.mesh import make_mesh
    from agentrl_jax.sharding.placement import to_host
    learner = Learner(tiny_model(), config(), mesh=make_mesh(**mesh_shape))
    metrics = []
    for seed in (1, 2):
        batch = make_batch(seed)
        metrics.append(learner.update(local_half(batch, process) if process_local else batch,
                                      UpdateOptions(process_local=process_local)))
    return learner, [to_host(x) for x in jax.tree.leaves(learner.params)], metrics


# ----------------------------------------------------------------- worker (a subprocess)
def worker(process_id: int, coordinator: str, out: str) -> None:
    import jax

    from agentrl_jax.learner import UpdateOptions
    init_worker(process_id, coordinator, N_PROC)
    from learner_helpers import update_logprobs
    results: dict[str, np.ndarray] = {}
    for mesh_name, shape in MESHES.items():
        for mode in MODES:
            learner, params, metrics = run_steps(shape, mode == "local", process_id)
            for i, leaf in enumerate(params):
                results[f"{mesh_name}/{mode}/param{i}"] = leaf
            for step, m in enumerate(metrics):
                for key in LOSS_KEYS:
                    results[f"{mesh_name}/{mode}/{step}/{key}"] = np.float64(m[key])
        # per-row outputs: this process's rows of process-local logprobs == the same rows of
        # the global computation
        batch = make_batch(3)
        mine = local_half(batch, process_id)
        results[f"{mesh_name}/lp_global"] = update_logprobs(learner, batch)
        results[f"{mesh_name}/lp_local"] = update_logprobs(learner, mine, process_local=True)
    # every process numbering its groups from 0 is refused, on every process
    try:
        learner.update(local_half(make_batch(4), process_id) | {"group_id": np.arange(6) // 3},
                       UpdateOptions(process_local=True))
        results["group_check"] = np.array("no error")
    except ValueError as e:
        results["group_check"] = np.array(str(e))
    np.savez(out, **results)
    jax.distributed.shutdown()


# ----------------------------------------------------------------- the test (pytest process)
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Start the workers, compute the single-process references meanwhile, collect."""
    import jax
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (virtual) devices for the single-process reference")
    tmp = tmp_path_factory.mktemp("multiprocess")
    coordinator = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    procs = Workers([[sys.executable, __file__, str(i), coordinator, str(tmp / f"worker{i}.npz")]
                     for i in range(N_PROC)], [worker_env()] * N_PROC,
                    [tmp / f"worker{i}.log" for i in range(N_PROC)])
    reference = {name: run_steps(shape) for name, shape in MESHES.items()}
    procs.wait(WORKER_TIMEOUT_S, tail=60)
    workers = [dict(np.load(tmp / f"worker{i}.npz")) for i in range(N_PROC)]
    print(f"\nworkers + references: {time.monotonic() - start:.1f} s")
    return reference, workers


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_two_processes_match_single_process(runs, mesh_name, mode):
    reference, workers = runs
    _, ref_params, ref_metrics = reference[mesh_name]
    for i, got in enumerate(workers):
        for j, want in enumerate(ref_params):
            np.testing.assert_allclose(got[f"{mesh_name}/{mode}/param{j}"], want, atol=1e-5,
                                       rtol=0, err_msg=f"process {i}, param leaf {j}")
        for step, want_m in enumerate(ref_metrics):
            for key in LOSS_KEYS:
                np.testing.assert_allclose(got[f"{mesh_name}/{mode}/{step}/{key}"],
                                           want_m[key], atol=1e-5, rtol=1e-5,
                                           err_msg=f"process {i}, step {step}, {key}")
    # the parameters moved (the comparison is not trivially true)
    moved = max(np.abs(p - q).max() for p, q in zip(ref_params, jax_leaves(tiny_model())))
    assert moved > 5e-4
    assert ref_metrics[0]["batch/padded_length"] == 64 and ref_metrics[0]["batch/rows"] == ROWS


def jax_leaves(model):
    import jax
    from flax import nnx
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_process_local_logprobs_are_own_rows(runs, mesh_name):
    _, workers = runs
    for i, got in enumerate(workers):
        lp_global, lp_local = got[f"{mesh_name}/lp_global"], got[f"{mesh_name}/lp_local"]
        mine = local_half(make_batch(3), i)
        assert lp_global.shape == (ROWS, LENGTH) and lp_local.shape == mine["tokens"].shape
        rows = slice(i * ROWS // N_PROC, (i + 1) * ROWS // N_PROC)
        np.testing.assert_allclose(lp_local, lp_global[rows, :lp_local.shape[1]], atol=1e-6)


def test_colliding_group_ids_are_refused_on_every_process(runs):
    _, workers = runs
    for got in workers:
        assert "occur on more than one process" in str(got["group_check"])


if __name__ == "__main__":
    worker(int(sys.argv[1]), sys.argv[2], sys.argv[3])
