"""The optimiser step over packed rows: fixed-shape micro-batch calls, one compile per run.

``train_step.make_train_step`` scans over a mini-batch's ``n_micro`` micro-batches inside one
jitted call, so every new ``n_micro`` or padded length is a new program. With packed rows
(``packing.py``) every micro-batch is ``[micro_batch_size, pack_length]`` whatever the rollout
produced, and a mini-batch is any number of them. This module splits the step in two jitted
functions that never change shape:

    accumulate(params, grad_sum, metric_sum, micro_batch) -> grad_sum, metric_sum   (donated)
    apply(params, opt_state, grad_sum) -> params, opt_state, grad_norm               (donated)

and the learner calls ``accumulate`` once per micro-batch, then ``apply`` once per optimiser
step. With ``offload_optimizer_state``, ``opt_state`` stays in pinned host memory and
``apply`` is not one jitted program but ``offload.LeafwiseUpdate`` (same signature and
donation): a jitted clip over the whole gradient tree, then a host loop of one jitted call per
parameter leaf, each bringing only that leaf's moments to the device. The loss of a
micro-batch is ``sum(l * token_weights)`` with weights normalised over the whole mini-batch
(``algorithms.aggregation_weights``), so the summed micro-batch gradients are exactly the
mini-batch gradient, for every loss aggregation mode.

Micro-batch keys (``[micro_batch_size, pack_length]``): ``tokens``, ``positions``,
``segment_ids`` (int32), ``loss_mask``, ``loss_weights``, ``old_logprobs``, ``advantages``
(float32); optional ``ref_logprobs`` (KL loss) and ``is_weights`` (truncated importance
sampling). ``token_share`` (a scalar: this micro-batch's share of the mini-batch's loss
tokens) weights per-token-mean metrics.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentrl_jax.compile_notice import Announced
from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.offload import LeafwiseUpdate, offload_parts
from agentrl_jax.learner.train_step import (cast_params, combine_metrics, init_metrics,
                                             policy_loss_fn)
from agentrl_jax.sharding.activations import activation_mesh
from agentrl_jax.sharding.rules import BATCH_AXES


def micro_sharding(mesh: Mesh) -> NamedSharding:
    """``[micro_batch_size, T]``: rows over data x fsdp."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


class PackedSteps:
    """The two jitted functions (see the module docstring) for one model / config / mesh."""

    def __init__(self, *, config: LearnerConfig, mesh: Mesh, graphdef: nnx.GraphDef,
                 tx: optax.GradientTransformation, param_shardings: Any, opt_shardings: Any,
                 batch_keys: tuple[str, ...], scored_capacity: int | None = None):
        self.batch_keys = batch_keys
        self.scored_capacity = scored_capacity  # LM head at <= this many scored positions a row
        loss_fn = policy_loss_fn(graphdef, config, scored_capacity)
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        replicated = NamedSharding(mesh, P())
        mb_sh = {k: micro_sharding(mesh) for k in batch_keys}

        def metric_shapes(params, micro):
            return jax.eval_shape(grad_fn, cast_params(params, config.dtype), micro, 1.0)[0][1]

        self.metric_shapes = metric_shapes  # (params, micro) -> the step's metric shapes
        self._shapes: dict[str, Any] | None = None

        def accumulate(params, grad_sum, metric_sum, micro, token_share):
            with activation_mesh(mesh):
                compute = jax.lax.with_sharding_constraint(
                    cast_params(params, config.dtype), param_shardings)
                (_, metrics), grads = grad_fn(compute, micro, 1.0)
                grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads)
                grad_sum = jax.lax.with_sharding_constraint(grad_sum, param_shardings)
                return grad_sum, combine_metrics(metric_sum, metrics, token_share)

        def apply(params, opt_state, grad_sum):
            with activation_mesh(mesh):
                norm = optax.global_norm(grad_sum)
                updates, opt_state = tx.update(grad_sum, opt_state, params)
                return optax.apply_updates(params, updates), opt_state, norm

        self.accumulate = Announced(jax.jit(
            accumulate, in_shardings=(param_shardings, param_shardings, replicated, mb_sh,
                                      replicated),
            out_shardings=(param_shardings, replicated), donate_argnums=(1, 2)), (3,),
            lambda args: "the packed train step for rows of "
                         f"{getattr(args[3].get('tokens'), 'shape', ('?',))[-1]} tokens"
                         + (f" (LM head at {scored_capacity} scored positions a row)"
                            if scored_capacity is not None else ""))
        parts = offload_parts(config)
        if parts is None:
            self.apply = jax.jit(apply, in_shardings=(param_shardings, opt_shardings,
                                                      param_shardings),
                                 out_shardings=(param_shardings, opt_shardings, replicated),
                                 donate_argnums=(0, 1, 2))
        else:  # opt_state in pinned host memory: a host loop of per-leaf jitted calls
            self.apply = LeafwiseUpdate(parts, param_shardings, opt_shardings)
        self._zeros = jax.jit(lambda p: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32),
                                                     p), out_shardings=param_shardings)
        self._mesh = mesh

    def zero_state(self, params: Any, micro: dict[str, Any]) -> tuple[Any, dict[str, jax.Array]]:
        """Fresh (grad_sum, metric_sum) accumulators for one optimiser step. The metric sums
        are placed replicated, as ``accumulate`` returns them: the first micro-batch's call
        and the later ones then share one compiled program (uncommitted scalars here compiled
        ``accumulate`` a second time for the second micro-batch)."""
        if self._shapes is None:
            self._shapes = self.metric_shapes(params, micro)
        return self._zeros(params), self.metric_zeros(self._shapes)

    def metric_zeros(self, names: Any) -> dict[str, jax.Array]:
        """``init_metrics(names)`` placed replicated over the mesh."""
        return jax.device_put(init_metrics(names), NamedSharding(self._mesh, P()))


__all__ = ["PackedSteps", "micro_sharding"]
