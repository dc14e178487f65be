"""Optimiser-state offload (``LearnerConfig.offload_optimizer_state``): the optax state lives in
pinned host memory and visits the device one parameter leaf at a time, inside the jitted update
(the "optimizer offload" of DeepSpeed ZeRO-Offload / verl, with the update itself still on the
accelerator).

Placement: every leaf of the optimiser state (AdamW ``mu`` and ``nu``: float32, the shapes of
the parameters; the step counts: int32 scalars) keeps the sharding it would have on the device,
with ``memory_kind="pinned_host"`` (:func:`host_shardings`): the same shards, in the page-locked
RAM of the process that owns each device, so the copies are plain DMA transfers.

The update (:func:`leafwise_update`, traced inside the learner's jitted ``apply`` /
``train_step``; ``N`` parameters, ``g = grads``, ``p = params``, ``t`` the new step count)::

    g <- clip_by_global_norm(g)                  whole tree, on the device (g is there already)
    for every parameter leaf i, in tree order:
        mu_i, nu_i <- device_put(host mu_i, nu_i)                   host -> device, 8 B / elem
        mu_i <- b1 mu_i + (1 - b1) g_i ;  nu_i <- b2 nu_i + (1 - b2) g_i^2
        p_i  <- p_i - lr(t) (mu_i / (1 - b1^t) / (sqrt(nu_i / (1 - b2^t)) + eps) + wd m_i p_i)
        host mu_i, nu_i <- device_put(mu_i, nu_i)                   device -> host, 8 B / elem
        optimization_barrier: leaf i + 1's update is ordered after leaf i's

(``m_i``: 1 for matrices, 0 for norm scales and biases: ``optim._decay_mask``.)

The arithmetic is optax's own: ``OptimizerParts.adamw.update`` is called on one-leaf trees
(``[g_i]``, ``[p_i]`` and the state sliced to leaf ``i``; the scalar step counts are shared),
which for AdamW is element-wise, so the result is the same as ``tx.update`` on the whole tree.
Traffic per optimiser step: ``8N`` bytes host -> device and ``8N`` back (``2 x 8`` bytes per
parameter: the two float32 moments, each way).

Expected device peak of the update: parameters + gradients (both resident anyway) + the
moments of the leaves in flight. Each leaf's update reads only its own moments, and the barrier
chain keeps XLA from fusing several leaves' updates into one kernel (a horizontal fusion would
need all their moments at once); *when* each host -> device copy starts is left to XLA's
scheduler (on GPU the latency-hiding scheduler issues a copy ahead of its use so that it
overlaps the previous leaves' updates). For a Qwen2.5-7B shape the largest leaves are the
embedding and the LM head, 152064 x 3584 = 545 M parameters: 2 x 2.2 GB of moments in and the
same out, i.e. a few GB in flight instead of 57 GiB resident. Not yet measured on a GPU.
:func:`leafwise_init` creates the state one leaf at a time too (one small jitted call per leaf,
each sending its zeros to the host), so the device never holds the whole state.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import optax
from jax.sharding import Mesh

from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.optim import OptimizerParts, chain_parts, optimizer_parts

HOST = "pinned_host"
DEVICE = "device"
OPTION = "learner.offload_optimizer_state"

UpdateFn = Callable[[Any, Any, Any], tuple[Any, Any]]


# ---------------------------------------------------------------------------- placement
def host_memory_kinds(mesh: Mesh) -> dict[str, list[str]]:
    """``{device: its memory kinds}`` for this process's devices of ``mesh``."""
    mine = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    return {str(d): sorted({m.kind for m in d.addressable_memories()}) for d in mine}


def require_host_memory(mesh: Mesh) -> None:
    """Raise ``ValueError`` naming the option unless every local device of ``mesh`` has the
    ``pinned_host`` memory kind."""
    for device, kinds in host_memory_kinds(mesh).items():
        if HOST not in kinds:
            raise ValueError(
                f"{OPTION}=True keeps the optimiser state in {HOST!r} memory, which device "
                f"{device} does not have (its memory kinds: {kinds}); set {OPTION}=False")


