"""Deep search (BM25 over the offline Wikipedia summaries) + SmolLM2-135M-Instruct: every
deep-search experiment, one named variant each.

    python launch/run.py --config experiments/deepsearch.py              # grpo_gpu
    python launch/run.py --config experiments/deepsearch.py:grpo_scaling  # the paper's schedule

The default is the one-GPU recipe (``grpo_gpu``, ``common.gpu_recipe``); ``grpo_scaling`` is
the paper's schedule (5 -> 8 -> 10 turns, 100 steps a phase),
as for every family; the learning result is SFT then RL (``sft_gpu``, then ``sft_grpo_gpu``;
docs/RESULTS.md). A turn is ``Action: <search> query </search>`` or ``Action: <answer> text
</answer>`` (one line; the environment reads the first tag). Variants
(``experiments/common.py`` holds the shared pieces):

========================== ========================================================================
grpo_scaling               the paper's schedule, 64 new tokens a turn
ppo                        ``grpo_scaling`` with PPO (critic + GAE) instead of GRPO
grpo_gpu                   the default: one GPU, 360 s of training (``common.gpu_recipe``)
choice_gpu                 ``grpo_gpu`` answering with the letter of a listed admissible action,
                           restricted policy, the whole history in a 6,144-token context
choice_shuffled_gpu        ``choice_gpu`` with each turn's options in a seeded permuted order
choice_evidence_gpu        ``choice_shuffled_gpu`` with a training-only evidence reward of 0.3
choice_answer_evidence_gpu ``choice_evidence_gpu`` with the reward for the answer's article only
sft_gpu                    behaviour cloning of the retrieval oracle on one GPU
sft_grpo_gpu               ``grpo_gpu`` started from ``sft_gpu``'s policy
========================== ========================================================================
"""

from __future__ import annotations

from ml_collections import ConfigDict

from agentrl_jax.training.config.experiment import use_ppo
from experiments.common import bc_gpu, gpu_recipe, paper_scaling, select, use_choice

DEFAULT = "grpo_gpu"


def grpo_scaling() -> ConfigDict:
    """GRPO + ScalingInter-RL (5 -> 8 -> 10 turns, K=100), evaluated at 30 turns."""
    c = paper_scaling(env="deepsearch", phases=(5, 8, 10), steps_per_phase=100, eval_horizon=30)
    c.rollout.max_new_tokens = 64  # "<search> query </search>" / "<answer> ... </answer>"
    return c


def ppo() -> ConfigDict:
    """``grpo_scaling`` with PPO (critic + GAE) instead of GRPO."""
    return use_ppo(grpo_scaling())


def grpo_gpu() -> ConfigDict:
    """GRPO + ScalingInter-RL on one GPU with the one-GPU recipe (``common.gpu_recipe``): the
    published schedule (5 -> 8 -> 10 turns) compressed to 10 steps a phase. Three passages per
    search (median 73 words each), so 10 turns fit 4096 tokens; 128 engine slots and episodes
    in flight (what the measured runs used). Evaluation: 128 of the 298 held-out questions x 4
    samples, 10 turns."""
    c = gpu_recipe(env="deepsearch", server_args="--max-sessions 1024 --max-steps 30",
                   phases=(5, 8, 10), steps_per_phase=10, eval_horizon=10, context=4096,
                   max_new_tokens=64)
    c.rollout.max_batch = 128
    c.rollout.max_concurrency = 128
    return c


def choice_gpu() -> ConfigDict:
    """``grpo_gpu`` (same schedule, learner, budget and evaluation) in the lettered-choice format
    with the policy restricted to the option letters (``common.use_choice``): the server lists
    the admissible searches and answers (``environments/deepsearch/admissible.py``: the
    question's key phrase, the names and years of the returned passages) as options and the
    reply is one letter (docs/RESULTS.md, "Lettered options and a policy restricted to the
    letters, per family, at step 0"; the jobs: benchmarks/jobs/families_choice_scratch.txt).

    With the whole history in a 6,144-token context (``rollout.max_context`` and the packed
    learner rows, ``learner.pack_length``; ``grpo_gpu`` has 4,096): each turn adds ~490 tokens
    (three passages and the ~160-token options block), so at 4,096 tokens 13 of 16 step-0
    episodes of 10 turns ended at the context at turns 7-9, and at 6,144 none did (at most 5,918
    tokens after 10 turns; CPU, results/choice_step0_cpu/deepsearch_train_10turns_option_limits
    .json and _ctx6144.json). A 4-turn history window ended none either (_window4.json) and
    drops nothing the choice needs (results/deepsearch_options/oracle_needs.json), but it
    re-prefills each windowed prompt and trains one row per turn past the fourth, ~3x the
    learner tokens of the whole history here; the wider context costs 1.5x the KV cache (128
    slots x 6,144 float32 tokens, ~36 GB) instead."""
    c = use_choice(grpo_gpu(), list_actions=True)
    c.rollout.max_context = 6144
    c.learner.pack_length = 6144
    return c


