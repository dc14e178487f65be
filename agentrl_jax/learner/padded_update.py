"""One RL update from a rollout batch on rows padded to length buckets (``Learner.update``'s
path without packing; also the process-local multi-process path and the critic / PPO path).

    pad T up to a length bucket and B up to ``mini_batches x n_micro x micro_batch_size`` rows
    (zero-mask rows) -> old logprobs (``ratio_source="recompute"``), reference logprobs
    (``kl_coef > 0``) and values (critic) in forward-only passes -> KL-in-reward penalty ->
    advantages (``agentrl_jax.algorithms.compute_advantages``) -> ``epochs`` x ``mini_batches``
    jitted optimiser steps (``train_step.make_train_step``), each accumulating gradients over
    ``n_micro`` micro-batches.

Process-local batches: see ``learner.py``'s module docstring.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from agentrl_jax.algorithms import (TURN_INPUTS, compute_advantages, is_logprob_level,
                                    is_supervised, is_turn_level, kl_estimate,
                                    kl_penalized_token_rewards)
from agentrl_jax.learner.jit_cache import cached
from agentrl_jax.learner.metrics import batch_stats, reduce_step_metrics
from agentrl_jax.learner.optim import optimizer_step_count
from agentrl_jax.learner.train_step import minibatch_sharding
from agentrl_jax.sharding.placement import (agree_max, allgather_rows, place_global,
                                            place_process_local, process_rows, to_host,
                                            to_host_tree)
from agentrl_jax.sharding.rules import batch_sharding

Batch = Any


def _as_np(x, dtype) -> np.ndarray:
    return to_host(x).astype(dtype, copy=False)


def _turn_inputs(hb: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-turn arrays of a turn-level estimator (GiGPO) that ``hb`` holds."""
    return {k: hb[k] for k in TURN_INPUTS if k in hb}