def with_memory_kind(shardings: Any, kind: str) -> Any:
    """The tree of ``NamedSharding`` ``shardings`` with every leaf in memory ``kind``."""
    return jax.tree.map(lambda s: s.with_memory_kind(kind), shardings)


def host_shardings(shardings: Any) -> Any:
    """``shardings`` in pinned host memory (same mesh and partition specs)."""
    return with_memory_kind(shardings, HOST)


def _put(tree: Any, shardings: Any, kind: str) -> Any:
    """Inside jit: move every leaf of ``tree`` to memory ``kind`` of its sharding."""
    return jax.tree.map(lambda x, s: jax.device_put(x, s.with_memory_kind(kind)),
                        tree, shardings)


# ---------------------------------------------------------------------------- state slots
class _Slots:
    """The AdamW state cut into *slots*: the sub-trees with the parameters' tree structure
    (``mu``, ``nu``: one entry per parameter leaf) and the other leaves (step counts: shared by
    every parameter, must be scalars). ``state_def`` is the state's structure with each slot a
    leaf; the state of parameter leaf ``i`` alone is ``state_def`` filled with ``[slot_i]`` for
    the per-parameter slots and the shared values for the others."""

    def __init__(self, state: Any, params_def: jax.tree_util.PyTreeDef):
        self.params_def = params_def
        self.slots, self.state_def = jax.tree.flatten(state, is_leaf=self._is_param_tree)
        self.per_param = [self._is_param_tree(s) for s in self.slots]
        for slot, per_param in zip(self.slots, self.per_param):
            if not per_param and getattr(slot, "ndim", 0) != 0:
                raise ValueError(
                    f"{OPTION}: the optimiser state has a non-scalar leaf of shape "
                    f"{slot.shape} that is not per-parameter; the leaf-wise update supports "
                    "AdamW-like states (per-parameter trees + shared scalars) only")

    def _is_param_tree(self, x: Any) -> bool:
        return self.params_def.num_nodes > 1 and jax.tree.structure(x) == self.params_def

    def leaf_state(self, leaf_values: list[Any], shared: list[Any]) -> Any:
        """The state of one parameter leaf: ``[leaf_values[k]]`` (a one-leaf list, like the
        one-leaf parameter tree ``[p_i]``) for per-parameter slot ``k``, ``shared[k]`` for
        the others."""
        return self.state_def.unflatten([[leaf_values[k]] if pp else shared[k]
                                         for k, pp in enumerate(self.per_param)])

    def split_leaf_state(self, state: Any) -> list[Any]:
        """Inverse of ``leaf_state``: the slot values (per-parameter ones unwrapped)."""
        return [v[0] if pp else v
                for v, pp in zip(self.state_def.flatten_up_to(state), self.per_param)]

    def per_leaf_values(self, tree: Any) -> tuple[list[list[Any]], list[Any]]:
        """``(per_leaf, shared)`` of a tree with this state's structure (the state itself or
        its shardings): per-parameter slots as lists of leaves, the others as they are."""
        values = self.state_def.flatten_up_to(tree)
        per_leaf = [self.params_def.flatten_up_to(v) if pp else None
                    for v, pp in zip(values, self.per_param)]
        shared = [None if pp else v for v, pp in zip(values, self.per_param)]
        return per_leaf, shared

    def assemble(self, per_leaf: list[list[Any]], shared: list[Any]) -> Any:
        """The whole state from per-parameter leaf lists and shared values."""
        return self.state_def.unflatten([self.params_def.unflatten(per_leaf[k]) if pp
                                         else shared[k]
                                         for k, pp in enumerate(self.per_param)])


def _split_chain(parts: OptimizerParts, tree: Any) -> tuple[tuple[Any, ...], Any]:
    """``chain_parts``'s state (or its shardings) -> ``(clip part, AdamW part)``."""
    n_clip = 0 if parts.clip is None else 1
    if not isinstance(tree, tuple) or len(tree) != n_clip + 1:
        raise ValueError(f"{OPTION}: the optimiser state is not chain(clip, adamw)'s "
                         "(optim.make_optimizer); the leaf-wise update cannot split it")
    return tuple(tree[:n_clip]), tree[n_clip]


