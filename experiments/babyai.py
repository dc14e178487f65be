"""BabyAI + SmolLM2-135M-Instruct: every BabyAI experiment, one named variant each.

    python launch/run.py --config experiments/babyai.py --workdir runs/babyai   # grpo_gpu
    python launch/run.py --config experiments/babyai.py:grpo_scaling  # the paper's schedule

The default (``grpo_gpu``, the README's main job) is the recipe that learns: GRPO +
ScalingInter-RL (6 -> 13 -> 20 turns) compressed to 15 steps a phase for a ~10-minute run on one
GPU (``common.gpu_recipe``); ``grpo_scaling`` is the paper's schedule (100 steps a phase) with
the settings' defaults. Variants (``experiments/common.py`` holds the
shared pieces):

================== ==========================================================================
grpo_scaling       the paper's schedule with the settings' defaults
grpo_fixed         the ScalingInter baseline: a fixed 20-turn horizon
ppo                ``grpo_scaling`` with PPO (critic + GAE) instead of GRPO
grpo_gpu           the default: one GPU, 360 s of training (``common.gpu_recipe``)
grpo_long_gpu      ``grpo_gpu`` to the end of its curve: 1,350 s of training, resumable
grpo_scaling_gpu10min  an older one-GPU sizing: bf16, 8 steps a phase, 64 evaluation tasks
gigpo_gpu          ``grpo_gpu`` with the GiGPO estimator
grpo_curve_gpu     ``grpo_gpu`` followed until its dev curve is flat (>= 30 min of training)
gigpo_curve_gpu    ``gigpo_gpu`` followed until its dev curve is flat (>= 30 min of training)
dpo_gpu            ``grpo_gpu``'s rollouts trained by DPO on success/failure pairs
sft                behaviour cloning of the macro-action expert, CPU-sized
sft_gpu            behaviour cloning on one GPU
sft_grpo_gpu       ``grpo_gpu`` started from ``sft_gpu``'s policy
sft_gigpo_gpu      ``sft_grpo_gpu`` with the GiGPO estimator
choice_gpu         ``grpo_gpu`` answering with the letter of a listed action, restricted policy
choice_tiny        the CPU learning-path check: a tiny random model picks lettered actions
choice_tiny_t1     ``choice_tiny`` at temperature 1, the policy restricted to the option letters
paper_scale_7b     a paper-scale RL step for sizing runs: a Qwen2.5-7B-shaped random policy
================== ==========================================================================
"""

from __future__ import annotations

import os

from ml_collections import ConfigDict

from agentrl_jax.agent.parsing import CHOICE_LABELS
from agentrl_jax.training.config.experiment import base_config, use_fixed_horizon, use_ppo
from experiments.common import (bc_gpu, cpu_sized_sft, curve_run, gpu_recipe, long_run,
                                paper_scaling, select, sft_learner, sft_section, use_choice,
                                use_gigpo)

DEFAULT = "grpo_gpu"


def grpo_scaling() -> ConfigDict:
    """GRPO + ScalingInter-RL (6 -> 13 -> 20 turns, K=100): the README's main job."""
    return paper_scaling(env="babyai", phases=(6, 13, 20), steps_per_phase=100, eval_horizon=20)


def grpo_fixed() -> ConfigDict:
    """GRPO with a fixed 20-turn horizon (the ScalingInter baseline)."""
    c = base_config()
    c.env.names = "babyai"
    use_fixed_horizon(c, 20)
    c.train.eval_horizon = 20
    return c


def ppo() -> ConfigDict:
    """``grpo_scaling`` with PPO (critic + GAE) instead of GRPO."""
    return use_ppo(grpo_scaling())


