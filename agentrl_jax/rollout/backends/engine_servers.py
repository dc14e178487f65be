"""Data-parallel rollout in processes: one rollout-server process per local accelerator group.

``EngineReplicas`` runs one engine thread per device group inside the trainer's process. The
engines' host work (admission, prefill batching, stop checks, building results) and the
trainer's own Python then share one GIL: each replica's calls took longer than a lone
replica's (docs/PERFORMANCE.md, "Rollout on 1, 2, 4 GPUs"). Here each
replica is its own ``python -m agentrl_jax.rollout.servers.server`` process (the embedded engine behind
the SGLang HTTP API), pinned to its devices, and the trainer talks to all of them through
:class:`~agentrl_jax.rollout.backends.sglang.SGLangBackend` (sticky sessions, so a multi-turn
episode returns to the server holding its KV prefix; retries; least-loaded routing):

* **Start.** The policy is exported once (``save_hf_directory``, in the engine dtype) into a
  directory in shared memory (``/dev/shm`` when it has room, else the temporary directory);
  every server loads it and may later load weights from that directory only.
* **Placement.** Server ``i`` sees only its group's GPUs (``CUDA_VISIBLE_DEVICES``, mapped
  through this process's own list) and shards its engine over them (``--tensor-parallel``);
  on CPU a server is a CPU process with as many virtual devices as its group has (tests).
  Servers do not preallocate GPU memory (``XLA_PYTHON_CLIENT_PREALLOCATE=false``) unless
  ``mem_fraction`` is given: a trainer process that preallocated 75% of each GPU leaves the
  servers the rest.
* **Weight sync.** ``update_weights(model)`` writes one safetensors export into the same
  directory and every server loads it (``/update_weights_from_disk``) in parallel: a copy
  through host memory, ~2 bytes per parameter written once and read by each server.
* **Lifetime.** Servers run in their own process groups and exit when this process dies
  (``--parent-pid``); ``aclose()`` / ``close()`` stops them and removes the export directory.

Registry name ``engine_servers``; the trainer uses it with ``rollout.backend="engine_servers"``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import tempfile
from typing import Any, Sequence

from agentrl_jax.rollout.contract import BackendBuild
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.backends.sglang import SGLangBackend
from agentrl_jax.rollout.servers.engine_flags import engine_flags

log = logging.getLogger(__name__)

#: where the weight exports go when it has room (tmpfs: a copy in memory, not on disk)
SHARED_MEMORY_DIR = "/dev/shm"


def server_flags(config: EngineConfig) -> list[str]:
    """``agentrl_jax.rollout.servers.server`` command-line flags that rebuild ``config`` there:
    every engine setting, written by the options' own generator (``servers/engine_flags.py``),
    so no setting of a run (``share_prompts``, ...) is left to the server's defaults."""
    return engine_flags(config)


def device_environment(group: Sequence[int], platform: str,
                       mem_fraction: float | None = None) -> dict[str, str]:
    """Environment variables that give a server process only the devices ``group`` (local
    device ids of this process: positions in its own ``CUDA_VISIBLE_DEVICES`` list)."""
    if platform == "cpu":
        return {"JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": f"--xla_force_host_platform_device_count={len(group)}"}
    if platform != "gpu":
        raise ValueError(f"engine server processes support GPU and CPU devices, not {platform!r}"
                         " (on TPU use rollout.backend='embedded')")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in visible.split(",")] if visible else None
    if ids is not None and max(group) >= len(ids):
        raise ValueError(f"device {max(group)} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    env = {"CUDA_VISIBLE_DEVICES": ",".join(ids[i] if ids else str(i) for i in group),
           "JAX_PLATFORMS": "cuda"}
    if mem_fraction is None:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    else:
        if not 0.0 < mem_fraction <= 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(mem_fraction)
    return env


def export_directory(needed_bytes: int) -> str:
    """A fresh directory for weight exports: in shared memory when it has twice
    ``needed_bytes`` free (an export is written next to the previous one's files), else in
    the temporary directory."""
    base = None
    if os.path.isdir(SHARED_MEMORY_DIR) and os.access(SHARED_MEMORY_DIR, os.W_OK):
        if shutil.disk_usage(SHARED_MEMORY_DIR).free > 2 * needed_bytes:
            base = SHARED_MEMORY_DIR
    return tempfile.mkdtemp(prefix="agentrl-engines-", dir=base)


