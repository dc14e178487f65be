"""ScienceWorld + SmolLM2-135M-Instruct: every ScienceWorld experiment, one named variant each.

    python launch/run.py --config experiments/sciworld.py                # grpo_gpu
    python launch/run.py --config experiments/sciworld.py:grpo_scaling  # the paper's schedule

The default is the one-GPU recipe (``grpo_gpu``, ``common.gpu_recipe``); ``grpo_scaling`` is
the paper's schedule (10 -> 20 -> 30 turns, 100 steps a
phase), as for every family; the learning result is SFT then RL (``sft_gpu``, then
``sft_grpo_gpu``; docs/RESULTS.md). Each simulator is a JVM of ~2 GB. Variants
(``experiments/common.py`` holds the shared pieces):

=============== ==============================================================================
grpo_scaling    the paper's schedule, 8 episodes in flight, 4 simulators
ppo             ``grpo_scaling`` with PPO (critic + GAE) instead of GRPO
grpo_gpu        the default: one GPU (``common.gpu_recipe``), 4 servers of 16 JVMs
choice_gpu      ``grpo_gpu`` answering with the letter of a listed valid action, restricted policy
choice_one_h200 ``choice_gpu`` with 24 simulators, for a 16-core one-GPU host
sft_gpu         behaviour cloning of the gold action sequences on one GPU
sft_grpo_gpu    ``grpo_gpu`` started from ``sft_gpu``'s policy
=============== ==============================================================================
"""

from __future__ import annotations

from ml_collections import ConfigDict

from agentrl_jax.training.config.experiment import use_ppo
from experiments.common import bc_gpu, gpu_recipe, paper_scaling, select, use_choice

DEFAULT = "grpo_gpu"


def grpo_scaling() -> ConfigDict:
    """GRPO + ScalingInter-RL (10 -> 20 -> 30 turns, K=100)."""
    c = paper_scaling(env="scienceworld", phases=(10, 20, 30), steps_per_phase=100,
                      eval_horizon=30)
    c.rollout.max_concurrency = 8  # each ScienceWorld simulator is a ~2 GB JVM
    c.env.server_args = {"scienceworld": "--pool-size 4"}
    return c


def ppo() -> ConfigDict:
    """``grpo_scaling`` with PPO (critic + GAE) instead of GRPO."""
    return use_ppo(grpo_scaling())


def grpo_gpu() -> ConfigDict:
    """GRPO + ScalingInter-RL on one GPU (a 360-s training budget): the published
    schedule (10 -> 20 -> 30 turns) compressed to 4 steps a phase, with the one-GPU recipe
    (``common.gpu_recipe``). The reward is the simulator's score gain / 100 (an episode's
    rewards sum to its final score / 100), so partial progress is rewarded; ``success`` is a
    score of 100.

    Simulators: each is a JVM (~2 GB), borrowed per episode from a pool; four server processes
    of 16 JVMs each, and at most 64 episodes in flight (a pool's waiting borrowers are bounded:
    more episodes than simulators would fail); a 64-core machine runs two such jobs side by
    side. Evaluation: 128 of the 1,819 held-out test variations (evenly spaced: 26 of the 30
    task types) x 4 samples, 30 turns (its duration: docs/RESULTS.md)."""
    c = gpu_recipe(env="scienceworld", server_args="--pool-size 16 --max-sessions 1024 "
                   "--max-steps 100", phases=(10, 20, 30), steps_per_phase=4, eval_horizon=30,
                   context=6144, max_new_tokens=32)
    c.env.replicas = 4
    c.rollout.max_concurrency = 64
    c.rollout.max_batch = 64
    c.train.tasks_per_step = 16
    c.train.samples_per_task = 8
    return c


def choice_gpu() -> ConfigDict:
    """``grpo_gpu`` (same schedule, simulators, learner, budget and evaluation) in the
    lettered-choice format with the policy restricted to the option letters
    (``common.use_choice``): the server lists the first 26 of the simulator's valid actions
    after each observation (``agent.list_valid_actions``; in the order of
    ``environments/scienceworld/shortlist.py``: absurd combinations dropped, each command's
    actions on the task's objects and the latest-seen ones first, one ``focus on`` and it last,
    one action of each command before the combinatorial ones repeat), shown as options
    ``a) ... b) ...``, and the one-token reply is one of " a" .. " z" or EOS (docs/RESULTS.md,
    "Lettered options and a policy restricted to the letters, per family, at step 0"). Only
    the listed 26 of the hundreds of valid actions can be chosen."""
    return use_choice(grpo_gpu(), list_actions=True)