def grpo_gpu() -> ConfigDict:
    """GRPO + ScalingInter-RL on one GPU, the learning result: the published schedule
    (6 -> 13 -> 20 turns) compressed to 15 steps a phase for a ~10-minute budget, with the
    one-GPU recipe (``common.gpu_recipe``: packed rows, flat groups skipped, no entropy bonus or
    KL term, bfloat16 sampler and learner since 2026-12-03, truncated importance sampling, two
    optimiser steps per batch). Evaluation: 128 held-out test tasks x 4 samples, 20 turns,
    before and after. The episodes run in 4 actor worker processes (``rollout.actor_workers``,
    spawned beside the model load; the trajectories are the in-process ones): the rollout's
    host work leaves the engine's process, which shortened the rollout at every horizon
    measured (docs/PERFORMANCE.md, "Actor workers in the headline run"); before 2026-12-07
    the episodes ran in-process (``--config.rollout.actor_workers=0`` runs it so)."""
    c = gpu_recipe(env="babyai", server_args="--max-sessions 1024", phases=(6, 13, 20),
                   steps_per_phase=15, eval_horizon=20, context=3072, max_new_tokens=24)
    c.rollout.actor_workers = 4
    return c


def learnability_gpu() -> ConfigDict:
    """``grpo_gpu`` with ``train.task_sampling = "learnability"`` (training/rl/task_sampler.py):
    a step's tasks come from BabyAI levels drawn in proportion to ``p (1 - p) + eps``, ``p`` a
    level's running success estimate, instead of a uniform permutation of the train split.
    Why: from the base model 70-71% of GRPO groups are flat (all 8 samples alike, no gradient)
    and 14 levels are never solved (docs/RESULTS.md, "Where each family stands against issue
    47's targets"); levels solved sometimes give the groups with a gradient. Its comparison:
    benchmarks/jobs/babyai_learnability_dev.txt."""
    c = grpo_gpu()
    c.train.task_sampling = "learnability"
    return c


def grpo_long_gpu() -> ConfigDict:
    """``grpo_gpu`` to the end of its curve (issue 28): 1,350 s of training instead of 360 s
    (about 25 minutes on one H200 with both evaluations), 40 steps a phase (15 would put most
    of a long run at 20 turns, where a step costs ~3x one at 6), a held-out evaluation every 40
    steps, a checkpoint every 5 steps and at a SIGTERM (``benchmarks/gpu/jobs.sh``'s ``resume``
    jobs: the same command resumes a run cut off within the same budget)::

        bash benchmarks/gpu/jobs.sh --jobs benchmarks/jobs/babyai_long.txt --out runs/long \\
             --results results/long --gpu-ids 0,1,2,3 --budget 575      # three calls
    """
    return long_run(grpo_gpu(), max_seconds=1350.0, eval_every=40, steps_per_phase=40)


def grpo_curve_gpu() -> ConfigDict:
    """``grpo_gpu`` followed to the end of its curve (issue 48 item 2; ``common.curve_run``):
    the phases 6 -> 13 -> 20 turns of 40 steps each (20 from step 80 on), 128 dev tasks x 4
    every 20 steps, stopped by a flat curve after at least 30 minutes of training;
    checkpoints every 5 steps (and at a SIGTERM), so the same command resumes a run a call cut
    off."""
    return curve_run(grpo_gpu())


def gigpo_curve_gpu() -> ConfigDict:
    """``grpo_curve_gpu`` with the GiGPO estimator: the best from-scratch BabyAI recipe at 120
    equal steps (test Avg@4 0.471 against GRPO's 0.448, three seeds; docs/RESULTS.md "GiGPO
    beside GRPO at 120 equal steps") followed to the end of its curve (issue 48 item 2:
    "what the best recipe reaches"; benchmarks/jobs/curves_to_the_end.txt)."""
    return curve_run(gigpo_gpu())


