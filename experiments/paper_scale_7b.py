"""A paper-scale RL step for sizing runs: a Qwen2.5-7B-shaped policy (random weights), GRPO,
BabyAI, 32 tasks x 8 samples, a fixed 13-turn horizon.

Timed with ``benchmarks/rl_step.py --config experiments/paper_scale_7b.py --variants packed``
(``benchmarks/scaling_step_gpu.sh`` runs it) on the GPUs of ``CUDA_VISIBLE_DEVICES``: the
learner shards over every visible GPU (``learner.mesh``: FSDP) and the embedded engine runs a
bf16 replica on each of them (``rollout.engine_replicas=0``). By the estimate below 1 and 2
H100 80GB cannot hold it and 4 can (with the KV cache freed during the update), and 2 (or
more) H200 141GB can (measured runs: below the table); 1 H200 can by the estimate only with
the AdamW moments in host memory (``learner.offload_optimizer_state``, which this config turns
on for 1 GPU; measured on one H200: below). Random weights: actions are rarely valid, rewards are 0 and every
episode runs 13 turns of up to 24 tokens; ``train.skip_flat_groups`` is off so that the update
runs (on zero advantages) and is timed.
Results: docs/PERFORMANCE.md.

Memory (``agentrl_jax.training.memory_estimate``; ``python -m agentrl_jax.training.memory_estimate
--config experiments/paper_scale_7b.py`` prints the table):
float32 master weights + AdamW + the float32 gradient accumulator are 16 bytes x 7.62 B
parameters = 113 GiB, sharded over the GPUs, plus on each GPU a whole 14.2 GiB bfloat16 engine
replica and its KV cache (256 slots x 2,048 tokens x 56 KiB = 28 GiB, split over the replicas).
The policy is created directly in the learner's sharding (``init_model(..., mesh=...)``) and
the engine's first weights are cast from those shards: no GPU ever holds the float32 model.
On 1 GPU (``CUDA_VISIBLE_DEVICES`` names one; :func:`get_config`) the AdamW moments, 8 bytes x
N = 56.7 GiB, stay in pinned host memory and visit the GPU one parameter leaf at a time during
the optimiser step (a host loop of per-leaf jitted calls, ``agentrl_jax/learner/offload.py``;
the config uses packed rows, ``pack_length`` 4096, whose ``apply`` this replaces): 2 x 8
bytes per parameter (122 GB) cross the host link each optimiser step, and the host needs
56.7 GiB of page-locked RAM.

GiB per GPU; the verdicts are for an H100 80GB (79.1 GiB total; JAX may use 75.1 at
``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95``; at the default 0.75, 59.3: below the 4-GPU step's
estimated peak). The usable memory is ``--gpu-memory-gib`` (the card's total, GiB; default the
H100's 79.1) x ``--mem-fraction`` (0.95)::

    GPUs  master  AdamW      grads  engine  KV    merged  lower bound  peak   verdict
    1     28.4    56.7       28.4   14.2    28.0  7.9     135.2        164.3  does not fit
    1     28.4    0 (+8.1)   28.4   14.2    28.0  7.9      78.5        107.6  does not fit  (offloaded)
    2     14.2    28.4       14.2   14.2    14.0  7.9      78.7         96.3  does not fit
    4      7.1    14.2        7.1   14.2     7.0  7.9      50.4         62.4  fits

(``merged``: the decode GEMMs' concatenated q|k|v and gate|up weights a one-GPU replica keeps,
built and freed with the KV cache; the KV cache and they are released during the update:
``rollout.release_kv_during_update``; without it 4 GPUs are 57.5 / 77.3, "does not fit"). The
lower bounds of 1 and 2 GPUs are the rollout's live set (no gradients; KV cache and merged
weights) and exceed an H100's 75.1 whatever XLA does. The offloaded row is the config's for 1
GPU: AdamW 0 on the GPU, plus 8.1 GiB of moments assumed in flight during the optimiser step (twice the
moments of the 152064 x 3584 embedding: the largest leaf's, copied in and updated), which is
below the update's transients (36.6), so the peak is the forward / backward's: 164.3 - 56.7 =
107.6. An estimate: the per-leaf schedule's peak matched its estimate on a synthetic
1.9 B-parameter tree on an H100 (docs/LEARNER.md); the 7B step on one H200 peaked at 91.9 GiB
(below). H200 141GB
(``--gpu-memory-gib 140.4``: nvidia-smi's 143771 MiB, which ``benchmarks/scaling_step_gpu.sh``
passes; 133.4 GiB usable): 1 GPU fits only offloaded (107.6; 164.3 without), 2 and 4 fit
(peaks 96.3 and 62.4, below 90% of 133.4). Measured (2026-11-27, this config as it is on 2
and 4 GPUs, H200s; docs/PERFORMANCE.md, "session 9", which has the step times): 2 GPUs peak
86.4 GiB a GPU (estimate 96.3);
4 GPUs with JAX's memory capped at an H100's 75.1 GiB (``XLA_PYTHON_CLIENT_MEM_FRACTION=0.535``)
peak 54.7 GiB (estimate 62.4); 1 GPU (one H200, the moments offloaded, 2026-11-27, session 11):
peak 91.9 GiB (estimate 107.6: above an H100's 75.1).
Earlier: 4 H200s with a 110.5 GiB peak (before the remat fix), and 4 H100s out of
memory at the first update (before the KV release and the bf16 log-prob weights).

(lower bound: what must be live during an update or a rollout; peak adds the update's
transients -- the bf16 compute copy, a micro-batch's gradients, activations -- or, at a weight
sync, the new replica next to the old one and the one bf16 cast of the learner's shards.) An estimate, not
a measurement: benchmarks/rl_step.py records each GPU's measured peak.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.babyai_grpo_gpu import get_config as babyai_gpu_config  # noqa: E402

QWEN25_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584,
                 intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
                 head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 attention_bias=True, max_position_embeddings=32768)


def visible_gpu_count() -> int | None:
    """GPUs the run will use: the entries of ``CUDA_VISIBLE_DEVICES`` (how
    ``benchmarks/scaling_step_gpu.sh`` gives a run its GPUs), ``None`` when it is unset (then
    all of the machine's, a number this config does not know without starting JAX)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return len([d for d in visible.split(",") if d.strip()])


def get_config(num_gpus: int | None = None):
    """The experiment's config for ``num_gpus`` GPUs (default :func:`visible_gpu_count`).

    On one GPU the AdamW moments are kept in pinned host memory
    (``learner.offload_optimizer_state``; see ``agentrl_jax.training.memory_estimate``); with more, or an
    unknown count, they stay on the GPUs (``--set learner.offload_optimizer_state=True`` turns
    it on by hand)."""
    if num_gpus is None:
        num_gpus = visible_gpu_count()
    c = babyai_gpu_config()
    c.model.random_init = dict(QWEN25_7B)
    c.model.dtype = "bfloat16"
    c.rollout.engine_dtype = "bfloat16"
    c.rollout.max_context = 2048
    c.rollout.max_batch = 256
    c.rollout.max_concurrency = 256
    c.horizon.type = "fixed"
    c.horizon.turns = 13
    c.train.tasks_per_step = 32
    c.train.samples_per_task = 8
    c.train.skip_flat_groups = False
    c.train.max_seconds = 0.0
    c.train.eval_before = False
    c.train.eval_after = False
    # the engines' KV cache (7 GiB a GPU on 4 GPUs) is freed while the learner updates
    c.rollout.release_kv_during_update = True
    c.learner.dtype = "bfloat16"  # compute dtype; the master weights stay float32
    c.learner.pack_length = 4096
    c.learner.micro_batch_size = 4
    c.learner.logprob_batch_size = 8
    c.learner.mini_batches = 1
    # one GPU cannot hold the float32 master weights, gradients and AdamW moments (113 GiB)
    # next to the engine replica: the moments (57 GiB) go to pinned host memory
    c.learner.offload_optimizer_state = num_gpus == 1
    return c
