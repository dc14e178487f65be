"""Multi-process-correct placement of host arrays on a mesh, and read-back to NumPy.

In a multi-process JAX run (one process per host after ``jax.distributed.initialize()``) a
``Mesh`` spans the devices of every process, but each process drives only its own
(``jax.local_devices()``). A global ``jax.Array`` is then assembled from per-process pieces,
and reading one back to NumPy needs a gather across processes. These helpers are the only
way the learner moves batch data in or results out; with one process they reduce to
``device_put`` / ``np.asarray`` / the identity (same values, same dtypes).

- ``place_global(x, sharding)``: every process holds the same full ``x`` (e.g. ``[B, T]``);
  each builds only its addressable shards.
- ``place_process_local(x_local, sharding)``: each process holds only its own rows
  (``[B / num_processes, T]``); together they form the global ``[B, T]`` array.
- ``process_rows(x)``: the inverse: the rows of a global array that this process contributed.
- ``to_host(x)`` / ``to_host_tree(tree)``: the full global value on every process.
- ``allgather_rows(x_local)``: host arrays of equal shape concatenated over processes.
- ``check_process_local_layout(sharding, shape)``: each process owns distinct rows.
- ``agree_max(value)``: the max of an int over processes, so that shapes derived from local
  data (length bucket, padded rows) are the same on every process.
- ``allgather_objects(obj)``: a JSON-able object from every process, as a list in process order.
- ``local_replica(tree)``: the full value of every leaf on one local device of this process
  (e.g. the learner's sharded parameters for this host's embedded rollout engine).

Every function that talks to other processes is a collective: all processes must call it,
in the same order, with arrays of the same shape.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Sharding


def place_global(x: np.ndarray, sharding: Sharding) -> jax.Array:
    """A global ``jax.Array`` of ``x`` (any shape ``S``) laid out as ``sharding``.

    Every process must pass the same ``x`` (shape ``S``, same values); each transfers only
    the slices its own devices hold. Floating / integer dtypes are canonicalised as
    ``jax.device_put`` does (float64 -> float32 without x64).
    """
    x = np.asarray(x)
    x = x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def check_process_local_layout(sharding: Sharding, global_shape: Sequence[int]) -> None:
    """Raise ``ValueError`` unless the processes' addressable blocks of a ``global_shape``
    array under ``sharding`` tile it without overlap (each process owns distinct rows)."""
    n_proc = jax.process_count()
    idx_map = sharding.addressable_devices_indices_map(tuple(global_shape))
    local = 1
    for dim, size in enumerate(global_shape):
        starts = {(s[dim].start or 0) for s in idx_map.values()}
        local *= len(starts) * sharding.shard_shape(tuple(global_shape))[dim]
    if local * n_proc != int(np.prod(global_shape)):
        raise ValueError(
            f"process-local placement of {tuple(global_shape)} with {sharding} needs every "
            f"process's devices to hold a distinct block of rows ({n_proc} processes, this one "
            f"addresses {local} of {int(np.prod(global_shape))} elements): a mesh axis that "
            "replicates the batch (e.g. 'tensor') must not span processes")


def place_process_local(x_local: np.ndarray, sharding: Sharding,
                        global_shape: Sequence[int] | None = None) -> jax.Array:
    """A global ``jax.Array`` of ``global_shape`` from each process's own block ``x_local``.

    ``x_local`` ``[B_local, ...]``: this process's rows; ``global_shape`` defaults to
    ``[B_local * num_processes, ...]`` (the split is on the leading axis). Give
    ``global_shape`` explicitly to split another axis, e.g. ``x_local [n_micro, mb_local, T]``
    into ``(n_micro, mb_local * num_processes, T)``. ``B_local`` must be the same on every
    process. Process ``p``'s rows land on the global indices its devices hold under
    ``sharding`` (for a mesh over ``jax.devices()`` in their usual process-major order: the
    ``p``-th block); ``process_rows`` returns them. With one process this is ``place_global``.
    """
    x_local = np.asarray(x_local)
    x_local = x_local.astype(jax.dtypes.canonicalize_dtype(x_local.dtype), copy=False)
    n_proc = jax.process_count()
    if global_shape is None:
        global_shape = (x_local.shape[0] * n_proc, *x_local.shape[1:])
    global_shape = tuple(int(d) for d in global_shape)
    if n_proc == 1:
        if global_shape != x_local.shape:
            raise ValueError(f"one process: global_shape {global_shape} != local shape "
                             f"{x_local.shape}")
        return place_global(x_local, sharding)
    check_process_local_layout(sharding, global_shape)
    return jax.make_array_from_process_local_data(sharding, x_local, global_shape)


def process_rows(x: jax.Array) -> np.ndarray:
    """This process's block of a global array (inverse of ``place_process_local``).

    For ``x`` ``[B, ...]`` placed from per-process blocks ``[B_local, ...]`` (or computed
    from such arrays with the same sharding), returns this process's ``[B_local, ...]`` rows
    as NumPy, without talking to other processes. One process: ``np.asarray(x)``.
    """
    if jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(x)
    shards = x.addressable_shards
    shard_shape = shards[0].data.shape
    starts = [sorted({(s.index[d].start or 0) for s in shards}) for d in range(x.ndim)]
    out = np.empty([len(st) * n for st, n in zip(starts, shard_shape)], x.dtype)
    for shard in shards:
        pos = tuple(slice(st.index(sl.start or 0) * n, (st.index(sl.start or 0) + 1) * n)
                    for st, sl, n in zip(starts, shard.index, shard_shape))
        out[pos] = np.asarray(shard.data)
    return out


def to_host(x: jax.Array) -> np.ndarray:
    """The full global value of ``x`` as NumPy, on every process (shape ``x.shape``).

    ``np.asarray`` when this process holds all of it (one process, or a replicated array);
    otherwise ``process_allgather`` (a collective: every process must call it).
    """
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def to_host_tree(tree: Any) -> Any:
    """``to_host`` of every leaf; one batched ``jax.device_get`` when all are local."""
    leaves = jax.tree.leaves(tree)
    if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
        return jax.device_get(tree)
    return jax.tree.map(to_host, tree)


def allgather_rows(x_local: Any) -> Any:
    """Host arrays (a pytree) ``[B_local, ...]`` -> ``[B_local * num_processes, ...]``,
    concatenated in process order, on every process. Shapes must match across processes.
    One process: the input as NumPy."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, x_local)
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(x_local, tiled=True))


