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
durable and ``close()`` waits too. A save that fails in the background (a full disk) surfaces
at the next ``save`` / ``wait`` / ``close`` as a :class:`CheckpointSaveError` naming the step
whose write failed; :meth:`Checkpointer.remove_partial` deletes what it left (orbax's
temporary directories), so that the last finished checkpoint is the one a rerun restores.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp

from agentrl_jax.sharding.rules import key_path_names

TRAINER_STATE = "trainer_state"


class CheckpointSaveError(RuntimeError):
    """A checkpoint save failed (raised by :meth:`Checkpointer.save` / ``wait`` / ``close``).

    ``step``: the step whose save failed (``None`` when unknown); ``path``: its directory;
    ``__cause__``: orbax's exception."""

    def __init__(self, step: int | None, path: str, cause: BaseException):
        self.step = step
        self.path = path
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        super().__init__(f"checkpoint save of step {step} failed ({path}): "
                         f"{type(cause).__name__}: {first}")


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
                                               create=True, cleanup_tmp_directories=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._pending: int | None = None  # the step whose background write may still run
        self._reported: CheckpointSaveError | None = None  # the failed save raised last

    # ---------------------------------------------------------------- save
    def save(self, step: int, trees: Mapping[str, Any], trainer_state: Mapping[str, Any],
             force: bool = False) -> bool:
        """Save ``trees`` (name -> pytree of arrays) and the JSON-able ``trainer_state``.

        Returns whether a save was started (``save_interval_steps`` may skip it). Raises
        :class:`CheckpointSaveError` when the previous save's write failed (it is waited for
        first: orbax would raise its error here anyway) or this one fails to start.
        """
        self.wait()
        items = {name: ocp.args.StandardSave(flatten(tree)) for name, tree in trees.items()}
        items[TRAINER_STATE] = ocp.args.JsonSave(dict(trainer_state))
        self._pending = int(step)
        try:
            started = self._manager.save(int(step), args=ocp.args.Composite(**items),
                                         force=force)
        except Exception as error:
            self._pending = None
            raise CheckpointSaveError(int(step), self.step_path(int(step)), error) from error
        if not started:
            self._pending = None
        return started

    def step_path(self, step: int) -> str:
        """The directory of checkpoint ``step``."""
        return os.path.join(self.directory, str(step))

    def remove_partial(self) -> list[str]:
        """Delete the unfinished checkpoints (orbax's ``*.orbax-checkpoint-tmp*`` directories)
        of a failed save; returns their paths. Never raises."""
        removed = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return removed
        for name in names:
            if ".orbax-checkpoint-tmp" in name:
                path = os.path.join(self.directory, name)
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

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
    def check(self) -> None:
        """Raise :class:`CheckpointSaveError` if the background write has failed already;
        returns at once otherwise (while the write runs, or when it succeeded).

        Orbax reports a failed write only from a blocking ``wait_until_finished``; its save
        runs in a finalize thread that keeps the exception, so a finished thread with one
        means that the wait returns (raises) at once. (Read through the manager's
        ``_finalize_thread``; an orbax without it reports the failure at the next save.)
        """
        ref = getattr(self._manager, "_finalize_thread", None)
        try:
            failed = ref is not None and bool(ref.map(
                lambda t: t is not None and not t.is_alive() and t.exception is not None))
        except Exception:  # another orbax layout: leave it to the next save
            failed = False
        if failed:
            self.wait()

    def wait(self) -> None:
        """Block until the background write is durable; :class:`CheckpointSaveError` if it
        failed. A failure is raised once: orbax keeps its finalize thread's exception and
        would raise it again at every later wait (and at ``close``)."""
        pending, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as error:
            if self._reported is not None and error is self._reported.__cause__:
                return  # reported already
            self._reported = CheckpointSaveError(
                pending, self.step_path(pending) if pending is not None else self.directory,
                error)
            raise self._reported from error

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def restore_item(step_path: str, name: str, target: Any) -> Any:
    """One array tree (``name``, e.g. ``"params"``) of the checkpoint in ``step_path``, read
    alone: the other items (the optimiser state: twice the parameters' bytes) are not read, and
    no ``CheckpointManager`` is opened (it would clean up the temporary directories of a run that
    is still saving). ``target``: the tree's structure, as arrays or ``ShapeDtypeStruct`` with
    the sharding each array is placed in (e.g. one CPU device)."""
    item = os.path.join(step_path, name)
    if not os.path.isdir(item):
        raise FileNotFoundError(f"checkpoint {step_path} has no {name}/")
    abstract = abstract_like(target)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(item, flatten(abstract))
    return unflatten(abstract, restored)


__all__ = ["Checkpointer", "CheckpointSaveError", "flatten", "unflatten", "abstract_like",
           "restore_item"]
