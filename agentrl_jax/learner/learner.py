"""``Learner``: policy (+ critic, + frozen reference) parameters, optimiser states and the
jitted functions that update them from rollout batches.

``update(batch, options)`` takes a ``batch.RolloutBatch`` (its docstring gives every array's
shape; a dict of the same arrays is accepted) and ``batch.UpdateOptions``, and runs
``update.UpdatePipeline``: place the batch on the device once, old / reference log-probs and
critic values in forward-only passes, the KL penalty, advantages, a device-side shuffle, then
``epochs`` x ``mini_batches`` optimiser steps over padded or packed rows (``layouts.py``).
Returns a flat ``dict[str, float]`` of metrics.

Multi-process runs (``jax.distributed.initialize()``): every process passes the same global
batch, or (``UpdateOptions.process_local``) only its own rows, padded to the agreed largest
shape, with losses normalised by the global token count and group advantages over the global
batch; docs/LEARNER.md ("Multi-process batches") states the contract.

Every method that takes a batch is a collective in a multi-process run: all processes must
call it in the same order.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from agentrl_jax.learner.batch import RolloutBatch, UpdateOptions
from agentrl_jax.learner.checkpoint import Checkpointer
from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.jit_cache import cached
from agentrl_jax.learner.critic import ValueModel, critic_from_policy
from agentrl_jax.learner.metrics import MetricsWriter, Throughput
from agentrl_jax.learner.offload import init_opt_state, offload_parts, opt_state_shardings
from agentrl_jax.learner.optim import make_optimizer
from agentrl_jax.learner import passes
from agentrl_jax.learner.packed_step import PackedSteps
from agentrl_jax.learner.passes import announced
from agentrl_jax.learner.scored import ScoredCapacity
from agentrl_jax.learner.shapes import LearnerShapes
from agentrl_jax.learner.token_space import PackedTokenRows
from agentrl_jax.learner.train_step import make_train_step, minibatch_sharding
from agentrl_jax.learner.update import UpdatePipeline
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.sharding.mesh import mesh_from_config
from agentrl_jax.sharding.placement import (agree_max, check_process_local_layout,
                                            place_global, place_process_local)
from agentrl_jax.sharding.rules import batch_sharding, state_shardings

Batch = Mapping[str, Any]

def _abstract(module_fn):
    return nnx.eval_shape(module_fn)


def _copy_tree(tree, dtype=None):
    """A real copy (new buffers; never aliased by donation), optionally cast."""
    return jax.tree.map(lambda x: jnp.array(x, dtype=dtype or x.dtype, copy=True), tree)


def _local_mode(process_local: bool) -> bool:
    """Whether batches hold only this process's rows (``process_local`` with > 1 process;
    with one process the local rows are the global batch)."""
    return bool(process_local) and jax.process_count() > 1



class Learner:
    """Holds and updates the policy (and critic / reference); see the module docstring.

    Args:
      model: the initial policy (get the current one from ``policy_model()``). In a
        multi-process run every process passes the same model (same parameter values).
      config: ``LearnerConfig`` or a dict of its fields.
      mesh: device mesh (default: ``mesh_from_config(config.mesh)`` over all devices).
      reference: frozen reference policy for the KL term (default: a copy of ``model``).
      critic: value model (default: ``critic_from_policy(model)`` when the config needs one).
      checkpoint_dir / max_to_keep / async_checkpoint: orbax checkpointing (optional).
      log_dir: tensorboardX directory (optional); ``metrics_jsonl``: JSON-lines copy.
      copy_model: copy the model's parameters (default). ``False`` adopts the arrays as they
        are (no second copy in device memory; they are donated by the first step, so
        ``model`` is unusable afterwards).

    With ``config.offload_optimizer_state`` the optimiser states (``opt_state``,
    ``critic_opt_state``) live in pinned host memory (``opt_shardings`` have
    ``memory_kind="pinned_host"``), both update paths update them with a host loop of
    per-parameter-leaf jitted calls (``offload.LeafwiseUpdate``), ``save`` / ``restore`` keep
    them there, and an optimiser step first waits for an in-flight async save and, after a
    save or a restore, works on fresh copies of the states (:meth:`before_donating_opt_state`);
    construction raises ``ValueError`` on a backend without that memory kind.
    """

    def __init__(self, model: CausalLM, config: LearnerConfig | Mapping[str, Any] | None = None,
                 *, mesh: Mesh | None = None, reference: CausalLM | None = None,
                 critic: ValueModel | None = None, checkpoint_dir: str | None = None,
                 max_to_keep: int | None = 3, async_checkpoint: bool = True,
                 log_dir: str | None = None, metrics_jsonl: str | None = None,
                 copy_model: bool = True):
        if config is None:
            config = LearnerConfig()
        elif not isinstance(config, LearnerConfig):
            config = LearnerConfig.from_dict(config)
        self.config = config
        self.mesh = mesh if mesh is not None else mesh_from_config(config.mesh)
        # what the programs are compiled for (shapes.py): graph, shardings, optimiser
        params = nnx.state(model, nnx.Param)
        self.shapes = LearnerShapes.build(model.cfg, config, self.mesh, params)
        self.batch_shards = self.shapes.batch_shards
        self.logprob_batch_size = self.shapes.logprob_batch_size
        self.model_config: ModelConfig = self.shapes.model_config
        self.graphdef = self.shapes.graphdef
        self.param_shardings = self.shapes.param_shardings
        self.tx, self.schedule = self.shapes.tx, self.shapes.schedule
        self.opt_shardings = self.shapes.opt_shardings

        # reference and critic are built from the model before its buffers can be donated
        self.ref_params = None
        if config.use_reference:
            ref_src = nnx.state(reference, nnx.Param) if reference is not None else params
            self.ref_params = jax.device_put(_copy_tree(ref_src, jnp.dtype(config.reference_dtype)),
                                             self.param_shardings)
        self.critic_graphdef = self.critic_params = self.critic_opt_state = None
        self.critic_shardings = self.critic_opt_shardings = self.critic_tx = None
        if config.use_critic:
            if critic is None:
                critic = critic_from_policy(model, seed=config.seed)
            self.critic_graphdef = nnx.split(
                _abstract(lambda: ValueModel(self.model_config, nnx.Rngs(0))), nnx.Param)[0]
            cparams = nnx.state(critic, nnx.Param)
            self.critic_shardings = state_shardings(cparams, self.mesh)
            self.critic_tx, self.critic_schedule = make_optimizer(
                config, peak_lr=config.critic_learning_rate)
            self.critic_opt_shardings = opt_state_shardings(config, state_shardings(
                jax.eval_shape(self.critic_tx.init, cparams), self.mesh))
            self.critic_params = jax.device_put(_copy_tree(cparams), self.critic_shardings)
            self.critic_opt_state = init_opt_state(
                self.critic_tx, offload_parts(config, config.critic_learning_rate),
                self.critic_params, self.critic_opt_shardings)

        self.params = jax.device_put(_copy_tree(params) if copy_model else params,
                                     self.param_shardings)
        self.opt_state = init_opt_state(self.tx, offload_parts(config), self.params,
                                        self.opt_shardings)
        self.update_step = 0  # completed update() calls (rollout batches)
        self.scored_capacity = ScoredCapacity(config.scored_lm_head, config.scored_capacity_min)
        # the packed update's token-space rows (token_space.py): kept, only grows
        self.token_rows = PackedTokenRows()

        self.checkpointer = (Checkpointer(checkpoint_dir, max_to_keep=max_to_keep,
                                          async_save=async_checkpoint)
                             if checkpoint_dir else None)
        # offload_optimizer_state: the host-resident states were handed to orbax (a save or a
        # restore) and may still be referenced by it (see before_donating_opt_state)
        self._opt_state_shared = False
        self.writer = MetricsWriter(log_dir, metrics_jsonl) if (log_dir or metrics_jsonl) else None
        self.throughput = Throughput(self.model_config, num_devices=self.mesh.size,
                                     device_kind=self.mesh.devices.flat[0].device_kind)
        self.cfg_key = self.shapes.cfg_key

    # ------------------------------------------------------------------ jitted functions
    def logprob_fn(self, params_dtype: str, capacity: int | None = None,
                   with_options: bool = False):
        """``passes.logprob_fn`` for parameters of ``params_dtype``."""
        return self.shapes.logprob_fn(params_dtype, capacity, with_options)

    def packed_logprob_fn(self, params_dtype: str, capacity: int | None = None,
                          with_options: bool = False):
        """``passes.packed_logprob_fn`` for parameters of ``params_dtype``."""
        return self.shapes.packed_logprob_fn(params_dtype, capacity, with_options)

    def row_sharding(self):
        """``[rows, T]`` arrays: rows over data x fsdp."""
        return self.shapes.row_sharding()

    def packed_steps(self, batch_keys: tuple[str, ...], capacity: int | None = None
                     ) -> PackedSteps:
        """``LearnerShapes.packed_steps``."""
        return self.shapes.packed_steps(batch_keys, capacity)

    def value_fn(self):
        """``passes.value_fn`` of the critic."""
        return passes.value_fn(self.critic_graphdef, self.mesh, self.critic_shardings,
                               self.config.use_attention_mask)

    def train_step(self, batch_keys: tuple[str, ...], train_policy: bool, train_critic: bool,
                   capacity: int | None = None):
        key = ("train", self.graphdef, self.critic_graphdef, self.cfg_key, self.mesh, batch_keys,
               train_policy, train_critic, capacity)
        return cached(key, lambda: announced(make_train_step(
            config=self.config, mesh=self.mesh, policy_graphdef=self.graphdef, policy_tx=self.tx,
            policy_shardings=self.param_shardings, policy_opt_shardings=self.opt_shardings,
            critic_graphdef=self.critic_graphdef, critic_tx=self.critic_tx,
            critic_shardings=self.critic_shardings, critic_opt_shardings=self.critic_opt_shardings,
            batch_keys=batch_keys, train_policy=train_policy, train_critic=train_critic,
            scored_capacity=capacity),
            "the train step", key_args=(4,)))

    def before_donating_opt_state(self) -> None:
        """Called before every optimiser step (which donates the optimiser states): with
        ``offload_optimizer_state``, wait for an in-flight async checkpoint save, and after a
        save or a restore give the step fresh copies of the pinned-host states. Orbax keeps
        references to the host buffers it wrote or read, even once the save has finished, and
        donating such a buffer fails on GPU (``INVALID_ARGUMENT: Donation requested for buffer
        with external reference``; seen on an H100 with and without the wait). The copy is a
        host-to-host ``device_put`` per leaf (no device memory), once per checkpoint: host RAM
        holds two copies of the moments until orbax lets go of the old ones. Without offload
        the states are device arrays, which the save has copied to the host before returning:
        nothing to do (as before)."""
        if not self.config.offload_optimizer_state:
            return
        if self.checkpointer is not None:
            self.checkpointer.wait()
        if self._opt_state_shared:
            self.opt_state = _fresh_copy(self.opt_state)
            if self.critic_opt_state is not None:
                self.critic_opt_state = _fresh_copy(self.critic_opt_state)
            self._opt_state_shared = False

    # ------------------------------------------------------------------ process-local rows
    def require_process_local_layout(self) -> int:
        """Process-local batches: the number of processes ``P``; raises unless the batch
        sharding gives every process distinct rows and ``P`` divides the row counts."""
        n_proc = jax.process_count()
        for name, n in (("micro_batch_size", self.config.micro_batch_size),
                        ("logprob_batch_size", self.logprob_batch_size)):
            if n % n_proc:
                raise ValueError(f"process_local=True: {name}={n} must be a multiple of the "
                                 f"number of processes {n_proc}")
        check_process_local_layout(batch_sharding(self.mesh, 2), (self.batch_shards, 1))
        return n_proc

    def update(self, batch: RolloutBatch | Batch, options: UpdateOptions | None = None
               ) -> dict[str, float]:
        """One RL update from a rollout batch; returns metrics (also written to the log
        unless ``options.log`` is false).

        Packed rows (``config.pack_length > 0``, single-process batches, no critic) or rows
        padded to length buckets: ``update.UpdatePipeline``. ``options.process_local``:
        ``batch`` holds only this process's rows (see the module docstring: group ids
        globally unique, each group on one process); the metrics describe the global batch.
        With process-local batches every process learns of any process's invalid batch (and
        raises), so none is left waiting in a collective."""
        if options is not None and not isinstance(options, UpdateOptions):
            raise TypeError(f"options must be an UpdateOptions (got {options!r})")
        options = options or UpdateOptions()
        local = _local_mode(options.process_local)
        err: Exception | None = None
        try:
            batch = RolloutBatch.from_mapping(batch)
            batch.validate(right_padded=not self.config.use_attention_mask)
        except (KeyError, ValueError) as e:
            err = e
        if local and agree_max(int(err is not None)):
            raise err or ValueError("the batch of another process failed validation")
        if err is not None:
            raise err
        metrics = UpdatePipeline(self, batch, local)()
        if options.log and self.writer is not None:
            self.writer.write(self.update_step, metrics)
        return metrics

    def optimiser_step(self, step_fn: Any, minibatch: Mapping[str, jax.Array]
                       ) -> dict[str, jax.Array]:
        """Apply ``step_fn`` (a :meth:`train_step`) to the policy / critic states with a
        placed mini-batch; returns the step's (device) metrics."""
        self.before_donating_opt_state()
        (self.params, self.opt_state, self.critic_params, self.critic_opt_state,
         metrics) = step_fn(self.params, self.opt_state, self.critic_params,
                            self.critic_opt_state, minibatch)
        return metrics

    def apply_packed_gradients(self, steps: PackedSteps, grads: Any) -> jax.Array:
        """``steps.apply`` (one optimiser step from summed gradients) on the policy; returns
        the gradient norm (a device scalar)."""
        self.before_donating_opt_state()
        self.params, self.opt_state, norm = steps.apply(self.params, self.opt_state, grads)
        return norm

    def train_minibatch(self, minibatch: Mapping[str, Any], train_policy: bool = True,
                        train_critic: bool | None = None, process_local: bool = False
                        ) -> dict[str, jax.Array]:
        """One optimiser step on a prepared mini-batch (no padding, advantages or shuffling).

        ``minibatch``: arrays ``[n_micro, micro_batch_size, T]`` with the keys listed in
        ``train_step.py`` (host arrays or global arrays already placed with
        ``minibatch_sharding(self.mesh)``). ``process_local``: host arrays are this
        process's ``[n_micro, micro_batch_size / P, T]`` share of every micro-batch. Returns
        the step's metrics as (replicated) device scalars (not synchronised: call
        ``jax.block_until_ready`` to time it). For benchmarks and custom training loops;
        ``update`` is the normal entry point.
        """
        if train_critic is None:
            train_critic = self.critic_params is not None
        local = _local_mode(process_local)
        n_proc = self.require_process_local_layout() if local else 1
        keys = tuple(sorted(minibatch))
        step_fn = self.train_step(keys, train_policy, train_critic)
        sh = minibatch_sharding(self.mesh)
        mb = {}
        for k, v in minibatch.items():
            if isinstance(v, jax.Array) and not (local and v.is_fully_addressable):
                mb[k] = jax.device_put(v, sh)  # a global array already: reshard if needed
            elif local:
                v = np.asarray(v)
                mb[k] = place_process_local(v, sh, (v.shape[0], v.shape[1] * n_proc,
                                                    *v.shape[2:]))
            else:
                mb[k] = place_global(np.asarray(v), sh)
        return self.optimiser_step(step_fn, mb)

    # ------------------------------------------------------------------ models / export
    def policy_model(self) -> CausalLM:
        """The current policy as an nnx module (compute dtype, sharded float32 parameters)."""
        return nnx.merge(self.graphdef, self.params)

    # ------------------------------------------------------------------ checkpoints
    def _trees(self) -> dict[str, Any]:
        trees = {"params": self.params, "opt_state": self.opt_state}
        if self.critic_params is not None:
            trees["critic_params"] = self.critic_params
            trees["critic_opt_state"] = self.critic_opt_state
        return trees

    def trainer_state(self) -> dict[str, Any]:
        return {"update_step": self.update_step, "seed": self.config.seed,
                "config": self.config.to_dict()}

    def save(self, extra_state: Mapping[str, Any] | None = None, step: int | None = None,
             force: bool = False) -> bool:
        """Checkpoint params, optimiser states and ``trainer_state`` (async).

        ``extra_state``: the caller's JSON-able state (data cursor, curriculum phase, RNG...),
        returned by ``restore`` / ``restore_latest``. ``step`` defaults to ``update_step``.
        """
        if self.checkpointer is None:
            raise ValueError("Learner was built without checkpoint_dir")
        state = {"learner": self.trainer_state(), "extra": dict(extra_state or {})}
        saved = self.checkpointer.save(self.update_step if step is None else step,
                                       self._trees(), state, force=force)
        self._opt_state_shared |= bool(saved)
        return saved

    def restore(self, step: int | None = None) -> dict[str, Any]:
        """Load checkpoint ``step`` (None: latest) into this learner; returns ``extra_state``."""
        if self.checkpointer is None:
            raise ValueError("Learner was built without checkpoint_dir")
        trees, state = self.checkpointer.restore(step, self._trees())
        self.params = trees["params"]
        self.opt_state = trees["opt_state"]
        if self.critic_params is not None:
            self.critic_params = trees["critic_params"]
            self.critic_opt_state = trees["critic_opt_state"]
        self.update_step = int(state.get("learner", {}).get("update_step", 0))
        self._opt_state_shared = True
        return dict(state.get("extra", {}))

    def restore_latest(self) -> dict[str, Any] | None:
        """Resume from the newest checkpoint if there is one (returns its ``extra_state``),
        else leave the learner as built and return ``None``."""
        if self.checkpointer is None or self.checkpointer.latest_step() is None:
            return None
        return self.restore(None)

    def wait(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.wait()

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        if self.writer is not None:
            self.writer.close()


def _fresh_copy(tree: Any) -> Any:
    """A copy of every array of ``tree`` in its own sharding and memory (``device_put`` with
    ``may_alias=False``: for pinned-host arrays a host-side copy), so nothing else holds a
    reference to the new buffers."""
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding, may_alias=False), tree)


__all__ = ["Learner"]
