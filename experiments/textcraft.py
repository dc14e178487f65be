"""TextCraft + SmolLM2-135M-Instruct: every TextCraft experiment, one named variant each.

    python launch/run.py --config experiments/textcraft.py               # grpo_gpu
    python launch/run.py --config experiments/textcraft.py:grpo_scaling  # the paper's schedule

The default is the one-GPU recipe (``grpo_gpu``, ``common.gpu_recipe``); ``grpo_scaling`` is
the paper's schedule (10 -> 20 -> 30 turns, 100 steps a
phase), as for every family. From the base model, free text gives RL no signal on TextCraft (0/472
successes: every group is flat); the lettered options of ``choice_gpu`` do (test Avg@4 0.378 ->
0.888 in 45 steps, three seeds), though their goal-first order is itself worth 0.739
(docs/RESULTS.md, "TextCraft from the base model, lettered options"), which
``choice_shuffled_gpu`` takes away: shuffled, the same 45 steps go 0.220 -> 0.363, no better
than a uniform choice among the options (0.379). SFT then RL: ``sft_gpu``, then
``sft_grpo_gpu``.
Variants (``experiments/common.py`` holds the shared pieces):

========================== ========================================================================
grpo_scaling               the paper's schedule with the settings' defaults
ppo                        ``grpo_scaling`` with PPO (critic + GAE) instead of GRPO
grpo_gpu                   the default: one GPU, 360 s of training (``common.gpu_recipe``)
gigpo_gpu                  ``grpo_gpu`` with the GiGPO estimator (anchor states: the inventory)
choice_gpu                 ``grpo_gpu`` answering with a listed action's letter, restricted policy
choice_shuffled_gpu        ``choice_gpu`` with each turn's options in a seeded permuted order
choice_shuffled_gigpo_gpu  ``choice_shuffled_gpu`` with the GiGPO estimator
choice_shuffled_window_gpu ``choice_shuffled_gpu`` with an 8-turn history window of stride 4
choice_curve_gpu           ``choice_gpu`` followed until its dev curve is flat (>= 30 min)
choice_shuffled_curve_gpu  ``choice_shuffled_gpu`` followed until its dev curve is flat (>= 30 min)
sft                        behaviour cloning of the recipe expert, CPU-sized
sft_gpu                    behaviour cloning on one GPU
sft_grpo_gpu               ``grpo_gpu`` started from ``sft_gpu``'s policy
sft_gigpo_gpu              ``sft_grpo_gpu`` with the GiGPO estimator
sft_grpo_long_gpu          ``sft_grpo_gpu`` to the end of its curve: 1,200 s of training, resumable
========================== ========================================================================
"""

from __future__ import annotations

from ml_collections import ConfigDict

from agentrl_jax.training.config.experiment import use_ppo
from experiments.common import (bc_gpu, cpu_sized_sft, curve_run, gpu_recipe, long_run,
                                paper_scaling, select, sft_learner, sft_section, use_choice,
                                use_gigpo)

DEFAULT = "grpo_gpu"


def grpo_scaling() -> ConfigDict:
    """GRPO + ScalingInter-RL (10 -> 20 -> 30 turns, K=100)."""
    return paper_scaling(env="textcraft", phases=(10, 20, 30), steps_per_phase=100,
                         eval_horizon=30)


def ppo() -> ConfigDict:
    """``grpo_scaling`` with PPO (critic + GAE) instead of GRPO."""
    return use_ppo(grpo_scaling())


def grpo_gpu() -> ConfigDict:
    """GRPO + ScalingInter-RL on one GPU: the published schedule (10 -> 20 -> 30 turns)
    compressed to 15 steps a phase for a ~10-minute budget, with the one-GPU recipe
    (``common.gpu_recipe``). Evaluation: 128 held-out test tasks x 4 samples, 30 turns."""
    return gpu_recipe(env="textcraft", server_args="--max-sessions 1024", phases=(10, 20, 30),
                      steps_per_phase=15, eval_horizon=30, context=4096, max_new_tokens=32)


def gigpo_gpu() -> ConfigDict:
    """``grpo_gpu`` with the GiGPO estimator (TextCraft reports its state: the inventory)."""
    return use_gigpo(grpo_gpu())


def choice_gpu() -> ConfigDict:
    """``grpo_gpu`` (same schedule, learner, budget and evaluation) in the lettered-choice format
    with the policy restricted to the option letters (``common.use_choice``): the server lists
    the actions that succeed now after each observation (``agent.list_valid_actions``;
    ``environments/textcraft/actions.py``: the crafts the inventory allows, the goal's first,
    then the ``get`` of the commands' base items nearest the goal, then ``inventory``; at most
    26), shown as options ``a) ... b) ...``, and the one-token reply is one of " a" .. " z" or
    EOS (docs/RESULTS.md, "Lettered options and a policy restricted to the letters, per family,
    at step 0"; the jobs: benchmarks/jobs/families_choice_scratch.txt)."""
    return use_choice(grpo_gpu(), list_actions=True)


