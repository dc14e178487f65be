"""What the experiment files share: the variant choice and the recipe pieces several families use.

An experiment file is one environment family (``babyai.py``, ``textcraft.py``, ``sciworld.py``,
``webnav.py``, ``deepsearch.py``) or the random-model system checks (``smoke.py``). It defines

* one function per named variant, returning that variant's ``ConfigDict``;
* ``VARIANTS``: name -> that function; ``DEFAULT``: the variant of a plain ``--config FILE``;
* ``get_config(variant=None)``: ``select(VARIANTS, DEFAULT, variant, __file__)``.

``--config experiments/babyai.py:grpo_gpu`` picks a variant (``ml_collections`` passes what
follows the ``:`` to ``get_config``, as in big_vision). A family file imports only this module
and ``agentrl_jax``; a variant built on another of its file's variants calls it.
"""

from __future__ import annotations

import difflib
import os
from typing import Callable

from ml_collections import ConfigDict

from agentrl_jax.agent.parsing import CHOICE_LABELS
from agentrl_jax.training.config.experiment import base_config

Variant = Callable[[], ConfigDict]


class UnknownVariant(ValueError):
    """``get_config`` was given a name that is not one of its file's variants."""


def variant_problem(variants: dict[str, Variant], variant: str, path: str) -> str | None:
    """One line naming the variants when ``variant`` is not one of them, else None."""
    if variant in variants:
        return None
    close = difflib.get_close_matches(variant, list(variants), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (f"{os.path.relpath(path)} has no variant {variant!r}{hint}; its variants: "
            f"{', '.join(variants)}")


def select(variants: dict[str, Variant], default: str, variant: str | None,
           path: str) -> ConfigDict:
    """The config of ``variant`` (``default`` when None or empty); ``UnknownVariant`` naming
    the variants when there is no such one."""
    name = variant or default
    problem = variant_problem(variants, name, path)
    if problem:
        raise UnknownVariant(problem)
    return variants[name]()


def gpu_recipe(*, env: str, server_args: str, phases: tuple[int, ...], steps_per_phase: int,
               eval_horizon: int, context: int, max_new_tokens: int) -> ConfigDict:
    """GRPO + ScalingInter-RL sized for one GPU and a ~10-minute run: the recipe every family's
    ``grpo_gpu`` variant measured (docs/RESULTS.md), for environment ``env`` (its server gets
    ``server_args``), the turn schedule ``phases`` with ``steps_per_phase`` steps a phase,
    held-out evaluation at ``eval_horizon`` turns, ``context`` tokens per episode (engine and
    packed learner rows alike) and ``max_new_tokens`` per turn.

    * packed learner rows (``learner.pack_length``): one compiled shape, no length buckets;
    * flat groups skipped (``train.skip_flat_groups``): all-failure groups have advantage 0;
    * no entropy bonus and no KL term (the bonus raised entropy 0.84 -> 1.35 in 7 steps while
      most advantages were 0; the KL reference pass costs a forward);
    * bfloat16 sampler and learner (engine weights, compute and KV cache; the learner's compute,
      its master weights and AdamW moments float32) since 2026-12-03: on BabyAI they learn as the
      float32 pair does (three seeds, docs/RESULTS.md "A bfloat16 sampler beside the bfloat16
      learner"), in ~half the GPU memory and a shorter step (docs/PERFORMANCE.md). Their
      log-probs differ more (sampler / learner ratios ~0.2-2.7 against 0.97-1.03 in float32);
      the learner's log-probs are the PPO "old" log-probs (packed updates always recompute
      them), with truncated importance sampling of the mismatch (``learner.tis_cap``). Runs
      made before 2026-12-03 ran float32: to re-run one as it ran, add
      ``--config.rollout.engine_dtype=float32 --config.learner.dtype=float32``;
    * two optimiser steps per rollout batch (``learner.mini_batches``), clip-higher 0.28;
    * each assistant turn opened with "Action:" (the 135M model does not follow a ReAct format);
    * a 360-s training budget; evaluation of 128 held-out tasks x 4 before and after training.
    """
    c = base_config()
    c.env.names = env
    c.env.server_args = {env: server_args}
    c.horizon.phases = phases
    c.horizon.steps_per_phase = steps_per_phase
    c.rollout.engine_dtype = "bfloat16"
    c.rollout.max_batch = 256
    c.rollout.max_concurrency = 256
    c.rollout.max_context = context
    c.rollout.max_new_tokens = max_new_tokens
    c.rollout.decode_steps = 8
    c.agent.prompt_style = "action"
    c.agent.response_prefix = "Action:"
    c.train.total_steps = 1000
    c.train.max_seconds = 360.0
    c.train.tasks_per_step = 32
    c.train.samples_per_task = 8
    c.train.skip_flat_groups = True
    c.train.save_every = 1000
    c.train.eval_every = 0
    c.train.eval_tasks = 128
    c.train.eval_samples = 4
    c.train.eval_horizon = eval_horizon
    c.learner.learning_rate = 1e-5
    c.learner.dtype = "bfloat16"
    c.learner.remat = True
    c.learner.pack_length = context
    # flash attention for packed rows that skips the blocks between packed sequences (our
    # Pallas/Triton kernels; JAX's "pallas" computes them and masks them out): the faster update
    # in benchmarks/speed/update_profile.py, docs/PERFORMANCE.md "Learner: compile ahead and
    # segment-skipping attention". Runs compared with those made before 2026-11-28 pin "pallas".
    c.learner.attention_impl = "pallas_segments"
    c.learner.micro_batch_size = 4
    c.learner.logprob_batch_size = 16
    c.learner.mini_batches = 2
    c.learner.entropy_coef = 0.0
    c.learner.kl_coef = 0.0
    c.learner.clip_ratio_high = 0.28
    c.learner.tis_cap = 2.0
    return c


#: the option letters as the tokens that follow the "Action:" prefix: a space, then the letter
#: (" a" .. " z", one token each in SmolLM2's vocabulary)
SPACED_CHOICE_LABELS: tuple[str, ...] = tuple(" " + label for label in CHOICE_LABELS)


def use_choice(c: ConfigDict, *, list_actions: bool,
               output_tokens: str | tuple[str, ...] = SPACED_CHOICE_LABELS) -> ConfigDict:
    """The lettered-choice answer format on a recipe (docs/TRAINING.md, "A policy restricted to
    its action tokens"): the environment's valid actions follow each observation as options
    ``a) ... b) ...`` and the reply is one letter (``rollout.parser = "choice"``), sampled from
    the policy restricted to ``output_tokens`` and EOS (``model.output_tokens``), so every reply
    is a letter and one token is the whole reply. ``list_actions``: ask the environment server
    to list its valid actions (``agent.list_valid_actions``, as many as there are letters) for a
    family whose observations do not list them (ScienceWorld; BabyAI's do). The default tokens
    are the space-prefixed letters, measured against the bare ones in docs/RESULTS.md ("Lettered
    options and a policy restricted to the letters, per family, at step 0"). The options block
    is the only action list a prompt shows (``agent.actions_in_observation`` False: no BabyAI
    "Available actions" line, no server "Valid actions" line), so the actions are not paid for
    twice in every turn's tokens. A turn with n options samples only the first n letters
    (``agent.option_limits``: the engine and the learner restrict that turn's tokens alike), so
    a letter past the last option, a parser failure, cannot be sampled."""
    c.rollout.parser = "choice"
    c.agent.prompt_style = "choice"
    c.agent.response_prefix = "Action:"
    c.agent.list_valid_actions = len(CHOICE_LABELS) if list_actions else 0
    c.agent.actions_in_observation = False
    c.agent.option_limits = True
    c.model.output_tokens = output_tokens
    c.rollout.max_new_tokens = 1
    c.rollout.decode_steps = 1
    return c


def paper_scaling(*, env: str, phases: tuple[int, ...], steps_per_phase: int,
                  eval_horizon: int) -> ConfigDict:
    """GRPO + ScalingInter-RL at the paper's schedule (``phases``, ``steps_per_phase`` steps a
    phase) on ``env`` with the settings' defaults otherwise (training/config/sections.py)."""
    c = base_config()
    c.env.names = env
    c.horizon.phases = phases
    c.horizon.steps_per_phase = steps_per_phase
    c.train.eval_horizon = eval_horizon
    return c


def use_gigpo(c: ConfigDict, gamma: float = 0.95, omega: float = 1.0,
              norm_std: bool = True) -> ConfigDict:
    """``c`` with the GiGPO estimator (docs/ALGORITHMS.md): episode groups plus anchor-state step
    groups (the environment reports its state), per-turn discount ``gamma`` (0.95: the
    paper's), step-group weight ``omega``, std normalisation at both levels."""
    c.learner.advantage_estimator = "gigpo"
    c.learner.gamma = gamma
    c.learner.advantage_kwargs = ConfigDict({"omega": omega, "norm_std": norm_std})
    return c


def long_run(c: ConfigDict, max_seconds: float, eval_every: int,
             steps_per_phase: int) -> ConfigDict:
    """``c`` turned into a resumable long run (issue 28): its budget ``max_seconds``, a held-out
    curve every ``eval_every`` steps, a checkpoint every 5 steps (2 kept), ``steps_per_phase``
    a phase. A SIGTERM checkpoints too, so the same command resumes a run cut off, and
    ``train.max_seconds`` counts the training of every session (docs/TRAINING.md, "Time
    budget")."""
    c.train.max_seconds = max_seconds
    c.train.save_every = 5
    c.train.keep_checkpoints = 2
    c.train.eval_every = eval_every
    c.horizon.steps_per_phase = steps_per_phase
    return c


def curve_run(c: ConfigDict, eval_every: int = 20, steps_per_phase: int = 40) -> ConfigDict:
    """``c`` followed to the end of its held-out curve (issue 48 item 2): ``long_run`` with no
    time budget and up to 1,000 steps, a DEV evaluation (evenly spaced tasks) every
    ``eval_every`` steps, and training stops once three evaluations in a row did not beat the
    best earlier one by more than two standard errors (``train.stop_on_plateau``,
    docs/TRAINING.md "A flat held-out curve"), but not before 30 minutes of training. The
    stopping point is chosen on dev; the final policy is scored on test with
    ``launch/eval.py`` (benchmarks/jobs/curves_to_the_end.txt)."""
    c = long_run(c, max_seconds=0.0, eval_every=eval_every, steps_per_phase=steps_per_phase)
    c.train.total_steps = 1000
    c.train.stop_on_plateau = 3
    c.train.plateau_min_seconds = 1800.0
    c.train.eval_split = "dev"
    c.train.eval_sample = "spaced"
    return c


def sft_section(data: str = "runs/experts", record_horizon: int = 20) -> ConfigDict:
    """The ``sft`` section (its other keys keep their defaults, training/config/sections.py's
    SFTConfig): expert episodes from ``data`` (a directory of <env>.jsonl from
    launch/record_experts.py, or files), recorded with ``record_horizon`` turns."""
    s = base_config().sft
    s.data = data
    s.record_horizon = record_horizon
    return s


def sft_learner(c: ConfigDict, learning_rate: float = 1e-5) -> ConfigDict:
    """The learner of an RL config turned into the SFT learner (same model, mesh, packing)."""
    c.learner.policy_loss = "sft"
    c.learner.learning_rate = learning_rate
    c.learner.lr_schedule = "warmup_constant"
    c.learner.warmup_steps = 10
    c.learner.kl_coef = 0.0
    c.learner.entropy_coef = 0.0
    c.learner.mini_batches = 1
    c.learner.epochs = 1
    c.learner.tis_cap = None
    c.learner.loss_agg_mode = "token_mean"
    return c


def bc_gpu(c: ConfigDict, data: str, record_episodes: int, batch_size: int, epochs: int,
            max_seconds: float) -> ConfigDict:
    """A family's ``grpo_gpu`` config ``c`` turned into behaviour cloning on one GPU: its model,
    answer format, engine, packed learner and evaluation, with the ``sft`` loss (learning rate
    2e-5) on ``record_episodes`` expert episodes under ``data`` recorded with the evaluation
    horizon, ``epochs`` epochs of batches of ``batch_size`` within ``max_seconds``."""
    c.sft = sft_section(data=data, record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = record_episodes  # launch/record_experts.py's default
    c.sft.batch_size = batch_size
    c.sft.epochs = epochs
    c.sft.max_seconds = max_seconds
    return sft_learner(c, learning_rate=2e-5)


def cpu_sized_sft(c: ConfigDict) -> ConfigDict:
    """An SFT config sized for a CPU: unpacked learner rows one at a time, the default engine
    dtype, a float32 learner, 64 episodes in flight in this process (no actor workers), 32
    evaluation tasks (the GPU variants keep the RL config's bfloat16 engine, packed learner and
    workers)."""
    c.learner.attention_impl = None
    c.learner.dtype = "float32"
    c.learner.micro_batch_size = 1
    c.learner.logprob_batch_size = 1
    c.rollout.engine_dtype = ""
    c.rollout.max_batch = 64
    c.rollout.max_concurrency = 64
    c.rollout.actor_workers = 0
    c.train.eval_tasks = 32
    return c
