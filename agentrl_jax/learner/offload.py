"""Optimiser-state offload (``LearnerConfig.offload_optimizer_state``): the optax state lives in
pinned host memory and visits the device one parameter leaf at a time, in a host-side loop of
small jitted calls (the "optimizer offload" of DeepSpeed ZeRO-Offload / verl, with the update
arithmetic itself still on the accelerator).

Placement: every leaf of the optimiser state (AdamW ``mu`` and ``nu``: float32, the shapes of
the parameters; the step counts: int32 scalars) keeps the sharding it would have on the device,
with ``memory_kind="pinned_host"`` (:func:`host_shardings`): the same shards, in the page-locked
RAM of the process that owns each device, so the copies are plain DMA transfers.

The update (:class:`LeafwiseUpdate`; ``N`` parameters, ``g = grads``, ``p = params``, ``t`` the
new step count, every line below a separate jitted call issued from Python)::

    g, |g| <- clip_by_global_norm(g), global_norm(g)      one call, whole tree, on the device
                                                          (g is there already; donated: in place)
    for every parameter leaf i, in tree order:            one call per leaf (`leaf_step`)
        mu_i, nu_i <- device_put(host mu_i, nu_i)                   host -> device, 8 B / elem
        mu_i <- b1 mu_i + (1 - b1) g_i ;  nu_i <- b2 nu_i + (1 - b2) g_i^2
        p_i  <- p_i - lr(t) (mu_i / (1 - b1^t) / (sqrt(nu_i / (1 - b2^t)) + eps) + wd m_i p_i)
        host mu_i, nu_i <- mu_i, nu_i                               device -> host, 8 B / elem

(``m_i``: 1 for matrices, 0 for norm scales and biases: ``optim._decay_mask``, applied by
optax to the one-leaf tree ``[p_i]`` exactly as to the whole tree.) ``p_i``, ``mu_i`` and
``nu_i`` are donated to their call; the step counts (shared scalars) go in unchanged to every
leaf's call and the new ones are taken from leaf 0's (every leaf computes the same ``t``).

The arithmetic is optax's own: the first call is ``OptimizerParts.clip.update`` on the whole
gradient tree, and ``leaf_step`` calls ``OptimizerParts.adamw.update`` on one-leaf trees
(``[g_i]``, ``[p_i]`` and the state sliced to leaf ``i``), which for AdamW is element-wise, so
the result is ``tx.update`` on the whole tree up to float32 rounding (XLA compiles the two
programs differently). Traffic per optimiser step: ``8N`` bytes host -> device and ``8N`` back.

Device memory: the moments of one leaf at a time, by program structure rather than XLA's
scheduling: a leaf's moments reach the device only inside its own call (the host -> device
copy is part of that call's program, its device buffers are that program's temporaries), and
a device runs the programs issued to it one after another. The calls are dispatched
asynchronously, so Python runs ahead of the device while it works through the queue. Expected
peak of the update: parameters + gradients (resident anyway) + the largest leaf's moments,
``8 x`` its size, at most twice (the copy in, and the updated moments before they go back out,
when XLA does not update them in place); gradient leaves are freed as their calls complete.
For a Qwen2.5-7B shape the largest leaves are the embedding and the LM head, 152064 x 3584 =
545 M parameters: 4.4 GB of moments (8.7 GB at most) instead of 57 GiB resident. Measured
on an H100 (``benchmarks/speed/optimizer_offload.py``, a synthetic 1.9 B-parameter tree): peak
22.3 GiB with offload (the expected value) vs 35.5 without; the step is much slower, since the
moments cross the host link (step times: docs/LEARNER.md).

Executables: ``leaf_step`` is one ``jax.jit`` object per distinct sharding of a leaf (held by
the :class:`LeafwiseUpdate`, which the learner caches with its jitted steps), and each compiles
once per shape / dtype: a 7B model's ~340 leaves reuse a handful of executables.

:func:`leafwise_init` creates the state one leaf at a time too (one small jitted call per leaf,
each sending its zeros to the host), so the device never holds the whole state.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.optim import OptimizerParts, chain_parts, optimizer_parts

HOST = "pinned_host"
DEVICE = "device"
OPTION = "learner.offload_optimizer_state"

#: ``update(params, opt_state, grads) -> (new_params, new_opt_state, grad_norm)``, called from
#: Python (not traced): ``params`` and ``opt_state`` are donated, and ``grads`` may be (the
#: offloaded update clips them in place): do not use them afterwards.
UpdateFn = Callable[[Any, Any, Any], tuple[Any, Any, jax.Array]]


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
    """The structure of an AdamW state cut into *slots*: the sub-trees with the parameters'
    tree structure (``mu``, ``nu``: one entry per parameter leaf; "leaf slots") and the other
    leaves (step counts: shared by every parameter; "shared slots").

    Built from any tree with the state's structure (the state, its shardings, its abstract
    values); holds no arrays. The state of parameter leaf ``i`` alone is the state's
    structure with ``[leaf_slot_values[k]]`` (a one-leaf list, like the one-leaf parameter
    tree ``[p_i]``) for leaf slot ``k`` and the shared values for the others."""

    def __init__(self, tree: Any, params_def: jax.tree_util.PyTreeDef):
        if params_def.num_leaves < 2:
            raise ValueError(f"{OPTION}: the leaf-wise update needs a parameter tree of at "
                             "least two leaves")
        self.params_def = params_def
        slots, self.state_def = jax.tree.flatten(tree, is_leaf=self._is_param_tree)
        self.per_param = tuple(self._is_param_tree(s) for s in slots)

    def _is_param_tree(self, x: Any) -> bool:
        return jax.tree.structure(x) == self.params_def

    def split(self, tree: Any) -> tuple[list[list[Any]], list[Any]]:
        """``(leaf_slots, shared)`` of a tree with the state's structure: ``leaf_slots[k][i]``
        is leaf slot ``k``'s value for parameter leaf ``i``; ``shared``: the shared slots'."""
        values = self.state_def.flatten_up_to(tree)
        leaf_slots = [self.params_def.flatten_up_to(v)
                      for v, pp in zip(values, self.per_param) if pp]
        shared = [v for v, pp in zip(values, self.per_param) if not pp]
        return leaf_slots, shared

    def assemble(self, leaf_slots: list[list[Any]], shared: Sequence[Any]) -> Any:
        """Inverse of :meth:`split`."""
        leaf_it, shared_it = iter(leaf_slots), iter(shared)
        return self.state_def.unflatten([self.params_def.unflatten(next(leaf_it)) if pp
                                         else next(shared_it) for pp in self.per_param])

    def leaf_state(self, leaf_values: Sequence[Any], shared: Sequence[Any]) -> Any:
        """The state of one parameter leaf from its leaf-slot values and the shared ones."""
        leaf_it, shared_it = iter(leaf_values), iter(shared)
        return self.state_def.unflatten([[next(leaf_it)] if pp else next(shared_it)
                                         for pp in self.per_param])

    def split_leaf_state(self, state: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Inverse of :meth:`leaf_state`: ``(leaf-slot values, shared values)``."""
        values = self.state_def.flatten_up_to(state)
        return (tuple(v[0] for v, pp in zip(values, self.per_param) if pp),
                tuple(v for v, pp in zip(values, self.per_param) if not pp))