class PaddedUpdate:
    """Runs ``update`` for a :class:`~agentrl_jax.learner.learner.Learner` on padded rows."""

    def __init__(self, learner: Any):
        self.learner = learner

    def __call__(self, batch: Batch, local: bool) -> dict[str, float]:
        lr = self.learner
        cfg = lr.config
        t_start = time.perf_counter()
        b, t = np.asarray(batch["tokens"]).shape
        n_proc = lr._require_process_local_layout() if local else 1
        if local:
            t_all = agree_max(t)
            rows, cols = lr.padded_shape(agree_max(b) * n_proc, t_all)
        else:
            t_all = t
            rows, cols = lr.padded_shape(b, t)
        rows_local = rows // n_proc  # this process's padded rows (all of them: rows)
        first_pad_group = None
        if local and "group_id" in batch and "advantages" not in batch:
            first_pad_group = self._agree_groups(batch["group_id"], rows_local)
        turn_slots = None  # the turn axis of the per-turn arrays (GiGPO), agreed by processes
        if is_turn_level(cfg.advantage_estimator) and "advantages" not in batch:
            k = np.shape(batch["turn_anchors"])[1] if "turn_anchors" in batch else 0
            turn_slots = agree_max(k) if local else k
        hb = self._pad(batch, rows_local, cols, first_pad_group, turn_slots)
        m = hb["loss_mask"]

        # --- forward-only passes (old / reference logprobs, values)
        t0 = time.perf_counter()
        # a supervised loss has no ratio: no "old" log-prob pass (unless the KL needs one)
        skip_old = is_supervised(cfg.policy_loss) and lr.ref_params is None
        preference = is_logprob_level(cfg.advantage_estimator)  # dpo: needs pi's own log-probs
        need_old = not skip_old and (cfg.ratio_source == "recompute" or preference
                                     or "rollout_logprobs" not in hb)
        if skip_old:
            old_lp = np.zeros(hb["tokens"].shape, np.float32)
        elif need_old:
            old_lp, _ = lr._forward_rows(
                lr._logprob_fn(str(jax.tree.leaves(lr.params)[0].dtype)), lr.params,
                hb["tokens"], hb["attention_mask"], local)
        else:
            old_lp = hb["rollout_logprobs"]
        ref_lp = None
        if lr.ref_params is not None:
            ref_lp, _ = lr._forward_rows(
                lr._logprob_fn(cfg.reference_dtype), lr.ref_params, hb["tokens"],
                hb["attention_mask"], local)
        values = None
        if lr.critic_params is not None:
            values = lr._forward_rows(lr._value_fn(), lr.critic_params, hb["tokens"],
                                        hb["attention_mask"], local)
        t_forward = time.perf_counter() - t0

        # --- rewards and advantages
        token_rewards = hb.get("token_rewards")
        kl_tok = None
        if ref_lp is not None:
            kl_tok = np.asarray(kl_estimate(old_lp, ref_lp, cfg.kl_estimator))
            if cfg.kl_in_reward:
                token_rewards = np.asarray(kl_penalized_token_rewards(
                    token_rewards, old_lp, ref_lp, m, cfg.kl_coef, estimator=cfg.kl_estimator))
        lp_inputs = ({"logprobs": _as_np(old_lp, np.float32),
                      "ref_logprobs": _as_np(ref_lp, np.float32)} if preference else {})
        if "advantages" in hb:
            adv = hb["advantages"]
            ret = hb.get("returns", adv)
        elif local:
            adv, ret = self._advantages_global(hb, values, token_rewards, lp_inputs)
        else:
            out = compute_advantages(
                cfg.advantage_estimator, rewards=hb["reward"], loss_mask=m,
                group_ids=hb["group_id"], values=values, token_rewards=token_rewards,
                gamma=cfg.gamma, lam=cfg.lam, **_turn_inputs(hb), **lp_inputs,
                **cfg.advantage_kwargs)
            adv, ret = _as_np(out.advantages, np.float32), _as_np(out.returns, np.float32)

        mb_data = {"tokens": hb["tokens"], "attention_mask": hb["attention_mask"],
                   "loss_mask": m, "old_logprobs": _as_np(old_lp, np.float32),
                   "advantages": adv}
        if ref_lp is not None and not cfg.kl_in_reward:
            mb_data["ref_logprobs"] = _as_np(ref_lp, np.float32)
        if values is not None:
            mb_data["returns"] = ret
            mb_data["old_values"] = _as_np(values, np.float32)
        keys = tuple(sorted(mb_data))
        train_policy = lr.update_step >= cfg.critic_warmup_steps or values is None
        step_fn = lr._train_step(keys, train_policy, values is not None)

        # --- epochs x mini-batches of jitted optimiser steps (with process-local rows, each
        # mini-batch takes rows_local / mini_batches rows of every process)
        per_mini = rows_local // cfg.mini_batches
        n_micro = rows // cfg.mini_batches // cfg.micro_batch_size
        micro = cfg.micro_batch_size // n_proc
        mb_sh = minibatch_sharding(lr.mesh)
        rng = np.random.default_rng([cfg.seed, lr.update_step])
        step_metrics = []
        lr_before = float(lr.schedule(optimizer_step_count(lr.opt_state) or 0))
        t0 = time.perf_counter()
        for _ in range(cfg.epochs):
            order = rng.permutation(rows_local) if cfg.shuffle else np.arange(rows_local)
            for k in range(cfg.mini_batches):
                idx = order[k * per_mini:(k + 1) * per_mini]
                mb = {}
                for name, arr in mb_data.items():
                    x = arr[idx].reshape(n_micro, micro, *arr.shape[1:])
                    mb[name] = (place_process_local(
                        x, mb_sh, (n_micro, cfg.micro_batch_size, *arr.shape[1:]))
                        if local else place_global(x, mb_sh))
                lr._before_donating_opt_state()
                (lr.params, lr.opt_state, lr.critic_params, lr.critic_opt_state,
                 sm) = step_fn(lr.params, lr.opt_state, lr.critic_params,
                               lr.critic_opt_state, mb)
                step_metrics.append(sm)
        step_metrics = to_host_tree(step_metrics)
        t_train = time.perf_counter() - t0
        lr.update_step += 1

        # --- host views of the batch for metrics: the global batch's real rows [b_all, t_all]
        diff_arrays = "rollout_logprobs" in hb and need_old
        if local:
            view = {"loss_mask": m, "attention_mask": hb["attention_mask"], "advantages": adv,
                    "returns": ret, "real_row": np.arange(rows_local) < b}
            extra = {"reward": hb.get("reward"), "values": values, "kl": kl_tok}
            if diff_arrays:
                extra.update(old_logprobs=old_lp, rollout_logprobs=hb["rollout_logprobs"])
            view.update({name: np.asarray(arr) for name, arr in extra.items() if arr is not None})
            view = allgather_rows(view)
            sel = view["real_row"]
            real = view["loss_mask"][sel, :t_all] != 0
            seq_real = view["attention_mask"][sel, :t_all] != 0
            mask_all, am_all = view["loss_mask"], view["attention_mask"]
            adv_r, ret_r = view["advantages"][sel, :t_all], view["returns"][sel, :t_all]
            val_r = view["values"][sel, :t_all] if values is not None else None
            rew_r = view["reward"][sel] if "reward" in view else None
            kl_all = view.get("kl")
            if diff_arrays:
                rollout_all, old_all = view["rollout_logprobs"], view["old_logprobs"]
            b_all = int(sel.sum())
        else:
            real = np.asarray(batch["loss_mask"]) != 0
            seq_real = np.asarray(batch["attention_mask"]) != 0
            mask_all, am_all = m, hb["attention_mask"]
            adv_r, ret_r = adv[:b, :t], ret[:b, :t]
            val_r = values[:b, :t] if values is not None else None
            rew_r = np.asarray(hb["reward"])[:b] if "reward" in hb else None
            kl_all = kl_tok
            if diff_arrays:
                rollout_all, old_all = hb["rollout_logprobs"], old_lp
            b_all = b

        # --- metrics
        metrics: dict[str, float] = {}
        if diff_arrays:
            diff = (rollout_all - old_all)[mask_all > 0]
            if diff.size:
                metrics["rollout/logprob_abs_diff_mean"] = float(np.abs(diff).mean())
                metrics["rollout/logprob_abs_diff_max"] = float(np.abs(diff).max())
        if kl_all is not None:
            metrics["actor/ref_kl"] = float((kl_all * mask_all).sum() / max(mask_all.sum(), 1.0))
        metrics.update(reduce_step_metrics(step_metrics))
        metrics["actor/lr"] = lr_before
        if lr.critic_params is not None:
            metrics["critic/lr"] = float(lr.critic_schedule(
                optimizer_step_count(lr.critic_opt_state) or 0))
        metrics.update(batch_stats("reward", rew_r) if rew_r is not None else {})
        metrics.update(batch_stats("advantages", adv_r, real))
        metrics.update(batch_stats("returns", ret_r, real))
        if val_r is not None:
            metrics.update(batch_stats("critic/values", val_r, real))
            r, v = ret_r[real], val_r[real]
            if r.size > 1 and np.var(r) > 0:
                metrics["critic/explained_variance"] = float(1.0 - np.var(r - v) / np.var(r))
        metrics.update(batch_stats("response_length", real.sum(-1)))
        metrics.update(batch_stats("sequence_length", seq_real.sum(-1)))
        metrics["batch/rows"] = float(b_all)
        metrics["batch/padded_rows"] = float(rows)
        metrics["batch/padded_length"] = float(cols)
        metrics["batch/generated_tokens"] = float(real.sum())
        passes = cfg.epochs * (int(train_policy) + int(values is not None))
        metrics.update(lr.throughput(tokens=rows * cols, seq_len=cols, seconds=t_train,
                                       passes=passes, real_tokens=int((am_all != 0).sum())))
        metrics["perf/forward_time_s"] = t_forward
        metrics["perf/update_time_s"] = time.perf_counter() - t_start
        metrics["learner/update_step"] = float(lr.update_step)
        metrics["learner/optimizer_step"] = float(optimizer_step_count(lr.opt_state) or 0)
        return metrics

    def _agree_groups(self, group_id, rows_local: int) -> int:
        """Process-local batches: raise (on every process) if a group id occurs on two
        processes; return the first group id of this process's pad rows (globally unique)."""
        ids = np.unique(np.asarray(group_id).astype(np.int64))
        width = agree_max(ids.size)
        row = np.zeros((1, width + 1), np.int32)  # [count, ids..., 0 padding]
        row[0, 0] = ids.size
        row[0, 1:1 + ids.size] = ids
        table = allgather_rows(row)  # [P, width + 1]
        per_proc = [r[1:1 + r[0]] for r in table]
        seen = np.concatenate(per_proc)
        uniq, counts = np.unique(seen, return_counts=True)
        if np.any(counts > 1):
            raise ValueError(
                f"process_local=True: group ids {uniq[counts > 1][:8].tolist()} occur on more "
                "than one process; keep all samples of a group on one process and give groups "
                "globally unique ids (e.g. offset them by process_index * groups_per_process)")
        first = int(seen.max()) + 1 if seen.size else 0
        return first + jax.process_index() * rows_local

    def _pad(self, batch: Batch, rows: int, cols: int, first_pad_group: int | None = None,
             turn_slots: int | None = None) -> dict[str, np.ndarray]:
        """Host arrays padded to ``[rows, cols]`` (zeros; fresh group ids on pad rows, from
        ``first_pad_group`` or else the batch's largest id + 1). ``turn_slots``: also the
        per-turn arrays (``turn_ids [rows, cols]``, ``turn_rewards`` / ``turn_anchors``
        ``[rows, turn_slots]``), -1 (no turn) on padding; a batch without them (a process's
        empty share) gets all -1."""
        b, t = np.asarray(batch["tokens"]).shape
        if cols < t:
            raise ValueError(f"batch length {t} exceeds padded length {cols}")

        def pad2(x, dtype):
            out = np.zeros((rows, cols), dtype)
            out[:b, :t] = np.asarray(x).astype(dtype, copy=False)
            return out

        out = {"tokens": pad2(batch["tokens"], np.int32),
               "attention_mask": pad2(batch["attention_mask"], np.int32),
               "loss_mask": pad2(np.asarray(batch["loss_mask"]) != 0, np.float32)}
        for k in ("rollout_logprobs", "token_rewards", "advantages", "returns"):
            if batch.get(k) is not None:
                out[k] = pad2(batch[k], np.float32)
        if "reward" in batch:
            r = np.zeros((rows,), np.float32)
            r[:b] = np.asarray(batch["reward"], np.float32)
            out["reward"] = r
        if turn_slots is not None:
            def pad_turns(key, width, dtype, fill):
                out = np.full((rows, width), fill, dtype)
                if batch.get(key) is not None:
                    x = np.asarray(batch[key]).astype(dtype, copy=False)
                    out[:b, :x.shape[1]] = x
                return out
            out["turn_ids"] = pad_turns("turn_ids", cols, np.int32, -1)
            out["turn_rewards"] = pad_turns("turn_rewards", turn_slots, np.float32, 0)
            out["turn_anchors"] = pad_turns("turn_anchors", turn_slots, np.int32, -1)
        if "group_id" in batch:
            g = np.asarray(batch["group_id"]).astype(np.int64)
            start = first_pad_group if first_pad_group is not None else (g.max() + 1 if b else 0)
            fresh = start + np.arange(rows - b)
            out["group_id"] = np.concatenate([g, fresh]).astype(np.int32)
        return out

    def _advantages_global(self, hb: dict[str, np.ndarray], values, token_rewards,
                           lp_inputs: dict[str, np.ndarray] | None = None):
        """Process-local rows: advantages / returns of this process's rows, computed in jit
        over the global batch (group statistics and whitening span every process)."""
        lr = self.learner
        cfg, mesh = lr.config, lr.mesh
        args = {"rewards": hb["reward"], "loss_mask": hb["loss_mask"],
                "group_ids": hb["group_id"]}
        if values is not None:
            args["values"] = values
        if token_rewards is not None:
            args["token_rewards"] = token_rewards
        args.update(_turn_inputs(hb))
        args.update(lp_inputs or {})
        key = ("advantages", mesh, lr._cfg_key, tuple(sorted(args)))

        def build():  # closes over locals only
            def fn(a):
                return compute_advantages(cfg.advantage_estimator, **a, gamma=cfg.gamma,
                                          lam=cfg.lam, **cfg.advantage_kwargs)
            return jax.jit(fn, out_shardings=batch_sharding(mesh, 2))
        placed = {k: place_process_local(np.asarray(v), batch_sharding(mesh, np.ndim(v)))
                  for k, v in args.items()}
        out = cached(key, build)(placed)
        return (process_rows(out.advantages).astype(np.float32, copy=False),
                process_rows(out.returns).astype(np.float32, copy=False))


__all__ = ["PaddedUpdate"]
