"""Learner hyper-parameters: one typed dataclass, convertible to / from a plain dict.

``LearnerConfig.from_dict(d)`` accepts any mapping (a plain dict, a YAML section, an
``ml_collections.ConfigDict`` via ``.to_dict()``); unknown keys raise so typos do not pass
silently. ``to_dict()`` gives JSON/YAML-serialisable values (tuples become lists).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SCHEDULES = ("constant", "warmup_constant", "warmup_cosine")
AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm")
RATIO_SOURCES = ("rollout", "recompute")
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    # ------------------------------------------------------------------ optimiser
    learning_rate: float = 1e-6
    lr_schedule: str = "constant"  # constant | warmup_constant | warmup_cosine
    warmup_steps: int = 0
    decay_steps: int = 1000  # cosine: optimizer steps from the end of warm-up to min_lr
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of learning_rate
    weight_decay: float = 0.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    grad_clip: float | None = 1.0  # global-norm clip; None / 0 = off
    # True: keep the optimiser state (AdamW mu / nu, step count) in pinned host memory and move
    # it to the device one parameter leaf per jitted call of the update (offload.py); frees 8
    # bytes / parameter of device memory at the cost of 16 bytes / parameter of host <-> device
    # traffic per optimiser step. Needs a backend with the "pinned_host" memory kind.
    offload_optimizer_state: bool = False
    # ------------------------------------------------------------------ batching
    micro_batch_size: int = 8  # sequences per forward/backward (global, all devices)
    mini_batches: int = 1  # optimizer steps per epoch over one rollout batch
    epochs: int = 1  # passes over one rollout batch
    shuffle: bool = True  # reshuffle rows before splitting into mini-batches (per epoch)
    length_buckets: tuple[int, ...] = ()  # () = powers of two >= min_length_bucket
    min_length_bucket: int = 128
    logprob_batch_size: int | None = None  # rows per compute_logprobs call (None: micro)
    logprob_chunk_size: int = 512  # positions per chunk when computing logits->logprobs
    # > 0: pack trajectories end to end into rows of this many tokens (packed_update.py): one
    # compiled shape per run, little padding; micro_batch_size / logprob_batch_size then count
    # packed rows. Must be >= the longest trajectory (the rollout's max_context).
    pack_length: int = 0
    # ------------------------------------------------------------------ RL loss
    # the policy loss (algorithms.POLICY_LOSSES): "ppo" (clipped surrogate; clip_ratio_* and
    # dual_clip below) or "sft" (supervised: weighted NLL of the masked tokens, no ratio, no
    # old log-prob pass; behaviour cloning, training/sft.py)
    policy_loss: str = "ppo"
    advantage_estimator: str = "grpo"
    advantage_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    gamma: float = 1.0
    lam: float = 1.0
    loss_agg_mode: str = "token_mean"
    loss_max_len: int | None = None  # seq_mean_token_sum_norm constant (None: padded T)
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2  # clip-higher (DAPO): e.g. 0.28
    dual_clip: float | None = 3.0  # dual-clip constant c for A < 0; None = off
    ratio_source: str = "rollout"  # old logprobs: "rollout" (sampler) | "recompute"
    # truncated importance sampling of the sampler / learner mismatch (packed updates): each
    # token's policy loss is weighted by min(exp(learner_old - rollout), tis_cap); None = off
    tis_cap: float | None = None
    temperature: float = 1.0  # sampling temperature; logits are divided by it
    kl_coef: float = 0.0
    kl_estimator: str = "k3"  # k1 | k2 | k3 (low_var_kl)
    kl_in_reward: bool = False  # True: -kl_coef*KL on token rewards; False: KL loss term
    entropy_coef: float = 0.0
    entropy_metric: bool = True  # compute the entropy in the train step even when entropy_coef=0
    # ------------------------------------------------------------------ critic
    critic: bool | None = None  # None: on iff advantage_estimator needs values (gae)
    critic_learning_rate: float = 1e-5
    critic_warmup_steps: int = 0  # rollout updates training only the critic
    value_coef: float = 1.0
    value_clip: float | None = 0.5  # PPO value clip around old values; None = off
    # ------------------------------------------------------------------ compute
    dtype: str = "bfloat16"  # compute dtype (parameters stay float32)
    remat: bool = True
    remat_policy: str | None = None  # jax.checkpoint_policies name, e.g. dots_with_no_batch_dims_saveable
    attention_impl: str | None = None  # None (XLA) | "cudnn"
    reference_dtype: str = "float32"  # storage dtype of the frozen reference parameters
    use_attention_mask: bool = False  # False: right-padded rows, causal mask only (fast path)
    mesh: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {"data": 1, "fsdp": -1, "tensor": 1})
    seed: int = 0

    def __post_init__(self) -> None:
        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"LearnerConfig: {msg}")

        check(isinstance(self.offload_optimizer_state, bool),
              f"offload_optimizer_state must be a bool (got {self.offload_optimizer_state!r})")
        check(self.lr_schedule in SCHEDULES, f"lr_schedule must be one of {SCHEDULES}")
        check(self.loss_agg_mode.replace("-", "_") in AGG_MODES,
              f"loss_agg_mode must be one of {AGG_MODES}")
        check(self.ratio_source in RATIO_SOURCES, f"ratio_source must be one of {RATIO_SOURCES}")
        check(self.dtype in DTYPES and self.reference_dtype in DTYPES, f"dtypes must be in {DTYPES}")
        check(self.micro_batch_size >= 1 and self.mini_batches >= 1 and self.epochs >= 1,
              "micro_batch_size, mini_batches and epochs must be >= 1")
        check(self.logprob_chunk_size >= 1, "logprob_chunk_size must be >= 1")
        check(self.temperature > 0, "temperature must be > 0")
        check(self.min_length_bucket >= 1, "min_length_bucket must be >= 1")
        check(self.pack_length >= 0, "pack_length must be >= 0 (0 = no packing)")
        check(self.tis_cap is None or self.tis_cap > 0, "tis_cap must be > 0 or None")
        check(all(b >= 1 for b in self.length_buckets), "length_buckets must be positive")
        check(self.kl_estimator.lower() in ("k1", "k2", "k3", "low_var_kl", "kl", "mse", "abs"),
              "kl_estimator must be k1 / k2 / k3")
        from agentrl_jax.algorithms.losses import POLICY_LOSSES
        check(self.policy_loss in POLICY_LOSSES,
              f"policy_loss must be one of {sorted(POLICY_LOSSES)}")
        if self.advantage_estimator.lower().replace("-", "_") == "dpo":  # exact DPO gradient
            check(self.policy_loss == "sft"
                  and self.loss_agg_mode.replace("-", "_") == "seq_mean_token_sum",
                  "advantage_estimator='dpo' needs policy_loss='sft' and "
                  "loss_agg_mode='seq_mean_token_sum' (algorithms/dpo.py)")
        object.__setattr__(self, "length_buckets", tuple(sorted(int(b) for b in self.length_buckets)))
        object.__setattr__(self, "mesh", dict(self.mesh))
        object.__setattr__(self, "advantage_kwargs", dict(self.advantage_kwargs))

    # ------------------------------------------------------------------ derived
    @property
    def use_critic(self) -> bool:
        if self.critic is not None:
            return bool(self.critic)
        return self.advantage_estimator.lower().replace("-", "_") == "gae"

    @property
    def use_reference(self) -> bool:
        """A frozen reference model: for the KL term, or for a preference estimator (dpo)."""
        from agentrl_jax.algorithms.advantages import is_logprob_level
        return self.kl_coef > 0 or is_logprob_level(self.advantage_estimator)

    def replace(self, **changes: Any) -> "LearnerConfig":
        return dataclasses.replace(self, **changes)

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
