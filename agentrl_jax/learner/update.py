"""One RL update from a ``RolloutBatch``: a pipeline of named stages shared by both row layouts.

    place          host arrays -> device, once (``layouts.PaddedRows`` / ``PackedRows``)
    old_logprobs   the policy's log-probs of the batch (``ratio_source="recompute"``, packed
                   rows, preference estimators), else the sampler's
    reference      the frozen reference's log-probs (``use_reference``)
    values         the critic's values (PPO with a critic; padded rows)
    derive         one jitted program of three pure stages: ``kl_stage`` (per-token KL,
                   KL-in-reward penalty), ``advantage_stage`` (``compute_advantages`` over the
                   whole token space: group statistics over the global batch, unless the
                   batch brings advantages), ``importance_stage`` (``tis_cap``)
    shuffle        ``jax.random.permutation`` of the rows per epoch (key: seed, update step)
    optimise       ``epochs`` x ``mini_batches`` optimiser steps (the layout's mini-batches)
    metrics        one read-back of the token-space arrays for the batch statistics, and
                   ``learner/params_finite`` (every parameter finite after the update)

Every per-token array (log-probs, KL, advantages, returns, values, importance weights) and the
permutation is a device array from the stage that makes it to the optimiser steps; only the
metrics stage reads them back (once). The layouts differ only in how rows reach the model.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from agentrl_jax.algorithms import (TURN_INPUTS, AdvantageInputs, compute_advantages,
                                    is_supervised, kl_estimate, kl_penalized_token_rewards)
from agentrl_common.gc_clock import gc_totals
from agentrl_jax.compile_notice import compile_count
from agentrl_jax.learner.batch import RolloutBatch
from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.jit_cache import cached
from agentrl_jax.learner.layouts import PackedRows, PaddedRows
from agentrl_jax.learner.metrics import batch_stats, behaviour_consistency, reduce_step_metrics
from agentrl_jax.learner.optim import optimizer_step_count
from agentrl_jax.sharding.placement import to_host_tree

Arrays = dict[str, jax.Array]


@jax.jit
def all_finite(*trees: Any) -> jax.Array:
    """Whether every floating-point value of ``trees`` (parameter trees) is finite: one
    boolean, reduced on the devices that hold the values (``[]``, replicated)."""
    flags = [jnp.all(jnp.isfinite(x)) for tree in trees for x in jax.tree_util.tree_leaves(tree)
             if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)


def kl_stage(cfg: LearnerConfig, placed: Arrays, old_lp, ref_lp
             ) -> tuple[jax.Array, jax.Array | None]:
    """``(kl [N, W] on loss tokens, token rewards)``; with ``kl_in_reward`` the rewards carry
    the ``kl_coef`` penalty."""
    mask, token_rewards = placed["loss_mask"], placed.get("token_rewards")
    kl = kl_estimate(old_lp, ref_lp, cfg.kl_estimator) * mask
    if cfg.kl_in_reward:
        token_rewards = kl_penalized_token_rewards(token_rewards, old_lp, ref_lp, mask,
                                                   cfg.kl_coef, estimator=cfg.kl_estimator)
    return kl, token_rewards


def advantage_stage(cfg: LearnerConfig, placed: Arrays, values, token_rewards, old_lp, ref_lp
                    ) -> tuple[jax.Array, jax.Array]:
    """``(advantages, returns)`` ``[N, W]``: the batch's own, or ``cfg.advantage_estimator``
    over the whole token space (group statistics over the global batch)."""
    if "advantages" in placed:
        return placed["advantages"], placed.get("returns", placed["advantages"])
    # everything the batch holds; the estimator's record keeps the inputs it reads
    inputs = AdvantageInputs(rewards=placed["reward"], loss_mask=placed["loss_mask"],
                             group_ids=placed["group_id"], values=values,
                             token_rewards=token_rewards, logprobs=old_lp, ref_logprobs=ref_lp,
                             **{k: placed[k] for k in TURN_INPUTS if k in placed})
    out = compute_advantages(cfg.advantage_estimator, **vars(inputs), gamma=cfg.gamma,
                             lam=cfg.lam, **cfg.advantage_kwargs)
    return out.advantages.astype(jnp.float32), out.returns.astype(jnp.float32)


def importance_stage(cfg: LearnerConfig, placed: Arrays, old_lp) -> jax.Array:
    """Truncated importance sampling: ``min(exp(learner - rollout), tis_cap)`` on loss
    tokens."""
    ratio = jnp.exp(jnp.clip(old_lp - placed["rollout_logprobs"], -20.0, 20.0))
    return jnp.minimum(ratio, cfg.tis_cap).astype(jnp.float32) * placed["loss_mask"]


def derived_stages(cfg: LearnerConfig, use_tis: bool, placed: Arrays, old_lp, ref_lp, values
                   ) -> dict[str, jax.Array]:
    """KL -> advantages -> importance weights (jitted as one program by the pipeline):
    ``advantages``, ``returns`` and, where they apply, ``kl``, ``is_weights``."""
    kl, token_rewards = (kl_stage(cfg, placed, old_lp, ref_lp) if ref_lp is not None
                         else (None, placed.get("token_rewards")))
    adv, ret = advantage_stage(cfg, placed, values, token_rewards, old_lp, ref_lp)
    out = {"advantages": adv, "returns": ret}
    if kl is not None:
        out["kl"] = kl
    if use_tis:
        out["is_weights"] = importance_stage(cfg, placed, old_lp)
    return out


class UpdatePipeline:
    """Runs one update of ``learner`` (a :class:`~agentrl_jax.learner.learner.Learner`) on a
    validated ``RolloutBatch``; ``local``: process-local rows (padded layout only)."""

    def __init__(self, learner: Any, batch: RolloutBatch, local: bool = False):
        self.learner, self.config, self.batch, self.local = learner, learner.config, batch, local
        packed = learner.config.pack_length and not local and learner.critic_params is None
        self.layout = PackedRows(learner, batch) if packed else PaddedRows(learner, batch, local)

    # ---------------------------------------------------------------- stages
    def old_logprobs(self, placed: Arrays) -> tuple[jax.Array, bool]:
        """``(old log-probs [N, W], recomputed)``: zeros for a supervised loss without a
        reference, the policy's own when recomputed, else the sampler's."""
        lr, cfg = self.learner, self.config
        if is_supervised(cfg.policy_loss) and lr.ref_params is None:
            return jnp.zeros_like(placed["loss_mask"]), False
        if (self.layout.recomputes_old_logprobs or cfg.ratio_source == "recompute"
                or cfg.estimator.needs_reference
                or "rollout_logprobs" not in placed):
            return self._logprobs(lr.params, str(jax.tree.leaves(lr.params)[0].dtype),
                                  placed), True
        return placed["rollout_logprobs"], False

    def reference(self, placed: Arrays) -> jax.Array | None:
        """The frozen reference's log-probs ``[N, W]`` (``None`` without a reference)."""
        lr = self.learner
        if lr.ref_params is None:
            return None
        return self._logprobs(lr.ref_params, self.config.reference_dtype, placed)

    def values(self, placed: Arrays) -> jax.Array | None:
        """The critic's values ``[N, W]`` (``None`` without a critic)."""
        lr = self.learner
        if lr.critic_params is None:
            return None
        return self.layout.forward(lr.value_fn(), lr.critic_params, placed)

    def derive(self, placed: Arrays, old_lp, ref_lp, values, recomputed: bool
               ) -> dict[str, jax.Array]:
        """The KL, advantage and importance-weight stages (:func:`derived_stages`) in one
        jitted call on the device arrays."""
        cfg = self.config
        use_tis = bool(cfg.tis_cap and recomputed and "rollout_logprobs" in placed
                       and not is_supervised(cfg.policy_loss))
        inputs = {k: v for k, v in placed.items() if k not in ("tokens", "attention_mask")}
        key = ("derive", self.learner.cfg_key, tuple(sorted(inputs)), ref_lp is None,
               values is None, use_tis)
        fn = cached(key, lambda: jax.jit(functools.partial(derived_stages, cfg, use_tis)))
        return fn(inputs, old_lp, ref_lp, values)

    def shuffle(self, epoch: int) -> jax.Array:
        """The row order of ``epoch``: ``[n_rows]`` int32, a replicated device array (the
        same on every process); ``jax.random.permutation`` keyed by (seed, update step,
        epoch), the identity without ``config.shuffle``."""
        n, mesh, shuffle = self.layout.n_rows, self.learner.mesh, self.config.shuffle

        def build():
            def order(seed, step, epoch):
                if not shuffle:
                    return jnp.arange(n, dtype=jnp.int32)
                key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), epoch)
                return jax.random.permutation(key, n).astype(jnp.int32)
            return jax.jit(order, out_shardings=NamedSharding(mesh, P()))
        fn = cached(("shuffle", mesh, n, shuffle), build)
        return fn(np.uint32(self.config.seed), np.int32(self.learner.update_step),
                  np.int32(epoch))

    # ---------------------------------------------------------------- the update
    def __call__(self) -> dict[str, float]:
        lr, cfg = self.learner, self.config
        t_start = time.perf_counter()
        compiles_before = compile_count()
        gc_before, cpu_before = gc_totals(), time.thread_time()
        placed = self.layout.place()

        t0 = time.perf_counter()
        old_lp, recomputed = self.old_logprobs(placed)
        ref_lp = self.reference(placed)
        values = self.values(placed)
        jax.block_until_ready((old_lp, ref_lp, values))  # a wait, no transfer: timed passes
        t_forward = time.perf_counter() - t0

        derived = self.derive(placed, old_lp, ref_lp, values, recomputed)
        adv, ret = derived["advantages"], derived["returns"]
        kl, is_w = derived.get("kl"), derived.get("is_weights")
        per_token = {"tokens": placed["tokens"], "attention_mask": placed["attention_mask"],
                     "loss_mask": placed["loss_mask"], "old_logprobs": old_lp,
                     "advantages": adv}
        if ref_lp is not None and not cfg.kl_in_reward:
            per_token["ref_logprobs"] = ref_lp
        if values is not None:
            per_token.update(returns=ret, old_values=values)
        if is_w is not None:
            per_token["is_weights"] = is_w
        if "option_counts" in placed:
            per_token["option_counts"] = placed["option_counts"]

        train_policy = lr.update_step >= cfg.critic_warmup_steps or values is None
        lr_before = float(lr.schedule(optimizer_step_count(lr.opt_state) or 0))
        t0 = time.perf_counter()
        step_metrics = []
        for epoch in range(cfg.epochs):
            step_metrics += self.layout.optimiser_steps(per_token, self.shuffle(epoch),
                                                        train_policy, values is not None)
        step_metrics = to_host_tree(step_metrics)
        t_train = time.perf_counter() - t0
        lr.update_step += 1

        device = {"advantages": adv, "returns": ret}
        if values is not None:
            device["values"] = values
        if kl is not None:
            device["kl"] = kl
        if is_w is not None:
            device["is_weights"] = is_w
        if recomputed and "rollout_logprobs" in placed and not is_supervised(cfg.policy_loss):
            device.update(old_logprobs=old_lp, rollout_logprobs=placed["rollout_logprobs"])
        metrics = self.metrics(self.layout.host_view(device), step_metrics)
        metrics["actor/lr"] = lr_before
        if lr.critic_params is not None:
            metrics["critic/lr"] = float(lr.critic_schedule(
                optimizer_step_count(lr.critic_opt_state) or 0))
        metrics.update(self.layout.size_metrics(t_train, int(train_policy)
                                                + int(values is not None)))
        metrics["perf/forward_time_s"] = t_forward
        metrics["perf/update_time_s"] = time.perf_counter() - t_start
        # 1.0 / 0.0: the parameters after this update (policy and critic) are all finite; the
        # trainer stops a run whose update made them, its loss or its gradients non-finite
        metrics["learner/params_finite"] = float(all_finite(lr.params, lr.critic_params))
        # XLA programs compiled during the update (any thread of the process): 0 once a run's
        # shapes are compiled (a new token-space or micro-batch shape compiles several)
        metrics["perf/update_compiles"] = float(compile_count() - compiles_before)
        # what else can stretch an update without a compile: Python's garbage collections
        # during it (any thread: they hold the GIL the dispatch loop needs) and this thread's
        # CPU time (dispatch and host work; the rest of the wall is waiting: device or GIL)
        metrics["perf/update_gc_s"], full = gc_totals().since(gc_before)
        metrics["perf/update_gc_full"] = float(full)
        metrics["perf/update_thread_cpu_s"] = time.thread_time() - cpu_before
        metrics["learner/update_step"] = float(lr.update_step)
        metrics["learner/optimizer_step"] = float(optimizer_step_count(lr.opt_state) or 0)
        return metrics

    # ---------------------------------------------------------------- metrics
    def metrics(self, view: dict[str, np.ndarray], step_metrics: list[dict]
                ) -> dict[str, float]:
        """Batch statistics from the host view (the global batch's real rows and columns)."""
        cfg = self.config
        mask = view["loss_mask"]
        real = mask != 0
        out: dict[str, float] = {}
        if "old_logprobs" in view:
            out.update(behaviour_consistency(view["rollout_logprobs"], view["old_logprobs"],
                                             mask))
        if "is_weights" in view and real.any():
            w = view["is_weights"][real]
            out["rollout/tis_weight_mean"] = float(w.mean())
            out["rollout/tis_capped_frac"] = float(np.mean(w >= cfg.tis_cap))
        if "kl" in view:
            out["actor/ref_kl"] = float(view["kl"].sum() / max(mask.sum(), 1.0))
        out.update(reduce_step_metrics(step_metrics))
        if "reward" in view:
            out.update(batch_stats("reward", view["reward"]))
        out.update(batch_stats("advantages", view["advantages"], real))
        out.update(batch_stats("returns", view["returns"], real))
        if "values" in view:
            out.update(batch_stats("critic/values", view["values"], real))
            r, v = view["returns"][real], view["values"][real]
            if r.size > 1 and np.var(r) > 0:
                out["critic/explained_variance"] = float(1.0 - np.var(r - v) / np.var(r))
        out.update(batch_stats("response_length", real.sum(-1)))
        out.update(batch_stats("sequence_length", (view["attention_mask"] != 0).sum(-1)))
        out["batch/rows"] = float(mask.shape[0])
        out["batch/generated_tokens"] = float(real.sum())
        return out

    # ---------------------------------------------------------------- helpers
    def _logprobs(self, params, dtype: str, placed: Arrays) -> jax.Array:
        """The log-prob pass of ``params`` over the token space; with the layout's scored
        capacity (``learner.scored_lm_head``) the LM head runs only where ``loss_mask != 0``
        (0 elsewhere: every consumer reads the log-probs through the loss mask)."""
        lr, cap = self.learner, self.layout.capacity
        scored = cap is not None
        options = "option_counts" in placed  # per-turn option limits (output_tokens.py)
        if isinstance(self.layout, PackedRows):
            return self.layout.forward(lr.packed_logprob_fn(dtype, cap, options), params,
                                       placed, scored)
        if scored:
            return self.layout.forward(lr.logprob_fn(dtype, cap, options), params, placed,
                                       scored)
        lp, _ = self.layout.forward(lr.logprob_fn(dtype, None, options), params, placed)
        return lp


__all__ = ["UpdatePipeline", "all_finite"]