def agree_max(value: int) -> int:
    """The largest ``value`` over all processes (the identity with one process)."""
    if jax.process_count() == 1:
        return int(value)
    gathered = multihost_utils.process_allgather(np.asarray([int(value)], np.int32),
                                                 tiled=True)
    return int(np.max(gathered))


def allgather_objects(obj: Any) -> list[Any]:
    """A JSON-able ``obj`` from every process, as a list in process order (``[obj]`` with one
    process). For small per-process summaries (counts, per-episode scores), not bulk data."""
    if jax.process_count() == 1:
        return [obj]
    import json
    payload = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    width = agree_max(payload.size)
    row = np.zeros((1, width + 4), np.uint8)
    row[0, :4] = np.frombuffer(np.uint32(payload.size).tobytes(), np.uint8)
    row[0, 4:4 + payload.size] = payload
    table = allgather_rows(row)
    out = []
    for r in table:
        n = int(np.frombuffer(r[:4].tobytes(), np.uint32)[0])
        out.append(json.loads(r[4:4 + n].tobytes().decode()))
    return out


_REPLICATE: dict[Any, Any] = {}


def local_replica(tree: Any, device: Any = None) -> Any:
    """Every leaf's full value as a single-device array on ``device`` (default: this process's
    first local device).

    Leaves that span several processes are all-gathered on device by a jitted identity with a
    fully replicated out-sharding over their mesh (a collective: every process must call this,
    in the same order) and this process keeps the copy on ``device``; the replicated copies on
    its other local devices are freed when the call returns. Leaves this process already holds
    entirely are returned as they are (no copy). The result shares no buffer with a sharded
    input, so donating the input afterwards (a learner update) leaves it valid.
    """
    device = device or jax.local_devices()[0]
    leaves, treedef = jax.tree.flatten(tree)
    spanning = [i for i, x in enumerate(leaves)
                if isinstance(x, jax.Array) and not x.is_fully_addressable]
    if spanning:
        from jax.sharding import NamedSharding, PartitionSpec
        mesh = leaves[spanning[0]].sharding.mesh
        fn = _REPLICATE.get(mesh)
        if fn is None:
            fn = _REPLICATE[mesh] = jax.jit(  # an explicit copy: never forward an input buffer
                lambda t: jax.tree.map(jax.numpy.copy, t),
                out_shardings=NamedSharding(mesh, PartitionSpec()))
        # Wait for the gather: a collective still running when the caller starts the next one
        # (CPU runtimes may run both at once) would mismatch the processes' collectives.
        full = jax.block_until_ready(fn([leaves[i] for i in spanning]))
        for i, x in zip(spanning, full):
            leaves[i] = next(s.data for s in x.addressable_shards if s.device == device)
    return jax.tree.unflatten(treedef, leaves)


__all__ = ["place_global", "place_process_local", "check_process_local_layout", "process_rows",
           "to_host", "to_host_tree", "allgather_rows", "agree_max", "allgather_objects",
           "local_replica"]
