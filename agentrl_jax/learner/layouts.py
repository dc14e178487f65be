"""How the update lays a rollout batch's rows out on the device: padded rows or packed rows.

Both layouts hold the per-token arrays of the update (log-probs, advantages, KL, ...) as
device arrays ``[N, W]`` in their *token space*, and differ only in how rows reach the model:

- ``PaddedRows`` (``LearnerConfig.pack_length == 0``, process-local batches, the critic):
  token space = the batch padded to ``[rows, cols]`` (``padded_token_space``; rows: whole
  mini-batches of micro-batches, a power of two of them where padding rows cost nothing,
  zero-mask pad rows with fresh group ids; cols: a length bucket); the model
  sees ``[logprob_batch_size, cols]`` forward chunks and ``[n_micro, micro_batch_size, cols]``
  mini-batches (``train_step.make_train_step``).
- ``PackedRows`` (``pack_length > 0``): token space = the batch padded to ``[B, pack_length]``
  (``token_space.packed_token_space``: ``B`` a power of two the learner keeps and only grows,
  so the update's small programs compile once a run; zero-length pad rows pack into nothing,
  so the model does no extra work); the model
  sees rows of ``pack_length`` tokens holding several trajectories (``packing.py``), packed
  and unpacked on the device with gather indices (``packing.pack_index`` / ``unpack_index``);
  optimiser steps accumulate ``[micro_batch_size, pack_length]`` calls
  (``packed_step.PackedSteps``).

A layout offers the pipeline (``update.UpdatePipeline``): ``place`` (host arrays -> device,
once), ``forward`` (a per-token pass of a model over the token space), ``optimiser_steps``
(the mini-batches of one epoch in a given row order) and ``host_view`` (the real rows and
columns of token-space arrays, on the host, for the metrics). Index arithmetic (which rows,
pack plans) is host NumPy on integers the batch already holds; no float array leaves the
device inside an update.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from agentrl_jax.algorithms import aggregation_weights, is_turn_level
from agentrl_jax.learner.batch import RolloutBatch
from agentrl_jax.learner.config import LearnerConfig, bucket_length
from agentrl_jax.learner.jit_cache import cached
from agentrl_jax.learner.packing import pack, pack_index, plan_packing, segment_layout, unpack_index
from agentrl_jax.learner.scored import row_counts
from agentrl_jax.learner.token_space import call_sizes, logprob_call_rows, packed_token_space
from agentrl_jax.learner.train_step import minibatch_sharding, pass_rows
from agentrl_jax.sharding.placement import (agree_max, allgather_rows, place_global,
                                            place_process_local, to_host_tree)
from agentrl_jax.sharding.rules import batch_sharding

Arrays = dict[str, jax.Array]


def _take_rows(mesh, out_sharding):
    """Jitted ``(tree of [N, ...], idx [n]) -> tree of [n, ...]`` (rows gathered, clipped)."""
    return cached(("take_rows", mesh, out_sharding), lambda: jax.jit(
        lambda tree, idx: jax.tree.map(lambda x: jnp.take(x, idx, axis=0, mode="clip"), tree),
        out_shardings=out_sharding))


def _unpack_into(mesh, out_sharding):
    """Jitted ``(out [B, T], chunk [n, P], index [B, T], offset) -> out`` with ``chunk``'s
    tokens in place: where ``offset <= index < offset + n * P`` (``index`` into the flattened
    packed rows, -1 for none), ``chunk.flat[index - offset]``; elsewhere ``out`` unchanged."""
    def fn(out, chunk, index, offset):
        flat = chunk.reshape(-1)
        local = index - offset
        hit = (local >= 0) & (local < flat.shape[0])
        return jnp.where(hit, flat[jnp.clip(local, 0, flat.shape[0] - 1)].astype(out.dtype), out)
    return cached(("unpack_into", mesh, out_sharding),
                  lambda: jax.jit(fn, out_shardings=out_sharding))


def _gather_flat(mesh, out_sharding):
    """Jitted ``(tree of [B, T], index [...] into the flattened [B*T] or -1) -> tree of
    [...]`` (0 where the index is -1): device pack / unpack."""
    def fn(tree, index):
        def one(x):
            flat = x.reshape(-1)
            return jnp.where(index >= 0, flat[jnp.maximum(index, 0)], jnp.zeros((), x.dtype))
        return jax.tree.map(one, tree)
    return cached(("gather_flat", mesh, out_sharding),
                  lambda: jax.jit(fn, out_shardings=out_sharding))


class PaddedRows:
    """Rows padded to length buckets; see the module docstring. ``local``: process-local rows
    (each process holds ``rows / P`` of the token space's rows, in process order)."""

    recomputes_old_logprobs = False  # the sampler's log-probs serve as the old ones if asked

    def __init__(self, learner: Any, batch: RolloutBatch, local: bool):
        lr, cfg = learner, learner.config
        self.learner, self.config, self.local = lr, cfg, local
        b, t = batch.shape
        self.b, self.t = b, t
        self.n_proc = lr.require_process_local_layout() if local else 1
        self.t_all = agree_max(t) if local else t
        self.rows, self.cols = padded_token_space(
            agree_max(b) * self.n_proc if local else b, self.t_all, cfg, lr.mesh, local)
        self.rows_local = self.rows // self.n_proc
        first_pad_group = None
        if local and batch.group_id is not None and batch.advantages is None:
            first_pad_group = _agree_groups(batch.group_id, self.rows_local)
        turn_slots = None  # the turn axis of the per-turn arrays (GiGPO), agreed by processes
        if is_turn_level(cfg.advantage_estimator) and batch.advantages is None:
            k = batch.turn_anchors.shape[1] if batch.turn_anchors is not None else 0
            turn_slots = agree_max(k) if local else k
        self.host = _pad(batch, self.rows_local, self.cols, first_pad_group, turn_slots)
        self.n_rows = self.rows_local  # rows the shuffle permutes (the same on every process)
        # the LM head's per-row capacity (scored.py) of both passes: a row's count does not
        # change when the rows are shuffled into mini-batches; None: the full head
        count = int(row_counts(self.host["loss_mask"]).max(initial=0))
        self.capacity = lr.scored_capacity.for_rows(agree_max(count) if local else count,
                                                    self.cols)

    # ---------------------------------------------------------------- place
    def place(self) -> Arrays:
        """Every padded host array on the device, rows over data x fsdp (once)."""
        mesh = self.learner.mesh
        out = {}
        for k, v in self.host.items():
            sh = batch_sharding(mesh, v.ndim)
            out[k] = (place_process_local(v, sh, (self.rows, *v.shape[1:])) if self.local
                      else place_global(v, sh))
        return out

    # ---------------------------------------------------------------- forward passes
    def forward(self, fn, params, placed: Arrays, scored: bool = False) -> Any:
        """``fn(params, tokens, attention_mask)`` (``scored``: and ``loss_mask``; then
        ``option_counts`` where the batch has per-turn option limits; outputs
        ``[n, cols]`` or a tuple of them) over chunks of ``logprob_batch_size`` rows ->
        token-space ``[rows, cols]`` outputs. Single-process chunks of padding rows only are
        zeros (no forward pass)."""
        lr = self.learner
        n = lr.logprob_batch_size
        step = n // self.n_proc
        bs = batch_sharding(lr.mesh, 2)
        take = _take_rows(lr.mesh, bs)
        keys = (("tokens", "attention_mask") + (("loss_mask",) if scored else ())
                + (("option_counts",) if "option_counts" in placed else ()))
        inputs = {k: placed[k] for k in keys}
        has_tokens = self.host["attention_mask"].any(-1)
        outs, order = [], []
        for s in range(0, self.rows_local, step):
            # chunk rows: ``step`` rows of every process's block (process-major)
            idx = (np.arange(self.n_proc)[:, None] * self.rows_local
                   + np.minimum(s + np.arange(step), self.rows_local - 1)[None]).reshape(-1)
            order.append(idx)
            if not self.local and s > 0 and not has_tokens[s:s + n].any():
                outs.append(None)
                continue
            chunk = take(inputs, idx.astype(np.int32))
            outs.append(fn(params, *(chunk[k] for k in keys)))
        template = next(o for o in outs if o is not None)
        outs = [o if o is not None else jax.tree.map(jnp.zeros_like, template) for o in outs]
        stacked = jax.tree.map(lambda *xs: jnp.concatenate(xs), *outs)
        # inverse of the chunk order: token-space row r is stacked row inverse[r]
        flat = np.concatenate(order)
        inverse = np.empty(self.rows, np.int64)
        inverse[flat[::-1]] = np.arange(flat.size)[::-1]  # first occurrence wins
        return take(stacked, inverse.astype(np.int32))

    # ---------------------------------------------------------------- optimiser steps
    def optimiser_steps(self, per_token: Arrays, order: jax.Array, train_policy: bool,
                        train_critic: bool) -> list[dict]:
        """One epoch: ``mini_batches`` optimiser steps (``train_step.make_train_step``), step
        ``k`` on the rows ``order[k * per_mini:(k + 1) * per_mini]`` of every process's
        block. ``per_token``: token-space arrays keyed as the mini-batch wants them."""
        lr, cfg = self.learner, self.config
        step_fn = lr.train_step(tuple(sorted(per_token)), train_policy, train_critic,
                                self.capacity)
        per_mini = self.rows_local // cfg.mini_batches
        n_micro = self.rows // cfg.mini_batches // cfg.micro_batch_size
        micro = cfg.micro_batch_size // self.n_proc
        n_proc, rows_local, mesh = self.n_proc, self.rows_local, lr.mesh

        def build():
            def gather(arrays, order, k):
                sel = jax.lax.dynamic_slice_in_dim(order, k * per_mini, per_mini)
                sel = (sel.reshape(n_micro, 1, micro)
                       + (jnp.arange(n_proc) * rows_local)[None, :, None])
                sel = sel.reshape(n_micro, n_proc * micro)
                return {name: x[sel] for name, x in arrays.items()}
            return jax.jit(gather, out_shardings=minibatch_sharding(mesh))
        gather = cached(("minibatch", mesh, per_mini, n_micro, micro, n_proc, rows_local), build)
        metrics = []
        for k in range(cfg.mini_batches):
            mb = gather(per_token, order, np.int32(k))
            metrics.append(lr.optimiser_step(step_fn, mb))
        return metrics

    # ---------------------------------------------------------------- metrics
    def host_view(self, device: Arrays) -> dict[str, np.ndarray]:
        """Token-space arrays (``device``) and the loss / attention masks on the host,
        restricted to the global batch's real rows and ``t_all`` columns."""
        view = to_host_tree(device)
        real_row = np.arange(self.rows_local) < self.b
        masks = {"loss_mask": self.host["loss_mask"],
                 "attention_mask": self.host["attention_mask"], "real_row": real_row}
        if "reward" in self.host:
            masks["reward"] = self.host["reward"]
        masks = allgather_rows(masks) if self.local else masks
        sel = masks.pop("real_row")
        out = {k: v[sel] if v.ndim == 1 else v[sel, :self.t_all]
               for k, v in {**view, **masks}.items()}
        return out

    def size_metrics(self, seconds: float, train_passes: int) -> dict[str, float]:
        """Row / length counts and throughput of the optimiser steps."""
        lr = self.learner
        return {"batch/padded_rows": float(self.rows), "batch/padded_length": float(self.cols),
                **lr.throughput(tokens=self.rows * self.cols, seq_len=self.cols, seconds=seconds,
                                passes=self.config.epochs * train_passes,
                                real_tokens=int(self._real_tokens()))}

    def _real_tokens(self) -> int:
        am = self.host["attention_mask"] != 0
        return int(agree_sum(int(am.sum()))) if self.local else int(am.sum())


def skips_padding_passes(config: LearnerConfig, mesh: Any, local: bool) -> bool:
    """Whether the padded layout's padding rows cost nothing: its train step runs passes
    smaller than a micro-batch and skips those without loss tokens (``pass_rows``: CPU
    meshes), and its log-prob passes skip chunks of padding rows (rows not ``local``:
    ``PaddedRows.forward``)."""
    return not local and pass_rows(config, mesh) < config.micro_batch_size


def padded_token_space(rows: int, length: int, config: LearnerConfig, mesh: Any,
                       local: bool = False) -> tuple[int, int]:
    """``(rows_pad, cols)`` of the padded layout for ``rows`` x ``length`` tokens (global
    sizes: with process-local batches ``rows`` is the number of processes times the largest
    per-process row count, and each process holds ``rows_pad / P`` rows: ``local``).

    rows_pad = mini_batches * n_micro * micro_batch_size, n_micro = the micro-batches that a
    mini-batch needs, rounded up to a power of two where padding rows cost nothing
    (``skips_padding_passes``), so that row counts changing every step (flat groups skipped)
    reuse a few compiled programs; cols = ``bucket_length(length)``."""
    per_mini = -(-rows // config.mini_batches)
    n_micro = -(-per_mini // config.micro_batch_size)
    if skips_padding_passes(config, mesh, local):
        n_micro = 1 << (n_micro - 1).bit_length()
    return config.mini_batches * n_micro * config.micro_batch_size, bucket_length(length, config)


def agree_sum(value: int) -> int:
    """The sum of an int over processes (the identity with one process)."""
    return int(np.sum(allgather_rows(np.asarray([int(value)], np.int64))))


class PackedRows:
    """Trajectories packed into rows of ``pack_length`` tokens; see the module docstring.
    Single-process batches, no critic. The token space is the batch padded to
    :func:`packed_token_space` (zero-length rows with fresh group ids: they pack into
    nothing)."""

    recomputes_old_logprobs = True  # the sampler's log-probs are only compared with them

    def __init__(self, learner: Any, batch: RolloutBatch):
        lr, cfg = learner, learner.config
        self.learner, self.config, self.real = lr, cfg, batch
        self.real_b, self.real_t = batch.shape
        rows, cols = packed_token_space(self.real_b, self.real_t, cfg, lr.token_rows)
        if (rows, cols) != batch.shape:
            turn_slots = (batch.turn_anchors.shape[1] if batch.turn_anchors is not None
                          else 0) if batch.has_turns else None
            batch = RolloutBatch.from_mapping(_pad(batch, rows, cols, turn_slots=turn_slots))
        self.batch = batch
        self.b, self.t = batch.shape
        self.lengths = batch.lengths()
        self.n_rows = self.b
        self.packed_rows = 0  # packed rows trained on over the epochs (micro-batch multiples)
        self.filled_rows = 0  # of which rows holding tokens
        self.micro_batches = 0  # accumulate calls over the epochs
        self.counts = row_counts(batch.loss_mask)  # scored tokens per source row
        # the log-prob pass's call shapes: full calls, then micro-batch-sized ones
        self.calls = logprob_call_rows(lr.logprob_batch_size, cfg.micro_batch_size)
        self.plan = self.pack_plan(np.arange(self.b), self.calls[1])
        self.capacity = self.scored_capacity(self.plan)  # of the log-prob pass

    def pack_plan(self, rows: np.ndarray, row_multiple: int) -> Any:
        """The pack plan of source rows ``rows``: rows of ``pack_length`` tokens, a multiple of
        ``row_multiple`` of them (``packing.plan_packing``). Where a packed row of that plan
        would hold more scored tokens than the learner's scored LM head capacity, the plan is
        made again with the capacity as a budget per row, and taken where it needs no more
        rows: the update then runs the programs compiled for that capacity (``ahead.py``)
        instead of compiling a larger one, at the same cost in rows."""
        cfg = self.config
        counts = self.counts[rows]
        plain = plan_packing(self.lengths[rows], cfg.pack_length, row_multiple)
        budget = self.learner.scored_capacity.current(cfg.pack_length)
        per_row = np.bincount(plain.row, weights=counts, minlength=plain.num_rows)
        if budget is None or per_row.max(initial=0) <= budget:
            return plain
        kept = plan_packing(self.lengths[rows], cfg.pack_length, row_multiple, scored=counts,
                            scored_budget=budget)
        return kept if kept.num_rows <= plain.num_rows else plain

    def scored_capacity(self, plan: Any, rows: np.ndarray | None = None) -> int | None:
        """The LM head's per-row capacity (``scored.py``) for the packed rows of ``plan``
        (made for source rows ``rows``, default all); ``None``: the full head."""
        counts = self.counts if rows is None else self.counts[rows]
        per_row = np.bincount(plan.row, weights=counts, minlength=plan.num_rows)
        return self.learner.scored_capacity.for_rows(int(per_row.max(initial=0)),
                                                     plan.pack_length)

    def place(self) -> Arrays:
        """The batch's arrays on the device, replicated (``[B, T]``, ``[B]``, ``[B, K]``)."""
        rep = NamedSharding(self.learner.mesh, P())
        return {k: place_global(v, rep) for k, v in self.batch.arrays().items()}

    def forward(self, fn, params, placed: Arrays, scored: bool = False) -> jax.Array:
        """``fn(params, tokens, segment_ids, positions)`` (``scored``: and ``loss_mask``; then
        ``option_counts`` where the batch has them; packed on the device like the tokens) over
        the whole batch packed in ``[logprob_batch_size, pack_length]`` calls, the rest in
        ``[micro_batch_size, pack_length]`` ones (``token_space.logprob_call_rows``) ->
        token-space ``[B, T]``. Each call's output goes to its tokens' places at once
        (:func:`_unpack_into`), so no program's shape depends on how many packed rows the
        batch makes."""
        lr = self.learner
        plan = self.plan
        src = pack_index(plan, np.arange(self.b), self.t)
        seg, pos = segment_layout(plan)
        sh = lr.row_sharding()
        pack_dev = _gather_flat(lr.mesh, sh)
        rep = NamedSharding(lr.mesh, P())
        unpack = _unpack_into(lr.mesh, rep)
        index = place_global(unpack_index(plan, self.t), rep)
        out = None
        s = 0
        for n in call_sizes(plan.num_rows, *self.calls):
            tokens = pack_dev(placed["tokens"], src[s:s + n])
            mask = (pack_dev(placed["loss_mask"], src[s:s + n]),) if scored else ()
            if "option_counts" in placed:  # packed like the tokens (padding: 0, no limit)
                mask += (pack_dev(placed["option_counts"], src[s:s + n]),)
            chunk = fn(params, tokens, place_global(seg[s:s + n], sh),
                       place_global(pos[s:s + n], sh), *mask)
            if out is None:
                out = jnp.zeros(index.shape, chunk.dtype, device=rep)
            out = unpack(out, chunk, index, np.int32(s * plan.pack_length))
            s += n
        return out

    def optimiser_steps(self, per_token: Arrays, order: jax.Array, train_policy: bool = True,
                        train_critic: bool = False) -> list[dict]:
        """One epoch: the rows in ``order`` split into ``mini_batches`` parts
        (``np.array_split``), each packed into ``[micro_batch_size, pack_length]``
        micro-batches whose gradients are summed, then one optimiser step. The order comes to
        the host (``B`` ints): the pack plan of a mini-batch is host-side bin packing. Only
        the batch's own rows are split (the token space's padding rows, which hold no token,
        are dropped from the order first), so the mini-batches share them evenly however many
        padding rows the token space has."""
        lr, cfg = self.learner, self.config
        order = np.asarray(jax.device_get(order))
        order = order[order < self.real_b]
        mb = cfg.micro_batch_size
        sh = lr.row_sharding()
        pack_dev = _gather_flat(lr.mesh, sh)
        mask = self.batch.loss_mask
        per_token = {k: v for k, v in per_token.items() if k != "attention_mask"}
        keys = tuple(sorted({*per_token, "segment_ids", "positions", "loss_weights"}))
        metrics = []
        for rows in (p for p in np.array_split(order, cfg.mini_batches) if p.size):
            plan = self.pack_plan(rows, mb)
            steps = lr.packed_steps(keys, self.scored_capacity(plan, rows))
            seg, pos = segment_layout(plan)
            src = pack_index(plan, rows, self.t)
            weights = pack(plan, aggregation_weights(mask[rows], cfg.loss_agg_mode,
                                                     cfg.loss_max_len))
            packed_mask = pack(plan, mask[rows])
            total = max(float(mask[rows].sum()), 1.0)
            grads = metric_sum = None
            for s in range(0, plan.num_rows, mb):
                micro = pack_dev(per_token, src[s:s + mb])
                micro.update(segment_ids=place_global(seg[s:s + mb], sh),
                             positions=place_global(pos[s:s + mb], sh),
                             loss_weights=place_global(weights[s:s + mb], sh))
                if grads is None:
                    grads, metric_sum = steps.zero_state(lr.params, micro)
                share = np.float32(packed_mask[s:s + mb].sum() / total)
                grads, metric_sum = steps.accumulate(lr.params, grads, metric_sum, micro, share)
            norm = lr.apply_packed_gradients(steps, grads)
            step = {f"actor/{k}": v for k, v in metric_sum.items()}
            step["actor/grad_norm"] = norm
            metrics.append(step)
            self.packed_rows += plan.num_rows
            self.filled_rows += plan.used_rows
            self.micro_batches += -(-plan.num_rows // mb)
        return metrics

    def host_view(self, device: Arrays) -> dict[str, np.ndarray]:
        """The token-space arrays on the host, cut to the batch's own rows and columns."""
        b, t = self.real_b, self.real_t
        view = {k: v[:b, :t] for k, v in to_host_tree(device).items()}
        view.update(loss_mask=self.real.loss_mask, attention_mask=self.real.attention_mask)
        if self.real.reward is not None:
            view["reward"] = self.real.reward
        return view

    def size_metrics(self, seconds: float, train_passes: int) -> dict[str, float]:
        """Row counts (per epoch), packing efficiency and throughput of the optimiser steps:
        ``learner/rows`` packed rows holding tokens, ``learner/rows_padded`` the rows run (each
        mini-batch's rounded up to whole micro-batches; ``batch/packed_rows`` too),
        ``learner/micro_batches`` the accumulate calls, ``learner/logprob_rows`` /
        ``_padded`` the same for the log-prob pass (``learner/logprob_calls`` calls of
        ``logprob_batch_size`` rows, then of ``micro_batch_size`` rows) and
        ``learner/token_space_rows`` the rows of the token space (``token_space.py``)."""
        cfg = self.config
        return {"batch/packed_rows": float(self.packed_rows / cfg.epochs),
                "learner/rows": float(self.filled_rows / cfg.epochs),
                "learner/rows_padded": float(self.packed_rows / cfg.epochs),
                "learner/micro_batches": float(self.micro_batches / cfg.epochs),
                "learner/logprob_rows": float(self.plan.used_rows),
                "learner/logprob_rows_padded": float(self.plan.num_rows),
                "learner/logprob_calls": float(len(call_sizes(self.plan.num_rows,
                                                              *self.calls))),
                "learner/token_space_rows": float(self.b),
                "batch/padded_length": float(cfg.pack_length),
                "batch/packing_efficiency": self.plan.efficiency,
                "batch/real_tokens": float(self.lengths.sum()),
                **self.learner.throughput(tokens=self.packed_rows * cfg.pack_length,
                                          seq_len=cfg.pack_length, seconds=seconds, passes=1,
                                          real_tokens=int(self.lengths.sum()) * cfg.epochs)}


# -------------------------------------------------------------------- padded-row helpers
def _agree_groups(group_id: np.ndarray, rows_local: int) -> int:
    """Process-local batches: raise (on every process) if a group id occurs on two
    processes; return the first group id of this process's pad rows (globally unique)."""
    ids = np.unique(np.asarray(group_id).astype(np.int64))
    width = agree_max(ids.size)
    row = np.zeros((1, width + 1), np.int32)  # [count, ids..., 0 padding]
    row[0, 0] = ids.size
    row[0, 1:1 + ids.size] = ids
    table = allgather_rows(row)  # [P, width + 1]
    seen = np.concatenate([r[1:1 + r[0]] for r in table])
    uniq, counts = np.unique(seen, return_counts=True)
    if np.any(counts > 1):
        raise ValueError(
            f"process_local=True: group ids {uniq[counts > 1][:8].tolist()} occur on more "
            "than one process; keep all samples of a group on one process and give groups "
            "globally unique ids (e.g. offset them by process_index * groups_per_process)")
    first = int(seen.max()) + 1 if seen.size else 0
    return first + jax.process_index() * rows_local


def _pad(batch: RolloutBatch, rows: int, cols: int, first_pad_group: int | None = None,
         turn_slots: int | None = None) -> dict[str, np.ndarray]:
    """Host arrays padded to ``[rows, cols]`` (zeros; fresh group ids on pad rows, from
    ``first_pad_group`` or else the batch's largest id + 1). ``turn_slots``: also the
    per-turn arrays (``turn_ids [rows, cols]``, ``turn_rewards`` / ``turn_anchors``
    ``[rows, turn_slots]``), -1 (no turn) on padding; a batch without them gets all -1."""
    b, t = batch.shape
    if cols < t:
        raise ValueError(f"batch length {t} exceeds padded length {cols}")

    def pad2(x, dtype):
        out = np.zeros((rows, cols), dtype)
        out[:b, :t] = x
        return out

    out = {"tokens": pad2(batch.tokens, np.int32),
           "attention_mask": pad2(batch.attention_mask, np.int32),
           "loss_mask": pad2(batch.loss_mask, np.float32)}
    if batch.option_counts is not None:  # 0 on padding: no option limit
        out["option_counts"] = pad2(batch.option_counts, np.int32)
    for k in ("rollout_logprobs", "token_rewards", "advantages", "returns"):
        if getattr(batch, k) is not None:
            out[k] = pad2(getattr(batch, k), np.float32)
    if batch.reward is not None:
        out["reward"] = np.zeros((rows,), np.float32)
        out["reward"][:b] = batch.reward
    if turn_slots is not None:
        def pad_turns(x, width, dtype, fill):
            full = np.full((rows, width), fill, dtype)
            if x is not None:
                full[:b, :x.shape[1]] = x
            return full
        out["turn_ids"] = pad_turns(batch.turn_ids, cols, np.int32, -1)
        out["turn_rewards"] = pad_turns(batch.turn_rewards, turn_slots, np.float32, 0)
        out["turn_anchors"] = pad_turns(batch.turn_anchors, turn_slots, np.int32, -1)
    if batch.group_id is not None:
        g = batch.group_id.astype(np.int64)
        start = first_pad_group if first_pad_group is not None else (g.max() + 1 if b else 0)
        out["group_id"] = np.concatenate([g, start + np.arange(rows - b)]).astype(np.int32)
    return out


__all__ = ["PaddedRows", "PackedRows", "packed_token_space"]