def grpo_scaling_gpu10min() -> ConfigDict:
    """An older one-GPU sizing: 8 steps a phase, ``train.max_seconds`` 330, 64 held-out test
    tasks (k=4, 20 turns) before and after training, bf16 rollout and learner compute. Each
    assistant turn is opened with "Action:" (SmolLM2-135M does not follow a ReAct format at
    temperature 1: 0 of 256 base-model episodes produced an "Action:" line)."""
    c = base_config()
    c.env.names = "babyai"
    c.env.server_args = {"babyai": "--max-sessions 1024"}
    c.horizon.phases = (6, 13, 20)
    c.horizon.steps_per_phase = 8
    c.rollout.engine_dtype = "bfloat16"
    c.rollout.max_batch = 128
    c.rollout.max_concurrency = 128
    c.rollout.max_context = 4096
    c.rollout.max_new_tokens = 24
    c.agent.prompt_style = "action"
    c.agent.response_prefix = "Action:"
    c.rollout.stop = ()  # as measured in docs/RESULTS.md (base_config ends turns at "\n")
    c.train.total_steps = 1000
    c.train.max_seconds = 330.0
    c.train.tasks_per_step = 32
    c.train.samples_per_task = 8
    c.train.save_every = 1000
    c.train.eval_every = 0
    c.train.eval_tasks = 64
    c.train.eval_samples = 4
    c.train.eval_horizon = 20
    c.learner.learning_rate = 1e-5
    c.learner.dtype = "bfloat16"
    c.learner.micro_batch_size = 32
    return c


def gigpo_gpu() -> ConfigDict:
    """``grpo_gpu`` (same budget, seeds, schedule and learner) with GiGPO: anchor states are
    minigrid's hash + what the agent carries; discount 0.95, omega 1, std normalisation."""
    return use_gigpo(grpo_gpu())


def dpo_gpu() -> ConfigDict:
    """DPO on pairs from the same rollouts (algorithms/dpo.py): ``grpo_gpu``'s rollouts, budget
    and evaluation; each task's successful episodes against its failed ones, beta 0.1, through
    the supervised loss (one optimiser step per rollout batch, so each step is exact DPO at the
    sampling parameters)."""
    c = grpo_gpu()
    c.learner.advantage_estimator = "dpo"
    c.learner.advantage_kwargs = ConfigDict({"beta": 0.1})
    c.learner.policy_loss = "sft"
    c.learner.loss_agg_mode = "seq_mean_token_sum"
    c.learner.mini_batches = 1
    c.learner.tis_cap = None
    return c