def choice_shuffled_gpu() -> ConfigDict:
    """``choice_gpu`` with each turn's options listed in a permuted order
    (``agent.shuffle_options``, as ``experiments/deepsearch.py:choice_shuffled_gpu``). Why:
    the server lists the goal's craft first and the ``get`` nearest the goal next, so always
    answering " a" already scores 0.739 on the test goals (no model:
    ``benchmarks/analysis/action_scoring.py --policies first``), against 0.379 for a uniform
    choice; ``choice_gpu``'s 0.888 after 45 steps is partly that order. Shuffled, a letter
    position carries no fixed meaning (a list that comes back comes back in the same order, so
    a repeated letter repeats its action) and reward comes only from the options' text. Test
    118 x 4, 45 steps, three seeds: 0.220 -> 0.363 [0.326, 0.400], 38% of the final episodes
    ending at the 4,096-token context (docs/RESULTS.md, "With the options shuffled each
    turn"). Jobs: benchmarks/jobs/textcraft_choice_shuffled_test.txt."""
    c = choice_gpu()
    c.agent.shuffle_options = True
    return c


def choice_shuffled_gigpo_gpu() -> ConfigDict:
    """``choice_shuffled_gpu`` with the GiGPO estimator (anchor states: the inventory). Why:
    shuffled, the 45-step GRPO runs learned to stop repeating their last letter but not to
    choose by the options' text (docs/RESULTS.md, "With the options shuffled each turn"); an
    episode's one reward comes after ~10-20 choices, and GiGPO's step groups compare the turns
    that met the same inventory, where the shown order is the same too (it is a function of the
    option list), by what followed them. Jobs: benchmarks/jobs/textcraft_shuffled_dev.txt."""
    return use_gigpo(choice_shuffled_gpu())


def choice_shuffled_window_gpu() -> ConfigDict:
    """``choice_shuffled_gpu`` with an 8-turn history window (``agent.history_turns``,
    docs/TRAINING.md "History window": the prompt keeps the goal and its recipes, the first
    user message, and the last 8 turns). Why: 38% of the shuffled runs' final test episodes
    ended at the 4,096-token context, after 20 turns on average (13 at the soonest), while the
    episodes that ran on still found successes in turns 20-30 (``eval_episodes.jsonl.gz`` of
    results/textcraft_shuffled_test: ``num_turns`` and ``status``); with the window every
    episode has its 30 turns, and each turn still lists the actions that succeed now. GRPO,
    since a windowed run trains an episode as several rows that share one advantage (the
    config check refuses GiGPO with a window). The window drops 4 turns at once
    (``agent.history_stride``), so a prompt holds the last 5-8 turns and a new one starts every
    4th turn past the window: dropping one turn a time re-prefilled and trained the kept turns
    at every turn (the first dev run, 2026-12-05, cut at step 43 of 45: docs/RESULTS.md).
    Dev, seed 0: 0.336 against GRPO's 0.379 (-4.3 points [-9.3, +0.7]): the episodes the
    context used to cut now end at the turn limit (docs/RESULTS.md, "The window with a stride
    of 4"). Jobs: benchmarks/jobs/textcraft_shuffled_dev.txt."""
    c = choice_shuffled_gpu()
    c.agent.history_turns = 8
    c.agent.history_stride = 4
    return c


def choice_shuffled_learnability_gpu() -> ConfigDict:
    """``choice_shuffled_gpu`` with goals drawn by learnability (``train.task_sampling``,
    training/rl/task_sampler.py: weight ``p (1 - p) + 0.05``), ``p`` the goal's success share
    at its last visit (``train.learnability_ema = 1``). Why: 61-64% of the GRPO groups of the
    last phase are flat (all 8 episodes alike: no gradient) on the dev runs, and every TextCraft
    goal is its own level, visited ~4 times in 45 steps, so the default rate 0.25 hardly moves a
    goal's weight after a visit. Simulated from the dev runs' final per-goal success
    (``benchmarks/analysis/learnability_sim.py``, results/learnability_sim): flat groups 0.70
    with uniform draws, 0.68 at rate 0.25, 0.50 at rate 1 (0.43 in the last third). Jobs:
    benchmarks/jobs/textcraft_shuffled_dev.txt."""
    c = choice_shuffled_gpu()
    c.train.task_sampling = "learnability"
    c.train.learnability_ema = 1.0
    return c