def _split_chain(parts: OptimizerParts, tree: Any) -> tuple[tuple[Any, ...], Any]:
    """``chain_parts``'s state (or its shardings) -> ``(clip part, AdamW part)``."""
    n_clip = 0 if parts.clip is None else 1
    if not isinstance(tree, tuple) or len(tree) != n_clip + 1:
        raise ValueError(f"{OPTION}: the optimiser state is not chain(clip, adamw)'s "
                         "(optim.make_optimizer); the leaf-wise update cannot split it")
    return tuple(tree[:n_clip]), tree[n_clip]


def _check_state(parts: OptimizerParts, opt_state: Any, params: Any) -> None:
    """The state must be ``chain_parts(parts)``'s (a custom ``tx`` cannot be offloaded) and
    its leaves that are not per-parameter must be scalars (shared by every leaf's update)."""
    expected = jax.tree.structure(jax.eval_shape(chain_parts(parts).init, params))
    if jax.tree.structure(opt_state) != expected:
        raise ValueError(f"{OPTION}: the optimiser state does not have the structure of "
                         "optim.make_optimizer's (a custom optax transformation cannot be "
                         "offloaded leaf by leaf)")
    _, adam_state = _split_chain(parts, opt_state)
    for value in _Slots(adam_state, jax.tree.structure(params)).split(adam_state)[1]:
        if getattr(value, "ndim", 0) != 0:
            raise ValueError(
                f"{OPTION}: the optimiser state has a non-scalar leaf of shape {value.shape} "
                "that is not per-parameter; the leaf-wise update supports AdamW-like states "
                "(per-parameter trees + shared scalars) only")