def _check_structure(parts: OptimizerParts, opt_state: Any, params: Any) -> None:
    """The state must be ``chain_parts(parts)``'s: a custom ``tx`` cannot be offloaded."""
    expected = jax.tree.structure(jax.eval_shape(chain_parts(parts).init, params))
    if jax.tree.structure(opt_state) != expected:
        raise ValueError(f"{OPTION}: the optimiser state does not have the structure of "
                         "optim.make_optimizer's (a custom optax transformation cannot be "
                         "offloaded leaf by leaf)")


# ---------------------------------------------------------------------------- update / init
def _collect(slots: _Slots, values: list[Any], i: int, sh_leaf: list[list[Any]],
             sh_shared: list[Any], out_leaf: list[list[Any]], out_shared: list[Any]) -> None:
    """Inside jit: send the slot ``values`` of parameter leaf ``i`` to pinned host memory,
    appending per-parameter ones to ``out_leaf`` (the shared step counts: from leaf 0, every
    leaf computes the same)."""
    for k, per_param in enumerate(slots.per_param):
        if per_param:
            out_leaf[k].append(_put(values[k], sh_leaf[k][i], HOST))
        elif i == 0:
            out_shared[k] = _put(values[k], sh_shared[k], HOST)


def leafwise_update(parts: OptimizerParts, grads: Any, opt_state: Any, params: Any,
                    opt_shardings: Any) -> tuple[Any, Any]:
    """``(new_params, new_opt_state)`` = ``apply_updates(params, tx.update(grads, opt_state,
    params))`` with ``opt_state`` (and the result) in pinned host memory: traced inside jit;
    see the module docstring for the per-leaf schedule. ``opt_shardings``: the state's
    (host) shardings; ``params`` / ``grads`` are on the device."""
    _check_structure(parts, opt_state, params)
    clip_state, adam_state = _split_chain(parts, opt_state)
    clip_sh, adam_sh = _split_chain(parts, opt_shardings)
    new_clip: tuple[Any, ...] = ()
    if parts.clip is not None:  # needs every gradient (global norm): whole tree, on device
        cs = _put(clip_state[0], clip_sh[0], DEVICE)
        grads, cs = parts.clip.update(grads, cs, params)
        new_clip = (_put(cs, clip_sh[0], HOST),)

    params_def = jax.tree.structure(params)
    p_leaves, g_leaves = params_def.flatten_up_to(params), params_def.flatten_up_to(grads)
    slots = _Slots(adam_state, params_def)
    host_leaf, host_shared = slots.per_leaf_values(adam_state)
    sh_leaf, sh_shared = slots.per_leaf_values(adam_sh)
    shared = [None if s is None else _put(s, sh, DEVICE) for s, sh in zip(host_shared, sh_shared)]
    out_leaf: list[list[Any]] = [[] for _ in slots.per_param]
    out_shared: list[Any] = [None] * len(slots.per_param)
    new_params = []
    carry = None
    for i, (p, g) in enumerate(zip(p_leaves, g_leaves)):
        if carry is not None:  # leaf i's update after leaf i-1's (no cross-leaf fusion)
            (p, g), _ = jax.lax.optimization_barrier(((p, g), carry))
        on_device = [_put(host_leaf[k][i], sh_leaf[k][i], DEVICE) if pp else None
                     for k, pp in enumerate(slots.per_param)]
        updates, new_state = parts.adamw.update([g], slots.leaf_state(on_device, shared), [p])
        new_params.append(optax.apply_updates([p], updates)[0])
        values = slots.split_leaf_state(new_state)
        _collect(slots, values, i, sh_leaf, sh_shared, out_leaf, out_shared)
        carry = (new_params[-1], [v for v, pp in zip(values, slots.per_param) if pp])
    return params_def.unflatten(new_params), (*new_clip, slots.assemble(out_leaf, out_shared))


