"""Orbax checkpoints of the learner: array trees + JSON trainer state, async, keep N.

Layout (one directory per saved step, written atomically by orbax)::

    <dir>/<step>/
        params/            policy parameters (float32 master weights)
        opt_state/         optax state (AdamW moments, step count -> schedule position)
        critic_params/     (with a critic)
        critic_opt_state/  (with a critic)
        trainer_state/     JSON: learner step counters, RNG seed / cursor, caller's extras
                           (data cursor, ScalingInter-RL phase, ...)

Every array tree is stored as a *flat* mapping ``"a.b.0.c" -> array`` built from the tree's key
paths, so nnx ``State`` objects, optax named tuples and integer keys round-trip without orbax
having to understand them; restore rebuilds the exact tree structure of the caller's target and
places every array directly in the target's sharding (``jax.ShapeDtypeStruct(sharding=...)``),
so a sharded run restores sharded without a host copy of the whole model.

Saves are asynchronous (``enable_async_checkpointing``): ``save`` returns once the arrays are
copied off the accelerator, the write continues in the background; ``wait()`` blocks until it is
durable and ``close()`` waits too.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp

from agentrl_jax.sharding.rules import key_path_names

TRAINER_STATE = "trainer_state"


def _flat_key(path) -> str:
    return ".".join(str(k) for k in key_path_names(path)) or "_root"


def flatten(tree: Any) -> dict[str, Any]:
    """``{"a.b.0": leaf}`` from a pytree's key paths (keys must be unique)."""
    out: dict[str, Any] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        key = _flat_key(path)
        if key in out:
            raise ValueError(f"duplicate flattened checkpoint key {key!r}")
        out[key] = leaf
    return out


def unflatten(target: Any, flat: Mapping[str, Any]) -> Any:
    """The tree ``target`` with each leaf replaced by ``flat[its key]``."""
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(target)
    missing = [k for k in (_flat_key(p) for p, _ in leaves_with_path) if k not in flat]
    if missing:
        raise KeyError(f"checkpoint lacks {len(missing)} arrays, e.g. {missing[:3]}")
    return jax.tree_util.tree_unflatten(treedef, [flat[_flat_key(p)] for p, _ in leaves_with_path])


def abstract_like(tree: Any) -> Any:
    """``ShapeDtypeStruct`` (with sharding) for every array leaf of ``tree``."""
    def leaf(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
    return jax.tree.map(leaf, tree)


class Checkpointer:
    """``CheckpointManager`` for named array trees plus a JSON trainer state."""

    def __init__(self, directory: str, max_to_keep: int | None = 3, async_save: bool = True,
                 save_interval_steps: int = 1):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                               save_interval_steps=save_interval_steps,
                                               enable_async_checkpointing=async_save,
                                               create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    # ---------------------------------------------------------------- save
    def save(self, step: int, trees: Mapping[str, Any], trainer_state: Mapping[str, Any],
             force: bool = False) -> bool:
        """Save ``trees`` (name -> pytree of arrays) and the JSON-able ``trainer_state``.

        Returns whether a save was started (``save_interval_steps`` may skip it).
        """
        items = {name: ocp.args.StandardSave(flatten(tree)) for name, tree in trees.items()}
        items[TRAINER_STATE] = ocp.args.JsonSave(dict(trainer_state))
        return self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)

    # ---------------------------------------------------------------- restore
    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, step: int | None, targets: Mapping[str, Any]
                ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore ``step`` (None: latest) into the structure / shardings of ``targets``.

        ``targets``: name -> pytree of arrays or ``ShapeDtypeStruct`` (with ``sharding``).
        Returns ``(trees, trainer_state)``.
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = {name: abstract_like(tree) for name, tree in targets.items()}
        items = {name: ocp.args.StandardRestore(flatten(tree)) for name, tree in abstract.items()}
        items[TRAINER_STATE] = ocp.args.JsonRestore()
        restored = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        trees = {name: unflatten(abstract[name], restored[name]) for name in abstract}
        return trees, dict(restored[TRAINER_STATE] or {})

    # ---------------------------------------------------------------- lifecycle
    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Checkpointer", "flatten", "unflatten", "abstract_like"]
