"""The jitted PPO / GRPO optimiser step over one mini-batch, with explicit shardings.

One call = one optimiser step of the policy (and of the critic, when there is one):

    mini-batch arrays [n_micro, micro_batch, T]   (sharded P(None, ("data", "fsdp"), None))
      -> lax.scan over the n_micro micro-batches: forward + backward, gradients summed in f32
      -> clip_by_global_norm -> AdamW -> new params / optimiser state (donated buffers)

On CPU each micro-batch is further split into passes of ``data x fsdp`` rows (one row on one
device; ``pass_rows``) and passes without loss tokens (the learner's zero-mask padding rows)
are skipped: the same sums, with activation memory of one row instead of ``micro_batch``.

Loss normalisation across micro-batches: every micro-batch loss is aggregated with the
*mini-batch's* denominator (``denom``: the mini-batch's generated-token count for
``token_mean``, its number of non-empty rows for the ``seq_mean_*`` modes), so the summed
micro-batch losses / gradients equal the loss / gradient of the whole mini-batch in one piece
(gradient accumulation is exact, not an average of per-micro-batch means), and zero-mask
padding rows change nothing.

Mini-batch keys (all ``[n_micro, mb, T]``): ``tokens`` int32, ``attention_mask`` int32,
``loss_mask`` f32, ``old_logprobs``, ``advantages``; ``ref_logprobs`` (KL loss); ``returns``,
``old_values`` (critic); ``positions`` int32 and ``segment_ids`` int32 (optional, packed rows:
RoPE positions restarting at 0 in each sequence, and the sequence id of every token, which
attends only to earlier-or-same tokens with its id; 0 may mark padding). The policy loss
passes them to the model (``logprobs.model_hidden``); the critic does not take them yet.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentrl_jax.algorithms import actor_loss, value_loss
from agentrl_jax.algorithms.masked import as_mask
from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.logprobs import logprobs_from_hidden, model_hidden, option_limit
from agentrl_jax.learner.offload import LeafwiseUpdate
from agentrl_jax.learner.optim import optimizer_parts
from agentrl_jax.learner.scored import scored_logprobs_from_hidden
from agentrl_jax.models.lm_head import lm_head_f32
from agentrl_jax.sharding.activations import activation_mesh
from agentrl_jax.sharding.rules import BATCH_AXES

Array = jax.Array

#: metrics that are already normalised by the mini-batch denominator: summed over micro-batches.
_ADDITIVE = ("pg_loss", "kl_loss", "entropy", "total_loss", "vf_loss", "nll")
_MAXED = ("ratio_max",)
_MINNED = ("ratio_min",)


def minibatch_sharding(mesh: Mesh) -> NamedSharding:
    """``[n_micro, micro_batch, T]``: rows of each micro-batch over data x fsdp."""
    return NamedSharding(mesh, P(None, BATCH_AXES, None))


def loss_denominator(loss_mask: Array, agg: str) -> Array:
    """The whole mini-batch's normaliser for ``aggregate_loss(..., denom=)``."""
    m = as_mask(loss_mask)
    if agg.replace("-", "_") == "token_mean":
        return jnp.maximum(jnp.sum(m), 1.0)
    return jnp.maximum(jnp.sum(jnp.any(m > 0, axis=-1).astype(jnp.float32)), 1.0)


def combine_metrics(acc: dict[str, Array], new: dict[str, Array], weight: Array
                    ) -> dict[str, Array]:
    """Micro-batch metrics ``new`` folded into ``acc`` (sums, max / min, token-weighted
    means; ``weight``: the micro-batch's share of the loss tokens)."""
    out = {}
    for k, v in new.items():
        v = v.astype(jnp.float32)
        if k in _ADDITIVE:
            out[k] = acc[k] + v
        elif k in _MAXED:
            out[k] = jnp.maximum(acc[k], jnp.where(weight > 0, v, -jnp.inf))
        elif k in _MINNED:
            out[k] = jnp.minimum(acc[k], jnp.where(weight > 0, v, jnp.inf))
        else:  # per-token means of one micro-batch: weight by its share of the tokens
            out[k] = acc[k] + weight * v
    return out


