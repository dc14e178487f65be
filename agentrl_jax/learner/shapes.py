"""What the learner's programs are compiled for, known before any weight is loaded.

A :class:`LearnerShapes` is built from the policy's ``ModelConfig``, the ``LearnerConfig`` and
the mesh alone: the compute-dtype graph, the parameter and optimiser-state shardings, the
optimiser, the rows of a forward-only call and the key of jit's cache (``jit_cache.py``). The
``Learner`` builds its own from the model it is given and gets its jitted functions from it;
``ahead.py`` builds one from the config before the model is loaded, to compile the first
update's programs while the weights load. Both get the same jitted function objects from the
cache when the two agree, so what one compiles the other runs.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from agentrl_jax.learner import passes
from agentrl_jax.learner.config import LearnerConfig, model_attention_impl
from agentrl_jax.learner.jit_cache import cached
from agentrl_jax.learner.offload import opt_state_shardings, require_host_memory
from agentrl_jax.learner.optim import make_optimizer
from agentrl_jax.learner.packed_step import PackedSteps
from agentrl_jax.learner.scored import ScoredCapacity
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.sharding.rules import BATCH_AXES, batch_sharding, state_shardings


def abstract_params(model_config: ModelConfig) -> nnx.State:
    """The ``nnx.Param`` state of ``CausalLM(model_config)`` as ``jax.ShapeDtypeStruct``
    leaves (shapes and ``param_dtype``), nothing allocated."""
    return nnx.state(nnx.eval_shape(lambda: CausalLM(model_config, nnx.Rngs(0))), nnx.Param)


@dataclasses.dataclass(frozen=True, eq=False)
class LearnerShapes:
    """The learner's program-defining settings (see the module docstring). ``model_config``:
    the policy's config with the learner's compute dtype, remat and attention;
    ``param_shardings`` / ``opt_shardings``: states of ``NamedSharding``; ``batch_shards``: the
    data x fsdp size that divides every row count."""

    config: LearnerConfig
    mesh: Mesh
    model_config: ModelConfig
    graphdef: nnx.GraphDef
    param_shardings: Any
    tx: optax.GradientTransformation
    schedule: Any
    opt_shardings: Any
    batch_shards: int
    logprob_batch_size: int
    cfg_key: str

    @classmethod
    def build(cls, policy_config: ModelConfig, config: LearnerConfig, mesh: Mesh,
              params: Any = None) -> "LearnerShapes":
        """From the policy's ``ModelConfig`` (``params``: its parameter state, real or
        abstract; default :func:`abstract_params`). Raises ``ValueError`` for row counts the
        mesh does not divide, or an offloaded optimiser state on a backend without host
        memory."""
        batch_shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
        if config.micro_batch_size % batch_shards:
            raise ValueError(f"micro_batch_size={config.micro_batch_size} must be a multiple of "
                             f"the data x fsdp mesh size {batch_shards}")
        # default rows per forward-only call: a micro-batch; on CPU one row per batch shard, so
        # that the padding rows of a padded batch form calls of their own, which are skipped
        on_cpu = mesh.devices.flat[0].platform == "cpu"
        logprob_batch_size = config.logprob_batch_size or (
            batch_shards if on_cpu else config.micro_batch_size)
        if logprob_batch_size % batch_shards:
            raise ValueError(f"logprob_batch_size={logprob_batch_size} must be a multiple "
                             f"of the data x fsdp mesh size {batch_shards}")
        # the policy: a compute-dtype graph over float32 (param_dtype) parameters, sharded
        model_config = policy_config.replace(
            dtype=config.dtype, remat=config.remat, remat_policy=config.remat_policy,
            attention_impl=model_attention_impl(config.attention_impl))
        graphdef = nnx.split(nnx.eval_shape(lambda: CausalLM(model_config, nnx.Rngs(0))),
                             nnx.Param)[0]
        if params is None:
            params = abstract_params(policy_config)
        param_shardings = state_shardings(params, mesh)
        if config.offload_optimizer_state:  # fail before any state is built
            require_host_memory(mesh)
        tx, schedule = make_optimizer(config)
        # offload_optimizer_state: the same shardings in pinned host memory (offload.py)
        opt_shardings = opt_state_shardings(
            config, state_shardings(jax.eval_shape(tx.init, params), mesh))
        return cls(config=config, mesh=mesh, model_config=model_config, graphdef=graphdef,
                   param_shardings=param_shardings, tx=tx, schedule=schedule,
                   opt_shardings=opt_shardings, batch_shards=batch_shards,
                   logprob_batch_size=logprob_batch_size,
                   cfg_key=json.dumps(config.to_dict(), sort_keys=True, default=str))

    # ------------------------------------------------------------------ jitted functions
    def logprob_fn(self, params_dtype: str, capacity: int | None = None,
                   with_options: bool = False):
        """``passes.logprob_fn`` for parameters of ``params_dtype``."""
        return passes.logprob_fn(self.graphdef, self.mesh, self.param_shardings, self.config,
                                 params_dtype, capacity, with_options)

    def packed_logprob_fn(self, params_dtype: str, capacity: int | None = None,
                          with_options: bool = False):
        """``passes.packed_logprob_fn`` for parameters of ``params_dtype`` (``with_options``:
        it takes the per-turn option limits, ``option_counts``, as one more argument)."""
        return passes.packed_logprob_fn(self.graphdef, self.mesh, self.param_shardings,
                                        self.config, params_dtype, capacity, with_options)

    def row_sharding(self):
        """``[rows, T]`` arrays: rows over data x fsdp."""
        return batch_sharding(self.mesh, 2)

    def packed_steps(self, batch_keys: tuple[str, ...], capacity: int | None = None
                     ) -> PackedSteps:
        """The packed update's gradient accumulation and optimiser apply for micro-batches of
        ``batch_keys`` (``packed_step.py``), one per scored-head ``capacity``."""
        key = ("packed", self.graphdef, self.cfg_key, self.mesh, batch_keys, capacity)
        return cached(key, lambda: PackedSteps(
            config=self.config, mesh=self.mesh, graphdef=self.graphdef, tx=self.tx,
            param_shardings=self.param_shardings, opt_shardings=self.opt_shardings,
            batch_keys=batch_keys, scored_capacity=capacity))


def _placed(tree: Any, shardings: Any) -> Any:
    """``tree``'s leaves as ``jax.ShapeDtypeStruct`` in the matching leaf of ``shardings``."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def abstract_of(tree: Any) -> Any:
    """``tree``'s arrays as ``jax.ShapeDtypeStruct`` (shape, dtype, sharding)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


class AbstractLearner:
    """A ``Learner`` before its weights: the shapes, dtypes and shardings of the states the
    ``Learner`` over a model of ``policy_config`` will hold (``params``, ``opt_state``,
    ``ref_params``; ``jax.ShapeDtypeStruct`` leaves, nothing allocated) and its
    :class:`LearnerShapes`. What ``ahead.compile_first_update`` needs, so the first update's
    programs can compile while the model loads; :meth:`differences` then says whether the
    loaded learner is the one described (else those compiles were for other programs).
    ``opt_state`` is ``None`` with ``offload_optimizer_state`` (its apply is a host loop)."""

    def __init__(self, policy_config: ModelConfig, config: LearnerConfig, mesh: Mesh):
        self.config = config
        self.shapes = LearnerShapes.build(policy_config, config, mesh)
        params = abstract_params(policy_config)
        self.params = _placed(params, self.shapes.param_shardings)
        self.opt_state = None if config.offload_optimizer_state else _placed(
            jax.eval_shape(self.shapes.tx.init, params), self.shapes.opt_shardings)
        self.ref_params = None
        if config.use_reference:
            ref_dtype = np.dtype(config.reference_dtype)
            self.ref_params = _placed(
                jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, ref_dtype), params),
                self.shapes.param_shardings)
        self.scored_capacity = ScoredCapacity(config.scored_lm_head, config.scored_capacity_min)

    def differences(self, learner: Any) -> list[str]:
        """The parts in which ``learner`` (a built ``Learner``) differs from this description:
        ``[]`` when every program compiled from it is one ``learner`` runs."""
        mine, theirs = self.shapes, learner.shapes
        checks = {
            "graph": mine.graphdef == theirs.graphdef,
            "learner config": mine.cfg_key == theirs.cfg_key,
            "mesh": mine.mesh == theirs.mesh,
            "rows per log-prob call": mine.logprob_batch_size == theirs.logprob_batch_size,
            "parameters": same_tree(self.params, abstract_of(learner.params)),
            "optimiser state": (self.opt_state is None
                                or same_tree(self.opt_state, abstract_of(learner.opt_state))),
            "reference": (self.ref_params is None) == (learner.ref_params is None) and (
                self.ref_params is None
                or same_tree(self.ref_params, abstract_of(learner.ref_params))),
            "scored capacity": (self.scored_capacity.current(self.config.pack_length)
                                == learner.scored_capacity.current(self.config.pack_length)),
        }
        return [name for name, same in checks.items() if not same]


def same_tree(a: Any, b: Any) -> bool:
    """Whether two trees (of ``jax.ShapeDtypeStruct`` and scalars) have one structure and equal
    leaves (shape, dtype and sharding for the structs)."""
    return (jax.tree.structure(a) == jax.tree.structure(b)
            and all(x == y for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))


__all__ = ["AbstractLearner", "LearnerShapes", "abstract_of", "abstract_params", "same_tree"]
