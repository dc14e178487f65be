"""Data-parallel rollout: one embedded engine per local device (group), behind one backend.

On a host with several accelerators the rollout -- usually the larger half of an RL step --
would otherwise decode on one of them while the others wait. ``EngineReplicas`` starts an
:class:`~agentrl_jax.rollout.engine.engine.Engine` on every group of ``tensor_parallel`` local
devices (each with its own KV cache, scheduler thread and compiled functions) and routes
requests:

* **Sticky sessions.** A ``session_id`` is pinned to the replica that served its first request,
  so a multi-turn episode always returns to the KV row holding its prefix (prefix reuse works
  exactly as on one engine). A new session goes to the replica with the fewest live sessions
  (pinned and not ended: each replica caches one KV row per session), then the fewest requests
  in flight (ties: the lowest index).
* Requests without a session go to the least-loaded replica; the ``n`` samples of a request
  stay together (they share one prefill).
* ``update_weights`` reaches every replica (each gets its own copy on its devices, transferred
  from wherever the learner keeps the parameters, in parallel; cast to the engines'
  ``weights_dtype`` once, where they are, before the copies: :func:`cast_once`) and returns
  once all have swapped; ``flush_cache``, ``pause``, ``abort_all`` and ``close`` likewise.

The actor pool sees one ``RolloutBackend``; nothing else changes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
from typing import Any, Sequence

import numpy as np

from agentrl_jax.rollout.contract import (BackendUnavailableError, BatchedSamplesBackend,
                                      GenerateResult, SamplingParams, WeightSource)
from agentrl_jax.rollout.engine.engine import Engine, EngineConfig
from agentrl_jax.rollout.engine.placement import device_groups, to_state
from agentrl_jax.rollout.engine.requests import merge_stats

log = logging.getLogger(__name__)


_GATHERS: dict[tuple, Any] = {}


def _identity(tree: Any) -> Any:
    return tree


def gather_to_replicas(state: Any, replica_devices: Sequence[Sequence[Any]],
                       on_cpu: bool = False) -> list | None:
    """Every single-device replica's own whole copy of ``state`` (an nnx State of jax Arrays
    sharded over exactly the replicas' devices, e.g. the learner's FSDP parameters), made by
    one compiled all-gather over those devices (NCCL on GPUs) instead of one transfer per
    replica: copying a sharded array onto another single device goes through host memory in
    JAX (the 7B shape's weight sync was a large share of its step: docs/PERFORMANCE.md). The arrays
    returned are the gathered buffers themselves, each on its replica's device. None when the
    fast path does not apply (a replica with several devices, arrays not fully addressable or
    laid out over other devices, host arrays) or, unless ``on_cpu``, on CPU devices (XLA's
    CPU all-gather is slower than the transfers there: ``benchmarks/contenders/weight_sync.py``,
    docs/PERFORMANCE.md): the caller places the weights as before.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if any(len(group) != 1 for group in replica_devices) or len(replica_devices) < 2:
        return None
    devices = [group[0] for group in replica_devices]
    if devices[0].platform == "cpu" and not on_cpu:
        return None
    leaves, treedef = jax.tree.flatten(state)
    if not leaves or not all(isinstance(x, jax.Array) and x.is_fully_addressable
                             and x.sharding.device_set == set(devices) for x in leaves):
        return None
    key = tuple(devices)
    if key not in _GATHERS:  # one jitted function per device set: compiled once per layout
        everywhere = NamedSharding(Mesh(np.array(devices, dtype=object), ("replica",)),
                                   PartitionSpec())
        _GATHERS[key] = jax.jit(_identity, out_shardings=everywhere)
    gathered = _GATHERS[key](leaves)
    per_device = [{s.device: s.data for s in x.addressable_shards} for x in gathered]
    return [jax.tree.unflatten(treedef, [shards[d] for shards in per_device]) for d in devices]


def cast_once(params: Any, dtype: Any) -> Any:
    """``params`` (a ``CausalLM``, ``Pretrained``, ``nnx.State`` or pure dict) with every
    floating array cast to ``dtype`` where it lives (same shardings), once for all replicas.

    Each replica's engine casts the weights it is given to its ``weights_dtype`` before placing
    them on its devices; given the learner's float32 parameters, ``N`` replicas made ``N``
    casts at the same time, each a bfloat16 copy sharded like the learner's (a Qwen2.5-7B shape
    on 4 GPUs: 4 x 15 GB spread over the 4 GPUs, 15 GB a GPU, next to the replicas' old and new
    weights). Cast here first, each replica's own cast is a no-op and only this one copy
    exists while the replicas take theirs. ``dtype`` None: ``params`` unchanged.
    """
    if not dtype:
        return params
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from agentrl_jax.models.pretrained import Pretrained

    dt = jnp.dtype(dtype)

    def cast(x: Any) -> Any:
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt:
            return x.astype(dt) if isinstance(x, jax.Array) else np.asarray(x).astype(dt)
        return x

    if isinstance(params, Pretrained):
        import dataclasses
        return dataclasses.replace(params, model=cast_once(params.model, dtype))
    if isinstance(params, nnx.Module):
        graphdef, state = nnx.split(params)
        return nnx.merge(graphdef, jax.tree.map(cast, state))
    return jax.tree.map(cast, params)


class EngineReplicas(BatchedSamplesBackend):
    """``len(devices) // tensor_parallel`` engine replicas (registry name ``embedded`` with
    ``replicas`` > 1 through ``training.runtime.services.make_backend``).

    >>> backend = EngineReplicas(model, EngineConfig(max_batch=64), devices=jax.local_devices())
    """

    name = "embedded"
    takes_id_arrays = True  # submit() copies them (check_input_ids)
    #: a new session whose prompt equals a recent new session's goes to that session's replica
    #: (whose engine then prefills the prompt once for both: ``EngineConfig.share_prompts``,
    #: e.g. a GRPO group's first turns) unless that replica has more than this many live
    #: sessions above the least loaded one
    PROMPT_AFFINITY_SLACK = 8
    PROMPT_AFFINITY_MEMORY = 4096  # recent first prompts remembered

    def __init__(self, model: Any, config: EngineConfig | None = None, tokenizer: Any = None,
                 model_path: str | None = None, warmup: bool = True,
                 devices: Sequence[Any] | None = None, tensor_parallel: int = 1,
                 max_sessions: int = 1 << 16):
        import jax

        groups = device_groups(devices or jax.local_devices(), tensor_parallel)
        model = cast_once(model, config.weights_dtype if config is not None else None)
        # Build (and compile) the replicas concurrently: XLA compiles per device assignment,
        # and compilation releases the GIL.
        with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
            futures = [pool.submit(Engine, model, config, tokenizer, model_path, warmup, group)
                       for group in groups]
            replicas, errors = [], []
            for f in futures:
                try:
                    replicas.append(f.result())
                except Exception as e:  # noqa: BLE001 -- close the others, then raise
                    errors.append(e)
        if errors:
            for r in replicas:
                r.close()
            raise errors[0]
        self.replicas: list[Engine] = replicas
        self.config = replicas[0].config
        self.tokenizer = replicas[0].tokenizer
        self.model_path = replicas[0].model_path
        self.model_config = replicas[0].model_config
        self._in_flight = [0] * len(replicas)
        self._live = [0] * len(replicas)  # pinned (not ended) sessions per replica
        self._sessions: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._max_sessions = int(max_sessions)
        self._rids: dict[str, int] = {}
        self._prompt_replica: collections.OrderedDict[int, int] = collections.OrderedDict()

    # ----------------------------------------------------------------------------- routing
    def replica_for(self, session_id: str | None, input_ids: Sequence[int] | None = None
                    ) -> int:
        """The replica index a request goes to: a known session's own; a new session's is,
        when ``input_ids`` equal a recent new session's prompt, that session's replica (within
        ``PROMPT_AFFINITY_SLACK`` live sessions of the least loaded; with ``share_prompts``),
        else the one with the fewest live sessions, then the fewest requests in flight (each
        replica caches one KV row per session); a request without a session by load alone."""
        if session_id is None:
            return min(range(len(self.replicas)), key=lambda i: (self._in_flight[i], i))
        index = self._sessions.get(session_id)
        if index is not None:
            self._sessions.move_to_end(session_id)
            return index
        key = (hash(tuple(input_ids)) if input_ids is not None and self.config.share_prompts
               else None)
        known = self._prompt_replica.get(key) if key is not None else None
        if known is not None and self._live[known] <= min(self._live) + \
                self.PROMPT_AFFINITY_SLACK:
            index = known
        else:
            index = min(range(len(self.replicas)),
                        key=lambda i: (self._live[i], self._in_flight[i], i))
        if key is not None:
            self._prompt_replica[key] = index
            self._prompt_replica.move_to_end(key)
            while len(self._prompt_replica) > self.PROMPT_AFFINITY_MEMORY:
                self._prompt_replica.popitem(last=False)
        self._sessions[session_id] = index
        self._live[index] += 1
        while len(self._sessions) > self._max_sessions:  # forget the oldest sessions
            self._live[self._sessions.popitem(last=False)[1]] -= 1
        return index

    async def generate_n(self, input_ids: list[int], sampling: SamplingParams | None = None,
                         session_id: str | None = None, rid: str | None = None
                         ) -> list[GenerateResult]:
        index = self.replica_for(session_id, input_ids)
        engine = self.replicas[index]
        sampling = sampling or SamplingParams()
        future = engine.submit(input_ids, sampling, session_id, rid)
        key = future.rid  # type: ignore[attr-defined]
        self._rids[key] = index
        self._in_flight[index] += 1
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            engine.abort(key)
            raise
        finally:
            self._in_flight[index] -= 1
            self._rids.pop(key, None)

    def _forget_sessions(self) -> None:
        """Drop every pin (the caches were flushed: no replica holds a prefix any more)."""
        self._sessions.clear()
        self._prompt_replica.clear()
        self._live = [0] * len(self.replicas)

    def end_session(self, session_id: str) -> None:
        """Drop a finished session's pin and free its replica's cached KV row."""
        index = self._sessions.pop(session_id, None)
        if index is not None:
            self._live[index] -= 1
            self.replicas[index].end_session(session_id)

    # ------------------------------------------------------------------------- fan-out ops
    async def _each(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return list(await asyncio.gather(*(asyncio.to_thread(getattr(r, method), *args,
                                                             **kwargs)
                                           for r in self.replicas)))

    async def sync_weights(self, weights: WeightSource, version: int) -> None:
        """The learner's arrays themselves (this engine runs in the trainer's process: no
        export, no copy unless ``weights`` makes one)."""
        await self.update_weights(weights.arrays(), version=str(version))

    async def update_weights(self, params: Any = None, *, path: str | None = None,
                             version: str | None = None, flush_cache: bool = True,
                             abort_all: bool = False, cancel: threading.Event | None = None
                             ) -> str:
        if path is not None:  # read the checkpoint once, then place it on every replica
            params = await asyncio.to_thread(self.replicas[0].load_checkpoint, path, cancel)
        params = cast_once(params, self.config.weights_dtype)
        per_replica = gather_to_replicas(to_state(params, self.replicas[0].weights.abstract_state),
                                         [r.placement.devices for r in self.replicas])
        versions = list(await asyncio.gather(*(
            asyncio.to_thread(r.update_weights_sync, params if mine is None else mine,
                              version=version, flush_cache=flush_cache, abort_all=abort_all)
            for r, mine in zip(self.replicas, per_replica or [None] * len(self.replicas)))))
        if flush_cache:
            self._forget_sessions()
        if len(set(versions)) != 1:
            raise RuntimeError(f"replicas disagree on the weight version: {versions}")
        return versions[0]

    def update_weights_sync(self, params: Any = None, *, path: str | None = None,
                            version: str | None = None, flush_cache: bool = True,
                            abort_all: bool = False, cancel: threading.Event | None = None
                            ) -> str:
        """Blocking :meth:`update_weights` (for scripts and the HTTP server's thread)."""
        return asyncio.run(self.update_weights(params, path=path, version=version,
                                               flush_cache=flush_cache, abort_all=abort_all,
                                               cancel=cancel))

    async def flush_cache(self) -> int:
        freed = await self._each("flush_cache_sync")
        self._forget_sessions()
        return sum(freed)

    def flush_cache_sync(self) -> int:
        self._forget_sessions()
        return sum(r.flush_cache_sync() for r in self.replicas)

    async def release_kv_cache(self) -> int:
        """Every replica frees its KV cache (:meth:`Engine.release_kv_cache_sync`); the pins
        go with the cached prefixes. Returns the bytes freed over all replicas."""
        freed = await self._each("release_kv_cache_sync")
        self._forget_sessions()
        return sum(freed)

    async def resume_kv_cache(self) -> int:
        return sum(await self._each("resume_kv_cache_sync"))

    def abort(self, rid: str) -> bool:
        index = self._rids.get(str(rid))
        if index is not None:
            return self.replicas[index].abort(rid)
        return any(r.abort(rid) for r in self.replicas)

    def abort_all(self) -> int:
        return sum(r.abort_all() for r in self.replicas)

    def pause(self, mode: str = "in_place") -> None:
        for r in self.replicas:
            r.pause(mode)

    def resume(self) -> None:
        for r in self.replicas:
            r.resume()

    @property
    def paused(self) -> bool:
        return all(r.paused for r in self.replicas)

    async def health(self) -> bool:
        return all([await r.health() for r in self.replicas])

    def load(self) -> dict[str, int]:
        loads = [r.load() for r in self.replicas]
        return {k: sum(load[k] for load in loads) for k in loads[0]}

    @property
    def stats_dict(self) -> dict[str, Any]:
        """Counters summed over replicas (``EngineStats.as_dict`` fields)."""
        return merge_stats([r.stats.as_dict() for r in self.replicas])

    @property
    def weight_version(self) -> str:
        return self.replicas[0].weight_version

    @property
    def vocab_size(self) -> int:
        return self.replicas[0].vocab_size

    @property
    def max_length(self) -> int:
        return self.replicas[0].max_length

    @property
    def num_replicas(self) -> int:
        return len(self.replicas)

    @property
    def total_slots(self) -> int:
        return sum(r.config.max_batch for r in self.replicas)

    def close(self) -> None:
        for r in self.replicas:
            r.close()

    async def aclose(self) -> None:
        await self._each("close")

    def validate(self, input_ids: Any, sampling: SamplingParams) -> np.ndarray:
        return self.replicas[0].validate(input_ids, sampling)

    def submit(self, input_ids: Any, sampling: SamplingParams | None = None,
               session_id: str | None = None, rid: str | None = None
               ) -> concurrent.futures.Future:
        """Thread-safe submit to the routed replica (no in-flight accounting: for scripts)."""
        if not self.replicas:
            raise BackendUnavailableError("no replicas")
        return self.replicas[self.replica_for(session_id)].submit(input_ids, sampling,
                                                                   session_id, rid)


__all__ = ["EngineReplicas"]