def sft() -> ConfigDict:
    """Behaviour cloning of minigrid's BabyAIBot shortened with macro actions (every stretch a
    ``go to <object>`` reaches replaced by it; ``--expert babyai`` records the primitive bot),
    CPU-sized; ``grpo_gpu``'s answer format, context and evaluation, so the recorded token
    layout is the one RL trains on. Episodes are recorded with the evaluation horizon (20
    turns) and only successful ones are trained on::

        python launch/record_experts.py --env babyai --episodes 2000 --out runs/experts \\
            --config experiments/babyai.py:sft
        python launch/sft.py --config experiments/babyai.py:sft --workdir runs/babyai_sft
    """
    c = grpo_gpu()
    c.sft = sft_section(record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = 2000  # launch/record_experts.py's default
    c.sft.expert = "babyai_macro"
    sft_learner(c)
    return cpu_sized_sft(c)


def sft_gpu() -> ConfigDict:
    """Behaviour cloning of the macro expert on one GPU (docs/RESULTS.md, "BabyAI: behaviour
    cloning on a macro-action expert"): ``grpo_gpu``'s model, answer format, engine, packed
    learner and evaluation with the ``sft`` loss. Data: ``launch/record_experts.py --env babyai
    --config experiments/babyai.py:sft_gpu``; ``benchmarks/gpu/sft_rl_comparison.sh`` (the
    results table's SFT rows) records the primitive BabyAIBot with ``--expert babyai``."""
    c = bc_gpu(grpo_gpu(), data="runs/issue15/experts", record_episodes=2000, batch_size=32,
               epochs=4, max_seconds=240.0)
    c.sft.expert = "babyai_macro"
    return c


def sft_grpo_gpu() -> ConfigDict:
    """SFT + RL: ``grpo_gpu`` started from the behaviour-cloned policy that ``launch/sft.py
    --config experiments/babyai.py:sft_gpu --workdir runs/issue15/babyai_sft`` exported (another
    one: ``--config.model.name=<sft workdir>/model``). Its step-0 evaluation is the SFT
    policy's; the final one is SFT + RL."""
    c = grpo_gpu()
    c.model.name = "runs/issue15/babyai_sft/model"
    return c


def sft_gigpo_gpu() -> ConfigDict:
    """``sft_grpo_gpu`` with GiGPO: next to the GRPO run from the same SFT policy it gives
    GiGPO - GRPO from SFT (``benchmarks/gpu/sft_rl_comparison.sh``)."""
    return use_gigpo(sft_grpo_gpu())


def choice_gpu() -> ConfigDict:
    """``grpo_gpu`` (same schedule, learner, budget and evaluation) in the lettered-choice
    format with the policy restricted to the option letters (``common.use_choice``): BabyAI's
    observations list its available actions, shown as options ``a) ... b) ...``; the one-token
    reply is one of " a" .. " z" or EOS, so a reply is a valid action whenever its letter is
    within the listed options (docs/RESULTS.md, "Lettered options and a policy restricted to the
    letters, per family, at step 0"; the jobs: benchmarks/jobs/families_choice_scratch.txt)."""
    return use_choice(grpo_gpu(), list_actions=False)


def choice_tiny() -> ConfigDict:
    """The learning-path check on CPU (``tests/test_learning_path.py``; a few minutes on 2
    cores): a tiny random model learns BabyAI-GoToRedBallNoDists by GRPO. An untrained model
    never writes a valid action in free text, so it picks among the valid actions listed as
    lettered options (``rollout.parser = "choice"``): the first letter of its one-token reply
    names the action. At the start the choice is random (about 15% success in 3 turns); RL
    has to learn which letter to give in which state.

    Sampling temperature 0.05 (sampler and learner alike): the random model's logits have a
    standard deviation of ~0.16, so at temperature 1 every reply is one of ~49k near-equally
    likely tokens (15 steps at temperature 1 left the invalid share at ~0.7 and the reward
    flat); at 0.05 their spread is ~3.2 and each state's policy sits on a handful of tokens."""
    c = base_config()
    c.model.random_init = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                               num_kv_heads=2, head_dim=16)
    c.env.names = "babyai"
    c.env.task_filter = {"babyai": r"BabyAI-GoToRedBallNoDists-v0/seed=[0-9]+"}
    c.rollout.parser = "choice"
    c.agent.prompt_style = "choice"
    c.agent.response_prefix = "Action:"
    c.rollout.max_new_tokens = 1  # one token: its first letter is the choice
    c.rollout.temperature = 0.05  # the learner divides by it too (the ratio sees its log-probs)
    c.rollout.max_batch = 16
    c.rollout.max_concurrency = 16
    c.rollout.max_context = 1024  # a 3-turn episode is ~300-600 tokens
    c.rollout.decode_steps = 1
    use_fixed_horizon(c, 3)
    c.train.total_steps = 12
    c.train.tasks_per_step = 4
    c.train.samples_per_task = 4
    c.train.save_every = 1000
    c.train.eval_every = 0
    c.train.eval_before = False
    c.train.eval_after = False
    c.learner.learning_rate = 1e-3
    c.learner.kl_coef = 0.0
    c.learner.entropy_coef = 0.0
    # packed rows: the update's cost is the 49k-way output layer at every position, so padding
    # costs as much as content
    c.learner.pack_length = 1024
    c.learner.micro_batch_size = 4
    return c


def choice_tiny_t1() -> ConfigDict:
    """The learning-path check at sampling temperature 1 (issue 47 item 6): ``choice_tiny``
    with the policy restricted to the option letters (``model.output_tokens``: the 26 labels
    the choice prompt can list, and EOS; every other token's logit is -inf in the sampler and
    the learner alike, ``agentrl_jax/models/output_tokens.py``). The untrained policy picks
    near-uniformly among those 27 tokens; RL moves mass between them (docs/RESULTS.md, "The CPU
    learning check at temperature 1")."""
    c = choice_tiny()
    c.model.output_tokens = CHOICE_LABELS
    c.rollout.temperature = 1.0  # the learner divides by it too
    c.learner.learning_rate = 1e-2
    return c