class EngineServers(SGLangBackend):
    """One rollout-server process per device group, used through the SGLang client.

    model: the policy (``CausalLM``) the servers start with. config: every replica's
    ``EngineConfig`` (``max_batch`` slots each). groups: local device ids per replica, e.g.
    ``[[0], [1], [2], [3]]``; ``platform``: ``"gpu"`` or ``"cpu"``. mem_fraction: each server's
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (default: no preallocation). startup_timeout: seconds a
    server may take to load and compile. Other keyword arguments go to ``SGLangBackend``.
    """

    external_servers = False  # started by (and belonging to) this process

    name = "engine_servers"
    uses_local_engine = True

    def __init__(self, model: Any, config: EngineConfig, groups: Sequence[Sequence[int]],
                 platform: str, *, tokenizer: Any = None, mem_fraction: float | None = None,
                 startup_timeout: float = 900.0, **kwargs: Any):
        from agentrl_jax.models.safetensors_io import save_hf_directory
        from agentrl_common.processes import start_env_server

        if not groups:
            raise ValueError("EngineServers needs at least one device group")
        self.config = config
        self.groups = [list(g) for g in groups]
        dtype = config.weights_dtype or config.dtype or model.cfg.dtype
        per_param = 2 if dtype in ("bfloat16", "float16") else 4
        export_root = export_directory(per_param * model.cfg.num_parameters)
        self.processes: list[Any] = []
        try:
            initial = save_hf_directory(model, os.path.join(export_root, "initial"),
                                        tokenizer=tokenizer, dtype=dtype)
            flags = server_flags(config) + ["--model", initial, "--weights-dir", export_root,
                                            "--log-level", "warning"]
            if model.cfg.output_token_ids is not None:  # a restricted policy stays restricted
                flags += ["--output-token-ids", ",".join(map(str, model.cfg.output_token_ids))]
            # start every server at once (each loads and compiles for a while), then wait
            with concurrent.futures.ThreadPoolExecutor(len(self.groups)) as pool:
                futures = [pool.submit(start_env_server, "rollout",
                                       extra_args=flags + ["--tensor-parallel", str(len(g))],
                                       env=device_environment(g, platform, mem_fraction),
                                       startup_timeout=startup_timeout,
                                       module="agentrl_jax.rollout.servers.server")
                           for g in self.groups]
                errors = []
                for f in futures:
                    try:
                        self.processes.append(f.result())
                    except Exception as e:  # noqa: BLE001 -- the first one is raised below
                        errors.append(e)
                if errors:
                    raise errors[0]
        except BaseException:
            self._stop_servers()
            shutil.rmtree(export_root, ignore_errors=True)
            raise
        kwargs.setdefault("close_sessions", True)  # our servers free an ended episode's prefix
        kwargs.setdefault("takes_option_count", True)  # and apply per-turn option limits
        super().__init__([p.url for p in self.processes], export_dir=export_root,
                         export_dtype=dtype, tokenizer=tokenizer, **kwargs)
        log.info("engine servers: %d processes (%s), weights via %s", len(self.processes),
                 ", ".join(f"devices {g} at {p.url}" for g, p in zip(self.groups,
                                                                    self.processes)),
                 export_root)

    @classmethod
    def from_config(cls, model: Any = "smollm2", engine: EngineConfig | dict | None = None,
                    groups: Sequence[Sequence[int]] | None = None, tokenizer: Any = None,
                    **kwargs: Any) -> "EngineServers":
        """Registry factory: ``model`` a name / path for ``load_pretrained`` or a ``CausalLM``;
        ``engine`` an ``EngineConfig`` or its fields; ``groups`` default: one server per local
        device of this process's default platform."""
        import jax

        if isinstance(model, str):
            from agentrl_jax.models.pretrained import load_pretrained

            pretrained = load_pretrained(model)
            model, tokenizer = pretrained.model, tokenizer or pretrained.tokenizer
        config = engine if isinstance(engine, EngineConfig) else EngineConfig(**(engine or {}))
        devices = jax.local_devices()
        groups = groups if groups is not None else [[i] for i in range(len(devices))]
        return cls(model, config, groups, devices[0].platform, tokenizer=tokenizer, **kwargs)

    @classmethod
    def from_run(cls, build: BackendBuild) -> "EngineServers":
        """One server per device group of the run (``build.device_groups``), each an engine of
        ``build.engine_config``."""
        import jax

        local = jax.local_devices()  # a server's devices: positions in this list
        groups = [[local.index(d) for d in g] for g in build.device_groups]
        return cls(build.model, build.engine_config, groups, build.device_groups[0][0].platform,
                   tokenizer=build.tokenizer, api_key=build.api_key)

    @property
    def num_replicas(self) -> int:
        return len(self.processes)

    @property
    def total_slots(self) -> int:
        return self.config.max_batch * len(self.processes)

    async def server_info(self) -> list[dict[str, Any]]:
        """Each server's ``/get_server_info`` (engine config, devices, ``stats`` counters)."""
        return list(await asyncio.gather(*[self._get_json(i, "/get_server_info")
                                           for i in range(len(self.servers))]))

    async def server_stats(self) -> list[dict[str, Any]]:
        """Each server's engine counters (``/get_server_info`` ``stats``)."""
        return [info.get("stats", {}) for info in await self.server_info()]

    async def _get_json(self, i: int, path: str) -> dict[str, Any]:
        import json

        status, text = await self._get(i, path)
        if status != 200:
            raise RuntimeError(f"{self.servers[i].url}{path}: HTTP {status}: {text[:200]}")
        return json.loads(text)

    def _stop_servers(self) -> None:
        for p in self.processes:
            try:
                p.stop()
            except Exception:  # noqa: BLE001 -- stop the others regardless
                log.exception("stopping %s", p)
        self.processes = []

    async def aclose(self) -> None:
        await super().aclose()
        await asyncio.to_thread(self._stop_servers)
        if self.export_dir:
            shutil.rmtree(self.export_dir, ignore_errors=True)

    def close(self) -> None:
        """Stop the servers from synchronous code (no event loop running here)."""
        asyncio.run(self.aclose())


__all__ = ["EngineServers", "server_flags", "device_environment", "export_directory"]
