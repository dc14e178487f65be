"""The trainer (launch/run.py's job) in a real 2-process JAX run: 2 processes x 4 CPU devices.

Each worker process calls ``jax.distributed.initialize`` on a local coordinator (gloo CPU
collectives, one 8-device mesh), starts its own BabyAI / TextCraft servers and embedded engine
on loopback and runs the smoke config's trainer: every process draws the same task list, rolls
out its own block of groups, and trains on it with ``update(..., process_local=True)``.

Phase 1 (this file run as a script, so it can look inside): 2 steps of 2 tasks x 2 samples
(process 0 rolls out group 0, process 1 group 1), then the final evaluation (4 test tasks split
2 / 2). Each worker saves its learner parameters (``to_host``), its engine's weights and its
view of the run, and both export the sharded policy with ``save_hf_directory`` (a
collective; process 0 writes). Checked: both finish; both hold the same parameters, and each
engine holds them on its own local device; the parameters moved; the export holds them; the logged global trajectory count is the
sum of the per-process counts and what the config asks; process 0 alone wrote config, metrics,
TensorBoard and summary files; eval aggregated over both.

Phase 2 (``launch/run.py --distributed``, coordinator / process id from the environment):
resume to step 3 with 1 task per step, so process 0's share is empty and it takes part in
the update with zero rows. Checked: both resume at step 2 with the same task cursor (the
trainer checks it across processes), step 3 is logged once with 2 episodes, checkpoint 3
holds cursor 5.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np
import pytest

# also loaded by launch/run.py as its --config file, where tests/ is not on the path
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multiprocess_harness import REPO, Workers, free_port, init_worker, worker_env  # noqa: E402

N_PROC = 2
TIMEOUT_S = 300  # per phase, well above the whole test's duration (docs/PERFORMANCE.md)
OVERRIDES = {"train.total_steps": 2, "train.eval_tasks": 2, "train.eval_samples": 1,
             "rollout.max_new_tokens": 16, "learner.min_length_bucket": 256,
             "learner.logprob_chunk_size": 64}  # logits memory: 2 processes on one small box


def smoke_config(overrides: dict = OVERRIDES):
    """experiments/smoke.py with ``overrides`` (keys it may lack included)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("smoke", REPO / "experiments" / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


def get_config():  # this file as launch/run.py's --config
    return smoke_config()


# ----------------------------------------------------------------- worker (a subprocess)
def worker(process_id: int, coordinator: str, workdir: str, out: str) -> None:
    import jax
    init_worker(process_id, coordinator, N_PROC)
    from flax import nnx

    from agentrl_jax.sharding.placement import to_host
    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.runtime.policy import load_policy
    from agentrl_jax.training.rl.trainer import Trainer

    config = to_run_config(smoke_config())
    initial, _, _ = load_policy(config)
    trainer = Trainer(config, workdir, progress=False)
    summary = trainer.run()

    def flat(tree):
        return {jax.tree_util.keystr(p): x
                for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}

    params = {k: to_host(v) for k, v in flat(trainer.learner.params).items()}  # collective
    # the safetensors export of the sharded policy: a collective, process 0 writes
    from agentrl_jax.models.safetensors_io import save_hf_directory
    save_hf_directory(trainer.learner.policy_model(), os.path.join(workdir, "export"),
                      dtype="float32")
    engine = flat(trainer.backend.weights.state)
    results = {f"param{k}": v for k, v in params.items()}
    results.update({f"engine{k}": np.asarray(v) for k, v in engine.items()})
    results.update({f"initial{k}": np.asarray(v)
                    for k, v in flat(nnx.state(initial, nnx.Param)).items()})
    local = set(jax.local_devices())
    results["engine_on_one_local_device"] = np.array(all(
        len(v.devices()) == 1 and v.devices() <= local for v in engine.values()))
    results["has_writer"] = np.array(trainer.learner.writer is not None)
    results["summary"] = np.array(json.dumps(summary, default=str))
    np.savez(out, **results)
    jax.distributed.shutdown()


# ----------------------------------------------------------------- the test (pytest process)
def _lines(path: str) -> list[dict]:
    """The rows of ``path``, or of its gzip log ``path.gz`` (the trainer's trajectories)."""
    from agentrl_common.jsonl_files import read_records

    if not os.path.exists(path):
        assert os.path.exists(path + ".gz"), path
        path += ".gz"
    return read_records(path)


@pytest.mark.slow
def test_two_process_trainer_then_resume(tmp_path):
    workdir = str(tmp_path / "run")
    coordinator = f"127.0.0.1:{free_port()}"
    outputs = Workers(
        [[sys.executable, __file__, str(i), coordinator, workdir, str(tmp_path / f"w{i}.npz")]
         for i in range(N_PROC)], [worker_env()] * N_PROC,
        [tmp_path / f"phase1_{i}.log" for i in range(N_PROC)]).wait(TIMEOUT_S)
    workers = [dict(np.load(tmp_path / f"w{i}.npz")) for i in range(N_PROC)]

    # the same parameters on both processes, and in both engines (on their own device)
    names = [k[len("param"):] for k in workers[0] if k.startswith("param")]
    assert names
    for i, got in enumerate(workers):
        assert bool(got["engine_on_one_local_device"]), f"process {i}"
        for name in names:
            np.testing.assert_array_equal(got[f"param{name}"], workers[0][f"param{name}"])
            np.testing.assert_array_equal(got[f"engine{name}"], got[f"param{name}"],
                                          err_msg=f"process {i}'s engine, {name}")
    moved = max(np.abs(workers[0][f"param{n}"] - workers[0][f"initial{n}"]).max()
                for n in names)
    assert moved > 1e-6, "the updates did not change the parameters"

    # the export written by process 0 holds the trained parameters
    import safetensors.numpy
    exported = safetensors.numpy.load_file(os.path.join(workdir, "export", "model.safetensors"))
    embed = [n for n in names if "embed" in n]
    assert len(embed) == 1
    np.testing.assert_array_equal(exported["model.embed_tokens.weight"],
                                  workers[0][f"param{embed[0]}"])
    assert not os.path.exists(os.path.join(workdir, "export.tmp-export"))

    # global rollout numbers: 2 tasks x 2 samples per step, one group on each process
    per_process = [_lines(os.path.join(workdir, f"trajectories_train.process{i}.jsonl"))
                   for i in range(N_PROC)]
    assert not os.path.exists(os.path.join(workdir, "trajectories_train.jsonl.gz"))
    metrics = _lines(os.path.join(workdir, "metrics.jsonl"))
    train = [m for m in metrics if "train/horizon" in m]
    assert [m["step"] for m in train] == [1, 2]  # written once (by process 0)
    for step, m in zip((1, 2), train):
        local = [sum(t["step"] == step for t in trajs) for trajs in per_process]
        assert local == [2, 2], local
        assert m["rollout/episodes"] == sum(local) == 2 * 2
        assert m["batch/rows"] == m["rollout/episodes"] - m["rollout/dropped"]
        groups = [{t["group_id"] for t in trajs if t["step"] == step} for trajs in per_process]
        assert groups == [{0}, {1}]  # global group ids
    assert {t["env"] for t in per_process[0]} == {"babyai"}
    assert {t["env"] for t in per_process[1]} == {"textcraft"}
    # process 0 alone wrote the run's files
    assert [bool(w["has_writer"]) for w in workers] == [True, False]
    assert len(glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))) == 1
    assert os.path.exists(os.path.join(workdir, "config.json"))
    assert "[step 2/2]" in outputs[0] and "[step" not in outputs[1]
    # evaluation: 2 BabyAI + 2 TextCraft test tasks, split 2 / 2, scored over both
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert summary["process_count"] == 2 and summary["final_step"] == 2
    assert summary["evals"]["2"]["num_tasks"] == 4
    evals = [_lines(os.path.join(workdir, f"trajectories_eval.process{i}.jsonl"))
             for i in range(N_PROC)]
    assert [len(e) for e in evals] == [2, 2]
    assert len([m for m in metrics if "eval/avg@1" in m]) == 1
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "2"))

    # Phase 2: launch/run.py --distributed resumes to step 3 with 1 task per step: process 1's
    # share is empty (a zero-row update on that process).
    coordinator = f"127.0.0.1:{free_port()}"
    outputs = Workers(
        [[sys.executable, "launch/run.py", "--config", __file__, "--workdir", workdir,
          "--distributed", "--config.train.total_steps=3", "--config.train.tasks_per_step=1",
          "--config.train.eval_after=False"]
         for _ in range(N_PROC)],
        [worker_env(JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=str(N_PROC),
                    JAX_PROCESS_ID=str(i)) for i in range(N_PROC)],
        [tmp_path / f"phase2_{i}.log" for i in range(N_PROC)]).wait(TIMEOUT_S)
    assert "resumed at step 2" in outputs[0] and "[step 3/3] horizon=3" in outputs[0]
    train = [m for m in _lines(os.path.join(workdir, "metrics.jsonl")) if "train/horizon" in m]
    assert [m["step"] for m in train] == [1, 2, 3]
    assert train[-1]["rollout/episodes"] == 2 and "actor/pg_loss" in train[-1]
    per_process = [_lines(os.path.join(workdir, f"trajectories_train.process{i}.jsonl"))
                   for i in range(N_PROC)]
    assert [sum(t["step"] == 3 for t in trajs) for trajs in per_process] == [0, 2]
    state = json.load(open(os.path.join(workdir, "checkpoints", "3", "trainer_state",
                                        "metadata")))
    extra = dict(state["extra"])
    assert extra.pop("train_seconds") > 0  # the time budget's clock (both sessions' loops)
    assert extra == {"step": 3, "cursor": 5}  # 2 x 2 tasks, then 1


if __name__ == "__main__":
    worker(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