QWEN25_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584,
                 intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
                 head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 attention_bias=True, max_position_embeddings=32768)


def visible_gpu_count() -> int | None:
    """GPUs the run will use: the entries of ``CUDA_VISIBLE_DEVICES`` (how
    ``benchmarks/gpu/scaling_step.sh`` gives a run its GPUs), ``None`` when it is unset (then
    all of the machine's, a number this config does not know without starting JAX)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return len([d for d in visible.split(",") if d.strip()])


def paper_scale_7b(num_gpus: int | None = None) -> ConfigDict:
    """A paper-scale RL step for sizing runs: a Qwen2.5-7B-shaped policy (random weights), GRPO,
    BabyAI, 32 tasks x 8 samples, a fixed 13-turn horizon. Random weights: actions are rarely
    valid, rewards are 0 and every episode runs 13 turns of up to 24 tokens;
    ``train.skip_flat_groups`` is off so that the update runs (on zero advantages) and is timed,
    with ``benchmarks/speed/rl_step.py --config experiments/babyai.py:paper_scale_7b --variants
    packed`` (``benchmarks/gpu/scaling_step.sh`` runs it) on the GPUs of
    ``CUDA_VISIBLE_DEVICES``: the learner shards over every visible GPU (``learner.mesh``: FSDP)
    and the embedded engine runs a bf16 replica on each of them (``rollout.engine_replicas=0``).
    The policy is created directly in the learner's sharding, so no GPU ever holds the float32
    model. Its memory per GPU, which GPU counts hold it and the measured peaks: docs/MULTIHOST.md,
    "Sizing the paper-scale step" (``python -m agentrl_jax.training.preflight.memory_estimate
    --config experiments/babyai.py:paper_scale_7b`` prints the estimate); step times:
    docs/PERFORMANCE.md.

    ``num_gpus``: the GPUs it is sized for (default :func:`visible_gpu_count`); on one GPU the AdamW
    moments are kept in pinned host memory (``learner.offload_optimizer_state``: by the estimate
    one H200 holds the step only so); with more, or an unknown count, they stay on the GPUs
    (``--config.learner.offload_optimizer_state=True`` turns it on by hand).
    """
    if num_gpus is None:
        num_gpus = visible_gpu_count()
    c = grpo_gpu()
    c.model.random_init = dict(QWEN25_7B)
    c.model.dtype = "bfloat16"
    c.rollout.engine_dtype = "bfloat16"
    c.rollout.max_context = 2048
    c.rollout.max_batch = 256
    c.rollout.max_concurrency = 256
    c.rollout.actor_workers = 0  # the episodes in this process, as its step was sized
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


VARIANTS = {
    "grpo_scaling": grpo_scaling, "grpo_fixed": grpo_fixed, "ppo": ppo,
    "grpo_gpu": grpo_gpu, "learnability_gpu": learnability_gpu, "grpo_long_gpu": grpo_long_gpu,
    "grpo_curve_gpu": grpo_curve_gpu, "gigpo_curve_gpu": gigpo_curve_gpu,
    "grpo_scaling_gpu10min": grpo_scaling_gpu10min, "gigpo_gpu": gigpo_gpu, "dpo_gpu": dpo_gpu,
    "sft": sft, "sft_gpu": sft_gpu, "sft_grpo_gpu": sft_grpo_gpu, "sft_gigpo_gpu": sft_gigpo_gpu,
    "choice_gpu": choice_gpu, "choice_tiny": choice_tiny, "choice_tiny_t1": choice_tiny_t1,
    "paper_scale_7b": paper_scale_7b,
}


def get_config(variant: str | None = None, num_gpus: int | None = None) -> ConfigDict:
    """The config of ``variant`` (default: ``DEFAULT``, ``grpo_gpu``); ``num_gpus`` sizes
    ``paper_scale_7b`` (the only variant that depends on the GPU count)."""
    if num_gpus is not None and (variant or DEFAULT) == "paper_scale_7b":
        return paper_scale_7b(num_gpus)
    return select(VARIANTS, DEFAULT, variant, __file__)
