"""Learner hyper-parameters: one typed section (``agentrl_common.typed_sections``), convertible
to / from a plain dict.

Every field carries its default and its check; constructing a ``LearnerConfig`` with bad values
raises ``SectionError`` with one line per bad field (``"learner.learning_rate: must be a finite
number > 0 (got -1.0)"``). ``LearnerConfig.from_dict(d)`` accepts any mapping (a plain dict, a
YAML section, an ``ml_collections.ConfigDict`` via ``.to_dict()``); unknown keys raise so typos do
not pass silently. ``to_dict()`` gives JSON/YAML-serialisable values (tuples become lists).
Names (estimators, losses, KL estimators, loss aggregations) are checked against
``agentrl_jax.algorithms``, read when a config is checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from agentrl_common.typed_sections import Section, is_int, is_number, setting

SCHEDULES = ("constant", "warmup_constant", "warmup_cosine")
RATIO_SOURCES = ("rollout", "recompute")
DTYPES = ("float32", "bfloat16")
MESH_AXES = ("data", "fsdp", "tensor")
#: the default device mesh: all devices on the fsdp axis; an axis a given mesh does not name
#: takes its size from here
DEFAULT_MESH = {"data": 1, "fsdp": -1, "tensor": 1}


def _algorithms():
    import agentrl_jax.algorithms as algorithms

    return algorithms


def _normalize(name: str) -> str:
    from agentrl_common.registry import snake_case

    return snake_case(name)


def _names(attr: str):
    return lambda: _algorithms().__dict__[attr]


def _policy_losses():
    from agentrl_jax.algorithms.losses import POLICY_LOSSES

    return POLICY_LOSSES


#: ``learner.attention_impl``'s command-line spelling of None (the backend's choice)
AUTO_ATTENTION = "auto"


def model_attention_impl(value: str | None) -> str | None:
    """``learner.attention_impl`` as ``ModelConfig.attention_impl`` takes it (``"auto"`` -> None)."""
    return None if value == AUTO_ATTENTION else value


def _attention_impl_problem(value: Any) -> str | None:
    from agentrl_jax.models.config import ATTENTION_IMPLS

    if value is None or value == AUTO_ATTENTION or value in ATTENTION_IMPLS:
        return None
    names = ", ".join(n for n in ATTENTION_IMPLS if n)
    return (f"unknown attention implementation {value!r}; known: {names}, or "
            f"{AUTO_ATTENTION!r} (None in a config file: chosen by backend)")


@dataclasses.dataclass(frozen=True)
class LearnerConfig(Section):
    """The ``learner`` section: optimiser, batching, RL loss, critic and compute settings."""

    PREFIX = "learner"
    # ------------------------------------------------------------------ optimiser
    learning_rate: float = setting(1e-6, gt=0)
    lr_schedule: str = setting("constant", choices=SCHEDULES, kind="learning-rate schedule")
    warmup_steps: int = setting(0, ge=0)
    decay_steps: int = setting(1000, ge=0)  # cosine: optimizer steps from warm-up end to min_lr
    min_lr_ratio: float = setting(0.0, ge=0)  # cosine floor as a fraction of learning_rate
    weight_decay: float = setting(0.0, ge=0)
    adam_b1: float = setting(0.9, ge=0, le=1)
    adam_b2: float = setting(0.999, ge=0, le=1)
    adam_eps: float = setting(1e-8, gt=0)
    grad_clip: float | None = setting(1.0, ge=0, what=">= 0 (0: off)")  # global norm; None/0 off
    # True: keep the optimiser state (AdamW mu / nu, step count) in pinned host memory and move
    # it to the device one parameter leaf per jitted call of the update (offload.py); frees 8
    # bytes / parameter of device memory at the cost of 16 bytes / parameter of host <-> device
    # traffic per optimiser step. Needs a backend with the "pinned_host" memory kind.
    offload_optimizer_state: bool = setting(False)
    # ------------------------------------------------------------------ batching
    micro_batch_size: int = setting(8, ge=1)  # sequences per forward/backward (global)
    mini_batches: int = setting(1, ge=1)  # optimizer steps per epoch over one rollout batch
    epochs: int = setting(1, ge=1)  # passes over one rollout batch
    shuffle: bool = setting(True)  # reshuffle rows before splitting into mini-batches
    length_buckets: tuple[int, ...] = setting(())  # () = powers of two >= min_length_bucket
    min_length_bucket: int = setting(128, ge=1)
    logprob_batch_size: int | None = setting(None, ge=1)  # rows per logprob call (None: micro)
    logprob_chunk_size: int = setting(512, ge=1)  # positions per logits->logprobs chunk
    # > 0: pack trajectories end to end into rows of this many tokens (packed_update.py): one
    # compiled shape per run, little padding; micro_batch_size / logprob_batch_size then count
    # packed rows. Must be >= the longest trajectory (the rollout's max_context).
    pack_length: int = setting(0, ge=0)
    # the update's LM head (log-prob pass and train step) only at the scored tokens (loss mask
    # != 0), gathered into [rows, capacity] (learner/scored.py; exact: the same log-probs where
    # the loss reads them); False: at every position. The per-row capacity is a power of two
    # >= scored_capacity_min, grown to the largest row count seen (never shrinks); an RL run
    # first reserves its longest trajectory's (horizon x max_new_tokens), and packed rows keep
    # within it where that costs no extra rows (layouts.PackedRows.pack_plan)
    scored_lm_head: bool = setting(True)
    scored_capacity_min: int = setting(64, ge=1)
    # ------------------------------------------------------------------ RL loss
    # the policy loss (algorithms.POLICY_LOSSES): "ppo_dual_clip" (clipped surrogate, clip 0.2,
    # dual clip 3), "ppo" (no dual clip), "clip_higher" (clip 0.2 / 0.28, no dual clip), or "sft"
    # (supervised: weighted NLL of the masked tokens, no ratio, no old log-prob pass; behaviour
    # cloning, training/jobs/sft.py). Each entry carries its clip numbers; clip_ratio_* and
    # dual_clip below override them only when set.
    policy_loss: str = setting("ppo_dual_clip", choices=lambda: sorted(_policy_losses()),
                               kind="policy loss")
    advantage_estimator: str = setting("grpo", choices=_names("ADVANTAGE_ESTIMATORS"),
                                       normalize=_normalize, kind="advantage estimator")
    advantage_kwargs: Mapping[str, Any] = setting(factory=dict)
    gamma: float = setting(1.0, ge=0, le=1)
    lam: float = setting(1.0, ge=0, le=1)
    loss_agg_mode: str = setting("token_mean", choices=_names("LOSS_AGGREGATIONS"),
                                 normalize=_normalize, kind="loss aggregation mode")
    loss_max_len: int | None = setting(None, ge=1)  # seq_mean_token_sum_norm constant
    # the policy loss entry's clip numbers, overridden where set (None: the entry's own)
    # the ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]: low in (0, 1) (>= 1
    # leaves no lower bound, a ratio is > 0; 0 stops every token with A < 0 whose ratio fell
    # below 1), high > 0; None: the policy loss entry's numbers
    clip_ratio_low: float | None = setting(None, check=lambda v: None if v is None or (
        is_number(v) and 0 < v < 1) else f"must be a number in (0, 1), or None (got {v!r})")
    clip_ratio_high: float | None = setting(None, gt=0)  # clip-higher (DAPO): e.g. 0.28
    dual_clip: float | None = setting(None, gt=1)  # dual-clip constant c > 1 for A < 0
    ratio_source: str = setting("rollout", choices=RATIO_SOURCES, kind="ratio source")
    # truncated importance sampling of the sampler / learner mismatch (packed updates): each
    # token's policy loss is weighted by min(exp(learner_old - rollout), tis_cap); None = off
    tis_cap: float | None = setting(None, gt=0)
    # the sampler's temperature; logits are divided by it. In a run it is rollout.temperature
    # (training/config/sections.py::DERIVED_KEYS): a run's config does not set it here
    temperature: float = setting(1.0, gt=0)
    # the paper's GRPO settings (AgentGym-RL): a small KL loss to a frozen reference and a small
    # entropy bonus; 0 turns each term off (kl_coef 0: no reference model)
    kl_coef: float = setting(0.001, ge=0)
    kl_estimator: str = setting("k3", choices=_names("KL_ESTIMATORS"), normalize=_normalize,
                                kind="KL estimator")  # k1 | k2 | k3 (low_var_kl)
    kl_in_reward: bool = setting(False)  # True: -kl_coef*KL on token rewards; False: KL loss
    entropy_coef: float = setting(0.001, ge=0)
    entropy_metric: bool = setting(True)  # the entropy in the train step even when coef = 0
    # ------------------------------------------------------------------ critic
    critic: bool | None = setting(None)  # None: on iff advantage_estimator needs values (gae)
    critic_learning_rate: float = setting(1e-5, gt=0)
    critic_warmup_steps: int = setting(0, ge=0)  # rollout updates training only the critic
    value_coef: float = setting(1.0, ge=0)
    value_clip: float | None = setting(0.5, gt=0)  # PPO value clip around old values; None off
    # ------------------------------------------------------------------ compute
    # the forward / backward compute dtype (params stay float32); GPU recipes set bfloat16
    dtype: str = setting("float32", choices=DTYPES, kind="dtype")
    remat: bool = setting(True)
    remat_policy: str | None = setting(None)  # a jax.checkpoint_policies name
    # models.config.ATTENTION_IMPLS; None: by backend, spelled "auto" on a command line (an
    # override of a config file's string stays a string: "None" would be a name)
    attention_impl: str | None = setting(None, check=_attention_impl_problem)
    reference_dtype: str = setting("float32", choices=DTYPES, kind="dtype")
    use_attention_mask: bool = setting(False)  # False: right-padded rows, causal mask only
    mesh: Mapping[str, int] = setting(factory=lambda: dict(DEFAULT_MESH))
    seed: int = setting(0)

    def __post_init__(self) -> None:
        if isinstance(self.length_buckets, (list, tuple)) and all(
                is_int(b) for b in self.length_buckets):
            object.__setattr__(self, "length_buckets", tuple(sorted(self.length_buckets)))
        for name in ("mesh", "advantage_kwargs"):
            value = getattr(self, name)
            if hasattr(value, "to_dict"):
                value = value.to_dict()
            if isinstance(value, Mapping):
                value = {**DEFAULT_MESH, **value} if name == "mesh" else dict(value)
                object.__setattr__(self, name, value)
        super().__post_init__()

    def _extra_problems(self, prefix: str, bad: set[str]) -> list[str]:
        out = []
        if "length_buckets" not in bad and not all(b >= 1 for b in self.length_buckets):
            out.append(f"{prefix}.length_buckets: lengths must be >= 1 (got "
                       f"{self.length_buckets})")
        if not bad & {"advantage_estimator", "policy_loss", "loss_agg_mode"}:
            out += self._estimator_needs(prefix)
        if "mesh" in bad:
            return out
        dims = self.mesh
        unknown = sorted(set(dims) - set(MESH_AXES))
        if unknown:
            out.append(f"{prefix}.mesh: unknown axes {unknown}; known: {', '.join(MESH_AXES)}")
        if not all(is_int(v) and (v >= 1 or v == -1) for v in dims.values()):
            out.append(f"{prefix}.mesh: sizes must be integers >= 1 or -1 (got {dims})")
        elif sum(v == -1 for v in dims.values()) > 1:
            out.append(f"{prefix}.mesh: at most one axis may be -1 (got {dims})")
        elif "micro_batch_size" not in bad and all(v >= 1 for v in dims.values()):
            shards = dims["data"] * dims["fsdp"]
            if self.micro_batch_size % shards:
                out.append(f"{prefix}.micro_batch_size: must be a multiple of the mesh's data x "
                           f"fsdp size {shards} (got {self.micro_batch_size})")
        return out

    def _estimator_needs(self, prefix: str) -> list[str]:
        """What the advantage estimator's record needs of the loss (``dpo``: a supervised
        policy loss aggregated by ``seq_mean_token_sum``), checked."""
        estimator = self.estimator
        need = []
        if estimator.supervised_loss and not _policy_losses().get(self.policy_loss).supervised:
            supervised = [n for n in _policy_losses().names()
                          if _policy_losses().get(n).supervised]
            need.append(f"a supervised policy_loss ({', '.join(supervised)})")
        if estimator.loss_agg_mode and _normalize(self.loss_agg_mode) != estimator.loss_agg_mode:
            need.append(f"loss_agg_mode={estimator.loss_agg_mode!r}")
        if not need:
            return []
        return [f"{prefix}.advantage_estimator: {self.advantage_estimator!r} needs "
                f"{' and '.join(need)} (algorithms.ADVANTAGE_ESTIMATORS)"]

    # ------------------------------------------------------------------ derived
    @property
    def estimator(self) -> Any:
        """The ``AdvantageEstimator`` record of ``advantage_estimator``."""
        return _algorithms().get_advantage_estimator(self.advantage_estimator)

    def policy_loss_options(self) -> dict[str, Any]:
        """The options the train step passes to ``policy_loss``: its entry's defaults
        (``POLICY_LOSSES``), each replaced by the matching setting where that is set."""
        return _policy_losses().get(self.policy_loss).options(
            clip_low=self.clip_ratio_low, clip_high=self.clip_ratio_high,
            dual_clip=self.dual_clip)

    @property
    def use_critic(self) -> bool:
        if self.critic is not None:
            return bool(self.critic)
        return self.estimator.needs_critic

    @property
    def use_reference(self) -> bool:
        """A frozen reference model: for the KL term, or for a preference estimator (dpo)."""
        return self.kl_coef > 0 or self.estimator.needs_reference

    # ------------------------------------------------------------------ dict I/O
    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None = None, **overrides: Any) -> "LearnerConfig":
        values = dict(d or {})
        values.update(overrides)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"LearnerConfig: unknown keys {unknown}")
        if "length_buckets" in values and values["length_buckets"] is not None:
            values["length_buckets"] = tuple(values["length_buckets"])
        elif "length_buckets" in values:
            values["length_buckets"] = ()
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["length_buckets"] = list(self.length_buckets)
        return out


def bucket_length(length: int, config: LearnerConfig) -> int:
    """The smallest bucket >= ``length``: a listed bucket, else a power of two >= the minimum.

    Lengths above the largest listed bucket fall back to the next power of two (one more
    compiled shape rather than an error).
    """
    for b in config.length_buckets:
        if b >= length:
            return b
    b = config.min_length_bucket
    while b < length:
        b *= 2
    return b