def init_metrics(shapes: dict[str, Any]) -> dict[str, Array]:
    """The identity accumulators of :func:`combine_metrics` for metric names ``shapes``."""
    out = {}
    for k in shapes:
        if k in _MAXED:
            out[k] = jnp.array(-jnp.inf, jnp.float32)
        elif k in _MINNED:
            out[k] = jnp.array(jnp.inf, jnp.float32)
        else:
            out[k] = jnp.array(0.0, jnp.float32)
    return out


def cast_params(params, dtype: str, keep_float32: tuple[str, ...] = ("value_head",)):
    """Floating parameters cast to the compute dtype once, at the top of the loss.

    Numerically the same as the casts inside every layer (the model computes in ``dtype``
    anyway), but done on the *sharded* float32 master weights, so FSDP all-gathers move
    compute-dtype (bf16: half the bytes) parameters; gradients flow back through the cast to
    the float32 master weights.
    """
    dt = jnp.dtype(dtype)

    def cast(path, p):
        if not jnp.issubdtype(p.dtype, jnp.floating) or any(
                getattr(k, "key", None) == keep for k in path for keep in keep_float32):
            return p
        return p.astype(dt)
    return jax.tree_util.tree_map_with_path(cast, params)


def policy_loss_fn(graphdef: nnx.GraphDef, config: LearnerConfig, capacity: int | None = None
                   ) -> Callable[[nnx.State, dict[str, Array], Array], tuple[Array, dict]]:
    """``(params, micro_batch [mb, T] arrays, denom) -> (loss, metrics)``.

    ``capacity``: the LM head only at the scored positions (``loss_mask != 0``), at most
    ``capacity`` a row (``scored.py``; the log-probs and entropies elsewhere are 0, and every
    loss term and metric reads them through ``loss_mask``); ``None``: at every position."""
    kl_loss_coef = 0.0 if config.kl_in_reward else config.kl_coef
    with_entropy = bool(config.entropy_coef) or config.entropy_metric

    def fn(params, mb, denom):
        model = nnx.merge(graphdef, cast_params(params, config.dtype))
        hidden = model_hidden(model, mb["tokens"], mb.get("attention_mask"),
                              config.use_attention_mask, positions=mb.get("positions"),
                              segment_ids=mb.get("segment_ids"))
        head = dict(chunk_size=config.logprob_chunk_size, temperature=config.temperature,
                    with_entropy=with_entropy, vocab_size=model.cfg.vocab_size)
        head.update(option_limit(model, mb.get("option_counts")))  # per-turn option limits
        if capacity is None:
            lp, ent = logprobs_from_hidden(hidden, mb["tokens"], lm_head_f32(model), **head)
        else:
            lp, ent = scored_logprobs_from_hidden(hidden, mb["tokens"], mb["loss_mask"],
                                                  lm_head_f32(model), capacity, **head)
        return actor_loss(
            lp, mb.get("old_logprobs"), mb["advantages"], mb["loss_mask"],
            policy_loss=config.policy_loss, ref_logprobs=mb.get("ref_logprobs"),
            kl_coef=kl_loss_coef, kl_estimator=config.kl_estimator, entropy=ent,
            entropy_coef=config.entropy_coef, agg=config.loss_agg_mode,
            max_len=config.loss_max_len, denom=denom, token_weights=mb.get("loss_weights"),
            is_weights=mb.get("is_weights"), **clip)
    clip = config.policy_loss_options()  # the entry's clip numbers, the config's where set
    return fn


def critic_loss_fn(graphdef: nnx.GraphDef, config: LearnerConfig):
    """``(critic_params, micro_batch, denom) -> (value_coef * value_loss, metrics)``."""
    def fn(params, mb, denom):
        critic = nnx.merge(graphdef, cast_params(params, config.dtype))
        values = critic(mb["tokens"], mb["attention_mask"], config.use_attention_mask)
        loss, metrics = value_loss(values, mb["old_values"], mb["returns"], mb["loss_mask"],
                                   clip_range=config.value_clip, agg=config.loss_agg_mode,
                                   max_len=config.loss_max_len, denom=denom)
        return config.value_coef * loss, metrics
    return fn


