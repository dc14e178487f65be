"""The typed sections of a run's config, each holding the one default of every key.

``RunConfig`` holds ``model``, ``env``, ``rollout``, ``agent``, ``horizon``, ``train``, ``learner``
(``agentrl_jax.learner.config.LearnerConfig``) and ``sft``. Every field is declared with
``agentrl_common.typed_sections.setting``: its default, its type and its range or its known
names; a section checks itself when it is built (one line per bad field), and ``RunConfig``
adds the checks that span sections (``rollout.max_new_tokens < rollout.max_context``, ...).
``training/config/experiment.py`` turns these defaults into the ``ConfigDict`` experiment files start from
(``base_config()``) and a ``ConfigDict`` back into a ``RunConfig`` (``to_run_config``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from agentrl_common.registry import did_you_mean
from agentrl_common.typed_sections import Section, SectionError, is_int, setting
from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.training.config.derived_keys import (DERIVED_KEYS, derived_key_problems,
                                               learner_temperature)
from agentrl_jax.training.config.random_model_checks import random_init_problems
from agentrl_jax.training.config.rollout_section import RolloutConfig, as_list

HORIZON_TYPES = ("scaling_inter", "fixed")
#: ``train.task_sampling``'s choices (their samplers: training/rl/task_sampler.py)
TASK_SAMPLINGS = ("permutation", "learnability")
MODEL_DTYPES = ("float32", "bfloat16")
#: the shortest ``env.timeout`` (seconds per environment request) a run accepts
MIN_ENV_TIMEOUT = 1.0


def _family_names() -> list[str]:
    from environments.registry import family_names

    return family_names()


def _answer_formats() -> list[str]:
    from agentrl_jax.agent.prompts import PROMPT_STYLES

    return PROMPT_STYLES.names()


def _max_listed_actions() -> int:
    from environments.core.base import MAX_LISTED_ACTIONS

    return MAX_LISTED_ACTIONS


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """The policy: a known name, HF directory or .gguf path; or a random model of a shape."""

    PREFIX = "model"
    name: str = setting("smollm2")  # known name, HF directory or .gguf path
    dtype: str = setting("float32", choices=MODEL_DTYPES, kind="dtype")  # rollout / forward
    # non-empty: a random model of this shape (fields of models/config.py's ModelConfig) that
    # uses the tokenizer of ``name`` (smoke tests, memory benchmarks)
    random_init: Mapping[str, Any] = setting(factory=dict)
    pad_id: int = setting(2, ge=0)  # the token id padding a step's batch
    # the policy restricted to these tokens and EOS (a string: one token per character; a list:
    # token strings), each exactly one token of the model's tokenizer: every other token's logit
    # is -inf in the sampler, the learner, evaluation and the engine servers alike
    # (models/output_tokens.py); "" = the whole vocabulary
    output_tokens: str | tuple[str, ...] = setting("")

    def _extra_problems(self, prefix: str, bad: set[str]) -> list[str]:
        out = []
        if "name" not in bad and not self.name.strip():
            out.append(f"{prefix}.name: must be a model name, HF directory or .gguf path (got "
                       f"{self.name!r})")
        if "random_init" not in bad:
            out.extend(random_init_problems(self.random_init, f"{prefix}.random_init"))
        return out


@dataclasses.dataclass(frozen=True)
class EnvConfig(Section):
    """The environment families and their servers."""

    PREFIX = "env"
    names: str | tuple[str, ...] = setting("babyai")  # comma-separated families
    urls: Mapping[str, Any] = setting(factory=dict)  # <name>: "http://host:port,..."; none: start
    server_args: Mapping[str, Any] = setting(factory=dict)  # <name>: extra server flags
    # <name>: a regular expression every task id of that family must fully match (train and test)
    task_filter: Mapping[str, Any] = setting(factory=dict)
    replicas: int = setting(1, ge=1)  # servers started per family
    # seconds per environment request; less than MIN_ENV_TIMEOUT cannot reliably reach even a
    # server on loopback (a Python server answers in milliseconds, more under load)
    timeout: float = setting(120.0, ge=MIN_ENV_TIMEOUT)
    max_restarts: int = setting(3, ge=0)  # a server started here that dies: restarts at most

    @property
    def name_list(self) -> list[str]:
        return as_list(self.names)

    def _extra_problems(self, prefix: str, bad: set[str]) -> list[str]:
        if "names" in bad:
            return []
        names, known = self.name_list, _family_names()
        out = []
        if not names:
            out.append(f"{prefix}.names: lists no environment; known: {', '.join(known)}")
        for name in names:
            if name not in known:
                out.append(f"{prefix}.names: unknown environment family {name!r}; known: "
                           f"{', '.join(known)}{did_you_mean(name, known)}")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            out.append(f"{prefix}.names: lists {', '.join(map(repr, repeated))} more than once "
                       f"(got {','.join(names)!r})")
        if "urls" not in bad:
            for key in self.urls:
                if key not in names:
                    out.append(f"{prefix}.urls.{key}: names no environment of env.names "
                               f"({', '.join(names)})")
        if "task_filter" not in bad:
            for key, pattern in self.task_filter.items():
                where = f"{prefix}.task_filter.{key}"
                if key not in names:
                    out.append(f"{where}: names no environment of env.names ({', '.join(names)})")
                elif not isinstance(pattern, str):
                    out.append(f"{where}: must be a regular expression string (got {pattern!r})")
                else:
                    try:
                        re.compile(pattern)
                    except re.error as error:
                        out.append(f"{where}: is not a regular expression: {error} "
                                   f"(got {pattern!r})")
        return out


@dataclasses.dataclass(frozen=True)
class AgentConfig(Section):
    """The answer format. The default model (SmolLM2-135M-Instruct) cannot follow a ReAct
    format at temperature 1 (docs/RESULTS.md, benchmarks/analysis/action_format.py), so each assistant
    turn is opened with "Action:", the model only completes the action and the turn ends at the
    line break. Larger models: ``config.use_react``."""

    PREFIX = "agent"
    # action (Action only) | react (Thought + Action)
    prompt_style: str = setting("action", choices=_answer_formats, kind="answer format")
    response_prefix: str = setting("Action:")  # text opening every assistant turn
    # > 0: every observation ends with up to this many of the environment's valid actions, in
    # the family's order (the servers' list_actions); 0: off
    list_valid_actions: int = setting(0, check=lambda v: None if is_int(v) and (
        0 <= v <= _max_listed_actions()) else (f"must be an integer in 0.."
                                              f"{_max_listed_actions()} (got {v!r})"))
    # False: the environments write no action list into the observation text (BabyAI's
    # "Available actions: ..." line, the servers' "Valid actions: ..." line for
    # list_valid_actions); the actions reach the agent in info only. For the lettered-choice
    # prompt (rollout.parser = "choice"), whose options block lists them already: with True each
    # turn shows them twice (experiments/common.py: use_choice sets False)
    actions_in_observation: bool = setting(True)
    # > 0: a bounded history window: each prompt holds the system prompt, the first user
    # message (the task) and only the last this many (reply, observation) pairs; a windowed
    # episode trains as several rows (agent/episode.py, docs/TRAINING.md); 0: the whole history
    history_turns: int = setting(0, ge=0)
    # with a history window: how many turns a full window drops at once, the oldest first, so a
    # prompt holds between history_turns - history_stride + 1 and history_turns turns and only
    # every history_stride-th turn starts a new prompt (re-prefilled, one more training row);
    # the turns between extend it (agent/episode.py, docs/TRAINING.md); 1: every turn past the
    # window drops one
    history_stride: int = setting(1, ge=1)
    # True: a turn that lists n options (rollout.parser = "choice") samples only the first n
    # option letters of the restricted policy (model.output_tokens), EOS excluded, and the
    # learner scores the same distribution (models/output_tokens.py, docs/ROLLOUT.md "Per-turn
    # option limits"); False: any letter of model.output_tokens, or EOS
    option_limits: bool = setting(False)
    # True: a lettered-choice turn (rollout.parser = "choice") lists the environment's options
    # in a permuted order, parsing.option_order(options, seed): a function of the option list
    # and of the rollout's base seed (training: seed + step; evaluations: seed), not of the
    # sample, so the samples of a group that see one state see one order and a letter's
    # position carries no fixed meaning (agent/episode.py, docs/TRAINING.md); False: the
    # environment's order
    shuffle_options: bool = setting(False)

    def _extra_problems(self, prefix: str, bad: set[str]) -> list[str]:
        if bad & {"history_turns", "history_stride"} or self.history_stride == 1:
            return []
        if not self.history_turns:
            return [f"{prefix}.history_stride: needs a history window, agent.history_turns > 0 "
                    f"(got history_stride={self.history_stride} with history_turns=0)"]
        if self.history_stride > self.history_turns:
            return [f"{prefix}.history_stride: must be <= agent.history_turns="
                    f"{self.history_turns} (got {self.history_stride})"]
        return []


@dataclasses.dataclass(frozen=True)
class HorizonConfig(Section):
    """The turn limit per step: ``scaling_inter`` (phases of growing horizons) or ``fixed``."""

    PREFIX = "horizon"
    type: str = setting("scaling_inter", choices=HORIZON_TYPES, kind="horizon schedule")
    phases: tuple[int, ...] = setting((6, 13, 20), check=lambda v: None if isinstance(
        v, (tuple, list)) and v and all(is_int(p) and p >= 1 for p in v) else (
        f"must be a non-empty sequence of integers >= 1 (got {v!r})"))
    steps_per_phase: int = setting(100, ge=1)
    turns: int = setting(20, ge=1)  # for type=fixed

    def __post_init__(self) -> None:
        if isinstance(self.phases, list):
            object.__setattr__(self, "phases", tuple(self.phases))
        super().__post_init__()


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """The RL loop: steps, batch, checkpoints, evaluations and when a run stops."""

    PREFIX = "train"
    total_steps: int = setting(300, ge=0)
    tasks_per_step: int = setting(16, ge=1)
    samples_per_task: int = setting(8, ge=1)  # GRPO group size
    save_every: int = setting(25, ge=1)
    # the last N checkpoints are kept (the final one is the last; each holds the parameters
    # and the optimiser state: 1.4 GB for the 135M model)
    keep_checkpoints: int = setting(2, ge=1)
    # the share of training episodes written to trajectories_train.jsonl.gz: whole groups,
    # round(share x groups) of each step's (at least one), chosen by a hash of (step, group id)
    # (training/outputs/trajectory_log.py); evaluations keep every episode, metrics count every one.
    # Why 0.25: it keeps a one-GPU hour's training log under ~1 GB even uncompressed (the
    # measured sizes: docs/TRAINING.md, "How big a run folder gets").
    trajectory_share: float = setting(0.25, ge=0, le=1)
    # gzip the trajectory logs (.jsonl.gz: one gzip member per step, flushed; a killed run
    # leaves a readable prefix); False: plain .jsonl
    compress_trajectories: bool = setting(True)
    eval_every: int = setting(50, ge=0)  # 0: no evaluation during training
    # stop training once this many evaluations in a row (every eval_every steps) did not beat
    # the best earlier one by more than plateau_noise standard errors of Avg@k (0: never;
    # training/rl/plateau.py); the run then checkpoints and evaluates as at its last step
    stop_on_plateau: int = setting(0, ge=0)
    plateau_noise: float = setting(2.0, gt=0)
    # ... and only once the run has trained this long (train_seconds, every session counted)
    plateau_min_seconds: float = setting(0.0, ge=0)
    eval_before: bool = setting(True)
    eval_after: bool = setting(True)
    max_staleness: int = setting(0, ge=0)  # >= 1: next rollout overlaps the update
    # on accelerators, compile the first update's large programs on background threads while
    # the model loads, the engine starts and the first rollout runs (learner/ahead.py); the
    # first update then
    # takes its compile out of train.max_seconds, so runs compared at equal wall time must agree
    compile_ahead: bool = setting(True)
    # drop groups whose samples all scored the same (group advantages are 0 there; see
    # training/rl/batching.py::informative_groups); for group estimators (GRPO / RLOO / Dr.GRPO)
    skip_flat_groups: bool = setting(False)
    # which tasks a step's groups play (training/rl/task_sampler.py): "permutation" (a seeded
    # permutation of each environment's tasks, environments in turn), "learnability" (levels,
    # the task id before its first "/", drawn in proportion to p (1 - p) + learnability_eps,
    # p a level's running success estimate: more groups from levels sometimes solved)
    task_sampling: str = setting("permutation", choices=TASK_SAMPLINGS,
                                 kind="task sampling")
    # learnability: the moving average's rate, p <- (1 - rate) p + rate * the step's success
    # share, once per level and step; why 0.25: a level's prior (1/2) is 10% of its estimate
    # after 8 visits, while a 0.5 level's estimate from groups of 8 keeps a std of ~0.07
    learnability_ema: float = setting(0.25, gt=0, le=1)
    # learnability: the weight every level keeps beside p (1 - p) (at most 0.25), so none starves
    learnability_eps: float = setting(0.05, gt=0)
    max_seconds: float = setting(0.0, ge=0, what=">= 0 (0: no limit)")  # then eval_after
    eval_tasks: int = setting(64, ge=0)
    eval_samples: int = setting(4, ge=1)  # k of Avg@k / Pass@k
    eval_horizon: int = setting(20, ge=1)
    # the split the run's evaluations read: "test" for results, "dev" (a held-out carve of the
    # training distribution, where a family has one) for ablations and recipe choices
    eval_split: str = setting("test", choices=("test", "dev"), kind="evaluation split")
    # which eval_tasks of the split: "stratified" spreads them over its task groups (every
    # BabyAI level, ScienceWorld / MiniWoB task; runtime/task_sample.py), "spaced" takes evenly
    # spaced ids (what runs before 2026-12-02 evaluated: on BabyAI's interleaved split 128 of
    # them are 64 of the 96 levels, 100 are 2)
    eval_sample: str = setting("stratified", choices=("stratified", "spaced"),
                               kind="evaluation task sample")
    # an evaluation is a result only if at least this share of its tasks was scored (a task is
    # scored when one of its episodes finished without an environment / engine error)
    eval_min_scored: float = setting(0.9, ge=0, le=1)
    # stop the run (exit code 3) when more than this share of the episodes of the last
    # env_error_window rollouts ended with env_error (environment servers failing)
    max_env_error_rate: float = setting(0.5, ge=0, le=1)
    env_error_window: int = setting(10, ge=1)
    # stop the run (exit code 3) after this many consecutive steps with nothing to train on
    # (every episode ended with engine_error / env_error, or was too stale); 0: never
    max_failed_steps: int = setting(3, ge=0)


@dataclasses.dataclass(frozen=True)
class SFTConfig(Section):
    """Behaviour cloning on recorded expert episodes (``launch/sft.py``, training/jobs/sft.py)."""

    PREFIX = "sft"
    data: str = setting("runs/experts")  # a directory of <env>.jsonl (record_experts) or files
    only_success: bool = setting(True)
    batch_size: int = setting(32, ge=1)  # episodes per optimiser step
    epochs: int = setting(2, ge=1)
    steps: int = setting(0, ge=0)  # > 0: this many steps instead of epochs
    # seconds of training over every session of the run (a resumed run trains what is left)
    max_seconds: float = setting(0.0, ge=0, what=">= 0 (0: no limit)")
    # True: max_seconds also counts each session's first update, i.e. its compile, whose length
    # depends on the machine's load (docs/TRAINING.md; the SFT runs of 2026-11-28 counted it)
    count_first_update: bool = setting(False)
    save_every: int = setting(0, ge=0)  # 0: a checkpoint at the end only
    keep_checkpoints: int = setting(2, ge=1)
    log_every: int = setting(10, ge=1)
    eval_after: bool = setting(True)  # evaluate the exported policy on the held-out split
    record_horizon: int = setting(20, ge=1)  # launch/record_experts.py's default turn limit
    # launch/record_experts.py's default episode count (one per task, capped by the split)
    record_episodes: int = setting(100, ge=1)
    # launch/record_experts.py's default expert (an expert of the family's registry entry,
    # for the recorded environment, "<env>" or "<env>_<variant>"; "": the environment's own)
    expert: str = setting("")


def _option_limit_problems(rollout: Any, model: Any) -> list[str]:
    """What ``agent.option_limits`` needs: the lettered-choice parser (it lists the options)
    and a policy restricted to the option letters in their order (``model.output_tokens``'s
    entry ``k`` is the label of option ``k``, for every label the options block can show)."""
    from agentrl_jax.agent.parsing import CHOICE_LABELS
    from agentrl_jax.models.output_tokens import token_entries

    out = []
    if rollout is not None and rollout.parser != "choice":
        out.append(f"agent.option_limits: needs rollout.parser='choice' (the parser that lists "
                   f"options; got {rollout.parser!r})")
    if model is not None:
        entries = [e.strip().lower() for e in token_entries(model.output_tokens or "")]
        if entries[:len(CHOICE_LABELS)] != list(CHOICE_LABELS):
            out.append("agent.option_limits: needs model.output_tokens to start with the "
                       f"option labels {CHOICE_LABELS!r} in order (one token each, e.g. "
                       "' a' .. ' z'): option k is sampled as its k-th entry")
    return out


def _history_window_problems(learner: LearnerConfig) -> list[str]:
    """What ``agent.history_turns > 0`` needs of the learner: a windowed episode is trained as
    several rows that share the episode's advantage, which is exact only for an estimator
    whose advantage is one number per episode (its record's ``episode_scalar``), with no
    per-row token rewards, and with a loss that weighs every generated token alike
    (``token_mean``)."""
    out = []
    if not learner.estimator.episode_scalar:
        from agentrl_jax.algorithms import ADVANTAGE_ESTIMATORS

        ok = [n for n in ADVANTAGE_ESTIMATORS.names()
              if ADVANTAGE_ESTIMATORS.get(n).episode_scalar]
        out.append(f"agent.history_turns: a windowed episode trains as several rows sharing one "
                   f"episode advantage; learner.advantage_estimator={learner.advantage_estimator!r}"
                   f" computes per-token or per-turn advantages over the whole episode; use one "
                   f"of {', '.join(ok)} or agent.history_turns=0")
    if learner.kl_in_reward:
        out.append("agent.history_turns: needs learner.kl_in_reward=False (the KL penalty in "
                   "the reward would be summed per row, not per episode)")
    if learner.loss_agg_mode.replace("-", "_") != "token_mean":
        out.append(f"agent.history_turns: needs learner.loss_agg_mode='token_mean' (got "
                   f"{learner.loss_agg_mode!r}: a seq_mean_* mode counts each row as a "
                   f"sequence, and a windowed episode is several rows)")
    return out


SECTIONS: dict[str, type[Section]] = {
    "model": ModelConfig, "env": EnvConfig, "rollout": RolloutConfig, "agent": AgentConfig,
    "horizon": HorizonConfig, "train": TrainConfig, "learner": LearnerConfig, "sft": SFTConfig}


@dataclasses.dataclass(frozen=True)
class RunConfig(Section):
    """A whole run: top-level keys and one typed section each."""

    PREFIX = ""
    seed: int = setting(0)
    progress: bool = setting(False)  # progress bars even when stderr is not a terminal
    progress_seconds: float = setting(30.0, ge=0)  # without a terminal: a line this often
    # JAX's persistent compilation cache (agentrl_jax/compile_cache.py): "auto", "" off, a folder
    compile_cache: str = setting("auto")
    model: ModelConfig = setting(factory=ModelConfig)
    env: EnvConfig = setting(factory=EnvConfig)
    rollout: RolloutConfig = setting(factory=RolloutConfig)
    agent: AgentConfig = setting(factory=AgentConfig)
    horizon: HorizonConfig = setting(factory=HorizonConfig)
    train: TrainConfig = setting(factory=TrainConfig)
    learner: LearnerConfig = setting(factory=LearnerConfig)
    sft: SFTConfig = setting(factory=SFTConfig)

    def __post_init__(self) -> None:
        if isinstance(self.learner, LearnerConfig) and isinstance(self.rollout, RolloutConfig):
            temperature = learner_temperature(self.rollout.temperature)  # DERIVED_KEYS
            object.__setattr__(self, "learner", self.learner.replace(temperature=temperature))
        super().__post_init__()

    def _extra_problems(self, prefix: str, bad: set[str]) -> list[str]:
        return self.cross_problems({name: getattr(self, name) for name in SECTIONS})

    @staticmethod
    def cross_problems(sections: Mapping[str, Any]) -> list[str]:
        """The checks that span sections, over the valid ``sections`` by name (a check whose
        sections are not all there is skipped)."""
        out = []
        r, t, lr, agent = (sections.get(k) for k in ("rollout", "train", "learner", "agent"))
        if agent is not None and lr is not None and agent.history_turns:
            out.extend(_history_window_problems(lr))
        if agent is not None and agent.option_limits:
            out.extend(_option_limit_problems(r, sections.get("model")))
        if agent is not None and agent.shuffle_options and r is not None and (
                r.parser != "choice"):
            out.append(f"agent.shuffle_options: needs rollout.parser='choice' (the parser that "
                       f"lists options; got {r.parser!r})")
        if r is not None and t is not None and r.release_kv_during_update and t.max_staleness:
            out.append("rollout.release_kv_during_update: needs train.max_staleness = 0 (with "
                       f"{t.max_staleness} the next rollout decodes during the update)")
        if t is not None and lr is not None:
            from agentrl_jax.algorithms.advantages import min_group_size

            need = min_group_size(lr.advantage_estimator)
            if t.samples_per_task < need:
                out.append(f"train.samples_per_task: learner.advantage_estimator="
                           f"{lr.advantage_estimator!r} needs at least {need} samples per task "
                           f"(its baseline is the task's group: with {t.samples_per_task} every "
                           f"advantage is 0 and no step trains anything)")
        m = sections.get("model")
        if m is not None and r is not None and m.output_tokens and r.backend == "sglang":
            out.append("model.output_tokens: rollout.backend='sglang' cannot restrict the "
                       "policy (SGLang's constrained decoding masks what it samples but not the "
                       "log-probs it reports, so the sampler and the learner would score "
                       "different distributions); use the embedded or engine_servers backend")
        if r is not None and lr is not None and lr.pack_length and (
                lr.pack_length < r.max_context):
            out.append(f"learner.pack_length: must be 0 (off) or >= rollout.max_context="
                       f"{r.max_context} (a packed row holds a whole trajectory; got "
                       f"{lr.pack_length})")
        return out

    @classmethod
    def build_sections(cls, values: Mapping[str, Any] | None
                       ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """(the top-level values, the sections that are valid by name, one line per problem:
        top-level values first, as a config file lists them, then section by section)."""
        values = dict(values or {})
        problems = cls.unknown_key_problems(values, "")
        built: dict[str, Any] = {}
        top = {k: v for k, v in values.items() if k not in SECTIONS and k in cls.field_names()}
        for key, section_type in SECTIONS.items():
            given = values.get(key)
            if given is None:
                continue
            if hasattr(given, "to_dict"):
                given = given.to_dict()
            if isinstance(given, Section):
                built[key] = given
                continue
            if not isinstance(given, Mapping):
                problems.append(f"{key}: must be a section (got {given!r})")
                continue
            problems.extend(derived_key_problems(key, given))  # refused with a hint
            given = {k: v for k, v in given.items() if (key, k) not in DERIVED_KEYS}
            section, section_problems = section_type.from_mapping(given)
            problems.extend(section_problems)
            if section is not None:
                built[key] = section
        try:
            cls(**top)
        except SectionError as error:
            problems = error.problems + problems
        return top, built, problems

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> tuple[Any, list[str]]:
        """(the ``RunConfig`` of ``values``, []) or (None, one line per problem, section by
        section): unknown keys (with the closest name), bad types and values."""
        top, built, problems = cls.build_sections(values)
        if problems:  # with the checks spanning the sections that are valid
            defaults = {k: v for k, v in cls().__dict__.items() if k in SECTIONS
                        and k not in dict(values or {})}
            return None, problems + cls.cross_problems({**defaults, **built})
        try:
            return cls(**top, **built), []
        except SectionError as error:  # the checks spanning sections
            return None, error.problems
