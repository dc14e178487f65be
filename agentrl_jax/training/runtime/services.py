"""Start (or connect to) what a run needs: environment servers, env clients, rollout backend.

When the config names no URL for an environment, its server is started on loopback with
``agentrl_common.processes.start_env_server`` and stopped when the run ends (Ctrl-C included:
everything is registered on an ``ExitStack`` that the trainer closes in ``finally``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any, Callable, Mapping, Sequence

from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.rollout.engine.sizing import fit_engine_slots
from agentrl_jax.training.config.rollout_section import as_list, engine_config_of_run
from agentrl_jax.training.config.sections import RunConfig
from agentrl_jax.training.outputs.progress import say_line

log = logging.getLogger(__name__)


def env_names(config: RunConfig) -> list[str]:
    """The environment families of ``config.env.names``."""
    names = config.env.name_list
    if not names:
        raise ValueError("config.env.names lists no environment")
    return names


def start_env_services(config: RunConfig, stack: contextlib.ExitStack) -> dict[str, list[str]]:
    """URLs per environment: from ``config.env.urls.<name>`` or servers started here (and
    supervised: see :func:`start_supervised_env_services`)."""
    return start_supervised_env_services(config, stack)[0]


def start_supervised_env_services(config: RunConfig, stack: contextlib.ExitStack,
                                  on_event: Callable[[str], None] | None = None,
                                  say: Callable[[str], None] | None = None
                                  ) -> tuple[dict[str, list[str]], Any]:
    """``(urls per environment, supervisor)``. URLs come from ``config.env.urls.<name>`` or
    from servers started here on loopback; those are watched by an
    ``agentrl_common.processes.ServerSupervisor`` that restarts a server that dies, on the same
    port, at most ``config.env.max_restarts`` times per server (its ``failures`` list the
    servers given up on; ``on_event`` gets a line per death / restart). The supervisor is None
    when no server was started here. Everything stops when ``stack`` closes (the supervisor
    first). Before a family's servers start, its registry entry's ``prepare`` (a one-time build
    that may outlast a server's start-up limit, e.g. deep search's task set) runs here, its
    lines going to ``say`` (default: stdout)."""
    from agentrl_common.processes import ServerSupervisor, start_env_server
    from environments.registry import get_family

    env = config.env
    urls: dict[str, list[str]] = {}
    started = []
    for name in env.name_list:
        given = as_list(env.urls[name]) if name in env.urls else []
        if given:
            urls[name] = given
            continue
        flags = env.server_args[name] if name in env.server_args else []
        extra = as_list(flags) if isinstance(flags, str) else list(flags)
        urls[name] = []
        server_args = [a for arg in extra for a in arg.split()]
        family = get_family(name)
        if family.prepare is not None:
            family.prepare(server_args, say or say_line)
        for _ in range(env.replicas):
            server = start_env_server(name, extra_args=server_args)
            stack.callback(server.stop)
            started.append(server)
            log.info("started %s environment server at %s", name, server.url)
            urls[name].append(server.url)
    supervisor = None
    if started:
        supervisor = ServerSupervisor(started, max_restarts=env.max_restarts,
                                      on_event=on_event or log.warning).start()
        stack.callback(supervisor.stop)  # before the servers stop (LIFO)
    return urls, supervisor


def make_env_clients(urls: Mapping[str, Sequence[str]], config: RunConfig,
                     stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    from environments.core.client import EnvClient

    clients = {}
    for name, replica_urls in urls.items():
        client = EnvClient(list(replica_urls), timeout=config.env.timeout,
                           max_connections=config.rollout.max_concurrency * 2,
                           list_actions=config.agent.list_valid_actions,
                           action_text=config.agent.actions_in_observation)
        stack.push_async_callback(client.aclose)
        clients[name] = client
    return clients


def max_episodes_per_round(config: RunConfig) -> int:
    """Most episodes one rollout or evaluation round can have in flight: the larger of
    ``tasks_per_step x samples_per_task`` and ``eval_tasks x eval_samples`` per environment
    family."""
    t, n_envs = config.train, len(config.env.name_list)
    train = t.tasks_per_step * t.samples_per_task
    evals = t.eval_tasks * t.eval_samples * max(n_envs, 1)
    return max(1, train, evals)


def engine_slots(config: RunConfig, model_config: Any, dtype: str | None = None,
                 host_ram_bytes: int | None = None, backend: str | None = None,
                 episodes: int | None = None) -> int:
    """Decode slots (KV-cache rows) for the embedded engine.

    ``min(rollout.max_batch, rollout.max_concurrency, episodes)``: a slot per episode that can
    be in flight, and never more than the actor pool runs at once or a round has (decode reads
    every slot's whole KV row each step, so idle slots cost time too). ``episodes`` is the most
    episodes one round of the caller has (``launch/eval.py``: ``k x tasks``); by default
    :func:`max_episodes_per_round` of the config's ``train`` values. On the CPU backend the KV cache
    (``2 x layers x kv_heads x head_dim x max_context`` values per slot) lives in host RAM and
    is additionally capped at ``rollout.engine.sizing.CPU_KV_RAM_FRACTION`` of it (a 24 GB machine, SmolLM2 at
    4096 tokens in f32: about 21 slots of 189 MB instead of 64 slots = 12 GB, which the engine's
    start-up peak of ~2x the cache did not survive). Requests beyond the slots wait in the
    engine's queue; nothing is dropped.
    """
    r = config.rollout
    if episodes is None:
        episodes = max_episodes_per_round(config)
    slots = max(1, min(r.max_batch, r.max_concurrency, int(episodes)))
    return fit_engine_slots(slots, model_config, r.max_context, dtype, host_ram_bytes, backend)


#: the learner's length buckets on the CPU backend: multiples of this many tokens
CPU_LENGTH_BUCKET = 256


def learner_settings(config: RunConfig, platform: str | None = None) -> LearnerConfig:
    """``config.learner`` as ``Learner`` takes it, with length buckets for the backend.

    The learner pads every row to a length bucket and computes the padding too. On
    accelerators the default powers of two stay (few compiled shapes; padding is cheap in
    parallel). On the CPU backend, when the config lists no buckets and does not pack rows,
    the buckets are multiples of :data:`CPU_LENGTH_BUCKET` up to ``rollout.max_context``: a
    new bucket costs one more CPU compile, while a power of two can nearly double the work (the
    README's taste run: 4 rows of at most 1,153 tokens padded to 2048 instead of 1280;
    docs/PERFORMANCE.md, "Figures moved out of the code's comments").
    """
    import jax

    settings = config.learner
    platform = platform or jax.default_backend()
    if platform == "cpu" and not settings.length_buckets and not settings.pack_length:
        top = config.rollout.max_context
        settings = settings.replace(length_buckets=tuple(range(
            CPU_LENGTH_BUCKET, top + CPU_LENGTH_BUCKET, CPU_LENGTH_BUCKET)))
    return settings


def engine_device_groups(config: RunConfig) -> list[list[Any]]:
    """The local device groups the embedded engine runs on: ``rollout.tensor_parallel``
    devices per replica, ``rollout.engine_replicas`` replicas (0: as many as the local
    accelerators make; on the CPU backend one, since its "devices" are slices of the same
    cores and each replica would hold its own KV cache in host RAM)."""
    import jax

    from agentrl_jax.rollout.engine.placement import device_groups

    rollout = config.rollout
    devices = jax.local_devices()
    groups = device_groups(devices, rollout.tensor_parallel)
    wanted = rollout.engine_replicas
    if wanted == 0 and devices[0].platform == "cpu":
        wanted = 1
    if wanted > len(groups):
        raise ValueError(f"rollout.engine_replicas={wanted} but this host has only "
                         f"{len(groups)} group(s) of rollout.tensor_parallel="
                         f"{rollout.tensor_parallel} local devices")
    return groups[:wanted] if wanted > 0 else groups


def make_backend(config: RunConfig, model: Any, tokenizer: Any, model_path: str | None,
                 episodes: int | None = None) -> Any:
    """The rollout backend named by ``config.rollout.backend``; ``episodes``: the most episodes
    one round has (sizes the embedded engine, see :func:`engine_slots`).

    The name is looked up in ``ROLLOUT_BACKENDS``; a backend with ``uses_local_engine`` gets an
    ``EngineConfig`` and this job's device groups in its ``BackendBuild``. ``embedded``: one
    engine per local device group in this process (``EngineReplicas`` when there are several);
    ``engine_servers``: the same engines, each in its own server process
    (``rollout/backends/engine_servers.py``: no GIL shared between replicas; weights sync through a
    safetensors export); ``sglang``: external servers at ``rollout.urls``."""
    import dataclasses

    from agentrl_jax.rollout.contract import ROLLOUT_BACKENDS, BackendBuild

    rollout = config.rollout
    backend_cls = ROLLOUT_BACKENDS.get(rollout.backend)  # UnknownNameError: known names
    build = BackendBuild(model=model, tokenizer=tokenizer, model_path=model_path,
                         urls=tuple(rollout.url_list),
                         api_key=rollout.api_key or None)
    if backend_cls.uses_local_engine:
        model_config = model.cfg if hasattr(model, "cfg") else None
        slots = (engine_slots(config, model_config, rollout.engine_dtype or None,
                              episodes=episodes)
                 if model_config is not None else int(rollout.max_batch))
        groups = engine_device_groups(config)
        per_replica = -(-slots // len(groups))  # sessions spread evenly over the replicas
        # "auto" values stay: each engine resolves them for its devices (engine/resolution.py)
        engine_config = engine_config_of_run(rollout, config.seed, max_batch=per_replica)
        build = dataclasses.replace(build, engine_config=engine_config,
                                    device_groups=tuple(tuple(g) for g in groups))
    return backend_cls.from_run(build)


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


def make_sampling(config: RunConfig):
    from agentrl_jax.rollout.contract import SamplingParams

    r = config.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                          top_p=r.top_p, top_k=r.top_k, stop=stop_strings(r.stop))


def stop_strings(value: Any) -> list[str] | None:
    """``rollout.stop`` as the sampler's ``stop`` list: a sequence of strings (``("\\n",)``
    ends a turn at its first line break); empty or None: none."""
    if value is None or value == "":
        return None
    items = [value] if isinstance(value, str) else list(value)
    return [str(v) for v in items if str(v)] or None


def spawn_actor_workers(config: RunConfig) -> Any:
    """The actor worker processes (``rollout.actor_workers`` > 0) spawned now, beside what the
    run does next (the model load), so the first rollout does not wait for their start-up;
    ``None`` for in-process episodes. Hand the group to ``make_actor_pool``."""
    if config.rollout.actor_workers <= 0:
        return None
    from agentrl_jax.agent.workers import WorkerGroup

    group = WorkerGroup(config.rollout.actor_workers)
    group.spawn()
    return group


def make_actor_pool(config: RunConfig, backend: Any, clients: Mapping[str, Any], tokenizer: Any,
                    eos_token_ids: Sequence[int] = (), worker_group: Any = None):
    from agentrl_jax.agent.actor_pool import ActorPool
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.parsing import get_parser

    r, agent = config.rollout, config.agent
    return ActorPool(backend, clients, ChatFormatter(tokenizer, tuple(eos_token_ids) or None),
                     make_sampling(config), max_context=r.max_context,
                     max_concurrency=r.max_concurrency, parser=get_parser(r.parser),
                     prompt_style=agent.prompt_style, response_prefix=agent.response_prefix,
                     # > 0: prompts keep only the last this many turns (episode.py)
                     history_turns=agent.history_turns,
                     # a full window drops this many turns at once (episode.py)
                     history_stride=agent.history_stride,
                     # a turn listing n options samples only the first n letters (episode.py)
                     option_limits=agent.option_limits,
                     # the options in an order seeded by the run, not the env's (episode.py)
                     shuffle_options=agent.shuffle_options,
                     # episodes in N spawned processes, the backend here (docs/ROLLOUT.md)
                     workers=r.actor_workers,
                     # workers post to HTTP rollout servers themselves (engine_servers, sglang)
                     direct_workers=r.actor_workers_direct,
                     # its processes spawned ahead (spawn_actor_workers), or None
                     worker_group=worker_group)


def task_filters(config: RunConfig) -> dict[str, re.Pattern[str]]:
    """``config.env.task_filter``: per environment, a regular expression a task id must match
    in full to be trained or evaluated on (e.g. ``{"babyai": r"BabyAI-GoToObj-v0/.*"}`` keeps
    one BabyAI level); environments not named keep every task."""
    given = config.env.task_filter
    return {str(name): re.compile(str(pattern)) for name, pattern in given.items()}


async def task_refs(clients: Mapping[str, Any], split: str, limit: int | None = None,
                    filters: Mapping[str, re.Pattern[str]] | None = None,
                    sample: str = "stratified") -> list:
    """Task references of ``split`` for every environment. ``filters``: per environment, a
    pattern the task id must match in full (``task_filters``); a filter that keeps no task is
    an error. With ``limit``, ``limit`` ids of the (filtered) split per environment, chosen by
    ``sample`` (``train.eval_sample``; ``runtime/task_sample.py``): ``stratified`` spreads them
    over the split's task groups (BabyAI levels, ScienceWorld and MiniWoB tasks), ``spaced``
    takes evenly spaced ids (which alias on interleaved splits); the same ids every time."""
    from agentrl_jax.agent.actor_pool import TaskRef
    from agentrl_jax.training.runtime.task_sample import sample_tasks

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
            ids = sample_tasks(ids, limit, sample)
        tasks.extend(TaskRef(name, t) for t in ids)
    return tasks