def pass_rows(config: LearnerConfig, mesh: Mesh) -> int:
    """Rows per forward/backward pass: ``micro_batch_size``, except on CPU, where it is the
    ``data x fsdp`` size (1 on one device).

    On accelerators a micro-batch is one pass (parallel hardware wants the rows together). On
    CPU more rows per pass only add memory (activations scale with the rows; the matmuls of
    one 2048-token row already saturate the cores), and the learner pads a batch to whole
    micro-batches with zero-mask rows (the README's CPU run: 4 rows padded to 8), which
    :func:`_accumulate_grads` skips when they form passes of their own."""
    shards = 1
    for axis in BATCH_AXES:
        shards *= mesh.shape.get(axis, 1)
    if mesh.devices.flat[0].platform != "cpu" or config.micro_batch_size % shards:
        return config.micro_batch_size
    return shards


def split_passes(minibatch: dict[str, Array], rows: int, mesh: Mesh | None) -> dict[str, Array]:
    """``[n_micro, mb, ...]`` arrays -> ``[n_micro * mb / rows, rows, ...]`` passes.

    Pass ``j`` of a micro-batch takes its rows ``j, j + k, j + 2k, ...`` (``k = mb / rows``):
    a micro-batch's rows are split over the batch shards in contiguous blocks, so each pass
    keeps ``rows / shards`` rows on every shard (no resharding). Row order does not matter:
    every loss is normalised by the whole mini-batch's ``denom``."""
    def split(x: Array) -> Array:
        n, mb = x.shape[:2]
        k = mb // rows
        x = x.reshape(n, rows, k, *x.shape[2:]).swapaxes(1, 2)
        x = x.reshape(n * k, rows, *x.shape[3:])
        if mesh is not None and mesh.size > 1:
            spec = P(None, BATCH_AXES, *([None] * (x.ndim - 2)))
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
        return x

    first = next(iter(minibatch.values()))
    if first.shape[1] == rows:
        return minibatch
    return {key: split(x) for key, x in minibatch.items()}


