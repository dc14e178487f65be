"""Optimiser: ``clip_by_global_norm -> AdamW`` with a learning-rate schedule.

The schedule position is the optimiser's own step count (inside the AdamW state), so it is
saved and restored with the optimiser state: a resumed run continues the schedule exactly.
Weight decay is applied to matrices only (rank >= 2: kernels and embeddings), not to norm
scales or biases, as in verl / HF Trainer.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import optax

from agentrl_jax.learner.config import LearnerConfig


def make_schedule(config: LearnerConfig, peak_lr: float | None = None) -> optax.Schedule:
    lr = config.learning_rate if peak_lr is None else peak_lr
    warm = max(int(config.warmup_steps), 0)
    if config.lr_schedule == "constant":
        return optax.constant_schedule(lr)
    if config.lr_schedule == "warmup_constant":
        if warm == 0:
            return optax.constant_schedule(lr)
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warm),
                                     optax.constant_schedule(lr)], [warm])
    if config.lr_schedule == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=lr, warmup_steps=warm,
            decay_steps=warm + max(int(config.decay_steps), 1),
            end_value=lr * config.min_lr_ratio)
    raise ValueError(f"unknown lr_schedule {config.lr_schedule!r}")


def _decay_mask(params):
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


class OptimizerParts(NamedTuple):
    """The two stages of the optimiser, kept apart for the leaf-wise (offloaded) update.

    ``clip``: ``clip_by_global_norm`` (``None`` without ``grad_clip``): stateless, but needs
    every gradient (the global norm). ``adamw``: element-wise per parameter given its shared
    scalar state (the step count), so it can run one parameter leaf at a time
    (``offload.LeafwiseUpdate``). ``make_optimizer``'s ``tx`` is ``chain(clip, adamw)`` (or
    ``chain(adamw)``), whose state is ``(clip_state, adamw_state)`` (or ``(adamw_state,)``).
    """

    clip: optax.GradientTransformation | None
    adamw: optax.GradientTransformation
    schedule: optax.Schedule


def optimizer_parts(config: LearnerConfig, peak_lr: float | None = None) -> OptimizerParts:
    """The clip and AdamW stages of ``make_optimizer(config, peak_lr)``."""
    schedule = make_schedule(config, peak_lr)
    clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip else None
    adamw = optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                        weight_decay=config.weight_decay, mask=_decay_mask)
    return OptimizerParts(clip, adamw, schedule)


def chain_parts(parts: OptimizerParts) -> optax.GradientTransformation:
    """``chain(clip, adamw)`` (``chain(adamw)`` without clipping): the learner's ``tx``."""
    return optax.chain(*([parts.clip] if parts.clip is not None else []), parts.adamw)


def make_optimizer(config: LearnerConfig, peak_lr: float | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(tx, schedule)``: global-norm clipping (if ``grad_clip``) then AdamW(schedule)."""
    parts = optimizer_parts(config, peak_lr)
    return chain_parts(parts), parts.schedule


def optimizer_step_count(opt_state) -> int | None:
    """The AdamW step count stored in ``opt_state`` (host int), if found."""
    for leaf_path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        names = [getattr(k, "name", getattr(k, "key", None)) for k in leaf_path]
        if "count" in names:
            return int(jax.device_get(leaf))
    return None


__all__ = ["OptimizerParts", "chain_parts", "make_schedule", "make_optimizer",
           "optimizer_parts", "optimizer_step_count"]
