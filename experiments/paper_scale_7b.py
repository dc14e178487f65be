"""A paper-scale RL step for sizing runs: a Qwen2.5-7B-shaped policy (random weights), GRPO,
BabyAI, 32 tasks x 8 samples, a fixed 13-turn horizon.

Timed with ``benchmarks/rl_step.py --config experiments/paper_scale_7b.py --variants packed``
on 1, 2 and 4 GPUs (``CUDA_VISIBLE_DEVICES``): the learner shards over every visible GPU
(``learner.mesh``: FSDP) and the embedded engine runs a bf16 replica on each of them
(``rollout.engine_replicas=0``). Random weights: actions are rarely valid, rewards are 0 and
every episode runs 13 turns of up to 24 tokens; ``train.skip_flat_groups`` is off so that the
update runs (on zero advantages) and is timed. Results: docs/PERFORMANCE.md.

Memory: float32 master weights + AdamW + float32 gradients are 16 bytes x 7.6 B parameters =
122 GB before activations, sharded over the GPUs, plus a 15 GB bf16 engine replica and its KV
cache on each GPU.
"""

from experiments.babyai_grpo_gpu import get_config as babyai_gpu_config

QWEN25_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584,
                 intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
                 head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 attention_bias=True, max_position_embeddings=32768)


def get_config():
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
    c.learner.dtype = "bfloat16"  # compute dtype; the master weights stay float32
    c.learner.pack_length = 4096
    c.learner.micro_batch_size = 4
    c.learner.logprob_batch_size = 8
    c.learner.mini_batches = 1
    return c