# ---------------------------------------------------------------------------- the update
def _clip_fn(parts: OptimizerParts, param_shardings: Any, clip_shardings: tuple[Any, ...],
             replicated: NamedSharding) -> Callable[[Any, tuple[Any, ...]], tuple]:
    """Jitted ``(grads, clip_state) -> (clipped grads, new clip_state, global_norm(grads))``
    over the whole (device-resident) gradient tree: optax's ``clip_by_global_norm`` (the
    global norm needs every gradient), ``grads`` donated (clipped in place). The clip state
    (``EmptyState`` for ``clip_by_global_norm``) stays in host memory between calls. Without
    clipping, ``grads`` pass through unchanged (not donated)."""
    if parts.clip is None:
        norm = jax.jit(optax.global_norm, in_shardings=(param_shardings,),
                       out_shardings=replicated)
        return lambda grads, clip_state: (grads, clip_state, norm(grads))

    def clip(grads, clip_state):
        norm = optax.global_norm(grads)
        state = _put(clip_state[0], clip_shardings[0], DEVICE)
        grads, state = parts.clip.update(grads, state, None)
        return grads, (_put(state, clip_shardings[0], HOST),), norm

    return jax.jit(clip, in_shardings=(param_shardings, clip_shardings),
                   out_shardings=(param_shardings, clip_shardings, replicated),
                   donate_argnums=(0,))


def _leaf_step_fn(parts: OptimizerParts, slots: _Slots, param_sharding: NamedSharding,
                  leaf_shardings: tuple[NamedSharding, ...],
                  shared_shardings: tuple[NamedSharding, ...]) -> Callable:
    """Jitted ``leaf_step(p_i, g_i, leaf_values, shared) -> (new p_i, new leaf_values,
    new shared)`` for parameter leaves with these shardings (see the module docstring):

    * ``p_i``, ``g_i``: the parameter and its (clipped) gradient, on the device, any shape;
    * ``leaf_values``: leaf ``i``'s slot values (``(mu_i, nu_i)``, float32, ``p_i``'s shape),
      in pinned host memory (``leaf_shardings``); moved to the device inside the call, and the
      new ones returned to pinned host memory;
    * ``shared``: the shared slot values (step counts, int32 scalars), pinned host memory.

    ``p_i`` and ``leaf_values`` are donated."""
    def leaf_step(p, g, leaf_values, shared):
        on_device = _put(leaf_values, leaf_shardings, DEVICE)
        shared = _put(shared, shared_shardings, DEVICE)
        updates, new_state = parts.adamw.update([g], slots.leaf_state(on_device, shared), [p])
        new_leaf, new_shared = slots.split_leaf_state(new_state)
        return (optax.apply_updates([p], updates)[0], _put(new_leaf, leaf_shardings, HOST),
                _put(new_shared, shared_shardings, HOST))

    return jax.jit(leaf_step,
                   in_shardings=(param_sharding, param_sharding, leaf_shardings,
                                 shared_shardings),
                   out_shardings=(param_sharding, leaf_shardings, shared_shardings),
                   donate_argnums=(0, 2))


