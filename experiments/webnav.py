"""Web navigation (MiniWoB++) + SmolLM2-135M-Instruct: every web experiment, one named variant each.

    python launch/run.py --config experiments/webnav.py                  # grpo_gpu
    python launch/run.py --config experiments/webnav.py:grpo_scaling  # the paper's schedule

The default is the one-GPU recipe (``grpo_gpu``, ``common.gpu_recipe``); ``grpo_scaling`` is
the paper's schedule (8 -> 12 -> 15 turns, 80 steps a phase),
as for every family; the best result is SFT then RL (``sft_gpu``, then ``sft_grpo_gpu``;
docs/RESULTS.md). Each episode drives its own headless Chromium (~1 GB and a CPU core while it
renders); a machine without Chromium gets it from ``benchmarks/gpu/chromium_portable.sh``
(``unpack``, then ``source benchmarks/gpu/chromium_portable.sh env PREFIX`` before the run).
Variants (``experiments/common.py`` holds the shared pieces):

=================== ===============================================================================
grpo_scaling        the paper's schedule, 8 browsers in flight
ppo                 ``grpo_scaling`` with PPO (critic + GAE) instead of GRPO
grpo_gpu            the default: one GPU, 360 s of training (``common.gpu_recipe``), 24 browsers
sft_gpu             behaviour cloning of the rule-based expert on one GPU
sft_grpo_gpu        ``grpo_gpu`` started from ``sft_gpu``'s policy
choice_gpu          ``grpo_gpu`` answering with a listed action's letter, restricted policy
choice_shuffled_gpu ``choice_gpu`` with each turn's options in a seeded permuted order
=================== ===============================================================================
"""

from __future__ import annotations

from ml_collections import ConfigDict

from agentrl_jax.training.config.experiment import use_ppo
from experiments.common import bc_gpu, gpu_recipe, paper_scaling, select, use_choice

DEFAULT = "grpo_gpu"


def grpo_scaling() -> ConfigDict:
    """GRPO + ScalingInter-RL (8 -> 12 -> 15 turns, K=80)."""
    c = paper_scaling(env="miniwob", phases=(8, 12, 15), steps_per_phase=80, eval_horizon=15)
    c.rollout.max_concurrency = 8  # one headless Chromium per episode
    return c


def ppo() -> ConfigDict:
    """``grpo_scaling`` with PPO (critic + GAE) instead of GRPO."""
    return use_ppo(grpo_scaling())


def grpo_gpu() -> ConfigDict:
    """GRPO + ScalingInter-RL on one GPU with the one-GPU recipe (``common.gpu_recipe``): the
    published schedule (8 -> 12 -> 15 turns) compressed to 8 steps a phase. The machine's CPUs,
    not the GPU, bound the episodes in flight: 24 here for a 16-core, 128 GB host. Evaluation:
    128 held-out test episodes (evenly spaced over the tasks' test seeds) x 4 samples, 15
    turns."""
    c = gpu_recipe(env="miniwob", server_args="--max-sessions 64 --max-steps 15",
                   phases=(8, 12, 15), steps_per_phase=8, eval_horizon=15, context=6144,
                   max_new_tokens=32)
    c.env.timeout = 300.0  # a browser's start can take seconds when many start together
    c.rollout.max_batch = 32
    c.rollout.max_concurrency = 24
    c.train.tasks_per_step = 12
    c.train.samples_per_task = 8
    return c


def sft_gpu() -> ConfigDict:
    """Behaviour cloning of the MiniWoB++ rule-based expert on one GPU: ``grpo_gpu``'s model,
    answer format, engine, packed learner and evaluation with the ``sft`` loss (only successful
    episodes are trained on). The expert episodes are recorded on any machine with Chromium
    (the GPU host may lack it)::

        python launch/record_experts.py --env miniwob --episodes 400 --workers 4 \\
            --config experiments/webnav.py:sft_gpu --out runs/families/experts

    The evaluation needs Chromium where it runs (``benchmarks/gpu/chromium_portable.sh``)."""
    return bc_gpu(grpo_gpu(), data="runs/families/experts", record_episodes=400, batch_size=32,
                  epochs=4, max_seconds=120.0)


def sft_grpo_gpu() -> ConfigDict:
    """SFT + RL: ``grpo_gpu`` started from the behaviour-cloned policy of ``launch/sft.py
    --config experiments/webnav.py:sft_gpu --workdir runs/families/webnav_sft`` (another one:
    ``--config.model.name=<sft workdir>/model``). Its step-0 evaluation is the SFT policy's;
    the final one is SFT + RL."""
    c = grpo_gpu()
    c.model.name = "runs/families/webnav_sft/model"
    return c


def choice_gpu() -> ConfigDict:
    """``grpo_gpu`` (same schedule, browsers, learner, budget and evaluation) in the
    lettered-choice format with the policy restricted to the option letters
    (``common.use_choice``): the server lists the page's admissible actions after each
    observation (``agent.list_valid_actions``; ``environments/miniwob/admissible.py``: typing the
    instruction's quoted texts into fields, choosing options, clicking elements, pressing Enter,
    at most 26), shown as options ``a) ... b) ...``, and the one-token reply is one of " a" ..
    " z" or EOS (docs/RESULTS.md, "Lettered options and a policy restricted to the letters, per
    family, at step 0"; the jobs: benchmarks/jobs/families_choice_scratch.txt)."""
    return use_choice(grpo_gpu(), list_actions=True)


def choice_shuffled_gpu() -> ConfigDict:
    """``choice_gpu`` with each turn's options listed in a permuted order
    (``agent.shuffle_options``, as ``experiments/textcraft.py:choice_shuffled_gpu``). Why: the
    base model favours the first letters (on BabyAI), and the page's first listed element clicks
    the four trivial tasks' one button but fails most others (always the first option, no model:
    0.152 on the non-trivial test tasks, a uniform choice among the options 0.336:
    docs/RESULTS.md, "Chance"); a habit of letter position learned on the ordered list says
    nothing of the options' text. Shuffled, reward comes only from the text. Step 0 on a CPU
    beside ``choice_gpu``: docs/RESULTS.md, "Web navigation with shuffled options, at step 0";
    the jobs: benchmarks/jobs/webnav_choice_dev.txt."""
    c = choice_gpu()
    c.agent.shuffle_options = True
    return c


VARIANTS = {"grpo_scaling": grpo_scaling, "ppo": ppo, "grpo_gpu": grpo_gpu, "sft_gpu": sft_gpu,
            "sft_grpo_gpu": sft_grpo_gpu, "choice_gpu": choice_gpu,
            "choice_shuffled_gpu": choice_shuffled_gpu}


def get_config(variant: str | None = None) -> ConfigDict:
    """The config of ``variant`` (default: ``DEFAULT``, ``grpo_gpu``)."""
    return select(VARIANTS, DEFAULT, variant, __file__)