def _accumulate_grads(loss_fn, params, param_shardings, minibatch, denom, token_weight,
                      compute_dtype: str, skip_empty: bool = False):
    """Sum of micro-batch gradients (f32) and combined metrics via ``lax.scan``.

    The master weights are cast to the compute dtype once, before the micro-batch loop, and
    the loss is differentiated with respect to that copy: the gradient of ``cast(p)`` with
    respect to ``p`` is the identity on the (compute-dtype) cotangent, so this is exact, and
    it saves a full read of the f32 weights and write of the cast copy per micro-batch.

    ``skip_empty``: a micro-batch without loss tokens is skipped (``lax.cond``): its loss,
    gradient and metrics are exactly zero (every loss term is masked by ``loss_mask``, and its
    ``token_weight`` of 0 hides it from the max / min / per-token metrics)."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    compute_params = cast_params(params, compute_dtype)
    if param_shardings is not None:
        # keep the cast copy sharded like the master weights, so that FSDP all-gathers move
        # compute-dtype bytes (without this XLA may gather the f32 weights and cast after)
        compute_params = jax.lax.with_sharding_constraint(compute_params, param_shardings)
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if param_shardings is not None:
        zeros = jax.lax.with_sharding_constraint(zeros, param_shardings)
    first = jax.tree.map(lambda x: x[0], minibatch)
    _, metric_shapes = jax.eval_shape(grad_fn, compute_params, first, denom)[0]
    init = (zeros, init_metrics(metric_shapes))

    def accumulate(carry, mb, w):
        gsum, msum = carry
        (_, metrics), grads = grad_fn(compute_params, mb, denom)
        gsum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), gsum, grads)
        if param_shardings is not None:
            gsum = jax.lax.with_sharding_constraint(gsum, param_shardings)
        return gsum, combine_metrics(msum, metrics, w)

    def body(carry, xs):
        mb, w = xs
        if not skip_empty:
            return accumulate(carry, mb, w), None
        has_tokens = jnp.any(as_mask(mb["loss_mask"]) > 0)
        return jax.lax.cond(has_tokens, lambda c: accumulate(c, mb, w), lambda c: c, carry), None

    (grads, metrics), _ = jax.lax.scan(body, init, (minibatch, token_weight))
    return grads, metrics


def make_train_step(*, config: LearnerConfig, mesh: Mesh,
                    policy_graphdef: nnx.GraphDef, policy_tx: optax.GradientTransformation,
                    policy_shardings: Any, policy_opt_shardings: Any,
                    critic_graphdef: nnx.GraphDef | None = None,
                    critic_tx: optax.GradientTransformation | None = None,
                    critic_shardings: Any = None, critic_opt_shardings: Any = None,
                    batch_keys: tuple[str, ...] = (), train_policy: bool = True,
                    train_critic: bool = True, scored_capacity: int | None = None):
    """A jitted ``step(pparams, popt, cparams, copt, minibatch) -> (pparams, popt, cparams,
    copt, metrics)`` with in/out ``NamedSharding``s and donated state buffers.

    Without a critic pass ``None`` for ``cparams`` / ``copt``. ``batch_keys`` lists the
    mini-batch dict's keys (their shardings are ``minibatch_sharding(mesh)``).
    ``scored_capacity``: the policy's LM head only at scored positions (``policy_loss_fn``).

    With ``config.offload_optimizer_state`` the step is not one jitted program:
    :func:`_offloaded_train_step` (same signature, donation and results).
    """
    if config.offload_optimizer_state:
        return _offloaded_train_step(
            config=config, mesh=mesh, policy_graphdef=policy_graphdef,
            policy_shardings=policy_shardings, policy_opt_shardings=policy_opt_shardings,
            critic_graphdef=critic_graphdef, critic_shardings=critic_shardings,
            critic_opt_shardings=critic_opt_shardings, batch_keys=batch_keys,
            train_policy=train_policy, train_critic=train_critic,
            scored_capacity=scored_capacity)
    has_critic = critic_graphdef is not None
    train_critic = train_critic and has_critic
    grads_of = _grads_fn(config, mesh, policy_graphdef, critic_graphdef, scored_capacity)
    replicated = NamedSharding(mesh, P())

    def step(pparams, popt, cparams, copt, minibatch):
        with activation_mesh(mesh):
            return _step(pparams, popt, cparams, copt, minibatch)

    def _step(pparams, popt, cparams, copt, minibatch):
        m, grads_and_metrics = grads_of(minibatch)
        metrics: dict[str, Array] = {}
        def optimise(which, params, shardings, opt, tx, prefix):
            grads = grads_and_metrics(which, params, shardings, prefix, metrics)
            updates, opt = tx.update(grads, opt, params)
            return optax.apply_updates(params, updates), opt

        if train_policy:
            pparams, popt = optimise("policy", pparams, policy_shardings, popt, policy_tx,
                                     "actor")
        if train_critic:
            cparams, copt = optimise("critic", cparams, critic_shardings, copt, critic_tx,
                                     "critic")
        metrics["actor/num_tokens"] = jnp.sum(m)
        return pparams, popt, cparams, copt, metrics

    mb_sharding = minibatch_sharding(mesh)
    in_shardings = (policy_shardings, policy_opt_shardings,
                    critic_shardings if has_critic else None,
                    critic_opt_shardings if has_critic else None,
                    {k: mb_sharding for k in batch_keys})
    out_shardings = (policy_shardings, policy_opt_shardings,
                     critic_shardings if has_critic else None,
                     critic_opt_shardings if has_critic else None,
                     replicated)
    return jax.jit(step, in_shardings=in_shardings, out_shardings=out_shardings,
                   donate_argnums=(0, 1, 2, 3))


def _grads_fn(config: LearnerConfig, mesh: Mesh, policy_graphdef: nnx.GraphDef,
              critic_graphdef: nnx.GraphDef | None, scored_capacity: int | None = None):
    """Traced inside a jitted step: ``grads_of(minibatch) -> (loss_mask [n_micro, mb, T],
    grads_and_metrics)``, where ``grads_and_metrics(which, params, shardings, prefix,
    metrics)`` returns the mini-batch gradient of ``which`` (``"policy"`` / ``"critic"``;
    float32, the parameters' tree) and adds its metrics (``prefix/...``, ``prefix/grad_norm``
    = ``global_norm(grads)`` before clipping) to the dict ``metrics``."""
    rows = pass_rows(config, mesh)
    skip_empty = rows < config.micro_batch_size
    losses = {"policy": policy_loss_fn(policy_graphdef, config, scored_capacity),
              "critic": (critic_loss_fn(critic_graphdef, config)
                         if critic_graphdef is not None else None)}
    agg = config.loss_agg_mode

    def grads_of(minibatch):
        m = as_mask(minibatch["loss_mask"])  # [n_micro, mb, T]
        denom = loss_denominator(m.reshape(-1, m.shape[-1]), agg)
        passes = split_passes(minibatch, rows, mesh)  # [n_pass, rows, T]
        tokens_per_pass = jnp.sum(as_mask(passes["loss_mask"]), axis=(1, 2))
        token_weight = tokens_per_pass / jnp.maximum(jnp.sum(tokens_per_pass), 1.0)

        def grads_and_metrics(which, params, shardings, prefix, metrics):
            grads, ms = _accumulate_grads(losses[which], params, shardings, passes, denom,
                                          token_weight, config.dtype, skip_empty)
            metrics.update({f"{prefix}/{k}": v for k, v in ms.items()})
            metrics[f"{prefix}/grad_norm"] = optax.global_norm(grads)
            return grads
        return m, grads_and_metrics
    return grads_of


def _offloaded_train_step(*, config: LearnerConfig, mesh: Mesh,
                          policy_graphdef: nnx.GraphDef, policy_shardings: Any,
                          policy_opt_shardings: Any, critic_graphdef: nnx.GraphDef | None,
                          critic_shardings: Any, critic_opt_shardings: Any,
                          batch_keys: tuple[str, ...], train_policy: bool, train_critic: bool,
                          scored_capacity: int | None = None):
    """``make_train_step`` with ``offload_optimizer_state``: the optimiser states are in
    pinned host memory (``*_opt_shardings``), so the step is a Python function of the same
    signature and donation: one jitted call for the gradients and metrics
    (``grads(pparams, cparams, minibatch) -> (pgrads, cgrads, metrics)``: the fused step
    without its optimiser update), then ``offload.LeafwiseUpdate`` for the policy and the
    critic (a host loop of per-leaf jitted calls). The transformations are
    ``optim.make_optimizer(config)``'s (the critic's with ``peak_lr=critic_learning_rate``)."""
    has_critic = critic_graphdef is not None
    train_critic = train_critic and has_critic
    grads_of = _grads_fn(config, mesh, policy_graphdef, critic_graphdef, scored_capacity)

    def grads(pparams, cparams, minibatch):
        with activation_mesh(mesh):
            m, grads_and_metrics = grads_of(minibatch)
            metrics: dict[str, Array] = {}
            pgrads = (grads_and_metrics("policy", pparams, policy_shardings, "actor", metrics)
                      if train_policy else None)
            cgrads = (grads_and_metrics("critic", cparams, critic_shardings, "critic", metrics)
                      if train_critic else None)
            metrics["actor/num_tokens"] = jnp.sum(m)
            return pgrads, cgrads, metrics

    grads_jit = jax.jit(grads, in_shardings=(policy_shardings,
                                             critic_shardings if has_critic else None,
                                             {k: minibatch_sharding(mesh) for k in batch_keys}),
                        out_shardings=(policy_shardings if train_policy else None,
                                       critic_shardings if train_critic else None,
                                       NamedSharding(mesh, P())))
    pol_update = (LeafwiseUpdate(optimizer_parts(config), policy_shardings,
                                 policy_opt_shardings) if train_policy else None)
    crit_update = (LeafwiseUpdate(optimizer_parts(config, config.critic_learning_rate),
                                  critic_shardings, critic_opt_shardings)
                   if train_critic else None)

    def step(pparams, popt, cparams, copt, minibatch):
        pgrads, cgrads, metrics = grads_jit(pparams, cparams, minibatch)
        if pol_update is not None:
            pparams, popt, _ = pol_update(pparams, popt, pgrads)
        if crit_update is not None:
            cparams, copt, _ = crit_update(cparams, copt, cgrads)
        return pparams, popt, cparams, copt, metrics
    return step


__all__ = ["make_train_step", "minibatch_sharding", "loss_denominator", "policy_loss_fn",
           "critic_loss_fn", "pass_rows", "split_passes", "combine_metrics", "init_metrics"]