def choice_shuffled_gpu() -> ConfigDict:
    """``choice_gpu`` with each turn's options listed in a permuted order
    (``agent.shuffle_options``: ``parsing.option_order`` of the option list and the rollout's
    base seed; one order per list within a step, so a group's samples still see identical
    states the same way). Why: ``choice_gpu`` from the base model learned habits of letter
    position, not choices by content (seed 0 searched option c then c, seed 1 b then j), since
    the admissible options come in a fixed structure, ``a)`` being the question's key phrase
    (docs/RESULTS.md, "Deep search from the base model, lettered choices";
    results/choice_scratch/deepsearch_diagnosis.json). With the order shuffled a position
    habit earns nothing on average, so reward can only come from the options' text. Jobs:
    benchmarks/jobs/deepsearch_shuffled_dev.txt (against results/choice_scratch/
    deepsearch_choicer_dev*). Measured (3 seeds, 45 steps): no learning, dev Avg@4 gain -0.2
    points [-1.6, +1.3] (docs/RESULTS.md, "Deep search from the base model, shuffled lettered
    options"; results/deepsearch_shuffled_dev/)."""
    c = choice_gpu()
    c.agent.shuffle_options = True
    return c


def choice_evidence_gpu() -> ConfigDict:
    """``choice_shuffled_gpu`` with the environment's evidence reward 0.3 (server flag
    ``--evidence-reward 0.3``, ``environments/deepsearch/env.py``): a search that first returns
    an article of the question's ``QAItem.path`` earns ``0.3 / len(path)`` for it (0.3 for a
    paraphrased fact's one article, 0.15 for each of a two-hop question's two), at most 0.3 an
    episode. Why: from the base model 92-95% of GRPO groups were flat (every sample scored 0)
    and the golden article was listed in only 7-21% of episodes (docs/RESULTS.md, "Deep search
    from the base model, shuffled lettered options"), so exact match alone gave almost no
    gradient; reaching the evidence is the step before the answer and fires far more often.

    Why 0.3: a wrong answer after reaching all the evidence (return 0.3) must stay worth less
    than any correct answer (return >= 1.0, 1.3 with the evidence), so within a group the
    correct sample still has the highest return and the bonus only ranks samples that would
    otherwise tie; a sample that reaches the evidence and answers correctly (1.3) beats one that
    only searches (0.3) by the whole task reward. The bonus is training-only: the evaluation
    runs on the same servers, but Avg@k / Pass@k score the task reward (the episode's reward
    less its ``shaping``, ``eval_metrics.task_reward``), never the shaped return. Jobs:
    benchmarks/jobs/deepsearch_evidence_dev.txt (against results/deepsearch_shuffled_dev, the
    same recipe without the bonus)."""
    c = choice_shuffled_gpu()
    c.env.server_args = {"deepsearch": "--max-sessions 1024 --max-steps 30 --evidence-reward 0.3"}
    return c


def choice_answer_evidence_gpu() -> ConfigDict:
    """``choice_evidence_gpu`` with the server flag ``--evidence-articles answer``: the whole
    0.3 goes to the search that first returns the path's last article, the one that names the
    answer (a paraphrased fact's one article, as before; a two-hop question's second, where the
    first hop earns nothing). Why: with every path article rewarded, the runs learned to reach
    the first article and then answer (turn 3.2-3.6 on average), with the golden answer listed
    at the answer turn in 13-17% of episodes (docs/RESULTS.md, "Deep search from the base model
    with an evidence reward"): the second hop earned what the first did, and nothing favoured
    the next search over answering. Training-only as before (Avg@k / Pass@k score the exact
    match). Jobs: benchmarks/jobs/deepsearch_answer_evidence_dev.txt."""
    c = choice_evidence_gpu()
    c.env.server_args = {"deepsearch": c.env.server_args["deepsearch"]
                         + " --evidence-articles answer"}
    return c


def sft_gpu() -> ConfigDict:
    """Behaviour cloning of the retrieval oracle on one GPU: ``grpo_gpu``'s model, answer
    format, engine, packed learner and evaluation with the ``sft`` loss. Data:
    ``launch/record_experts.py --env deepsearch --config experiments/deepsearch.py:sft_gpu``
    (``benchmarks/gpu/sft_rl_families.sh`` records it: the oracle searches with the question and
    answers with the golden title found in a passage; only successful episodes are trained
    on)."""
    return bc_gpu(grpo_gpu(), data="runs/families/experts", record_episodes=1000, batch_size=32,
                  epochs=4, max_seconds=120.0)


def sft_grpo_gpu() -> ConfigDict:
    """SFT + RL: ``grpo_gpu`` started from the behaviour-cloned policy of ``launch/sft.py
    --config experiments/deepsearch.py:sft_gpu --workdir runs/families/deepsearch_sft``
    (another one: ``--config.model.name=<sft workdir>/model``). Its step-0 evaluation is the
    SFT policy's; the final one is SFT + RL."""
    c = grpo_gpu()
    c.model.name = "runs/families/deepsearch_sft/model"
    return c


VARIANTS = {"grpo_scaling": grpo_scaling, "ppo": ppo, "grpo_gpu": grpo_gpu,
            "choice_gpu": choice_gpu, "choice_shuffled_gpu": choice_shuffled_gpu,
            "choice_evidence_gpu": choice_evidence_gpu,
            "choice_answer_evidence_gpu": choice_answer_evidence_gpu,
            "sft_gpu": sft_gpu, "sft_grpo_gpu": sft_grpo_gpu}


def get_config(variant: str | None = None) -> ConfigDict:
    """The config of ``variant`` (default: ``DEFAULT``, ``grpo_gpu``)."""
    return select(VARIANTS, DEFAULT, variant, __file__)