def leafwise_init(parts: OptimizerParts, params: Any, opt_shardings: Any) -> Any:
    """``chain_parts(parts).init(params)`` placed in ``opt_shardings`` (pinned host memory),
    built one parameter leaf at a time: a Python loop of small jitted calls (one compile per
    leaf shape / sharding), each creating one leaf's state on the device and sending it to
    the host. Not one jitted program, because the initial moments (zeros) depend on no input:
    XLA could then create them all before the first copy, i.e. the whole state on the device
    at once; this way at most one leaf's state is (the largest: 8 bytes x V x D)."""
    clip_sh, adam_sh = _split_chain(parts, opt_shardings)
    clip = ((jax.jit(parts.clip.init, out_shardings=clip_sh[0])(params),)
            if parts.clip is not None else ())
    params_def = jax.tree.structure(params)
    _, adam_abstract = _split_chain(parts, jax.eval_shape(chain_parts(parts).init, params))
    slots = _Slots(adam_abstract, params_def)
    sh_leaf, sh_shared = slots.per_leaf_values(adam_sh)
    init_leaf = _leaf_init_fn(parts, slots)
    out_leaf: list[list[Any]] = [[] for _ in slots.per_param]
    out_shared: list[Any] = [None] * len(slots.per_param)
    for i, p in enumerate(params_def.flatten_up_to(params)):
        shardings = tuple(sh_leaf[k][i] if pp else sh_shared[k]
                          for k, pp in enumerate(slots.per_param))
        values = init_leaf(p, shardings)
        for k, pp in enumerate(slots.per_param):
            if pp:
                out_leaf[k].append(values[k])
            elif i == 0:
                out_shared[k] = values[k]
    return (*clip, slots.assemble(out_leaf, out_shared))


def _leaf_init_fn(parts: OptimizerParts, slots: _Slots) -> Callable[[Any, tuple], list[Any]]:
    """``(p_i, slot shardings) -> slot values of parameter leaf i's initial state``, jitted
    with those (host) out_shardings; one jitted function per distinct sharding tuple."""
    compiled: dict[tuple, Any] = {}

    def init(p: Any, shardings: tuple) -> list[Any]:
        if shardings not in compiled:
            compiled[shardings] = jax.jit(
                lambda x: slots.split_leaf_state(parts.adamw.init([x])),
                out_shardings=list(shardings))
        return compiled[shardings](p)
    return init


# ---------------------------------------------------------------------------- learner hooks
def offload_parts(config: LearnerConfig, peak_lr: float | None = None
                  ) -> OptimizerParts | None:
    """``optimizer_parts(config, peak_lr)`` when ``config.offload_optimizer_state``, else
    ``None`` (``peak_lr``: as given to ``make_optimizer``; the critic's learning rate for the
    critic)."""
    return optimizer_parts(config, peak_lr) if config.offload_optimizer_state else None


def opt_state_shardings(config: LearnerConfig, shardings: Any) -> Any:
    """The optimiser state's shardings: ``shardings`` (device memory), or the same in pinned
    host memory with ``offload_optimizer_state``."""
    return host_shardings(shardings) if config.offload_optimizer_state else shardings


def make_update_fn(tx: optax.GradientTransformation, parts: OptimizerParts | None,
                   opt_shardings: Any = None) -> UpdateFn:
    """``update(grads, opt_state, params) -> (new_params, new_opt_state)`` for a jitted step:
    ``tx.update`` + ``apply_updates`` when ``parts`` is ``None`` (state on the device), else
    :func:`leafwise_update` with the state in pinned host memory (``opt_shardings``: its host
    shardings)."""
    if parts is None:
        def update(grads, opt_state, params):
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state
        return update

    def offloaded(grads, opt_state, params):
        return leafwise_update(parts, grads, opt_state, params, opt_shardings)
    return offloaded


def init_opt_state(tx: optax.GradientTransformation, parts: OptimizerParts | None,
                   params: Any, opt_shardings: Any) -> Any:
    """``tx.init(params)`` placed in ``opt_shardings``: in one jitted call, or leaf by leaf
    (:func:`leafwise_init`) into pinned host memory when ``parts`` is given."""
    if parts is None:
        return jax.jit(tx.init, out_shardings=opt_shardings)(params)
    return leafwise_init(parts, params, opt_shardings)


__all__ = ["HOST", "DEVICE", "OPTION", "host_memory_kinds", "require_host_memory",
           "with_memory_kind", "host_shardings", "leafwise_update", "leafwise_init",
           "offload_parts", "opt_state_shardings", "make_update_fn", "init_opt_state"]
