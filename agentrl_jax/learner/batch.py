"""The learner's input: a typed rollout batch (``RolloutBatch``) and update options.

``training.rl.batching.assemble_batch`` builds a ``RolloutBatch`` from the actor pool's
trajectories; ``Learner.update(batch, UpdateOptions(...))`` consumes it. Arrays are host
(NumPy) arrays; the update places them on the device once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class UpdateOptions:
    """How one ``Learner.update`` runs.

    log: write the metrics to the learner's metrics writer (tensorboardX / JSON lines).
    process_local: the batch holds only this process's rows (multi-process runs; group ids
      globally unique, each group on one process); otherwise every process passes the same
      global batch. With one process both mean the same.
    """

    log: bool = True
    process_local: bool = False


#: float32 per-token arrays ``[B, T]``
_TOKEN_FLOATS = ("rollout_logprobs", "token_rewards", "advantages", "returns")


@dataclasses.dataclass(frozen=True)
class RolloutBatch:
    """``B`` trajectories, right-padded to ``T`` tokens (host arrays).

    tokens [B, T] int32: prompt, generated and observation ids, right-padded.
    loss_mask [B, T] float32: 1 on ids the policy generated (``loss_mask[:, 0]`` must be 0:
      no log-prob exists for a row's first token).
    attention_mask [B, T] int32: 1 on real ids (a prefix of each row unless
      ``LearnerConfig.use_attention_mask``).
    group_id [B] int32: samples of the same task share an id (``None`` only with
      ``advantages``).
    reward [B] float32: the outcome score (``None`` only with ``advantages``).
    rollout_logprobs [B, T] float32: the sampler's log-prob of each id at its own index.
    token_rewards [B, T] float32: optional per-token rewards.
    advantages, returns [B, T] float32: optional, precomputed (skips the estimator).
    turn_ids [B, T] int32: the turn of every id (-1: prompt / padding); turn-level
      estimators (GiGPO) only, with
    turn_rewards [B, K] float32 and turn_anchors [B, K] int32 (-1 where a row has no turn k).
    option_counts [B, T] int32: optional per-token option limits: token ``t`` was sampled from
      the first ``option_counts[b, t]`` option tokens only (0: no per-turn limit); the
      learner scores the same distribution (``models/output_tokens.py``).
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    attention_mask: np.ndarray
    group_id: np.ndarray | None = None
    reward: np.ndarray | None = None
    rollout_logprobs: np.ndarray | None = None
    token_rewards: np.ndarray | None = None
    advantages: np.ndarray | None = None
    returns: np.ndarray | None = None
    turn_ids: np.ndarray | None = None
    turn_rewards: np.ndarray | None = None
    turn_anchors: np.ndarray | None = None
    option_counts: np.ndarray | None = None

    def __post_init__(self) -> None:
        def put(name, dtype):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, np.asarray(value).astype(dtype, copy=False))
        put("tokens", np.int32)
        put("attention_mask", np.int32)
        object.__setattr__(self, "loss_mask",
                           (np.asarray(self.loss_mask) != 0).astype(np.float32))
        for name in _TOKEN_FLOATS + ("reward", "turn_rewards"):
            put(name, np.float32)
        for name in ("group_id", "turn_ids", "turn_anchors", "option_counts"):
            put(name, np.int32)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mapping(cls, batch: Mapping[str, Any]) -> "RolloutBatch":
        """A batch from a dict of arrays with the field names; raises ``ValueError`` on an
        unknown key (with the known ones) and ``KeyError`` on a missing required one."""
        if isinstance(batch, RolloutBatch):
            return batch
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(batch) - names)
        if unknown:
            raise ValueError(f"unknown batch keys {unknown}; known: {sorted(names)}")
        for k in ("tokens", "loss_mask", "attention_mask"):
            if k not in batch:
                raise KeyError(f"batch lacks {k!r}")
        return cls(**{k: v for k, v in batch.items() if v is not None})

    @classmethod
    def empty(cls) -> "RolloutBatch":
        """A zero-row batch (a process whose share produced no trainable trajectory still
        takes part in the collectives of a process-local update)."""
        z = np.zeros((0, 1))
        return cls(tokens=z, loss_mask=z, attention_mask=z, rollout_logprobs=z,
                   group_id=np.zeros((0,)), reward=np.zeros((0,)))

    # ------------------------------------------------------------------ views
    @property
    def shape(self) -> tuple[int, int]:
        """``(B, T)``."""
        return tuple(self.tokens.shape)  # type: ignore[return-value]

    def arrays(self) -> dict[str, np.ndarray]:
        """The present arrays by field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    @property
    def has_turns(self) -> bool:
        return self.turn_ids is not None or self.turn_anchors is not None

    def lengths(self) -> np.ndarray:
        """``[B]`` real tokens per row (the last real index + 1)."""
        am = self.attention_mask != 0
        return np.where(am.any(-1), am.shape[1] - np.argmax(am[:, ::-1], axis=-1), 0)

    # ------------------------------------------------------------------ checks
    def validate(self, right_padded: bool = True) -> None:
        """Raise ``ValueError`` / ``KeyError`` on a malformed batch: shapes, masks, the
        first-token rule, right padding (unless ``right_padded=False``), and group ids /
        rewards (needed unless advantages are given)."""
        if self.tokens.ndim != 2:
            raise ValueError(f"tokens must be [B, T], got shape {self.tokens.shape}")
        b, t = self.tokens.shape
        for name in ("attention_mask", "loss_mask", "turn_ids", "option_counts") + _TOKEN_FLOATS:
            x = getattr(self, name)
            if x is not None and x.shape != (b, t):
                raise ValueError(f"tokens, attention_mask and loss_mask must have the same "
                                 f"[B, T] shape; {name} is {x.shape}, tokens {(b, t)}")
        for name in ("group_id", "reward"):
            x = getattr(self, name)
            if x is None and self.advantages is None:
                raise KeyError(f"batch lacks {name!r}")
            if x is not None and x.shape != (b,):
                raise ValueError(f"{name} must be [B]={b}, got shape {x.shape}")
        if self.option_counts is not None and np.any(self.option_counts < 0):
            raise ValueError("option_counts must be >= 0 (0: no per-turn option limit)")
        am = self.attention_mask != 0
        lm = self.loss_mask != 0
        if np.any(lm & ~am):
            raise ValueError("loss_mask is 1 on a token whose attention_mask is 0")
        if t and np.any(lm[:, 0]):
            raise ValueError("loss_mask[:, 0] must be 0: no logprob exists for a row's first token")
        if right_padded and np.any(am[:, 1:] & ~am[:, :-1]):
            raise ValueError(
                "attention_mask is not right-padded (real tokens must form a prefix of each row); "
                "set LearnerConfig.use_attention_mask=True for arbitrary masks (slower)")


__all__ = ["RolloutBatch", "UpdateOptions"]