def choice_one_h200() -> ConfigDict:
    """``choice_gpu`` on the one-GPU machine the device lends (16 cores, 128 GB): two servers
    of 12 simulators and 24 episodes in flight instead of four of 16 and 64 (64 JVMs need a
    64-core host). The same episodes a step, schedule, learner and evaluation; only the
    rollout's parallelism differs."""
    c = choice_gpu()
    c.env.server_args = {"scienceworld": "--pool-size 12 --max-sessions 1024 --max-steps 100"}
    c.env.replicas = 2
    c.rollout.max_concurrency = 24
    c.rollout.max_batch = 24
    return c


def choice_one_gpu_worlds() -> ConfigDict:
    """``choice_one_h200`` with a simulator for every episode of a step: four servers of 32
    worlds, 8 to a JVM (``environments/scienceworld/shared_jvm.py``: 16 JVMs in all, each
    taking its worlds' calls one at a time), and all 128 episodes in flight. In
    ``choice_one_h200`` a step's 128 episodes go through 24 simulators, each held for a whole
    episode, so they run in about five waves. Four servers, not two: each server is one Python
    process, and on a 2-core CPU more episodes at once did not go faster (docs/PERFORMANCE.md,
    "ScienceWorld: a simulator held for a whole episode"); whether 16 cores and the model's
    latency turn that around is what this config measures. The same episodes a step,
    schedule, learner and evaluation; only the rollout's parallelism differs."""
    c = choice_one_h200()
    c.env.server_args = {"scienceworld": "--pool-size 32 --worlds-per-jvm 8 --workers 48 "
                                         "--max-sessions 1024 --max-steps 100"}
    c.env.replicas = 4
    c.rollout.max_concurrency = 128
    c.rollout.max_batch = 128
    return c


def sft_gpu() -> ConfigDict:
    """Behaviour cloning of ScienceWorld's gold action sequences on one GPU: ``grpo_gpu``'s model,
    answer format, engine, packed learner and evaluation with the ``sft`` loss. Data:
    ``launch/record_experts.py --env scienceworld --config experiments/sciworld.py:sft_gpu``
    (``benchmarks/gpu/sft_rl_families.sh`` records it) with the evaluation horizon (30 turns): a
    gold path longer than that (about half of the train variations) is recorded up to the limit,
    and such an episode, which earned part of the score, is kept as a demonstration
    (``sft.only_success`` keeps episodes with a positive reward)."""
    return bc_gpu(grpo_gpu(), data="runs/families/experts", record_episodes=320, batch_size=16,
                  epochs=8, max_seconds=120.0)


def sft_grpo_gpu() -> ConfigDict:
    """SFT + RL: ``grpo_gpu`` started from the behaviour-cloned policy of ``launch/sft.py
    --config experiments/sciworld.py:sft_gpu --workdir runs/families/sciworld_sft`` (another
    one: ``--config.model.name=<sft workdir>/model``). Its step-0 evaluation is the SFT
    policy's; the final one is SFT + RL."""
    c = grpo_gpu()
    c.model.name = "runs/families/sciworld_sft/model"
    return c


VARIANTS = {"grpo_scaling": grpo_scaling, "ppo": ppo, "grpo_gpu": grpo_gpu,
            "choice_gpu": choice_gpu, "choice_one_h200": choice_one_h200,
            "choice_one_gpu_worlds": choice_one_gpu_worlds, "sft_gpu": sft_gpu,
            "sft_grpo_gpu": sft_grpo_gpu}


def get_config(variant: str | None = None) -> ConfigDict:
    """The config of ``variant`` (default: ``DEFAULT``, ``grpo_gpu``)."""
    return select(VARIANTS, DEFAULT, variant, __file__)