class LeafwiseUpdate:
    """The offloaded optimiser step: ``update(params, opt_state, grads) -> (new_params,
    new_opt_state, grad_norm)``, called from Python (an :data:`UpdateFn`): one jitted call
    for the clip, then a Python loop of one jitted ``leaf_step`` per parameter leaf (module
    docstring). ``params`` / ``grads``: on the device (``param_shardings``); ``opt_state``
    (and the new one): ``chain_parts(parts)``'s state in ``opt_shardings`` (pinned host
    memory). ``params``, ``opt_state`` and (with clipping) ``grads`` are donated;
    ``grad_norm``: the global norm of ``grads`` before clipping, a replicated device scalar.

    ``leaf_calls`` counts the ``leaf_step`` calls issued (all steps); :meth:`executables` the
    compiled ``leaf_step`` programs."""

    def __init__(self, parts: OptimizerParts, param_shardings: Any, opt_shardings: Any):
        self.parts = parts
        self.params_def = jax.tree.structure(param_shardings)
        self._param_shardings = self.params_def.flatten_up_to(param_shardings)
        clip_sh, adam_sh = _split_chain(parts, opt_shardings)
        self.slots = _Slots(adam_sh, self.params_def)
        self._leaf_sh, self._shared_sh = self.slots.split(adam_sh)
        mesh = self._param_shardings[0].mesh
        self._clip = _clip_fn(parts, param_shardings, clip_sh, NamedSharding(mesh, P()))
        self._steps: dict[tuple, Callable] = {}  # leaf shardings -> jitted leaf_step
        self._checked = False
        self.leaf_calls = 0

    def _leaf_step(self, i: int) -> Callable:
        """The jitted ``leaf_step`` for parameter leaf ``i``'s shardings (made once)."""
        key = (self._param_shardings[i], tuple(s[i] for s in self._leaf_sh),
               tuple(self._shared_sh))
        if key not in self._steps:
            self._steps[key] = _leaf_step_fn(self.parts, self.slots, *key)
        return self._steps[key]

    def executables(self) -> int:
        """Compiled ``leaf_step`` programs so far (one per distinct leaf shape / dtype /
        sharding)."""
        return sum(f._cache_size() for f in self._steps.values())

    def __call__(self, params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any, jax.Array]:
        if jax.tree.structure(params) != self.params_def:
            raise ValueError(f"{OPTION}: the parameters do not have the structure of the "
                             "shardings this update was built for")
        if not self._checked:
            _check_state(self.parts, opt_state, params)
            self._checked = True
        clip_state, adam_state = _split_chain(self.parts, opt_state)
        grads, new_clip, norm = self._clip(grads, clip_state)
        leaf_slots, shared = self.slots.split(adam_state)
        p_leaves = self.params_def.flatten_up_to(params)
        g_leaves = self.params_def.flatten_up_to(grads)
        # only the leaf lists reference the inputs now: the loop frees each leaf after its call
        del opt_state, adam_state, clip_state, params, grads
        new_params, new_slots, new_shared = self._loop(p_leaves, g_leaves, leaf_slots, shared)
        new_state = (*new_clip, self.slots.assemble(new_slots, new_shared))
        return self.params_def.unflatten(new_params), new_state, norm

    def _loop(self, p_leaves: list[Any], g_leaves: list[Any], leaf_slots: list[list[Any]],
              shared: list[Any]) -> tuple[list[Any], list[list[Any]], tuple[Any, ...]]:
        """One ``leaf_step`` call per parameter leaf ``i``: ``p_leaves[i]`` / ``g_leaves[i]``
        (device), ``leaf_slots[k][i]`` (slot ``k``'s value, pinned host) and the ``shared``
        step counts -> ``(new parameter leaves, new leaf_slots, new shared values)``. Drops
        its references to each leaf's inputs once the call is issued, so that a gradient leaf
        is freed as soon as its update has run."""
        new_params: list[Any] = []
        new_slots: list[list[Any]] = [[] for _ in leaf_slots]
        new_shared: tuple[Any, ...] = tuple(shared)
        for i in range(len(p_leaves)):
            p, values, step_shared = self._leaf_step(i)(
                p_leaves[i], g_leaves[i], tuple(s[i] for s in leaf_slots), tuple(shared))
            p_leaves[i] = g_leaves[i] = None
            for s in leaf_slots:
                s[i] = None
            self.leaf_calls += 1
            new_params.append(p)
            for k, v in enumerate(values):
                new_slots[k].append(v)
            if i == 0:  # every leaf computes the same new step counts
                new_shared = step_shared
        return new_params, new_slots, new_shared


