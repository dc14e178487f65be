"""Start (or connect to) what a run needs: environment servers, env clients, rollout backend.

When the config names no URL for an environment, its server is started on loopback with
``environments.launcher.start_env_server`` and stopped when the run ends (Ctrl-C included:
everything is registered on an ``ExitStack`` that the trainer closes in ``finally``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any, Callable, Mapping, Sequence

log = logging.getLogger(__name__)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def env_names(config: Any) -> list[str]:
    names = _as_list(config.env.names)
    if not names:
        raise ValueError("config.env.names lists no environment")
    return names


def start_env_services(config: Any, stack: contextlib.ExitStack) -> dict[str, list[str]]:
    """URLs per environment: from ``config.env.urls.<name>`` or servers started here (and
    supervised: see :func:`start_supervised_env_services`)."""
    return start_supervised_env_services(config, stack)[0]


def start_supervised_env_services(config: Any, stack: contextlib.ExitStack,
                                  on_event: Callable[[str], None] | None = None
                                  ) -> tuple[dict[str, list[str]], Any]:
    """``(urls per environment, supervisor)``. URLs come from ``config.env.urls.<name>`` or
    from servers started here on loopback; those are watched by an
    ``environments.launcher.ServerSupervisor`` that restarts a server that dies, on the same
    port, at most ``config.env.max_restarts`` times per server (its ``failures`` list the
    servers given up on; ``on_event`` gets a line per death / restart). The supervisor is None
    when no server was started here. Everything stops when ``stack`` closes (the supervisor
    first)."""
    from environments.launcher import ServerSupervisor, start_env_server

    urls: dict[str, list[str]] = {}
    started = []
    configured: Mapping[str, Any] = dict(config.env.get("urls", {}) or {})
    server_args: Mapping[str, Any] = dict(config.env.get("server_args", {}) or {})
    for name in env_names(config):
        given = _as_list(configured.get(name))
        if given:
            urls[name] = given
            continue
        extra = _as_list(server_args.get(name)) if isinstance(server_args.get(name), str) else \
            list(server_args.get(name) or [])
        replicas = int(config.env.get("replicas", 1))
        urls[name] = []
        for _ in range(replicas):
            server = start_env_server(name, extra_args=[a for arg in extra for a in arg.split()])
            stack.callback(server.stop)
            started.append(server)
            log.info("started %s environment server at %s", name, server.url)
            urls[name].append(server.url)
    supervisor = None
    if started:
        supervisor = ServerSupervisor(started, max_restarts=int(config.env.get("max_restarts", 3)),
                                      on_event=on_event or log.warning).start()
        stack.callback(supervisor.stop)  # before the servers stop (LIFO)
    return urls, supervisor


def make_env_clients(urls: Mapping[str, Sequence[str]], config: Any,
                     stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    from environments.core.client import EnvClient

    clients = {}
    for name, replica_urls in urls.items():
        client = EnvClient(list(replica_urls), timeout=float(config.env.get("timeout", 120.0)),
                           max_connections=int(config.rollout.max_concurrency) * 2,
                           list_actions=int(config.agent.list_valid_actions))
        stack.push_async_callback(client.aclose)
        clients[name] = client
    return clients


#: share of the host's RAM the embedded engine's KV cache may take on the CPU backend.
CPU_KV_RAM_FRACTION = 1 / 6


def max_episodes_per_round(config: Any) -> int:
    """Most episodes one rollout or evaluation round can have in flight: the larger of
    ``tasks_per_step x samples_per_task`` and ``eval_tasks x eval_samples`` per environment
    family (an upper bound; a large number when the config has no ``train`` section)."""
    t = config.get("train", None)
    if t is None:
        return 1 << 30
    n_envs = len(_as_list(config.env.names)) if "env" in config else 1
    train = int(t.get("tasks_per_step", 1)) * int(t.get("samples_per_task", 1))
    evals = int(t.get("eval_tasks", 0)) * int(t.get("eval_samples", 1)) * max(n_envs, 1)
    return max(1, train, evals)


def engine_slots(config: Any, model_config: Any, dtype: str | None = None,
                 host_ram_bytes: int | None = None, backend: str | None = None,
                 episodes: int | None = None) -> int:
    """Decode slots (KV-cache rows) for the embedded engine.

    ``min(rollout.max_batch, rollout.max_concurrency, episodes)``: a slot per episode that can
    be in flight, and never more than the actor pool runs at once or a round has (decode reads
    every slot's whole KV row each step, so idle slots cost time too). ``episodes`` is the most
    episodes one round of the caller has (``launch/eval.py``: ``k x tasks``); by default
    :func:`max_episodes_per_round` of the config's ``train`` values. On the CPU backend the KV cache
    (``2 x layers x kv_heads x head_dim x max_context`` values per slot) lives in host RAM and
    is additionally capped at :data:`CPU_KV_RAM_FRACTION` of it (a 24 GB machine, SmolLM2 at
    4096 tokens in f32: about 21 slots of 189 MB instead of 64 slots = 12 GB, which the engine's
    start-up peak of ~2x the cache did not survive). Requests beyond the slots wait in the
    engine's queue; nothing is dropped.
    """
    r = config.rollout
    if episodes is None:
        episodes = max_episodes_per_round(config)
    slots = max(1, min(int(r.max_batch), int(r.max_concurrency), int(episodes)))
    return fit_engine_slots(slots, model_config, int(r.max_context), dtype, host_ram_bytes, backend)


def fit_engine_slots(slots: int, model_config: Any, max_length: int, dtype: str | None = None,
                     host_ram_bytes: int | None = None, backend: str | None = None) -> int:
    """``slots`` decode slots, or fewer on the CPU backend: as many as hold their KV cache
    (``2 x layers x kv_heads x head_dim x max_length`` values of ``dtype``, default the
    model's, per slot) in :data:`CPU_KV_RAM_FRACTION` of ``host_ram_bytes`` (default: this
    machine's RAM), at least one. The trainer's engine (:func:`engine_slots`) and the
    standalone inference server (``rollout/server.py``) are sized by it."""
    import jax
    import jax.numpy as jnp

    backend = backend or jax.default_backend()
    if backend != "cpu":
        return slots
    if host_ram_bytes is None:
        import os

        host_ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    itemsize = jnp.dtype(dtype or model_config.dtype).itemsize
    per_slot = (2 * model_config.num_layers * model_config.num_kv_heads * model_config.head_dim
                * int(max_length) * itemsize)
    fit = max(1, int(host_ram_bytes * CPU_KV_RAM_FRACTION // per_slot))
    if fit < slots:
        log.warning("rollout engine: %d decode slots instead of %d (KV cache %.1f GB of %.1f GB "
                    "host RAM on CPU); further requests wait for a free slot", fit, slots,
                    fit * per_slot / 1e9, host_ram_bytes / 1e9)
    return min(slots, fit)


#: chunked-prefill buckets of the embedded engine on the CPU backend (one sequence per call)
CPU_PREFILL_CHUNKS = (64, 256)


def engine_prefill(platform: str) -> dict[str, Any]:
    """``EngineConfig`` prefill fields for the engine's device ``platform``.

    A prefill call computes all of its ``rows x chunk`` token positions, each attending over
    the slot's whole ``max_length`` KV row, whatever share of them is real. Accelerators do
    that padding in parallel almost for free: the engine's defaults (up to 4096 positions a
    call, chunks up to 1024) stay. A CPU pays for every position: a multi-turn agent sends
    one sequence with a ~150-token observation at a time, which the defaults ran as a
    ``[4, 256]`` call (four times the positions of a ``[1, 256]`` call, and the CPU time too:
    docs/PERFORMANCE.md). On CPU: one sequence per call (``prefill_tokens`` = the smallest
    chunk) and chunks of :data:`CPU_PREFILL_CHUNKS` (two compiled prefill shapes, not three),
    each attending over the whole row (``prefill_kv_buckets=()``): the KV-length buckets an
    accelerator uses (``EngineConfig.prefill_kv_buckets``) would compile four times the prefill
    shapes, each a long CPU compile; not measured on CPU yet, so not enabled there.
    """
    if platform != "cpu":
        return {}
    return {"prefill_chunks": CPU_PREFILL_CHUNKS, "prefill_tokens": min(CPU_PREFILL_CHUNKS),
            "prefill_kv_buckets": ()}


def prefill_kv_buckets(value: Any) -> tuple[int, ...] | None:
    """``rollout.prefill_kv_buckets`` as ``EngineConfig.prefill_kv_buckets``: ``""`` -> ``()``
    (the whole row), ``"auto"`` -> ``None`` (powers of two), ``"512,1024"`` / a sequence ->
    those lengths."""
    from agentrl_jax.rollout.engine_config import parse_prefill_kv_buckets

    return parse_prefill_kv_buckets(value, "rollout.prefill_kv_buckets")


#: the learner's length buckets on the CPU backend: multiples of this many tokens
CPU_LENGTH_BUCKET = 256


def learner_settings(config: Any, platform: str | None = None) -> dict[str, Any]:
    """``config.learner`` as the dict ``Learner`` takes, with length buckets for the backend.

    The learner pads every row to a length bucket and computes the padding too. On
    accelerators the default powers of two stay (few compiled shapes; padding is cheap in
    parallel). On the CPU backend, when the config lists no buckets and does not pack rows,
    the buckets are multiples of :data:`CPU_LENGTH_BUCKET` up to ``rollout.max_context``: a
    new bucket costs one more CPU compile, while a power of two can nearly double the work (the
    README's taste run: 4 rows of at most 1,153 tokens padded to 2048 instead of 1280;
    docs/PERFORMANCE.md, "Figures moved out of the code's comments").
    """
    import jax

    settings = dict(config.learner)
    platform = platform or jax.default_backend()
    if platform == "cpu" and not settings.get("length_buckets") and not settings.get(
            "pack_length"):
        top = int(config.rollout.max_context)
        settings["length_buckets"] = tuple(range(CPU_LENGTH_BUCKET, top + CPU_LENGTH_BUCKET,
                                                 CPU_LENGTH_BUCKET))
    return settings


def engine_device_groups(config: Any) -> list[list[Any]]:
    """The local device groups the embedded engine runs on: ``rollout.tensor_parallel``
    devices per replica, ``rollout.engine_replicas`` replicas (0: as many as the local
    accelerators make; on the CPU backend one, since its "devices" are slices of the same
    cores and each replica would hold its own KV cache in host RAM)."""
    import jax

    from agentrl_jax.rollout.placement import device_groups

    rollout = config.rollout
    devices = jax.local_devices()
    groups = device_groups(devices, int(rollout.get("tensor_parallel", 1)))
    wanted = int(rollout.get("engine_replicas", 0))
    if wanted == 0 and devices[0].platform == "cpu":
        wanted = 1
    if wanted > len(groups):
        raise ValueError(f"rollout.engine_replicas={wanted} but this host has only "
                         f"{len(groups)} group(s) of rollout.tensor_parallel="
                         f"{rollout.get('tensor_parallel', 1)} local devices")
    return groups[:wanted] if wanted > 0 else groups


def make_backend(config: Any, model: Any, tokenizer: Any, model_path: str | None,
                 episodes: int | None = None) -> Any:
    """The rollout backend named by ``config.rollout.backend``; ``episodes``: the most episodes
    one round has (sizes the embedded engine, see :func:`engine_slots`).

    ``embedded``: one engine per local device group in this process (``EngineReplicas`` when
    there are several); ``engine_servers``: the same engines, each in its own server process
    (``rollout/engine_servers.py``: no GIL shared between replicas; weights sync through a
    safetensors export); ``sglang``: external servers at ``rollout.urls``."""
    from agentrl_jax.rollout.base import create_backend

    rollout = config.rollout
    if rollout.backend in ("embedded", "engine_servers"):
        from agentrl_jax.rollout.engine import Engine, EngineConfig

        model_config = model.cfg if hasattr(model, "cfg") else None
        slots = (engine_slots(config, model_config, rollout.get("engine_dtype") or None,
                              episodes=episodes)
                 if model_config is not None else int(rollout.max_batch))
        groups = engine_device_groups(config)
        per_replica = -(-slots // len(groups))  # sessions spread evenly over the replicas
        engine_kwargs = dict(
            max_batch=per_replica, max_length=int(rollout.max_context),
            dtype=rollout.get("engine_dtype") or None,
            weights_dtype=rollout.get("engine_dtype") or None,
            decode_steps=int(rollout.get("decode_steps", 16)), seed=int(config.seed),
            decode_attention=str(rollout.get("decode_attention", "auto")),
            decode_gemm=str(rollout.get("decode_gemm", "auto")),
            prefill_kv_buckets=prefill_kv_buckets(rollout.get("prefill_kv_buckets", "")))
        engine_kwargs.update(engine_prefill(groups[0][0].platform))
        engine_config = EngineConfig(**engine_kwargs)
        if rollout.backend == "engine_servers":
            import jax

            from agentrl_jax.rollout.engine_servers import EngineServers

            local = jax.local_devices()  # a server's devices: positions in this list
            return EngineServers(model, engine_config, [[local.index(d) for d in g]
                                                        for g in groups],
                                 groups[0][0].platform, tokenizer=tokenizer,
                                 api_key=rollout.get("api_key") or None)
        if len(groups) == 1:
            return Engine(model, engine_config, tokenizer=tokenizer, model_path=model_path,
                          devices=groups[0])
        from agentrl_jax.rollout.replicas import EngineReplicas

        return EngineReplicas(model, engine_config, tokenizer=tokenizer, model_path=model_path,
                              devices=[d for g in groups for d in g],
                              tensor_parallel=len(groups[0]))
    if rollout.backend == "sglang":
        urls = _as_list(rollout.get("urls"))
        if not urls:
            raise ValueError("rollout.backend='sglang' needs rollout.urls (comma-separated)")
        # rollout.api_key (or $AGENTRL_ROLLOUT_API_KEY): servers started with --api-key
        return create_backend("sglang", urls=urls, api_key=rollout.get("api_key") or None)
    raise ValueError(f"unknown rollout backend {rollout.backend!r} (embedded, engine_servers, "
                     "sglang)")


def describe_backend(backend: Any, episodes: int | None = None) -> str:
    """One line: the rollout backend and its decode slots (embedded engine)."""
    slots = getattr(backend, "total_slots", None) or getattr(
        getattr(backend, "config", None), "max_batch", None)
    what = (f"rollout engine: {slots} decode slots" if slots is not None
            else f"rollout backend: {type(backend).__name__}")
    replicas = getattr(backend, "num_replicas", None)
    if replicas:
        what += f" on {replicas} replicas"
    return what + (f" for {episodes} episodes per round" if episodes is not None else "")


def describe_urls(urls: Mapping[str, Sequence[str]]) -> str:
    """One line: every environment's server URLs."""
    return "environment servers: " + ", ".join(f"{name} {' '.join(u)}"
                                               for name, u in urls.items())


async def close_backend(backend: Any, drain_timeout: float = 30.0) -> None:
    """Close a rollout backend after what was in flight has been answered.

    An interrupted rollout (Ctrl-C, a cancelled overlapping rollout) leaves abort requests in
    the embedded engine's command queue; closing the engine before it ran them would fail each
    request's future with "the engine was closed" and, with nobody awaiting them any more,
    asyncio prints "Future exception was never retrieved" for each. So: abort everything, wait
    for one engine command round trip (commands run in order, so the aborts are answered
    first), then close.
    """
    abort_all = getattr(backend, "abort_all", None)
    flush = getattr(backend, "flush_cache", None)
    if abort_all is not None and flush is not None:
        with contextlib.suppress(Exception):
            abort_all()
            await asyncio.wait_for(flush(), drain_timeout)
    await backend.aclose()


def make_sampling(config: Any):
    from agentrl_jax.rollout.base import SamplingParams

    r = config.rollout
    return SamplingParams(max_new_tokens=int(r.max_new_tokens), temperature=float(r.temperature),
                          top_p=float(r.top_p), top_k=int(r.get("top_k", -1)),
                          stop=stop_strings(r.get("stop", ())))


def stop_strings(value: Any) -> list[str] | None:
    """``rollout.stop`` as the sampler's ``stop`` list: a sequence of strings (``("\\n",)``
    ends a turn at its first line break); empty or None: none."""
    if value is None or value == "":
        return None
    items = [value] if isinstance(value, str) else list(value)
    return [str(v) for v in items if str(v)] or None


def make_actor_pool(config: Any, backend: Any, clients: Mapping[str, Any], tokenizer: Any,
                    eos_token_ids: Sequence[int] = ()):
    from agentrl_jax.agent.actor_pool import ActorPool
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.parsing import get_parser

    r = config.rollout
    agent = config.get("agent", {}) or {}
    return ActorPool(backend, clients, ChatFormatter(tokenizer, tuple(eos_token_ids) or None),
                     make_sampling(config), max_context=int(r.max_context),
                     max_concurrency=int(r.max_concurrency),
                     parser=get_parser(r.get("parser", "react")),
                     prompt_style=agent.get("prompt_style", "react"),
                     response_prefix=agent.get("response_prefix", ""),
                     # episodes in N spawned processes, the backend here (docs/ROLLOUT.md)
                     workers=int(r.get("actor_workers", 0) or 0),
                     # workers post to HTTP rollout servers themselves (engine_servers, sglang)
                     direct_workers=bool(r.get("actor_workers_direct", True)))


def task_filters(config: Any) -> dict[str, re.Pattern[str]]:
    """``config.env.task_filter``: per environment, a regular expression a task id must match
    in full to be trained or evaluated on (e.g. ``{"babyai": r"BabyAI-GoToObj-v0/.*"}`` keeps
    one BabyAI level); environments not named keep every task."""
    given = config.env.get("task_filter", {}) or {}
    return {str(name): re.compile(str(pattern)) for name, pattern in dict(given).items()}


async def task_refs(clients: Mapping[str, Any], split: str, limit: int | None = None,
                    filters: Mapping[str, re.Pattern[str]] | None = None) -> list:
    """Task references of ``split`` for every environment. ``filters``: per environment, a
    pattern the task id must match in full (``task_filters``); a filter that keeps no task is
    an error. With ``limit``, an evenly spaced sample of the (filtered) split (a split is
    ordered by level/task, so the first N ids would all be one level); the same ids every
    time."""
    from agentrl_jax.agent.actor_pool import TaskRef

    tasks = []
    for name, client in clients.items():
        ids = list(await client.tasks(split))
        pattern = (filters or {}).get(name)
        if pattern is not None:
            total = len(ids)
            ids = [t for t in ids if pattern.fullmatch(t)]
            if not ids:
                raise ValueError(f"env.task_filter.{name} ({pattern.pattern!r}) keeps none of "
                                 f"the {total} {split} tasks of {name}")
        if limit is not None and len(ids) > limit:
            ids = [ids[(i * len(ids)) // limit] for i in range(limit)]
        tasks.extend(TaskRef(name, t) for t in ids)
    return tasks