def choice_curve_gpu() -> ConfigDict:
    """``choice_gpu`` followed to the end of its curve (issue 48 item 2; ``common.curve_run``;
    lettered options, since free text earns TextCraft no reward from the base model:
    docs/RESULTS.md "Where each family stands"): the phases 10 -> 20 -> 30 turns of 40 steps
    each, dev tasks x 4 every 20 steps, stopped by a flat curve after at least 30 minutes of
    training."""
    return curve_run(choice_gpu())


def choice_shuffled_curve_gpu() -> ConfigDict:
    """``choice_shuffled_gpu`` followed to the end of its curve (issue 48 item 2): the recipe
    whose score does not come from the list's order (``choice_curve_gpu``'s ordered options
    saturate near 0.90 within 120 steps, mostly by taking the first option: docs/RESULTS.md
    "TextCraft at 120 equal steps"), and whose training reward was still rising phase by phase
    at 45 steps."""
    return curve_run(choice_shuffled_gpu())


def sft() -> ConfigDict:
    """Behaviour cloning of the TextCraft recipe expert, CPU-sized, with ``grpo_gpu``'s answer
    format, context and evaluation. The train split has 426 goals (one expert episode each; the
    expert solves all but one in 30 turns)::

        python launch/record_experts.py --env textcraft --episodes 426 --out runs/experts \\
            --config experiments/textcraft.py:sft
        python launch/sft.py --config experiments/textcraft.py:sft --workdir runs/textcraft_sft
    """
    c = grpo_gpu()
    c.sft = sft_section(record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = 426  # launch/record_experts.py's default
    c.sft.epochs = 3
    sft_learner(c)
    return cpu_sized_sft(c)


def sft_gpu() -> ConfigDict:
    """Behaviour cloning of the recipe expert on one GPU: ``grpo_gpu``'s
    model, answer format, engine, packed learner and evaluation (all 118 held-out goals x 4)
    with the ``sft`` loss. Data: ``launch/record_experts.py --env textcraft --config
    experiments/textcraft.py:sft_gpu`` (one episode per train goal: 426)."""
    return bc_gpu(grpo_gpu(), data="runs/issue15/experts", record_episodes=426, batch_size=16,
                  epochs=8, max_seconds=240.0)


def sft_grpo_gpu() -> ConfigDict:
    """SFT + RL: ``grpo_gpu`` started from the behaviour-cloned policy of ``launch/sft.py
    --config experiments/textcraft.py:sft_gpu --workdir runs/issue15/textcraft_sft`` (another
    one: ``--config.model.name=<sft workdir>/model``)."""
    c = grpo_gpu()
    c.model.name = "runs/issue15/textcraft_sft/model"
    return c


def sft_gigpo_gpu() -> ConfigDict:
    """``sft_grpo_gpu`` (the behaviour-cloned policy, same budget, seeds, schedule and learner)
    with GiGPO: the GiGPO - GRPO comparison on TextCraft starts from the SFT policy
    (``benchmarks/gpu/sft_rl_comparison.sh``)."""
    return use_gigpo(sft_grpo_gpu())


def sft_grpo_long_gpu() -> ConfigDict:
    """``sft_grpo_gpu`` to the end of its curve (issue 28): 1,200 s of training instead of 110 s,
    a held-out evaluation every 25 steps, 20 steps a phase, a checkpoint every 5 steps and at a
    SIGTERM (the same command resumes a run cut off within the same budget). The SFT policy
    comes from ``launch/sft.py --config experiments/textcraft.py:sft_gpu`` (its 240 s)::

        bash benchmarks/gpu/jobs.sh --jobs benchmarks/jobs/textcraft_long.txt --out runs/long \\
             --results results/long --gpu-ids 0,1 --budget 575         # four calls
    """
    return long_run(sft_grpo_gpu(), max_seconds=1200.0, eval_every=25, steps_per_phase=20)


VARIANTS = {
    "grpo_scaling": grpo_scaling, "ppo": ppo, "grpo_gpu": grpo_gpu, "gigpo_gpu": gigpo_gpu,
    "choice_gpu": choice_gpu, "choice_shuffled_gpu": choice_shuffled_gpu,
    "choice_shuffled_gigpo_gpu": choice_shuffled_gigpo_gpu,
    "choice_shuffled_window_gpu": choice_shuffled_window_gpu,
    "choice_shuffled_learnability_gpu": choice_shuffled_learnability_gpu, "sft": sft,
    "sft_gpu": sft_gpu, "sft_grpo_gpu": sft_grpo_gpu, "sft_gigpo_gpu": sft_gigpo_gpu,
    "sft_grpo_long_gpu": sft_grpo_long_gpu, "choice_curve_gpu": choice_curve_gpu,
    "choice_shuffled_curve_gpu": choice_shuffled_curve_gpu,
}


def get_config(variant: str | None = None) -> ConfigDict:
    """The config of ``variant`` (default: ``DEFAULT``, ``grpo_gpu``)."""
    return select(VARIANTS, DEFAULT, variant, __file__)