# ---------------------------------------------------------------------------- init
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
    slots = _Slots(adam_sh, params_def)
    leaf_sh, shared_sh = slots.split(adam_sh)
    init_leaf = _leaf_init_fn(parts, slots)
    new_slots: list[list[Any]] = [[] for _ in leaf_sh]
    shared: tuple[Any, ...] = ()
    for i, p in enumerate(params_def.flatten_up_to(params)):
        values, leaf_shared = init_leaf(p, tuple(s[i] for s in leaf_sh), tuple(shared_sh))
        for k, v in enumerate(values):
            new_slots[k].append(v)
        if i == 0:
            shared = leaf_shared
    return (*clip, slots.assemble(new_slots, shared))


def _leaf_init_fn(parts: OptimizerParts, slots: _Slots) -> Callable[[Any, tuple, tuple], tuple]:
    """``(p_i, leaf-slot shardings, shared shardings) -> (leaf-slot values, shared values)``
    of parameter leaf ``i``'s initial state, jitted with those (host) out_shardings; one
    jitted function per distinct sharding tuple."""
    compiled: dict[tuple, Any] = {}

    def init(p: Any, leaf_sh: tuple, shared_sh: tuple) -> tuple:
        if (leaf_sh, shared_sh) not in compiled:
            compiled[leaf_sh, shared_sh] = jax.jit(
                lambda x: slots.split_leaf_state(parts.adamw.init([x])),
                out_shardings=(leaf_sh, shared_sh))
        return compiled[leaf_sh, shared_sh](p)
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
                   param_shardings: Any, opt_shardings: Any) -> UpdateFn:
    """The optimiser step as a Python callable ``update(params, opt_state, grads) ->
    (new_params, new_opt_state, global_norm(grads))`` (an :data:`UpdateFn`):

    * ``parts is None``: one jitted call, ``tx.update`` + ``apply_updates`` with the state on
      the device (``opt_shardings``); what the learner's non-offloaded steps do inside their
      own jitted programs;
    * else :class:`LeafwiseUpdate` (``opt_shardings``: pinned-host shardings of
      ``chain_parts(parts)``'s state; ``tx`` unused)."""
    if parts is not None:
        return LeafwiseUpdate(parts, param_shardings, opt_shardings)
    replicated = NamedSharding(jax.tree.leaves(param_shardings)[0].mesh, P())

    def update(params, opt_state, grads):
        norm = optax.global_norm(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, norm
    return jax.jit(update, in_shardings=(param_shardings, opt_shardings, param_shardings),
                   out_shardings=(param_shardings, opt_shardings, replicated),
                   donate_argnums=(0, 1))


def init_opt_state(tx: optax.GradientTransformation, parts: OptimizerParts | None,
                   params: Any, opt_shardings: Any) -> Any:
    """``tx.init(params)`` placed in ``opt_shardings``: in one jitted call, or leaf by leaf
    (:func:`leafwise_init`) into pinned host memory when ``parts`` is given."""
    if parts is None:
        return jax.jit(tx.init, out_shardings=opt_shardings)(params)
    return leafwise_init(parts, params, opt_shardings)


__all__ = ["HOST", "DEVICE", "OPTION", "UpdateFn", "host_memory_kinds", "require_host_memory",
           "with_memory_kind", "host_shardings", "LeafwiseUpdate", "leafwise_init",
           "offload_parts", "opt_state_shardings", "make_update_fn", "init_opt_state"]
