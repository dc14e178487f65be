"""One RL update from a rollout batch, on packed rows (``LearnerConfig.pack_length > 0``).

    batch [B, T] (right-padded trajectories)
      -> advantages on the unpacked rows (group statistics need whole trajectories)
      -> per mini-batch: pack rows into [R, P] (segment ids, positions restart per trajectory)
      -> learner log-probs of the packed rows under the current parameters (the PPO "old"
         log-probs) and under the reference (KL), in fixed [logprob_batch_size, P] calls
      -> behaviour / learner consistency: |rollout - learner| log-probs and the ratio
         exp(learner - rollout) that the first optimiser step would see
      -> optional truncated importance sampling: is_w = min(exp(learner - rollout), tis_cap)
      -> epochs x (accumulate over [micro_batch_size, P] micro-batches, apply)

Every array the jitted functions see has one shape for the whole run, so nothing compiles after
the first update. Single-process batches only (``process_local`` batches use
``Learner.update``'s padded path).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import jax
import numpy as np

from agentrl_jax.algorithms import (TURN_INPUTS, aggregation_weights, compute_advantages,
                                    is_logprob_level, is_supervised, kl_estimate,
                                    kl_penalized_token_rewards)
from agentrl_jax.learner.metrics import batch_stats, reduce_step_metrics
from agentrl_jax.learner.optim import optimizer_step_count
from agentrl_jax.learner.packing import PackPlan, pack, plan_packing, segment_layout, unpack
from agentrl_jax.sharding.placement import place_global, to_host, to_host_tree


def _row_lengths(attention_mask: np.ndarray) -> np.ndarray:
    am = np.asarray(attention_mask) != 0
    return np.where(am.any(-1), am.shape[1] - np.argmax(am[:, ::-1], axis=-1), 0)


def _mini_batches(b: int, config: Any, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(b) if config.shuffle else np.arange(b)
    return [part for part in np.array_split(order, config.mini_batches) if part.size]


def behaviour_consistency(rollout_lp: np.ndarray, learner_lp: np.ndarray,
                          mask: np.ndarray) -> dict[str, float]:
    """How far the sampler's log-probs are from the learner's at the same parameters.

    ``ratio = exp(learner - rollout)`` is the PPO ratio that the first optimiser step would
    compute if the rollout log-probs were used as the old log-probs; it should be 1."""
    sel = np.asarray(mask) != 0
    diff = (np.asarray(learner_lp, np.float64) - np.asarray(rollout_lp, np.float64))[sel]
    if not diff.size:
        return {}
    ratio = np.exp(diff)
    return {"rollout/logprob_abs_diff_mean": float(np.abs(diff).mean()),
            "rollout/logprob_abs_diff_max": float(np.abs(diff).max()),
            "rollout/behaviour_ratio_min": float(ratio.min()),
            "rollout/behaviour_ratio_max": float(ratio.max()),
            "rollout/behaviour_ratio_outside_10pct": float(np.mean(np.abs(ratio - 1.0) > 0.1))}


class PackedUpdate:
    """Runs ``update`` for a :class:`~agentrl_jax.learner.learner.Learner` on packed rows."""

    def __init__(self, learner: Any):
        self.learner = learner
        self.config = learner.config

    # ---------------------------------------------------------------- forward passes
    def _logprobs(self, params: Any, dtype: str, tokens: np.ndarray, segments: np.ndarray,
                  positions: np.ndarray) -> np.ndarray:
        """Token-aligned log-probs ``[R, P]`` of packed rows, ``logprob_batch_size`` rows a
        call (the row count is padded to a multiple with empty rows)."""
        lr = self.learner
        fn = lr._packed_logprob_fn(dtype)
        n = lr.logprob_batch_size
        rows = tokens.shape[0]
        padded = -(-rows // n) * n
        pad = ((0, padded - rows), (0, 0))
        tokens, segments, positions = (np.pad(x, pad) for x in (tokens, segments, positions))
        sh = lr._row_sharding()
        outs = [fn(params, place_global(tokens[s:s + n], sh), place_global(segments[s:s + n], sh),
                   place_global(positions[s:s + n], sh)) for s in range(0, padded, n)]
        return np.concatenate(to_host_tree(outs))[:rows]

    # ---------------------------------------------------------------- update
    def __call__(self, batch: Mapping[str, Any]) -> dict[str, float]:
        lr, cfg = self.learner, self.config
        t_start = time.perf_counter()
        tokens = np.asarray(batch["tokens"], np.int32)
        b, t = tokens.shape
        mask = (np.asarray(batch["loss_mask"]) != 0).astype(np.float32)
        lengths = _row_lengths(batch["attention_mask"])
        rollout_lp = (np.asarray(batch["rollout_logprobs"], np.float32)
                      if batch.get("rollout_logprobs") is not None else None)

        # --- old (learner) and reference log-probs of the whole batch, packed
        t0 = time.perf_counter()
        plan = plan_packing(lengths, cfg.pack_length, lr.logprob_batch_size)
        seg, pos = segment_layout(plan)
        packed_tokens = pack(plan, tokens)
        param_dtype = str(jax.tree.leaves(lr.params)[0].dtype)
        supervised = is_supervised(cfg.policy_loss)  # no ratio: no "old" log-prob pass
        if supervised and lr.ref_params is None:
            old_lp = np.zeros((b, t), np.float32)
        else:
            old_lp = unpack(plan, self._logprobs(lr.params, param_dtype, packed_tokens, seg,
                                                 pos), t)
        ref_lp = None
        if lr.ref_params is not None:
            ref_lp = unpack(plan, self._logprobs(lr.ref_params, cfg.reference_dtype,
                                                 packed_tokens, seg, pos), t)
        t_forward = time.perf_counter() - t0

        # --- rewards, advantages (unpacked: group statistics over whole trajectories)
        token_rewards = batch.get("token_rewards")
        kl_tok = None
        if ref_lp is not None:
            kl_tok = np.asarray(kl_estimate(old_lp, ref_lp, cfg.kl_estimator)) * mask
            if cfg.kl_in_reward:
                token_rewards = np.asarray(kl_penalized_token_rewards(
                    token_rewards, old_lp, ref_lp, mask, cfg.kl_coef,
                    estimator=cfg.kl_estimator))
        if batch.get("advantages") is not None:
            adv = np.asarray(batch["advantages"], np.float32)
        else:
            turns = {k: np.asarray(batch[k]) for k in TURN_INPUTS if batch.get(k) is not None}
            if is_logprob_level(cfg.advantage_estimator):  # dpo: policy and reference log-probs
                turns.update(logprobs=old_lp, ref_logprobs=ref_lp)
            out = compute_advantages(
                cfg.advantage_estimator, rewards=np.asarray(batch["reward"], np.float32),
                loss_mask=mask, group_ids=np.asarray(batch["group_id"]),
                token_rewards=token_rewards, gamma=cfg.gamma, lam=cfg.lam, **turns,
                **cfg.advantage_kwargs)
            adv = to_host(out.advantages).astype(np.float32)

        # --- per-token arrays of the loss (unpacked [B, T])
        per_token: dict[str, np.ndarray] = {"loss_mask": mask, "old_logprobs": old_lp,
                                            "advantages": adv}
        if ref_lp is not None and not cfg.kl_in_reward:
            per_token["ref_logprobs"] = ref_lp
        metrics: dict[str, float] = {}
        if rollout_lp is not None and not supervised:
            metrics.update(behaviour_consistency(rollout_lp, old_lp, mask))
            if cfg.tis_cap:
                is_w = np.minimum(np.exp(np.clip(old_lp - rollout_lp, -20.0, 20.0)),
                                  cfg.tis_cap).astype(np.float32) * mask
                per_token["is_weights"] = is_w
                sel = mask > 0
                if sel.any():
                    metrics["rollout/tis_weight_mean"] = float(is_w[sel].mean())
                    metrics["rollout/tis_capped_frac"] = float(
                        np.mean(is_w[sel] >= cfg.tis_cap))

        # --- epochs x mini-batches of optimiser steps over packed micro-batches
        rng = np.random.default_rng([cfg.seed, lr.update_step])
        lr_before = float(lr.schedule(optimizer_step_count(lr.opt_state) or 0))
        step_metrics: list[dict[str, Any]] = []
        packed_rows = 0
        t0 = time.perf_counter()
        for _ in range(cfg.epochs):
            for rows in _mini_batches(b, cfg, rng):
                sm, n_rows = self._optimiser_step(rows, tokens, lengths, per_token)
                step_metrics.append(sm)
                packed_rows += n_rows
        step_metrics = to_host_tree(step_metrics)
        t_train = time.perf_counter() - t0
        lr.update_step += 1

        # --- metrics
        metrics.update(reduce_step_metrics(step_metrics))
        if kl_tok is not None:
            metrics["actor/ref_kl"] = float(kl_tok.sum() / max(mask.sum(), 1.0))
        metrics["actor/lr"] = lr_before
        if batch.get("reward") is not None:
            metrics.update(batch_stats("reward", np.asarray(batch["reward"], np.float32)))
        real = mask > 0
        metrics.update(batch_stats("advantages", adv, real))
        metrics.update(batch_stats("response_length", real.sum(-1)))
        metrics.update(batch_stats("sequence_length", lengths))
        metrics["batch/rows"] = float(b)
        metrics["batch/packed_rows"] = float(packed_rows / cfg.epochs)
        metrics["batch/padded_length"] = float(cfg.pack_length)
        metrics["batch/packing_efficiency"] = plan.efficiency
        metrics["batch/generated_tokens"] = float(real.sum())
        metrics["batch/real_tokens"] = float(lengths.sum())
        metrics.update(lr.throughput(tokens=packed_rows * cfg.pack_length,
                                     seq_len=cfg.pack_length, seconds=t_train, passes=1,
                                     real_tokens=int(lengths.sum()) * cfg.epochs))
        metrics["perf/forward_time_s"] = t_forward
        metrics["perf/update_time_s"] = time.perf_counter() - t_start
        metrics["learner/update_step"] = float(lr.update_step)
        metrics["learner/optimizer_step"] = float(optimizer_step_count(lr.opt_state) or 0)
        return metrics

    def _optimiser_step(self, rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray,
                        per_token: dict[str, np.ndarray]) -> tuple[dict[str, Any], int]:
        """One optimiser step on the trajectories ``rows``: pack, weight, accumulate, apply."""
        lr, cfg = self.learner, self.config
        mb = cfg.micro_batch_size
        plan: PackPlan = plan_packing(lengths[rows], cfg.pack_length, mb)
        seg, pos = segment_layout(plan)
        mask = per_token["loss_mask"][rows]
        arrays = {"tokens": pack(plan, tokens[rows]), "segment_ids": seg, "positions": pos,
                  "loss_weights": pack(plan, aggregation_weights(mask, cfg.loss_agg_mode,
                                                                 cfg.loss_max_len))}
        for name, x in per_token.items():
            arrays[name] = pack(plan, x[rows])
        steps = lr._packed_steps(tuple(sorted(arrays)))
        sh = lr._row_sharding()
        total = max(float(mask.sum()), 1.0)
        grads = metric_sum = None
        for s in range(0, plan.num_rows, mb):
            micro = {k: place_global(v[s:s + mb], sh) for k, v in arrays.items()}
            if grads is None:
                grads, metric_sum = steps.zero_state(lr.params, micro)
            share = np.float32(arrays["loss_mask"][s:s + mb].sum() / total)
            grads, metric_sum = steps.accumulate(lr.params, grads, metric_sum, micro, share)
        lr._before_donating_opt_state()
        lr.params, lr.opt_state, norm = steps.apply(lr.params, lr.opt_state, grads)
        metric_sum = {f"actor/{k}": v for k, v in metric_sum.items()}
        metric_sum["actor/grad_norm"] = norm
        return metric_sum, plan.num_rows


__all__ = ["PackedUpdate", "behaviour_consistency"]
