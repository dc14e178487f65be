"""Record expert episodes for behaviour cloning, through the RL rollout path.

``record_experts(config, env, episodes, out_dir)`` starts (or connects to) the environment
server of ``env`` exactly as a run does, and collects episodes with the RL actor pool, whose
rollout backend is an :class:`~agentrl_jax.agent.experts.ExpertBackend`: same HTTP protocol,
same prompts, same chat template, same answer format (``agent.prompt_style``,
``agent.response_prefix``, ``rollout.stop``, ``rollout.parser``), the same history window
(``agent.history_turns``) and the same context limit as RL. A parser that cannot read an
expert's reply as its action (``choice``: option letters) is refused. Output::

    <out_dir>/<env>.jsonl   one trajectory per line (``Trajectory.to_json``: token ids, loss
                            mask, messages, rewards, status, turn states)
    <out_dir>/<env>.meta.json
                            what the trajectories were recorded with: tokenizer fingerprint,
                            model, answer format, split, horizon, counts, success rate

The token ids are those of the config's model tokenizer; ``training/jobs/sft.py`` refuses data
recorded with another tokenizer or answer format (record again with the SFT config).

Progress: a line (flushed) every ``progress_every`` finished episodes and every
``progress_seconds`` (30). An expert call is capped (``act_timeout_s``, and BabyAIBot's plan
is bounded: ``agent/experts.py``), so a stuck expert fails its episode instead of freezing the
recorder. :func:`record_experts_parallel` splits the tasks over worker processes (experts are
CPU-bound Python on one event loop, so one process uses one core), each with
its own environment server and a wall-clock limit, and merges their files into the same
``<env>.jsonl`` / ``<env>.meta.json`` (same tasks, same order as one process would record).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import time
from typing import Any, Callable

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.experts import EXPERT_POLICIES, ExpertBackend
from agentrl_jax.agent.parsing import get_parser
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.config.sections import RunConfig
from agentrl_jax.training.outputs.progress import say_line

META_SUFFIX = ".meta.json"


def _write_meta(out_dir: str, env: str, meta: dict[str, Any]) -> None:
    """``<out_dir>/<env>.meta.json``: what a recording holds and how it went."""
    with open(os.path.join(out_dir, f"{env}{META_SUFFIX}"), "w") as f:
        json.dump(meta, f, indent=2)


#: the recorder's ``print``: flushed, one write a line (its log is a file on the GPU machines)
say_flush = say_line


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of the tokenizer's vocabulary, special tokens and chat template: equal
    fingerprints give equal token ids and chat renderings."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps([tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token],
                        default=str).encode())
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    return h.hexdigest()[:16]


def answer_format(config: RunConfig) -> dict[str, Any]:
    """The parts of a config that decide a trajectory's token layout besides the tokenizer:
    the answer format, the parser (``choice`` lists options after each observation) and the
    history window (``agent.history_turns`` and ``agent.history_stride``: windowed prompts,
    several chunks an episode)."""
    from agentrl_jax.training.runtime.services import stop_strings

    return {"prompt_style": config.agent.prompt_style,
            "response_prefix": config.agent.response_prefix,
            "stop": stop_strings(config.rollout.stop),
            "max_context": config.rollout.max_context,
            "parser": config.rollout.parser,
            "history_turns": config.agent.history_turns,
            "history_stride": config.agent.history_stride}


def check_expert_parser(parser_name: str, response_prefix: str, stop: str | None) -> None:
    """Raise ``ValueError`` unless the config's parser reads an expert's reply
    (:func:`~agentrl_jax.agent.experts.reply_text`) back as the expert's action: the experts
    answer with the action's text, so a multiple-choice parser (``rollout.parser='choice'``,
    which reads an option letter) cannot record them."""
    from agentrl_jax.agent.experts import reply_text
    from agentrl_jax.agent.parsing import get_parser, takes_options

    parser = get_parser(parser_name)
    probe = "go to the red ball"
    if takes_options(parser) or parser(response_prefix + reply_text(
            probe, response_prefix, stop)).action != probe:
        raise ValueError(f"rollout.parser={parser_name!r} does not read an expert's reply "
                         f"(the action's text after agent.response_prefix={response_prefix!r}) "
                         "as its action: record with a parser that does (e.g. 'react')")


class ExpertPool(ActorPool):
    """The RL actor pool whose episodes are registered with the expert backend before they
    run (the backend finds each episode's trajectory by its session id)."""

    def episodes_for(self, *args: Any, **kwargs: Any):
        episodes = super().episodes_for(*args, **kwargs)
        for e in episodes:
            self.backend.sessions[e.session_id] = e.trajectory
        return episodes


def sample_tasks(ids: list[str], n: int, seed: int = 0, offset: int = 0) -> list[str]:
    """``n`` distinct ids of a seeded permutation of ``ids``, from position ``offset`` on (all of
    them when ``n >= len(ids)``). Random, not evenly spaced: BabyAI's split interleaves its
    96 levels, so a regular stride would alias onto a few levels."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(ids))
    picked = [order[(offset + i) % len(ids)] for i in range(min(n, len(ids)))]
    return [ids[i] for i in picked]


async def record_experts(config: RunConfig, env: str, episodes: int, out_dir: str, *,
                         split: str = "train", horizon: int | None = None, offset: int = 0,
                         say: Callable[..., None] = say_flush, progress_every: int = 100,
                         act_timeout_s: float | None = 10.0,
                         shard: tuple[int, int] | None = None,
                         expert: str | None = None) -> dict[str, Any]:
    """Record ``episodes`` expert episodes of ``env`` (see the module docstring); returns the
    meta record (also written next to the trajectories). ``progress_every``: a progress line
    every this many finished episodes (0: time-based lines only); ``act_timeout_s``: the
    wall-clock limit of one expert action (``ExpertBackend``); ``shard=(start, stop)``: only
    positions ``start:stop`` of the ``episodes`` tasks (a worker of
    :func:`record_experts_parallel`); ``expert``: a name in ``EXPERT_POLICIES`` to act in
    ``env`` (default: the config's ``sft.expert``, else ``env``'s own expert), kept in the meta
    record."""
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_jax.training.runtime import services
    from agentrl_jax.training.outputs.progress import EpisodeProgress, format_seconds, progress_mode

    expert = resolve_expert(env, expert or config.sft.expert)
    fmt = answer_format(config)
    horizon = int(horizon or config.train.eval_horizon)
    tokenizer = load_tokenizer(resolve_model_path(config.model.name))
    stops = fmt["stop"] or []
    if len(stops) > 1:
        raise ValueError(f"expert replies end with one stop string; rollout.stop is {stops}")
    check_expert_parser(fmt["parser"], fmt["response_prefix"], stops[0] if stops else None)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{env}.jsonl")
    t0 = time.monotonic()
    sub = config.replace(env=config.env.replace(names=env))
    with contextlib.ExitStack() as stack:
        async with contextlib.AsyncExitStack() as astack:
            urls = services.start_env_services(sub, stack)
            clients = services.make_env_clients(urls, sub, astack)
            ids = list(await clients[env].tasks(split))
            tasks = [TaskRef(env, t) for t in sample_tasks(ids, episodes, int(config.seed),
                                                           offset)]
            if len(tasks) < episodes and (shard is None or shard[0] == 0):
                say(f"the {split} split of {env} has {len(ids)} tasks: recording {len(tasks)} "
                    "episodes (one per task; the experts are deterministic)")
            if shard is not None:
                tasks = tasks[shard[0]:shard[1]]
            formatter = ChatFormatter(tokenizer)
            backend = ExpertBackend(formatter, fmt["response_prefix"],
                                    stops[0] if stops else None, tokenizer.eos_token_id,
                                    policies={env: EXPERT_POLICIES.get(expert)},
                                    act_timeout_s=act_timeout_s)
            pool = ExpertPool(backend, clients, formatter, services.make_sampling(sub),
                              max_context=fmt["max_context"],
                              max_concurrency=int(sub.rollout.max_concurrency),
                              # the run's parser and history window: the recorded prompts are
                              # those the SFT and RL runs of this config see
                              parser=get_parser(fmt["parser"]),
                              prompt_style=fmt["prompt_style"],
                              response_prefix=fmt["response_prefix"],
                              history_turns=fmt["history_turns"],
                              history_stride=fmt["history_stride"],
                              # an expert's replies are not sampled, and name no option
                              option_limits=False, shuffle_options=False)
            async with EpisodeProgress(len(tasks), f"recording {env} experts",
                                       progress_mode(force_bar=config.progress),
                                       config.progress_seconds, say) as bar:
                finished = collections.Counter()

                def progress(t: Trajectory) -> None:
                    backend.end_session(t.episode_id)  # frees the expert's replica
                    bar(t)
                    finished["wins" if t.ok and (t.success or t.reward > 0) else "other"] += 1
                    done = sum(finished.values())
                    if progress_every > 0 and (done % progress_every == 0 or done == len(tasks)):
                        failed = sum(backend.failures.values())
                        why = f" {dict(backend.failures)}" if failed else ""
                        say(f"recording {env} experts: {done}/{len(tasks)} episodes, "
                            f"{finished['wins']} successful, {failed} expert failures{why} "
                            f"({format_seconds(time.monotonic() - t0)})")
                trajectories, stats = await pool.collect(tasks, 1, horizon, progress=progress)
    with open(path, "w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_json()) + "\n")
    ok = [t for t in trajectories if t.ok]
    wins = [t for t in ok if t.success or t.reward > 0]
    meta = {"env": env, "expert": expert, "split": split, "offset": offset, "horizon": horizon,
            "model": str(config.model.name), "tokenizer": tokenizer_fingerprint(tokenizer),
            **fmt, "episodes": len(trajectories), "statuses": stats.statuses,
            "successful": len(wins), "success_rate": len(wins) / max(len(trajectories), 1),
            "mean_turns_successful": (sum(t.num_turns for t in wins) / len(wins)) if wins
            else 0.0,
            "assistant_tokens_successful": sum(t.num_generated for t in wins),
            "tokens_successful": sum(len(t.token_ids) for t in wins),
            "expert_failures": dict(backend.failures),
            **({"shard": list(shard)} if shard is not None else {}),
            "seconds": round(time.monotonic() - t0, 1),
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _write_meta(out_dir, env, meta)
    say(f"recorded {len(trajectories)} {env} expert episodes ({split} split, horizon {horizon}) "
        f"in {format_seconds(meta['seconds'])}: {len(wins)} successful "
        f"({100 * meta['success_rate']:.1f}%), {meta['mean_turns_successful']:.1f} turns and "
        f"{meta['tokens_successful'] / max(len(wins), 1):.0f} tokens per successful episode; "
        f"statuses {stats.statuses} -> {path}")
    return meta


def resolve_expert(env: str, expert: str | None) -> str:
    """The expert that records ``env``: ``expert`` if given, else the environment's own. An
    expert of an environment is named ``env`` or ``env_<variant>`` (``babyai_macro``), so a
    config's ``sft.expert`` for one environment never acts in another."""
    expert = expert or env
    if expert not in EXPERT_POLICIES:
        raise ValueError(f"no expert {expert!r} for environment {env!r} "
                         f"(have {sorted(EXPERT_POLICIES)})")
    if expert != env and not expert.startswith(env + "_"):
        raise ValueError(f"expert {expert!r} is not an expert of environment {env!r} "
                         f"(its experts are named {env!r} or {env + '_<variant>'!r})")
    return expert


def record_experts_sync(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(record_experts(*args, **kwargs))


#: environment of the worker processes: one thread per numeric library (many workers on many
#: cores), and JAX on the CPU (a recorder never needs the accelerator, which the GPU jobs next
#: to it hold)
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "TOKENIZERS_PARALLELISM": "false", "JAX_PLATFORMS": "cpu"}


def shard_bounds(episodes: int, workers: int) -> list[tuple[int, int]]:
    """``workers`` contiguous, non-empty ``(start, stop)`` ranges covering ``0..episodes`` with
    sizes differing by at most one."""
    if episodes < 1 or workers < 1:
        raise ValueError(f"episodes and workers must be >= 1 (got {episodes}, {workers})")
    workers = min(workers, episodes)
    return [(episodes * k // workers, episodes * (k + 1) // workers) for k in range(workers)]


def _record_shard(config: RunConfig, env: str, episodes: int, out_dir: str, kwargs: dict) -> None:
    """A worker process of :func:`record_experts_parallel` (its lines prefixed with the shard)."""
    start, stop = kwargs["shard"]
    prefix = f"[shard {start}:{stop}] "

    def say(message: str = "", **kw: Any) -> None:
        say_flush(prefix + str(message), **kw)

    asyncio.run(record_experts(config, env, episodes, out_dir, say=say, **kwargs))


def merge_shard_metas(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """One meta record for the concatenation of the shards' trajectories: counts summed,
    rates and means recomputed (``mean_turns_successful`` weighted by successful episodes)."""
    if not metas:
        raise ValueError("no shard to merge")
    out = {k: v for k, v in metas[0].items() if k not in ("shard", "seconds", "recorded")}
    statuses: collections.Counter = collections.Counter()
    failures: collections.Counter = collections.Counter()
    for m in metas:
        statuses.update(m.get("statuses", {}))
        failures.update(m.get("expert_failures", {}))
    episodes = sum(int(m["episodes"]) for m in metas)
    wins = sum(int(m["successful"]) for m in metas)
    out.update(episodes=episodes, statuses=dict(statuses), successful=wins,
               success_rate=wins / max(episodes, 1),
               mean_turns_successful=(sum(m["mean_turns_successful"] * m["successful"]
                                          for m in metas) / wins) if wins else 0.0,
               assistant_tokens_successful=sum(int(m["assistant_tokens_successful"])
                                               for m in metas),
               tokens_successful=sum(int(m["tokens_successful"]) for m in metas),
               expert_failures=dict(failures))
    return out


def record_experts_parallel(config: RunConfig, env: str, episodes: int, out_dir: str, *,
                            workers: int = 1, split: str = "train", horizon: int | None = None,
                            offset: int = 0, say: Callable[..., None] = say_flush,
                            progress_every: int = 100, act_timeout_s: float | None = 10.0,
                            shard_timeout_s: float | None = None,
                            expert: str | None = None) -> dict[str, Any]:
    """:func:`record_experts` over ``workers`` processes (``spawn``; each with its own
    environment server and :data:`WORKER_ENV`), each recording a contiguous part of the same
    task list; the parts are concatenated in order into ``<out_dir>/<env>.jsonl``, so the file
    holds the episodes one process would have recorded, in the same order.

    A worker still running ``shard_timeout_s`` seconds after the start is killed (its server
    exits with it); the parts that finished are kept and the meta record lists the missing
    ones under ``failed_shards`` (with ``episodes_requested``). Raises ``RuntimeError`` when no
    part finished. ``workers <= 1`` records in this process (no time limit)."""
    expert = resolve_expert(env, expert or config.sft.expert)  # before spawning
    if workers <= 1:
        return asyncio.run(record_experts(config, env, episodes, out_dir, split=split,
                                          horizon=horizon, offset=offset, say=say,
                                          progress_every=progress_every,
                                          act_timeout_s=act_timeout_s, expert=expert))
    from agentrl_jax.training.outputs.progress import format_seconds

    t0 = time.monotonic()
    bounds = shard_bounds(episodes, workers)
    parts_dir = os.path.join(out_dir, f".{env}.shards")
    shutil.rmtree(parts_dir, ignore_errors=True)
    os.makedirs(parts_dir)
    ctx = multiprocessing.get_context("spawn")
    saved = {k: os.environ.get(k) for k in WORKER_ENV}
    os.environ.update({k: os.environ.get(k) or v for k, v in WORKER_ENV.items()})
    procs = []
    try:
        for k, (start, stop) in enumerate(bounds):
            kwargs = dict(split=split, horizon=horizon, offset=offset,
                          progress_every=progress_every, act_timeout_s=act_timeout_s,
                          shard=(start, stop), expert=expert)
            p = ctx.Process(target=_record_shard, name=f"record-{env}-{k}",
                            args=(config, env, episodes, os.path.join(parts_dir, str(k)),
                                  kwargs))
            p.start()
            procs.append(p)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    say(f"recording {episodes} {env} expert episodes with {len(procs)} worker processes "
        f"({bounds[0][1] - bounds[0][0]}-{bounds[-1][1] - bounds[-1][0]} episodes each)"
        + (f", {shard_timeout_s:.0f} s limit" if shard_timeout_s else ""))
    failed: dict[int, str] = {}
    running = set(range(len(procs)))
    try:
        while running:
            for k in sorted(running):
                procs[k].join(timeout=0.2 / max(len(running), 1))
                if procs[k].exitcode is not None:
                    running.discard(k)
                    if procs[k].exitcode != 0:
                        failed[k] = f"exit code {procs[k].exitcode}"
                    say(f"recording {env}: worker {k} ({bounds[k][0]}:{bounds[k][1]}) "
                        f"{'finished' if k not in failed else 'FAILED: ' + failed[k]}; "
                        f"{len(procs) - len(running)}/{len(procs)} done "
                        f"({format_seconds(time.monotonic() - t0)})")
            if shard_timeout_s and time.monotonic() - t0 > shard_timeout_s:
                for k in sorted(running):
                    procs[k].kill()
                    procs[k].join(5)
                    failed[k] = f"killed after {shard_timeout_s:.0f} s"
                    say(f"recording {env}: worker {k} ({bounds[k][0]}:{bounds[k][1]}) "
                        f"{failed[k]}")
                running.clear()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    metas, path = [], os.path.join(out_dir, f"{env}.jsonl")
    with open(path + ".tmp", "w") as out:
        for k in range(len(procs)):
            part = os.path.join(parts_dir, str(k))
            meta_path = os.path.join(part, f"{env}{META_SUFFIX}")
            if k in failed or not os.path.exists(meta_path):
                failed.setdefault(k, "no output")
                continue
            with open(meta_path) as f:
                metas.append(json.load(f))
            with open(os.path.join(part, f"{env}.jsonl")) as f:
                shutil.copyfileobj(f, out)
    if not metas:
        os.remove(path + ".tmp")
        raise RuntimeError(f"no {env} recording worker finished: {failed}")
    os.replace(path + ".tmp", path)
    shutil.rmtree(parts_dir, ignore_errors=True)
    meta = merge_shard_metas(metas)
    meta.update(workers=len(procs), episodes_requested=episodes,
                failed_shards=[{"shard": list(bounds[k]), "reason": r}
                               for k, r in sorted(failed.items())],
                seconds=round(time.monotonic() - t0, 1),
                recorded=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    _write_meta(out_dir, env, meta)
    say(f"recorded {meta['episodes']} {env} expert episodes with {len(procs)} workers in "
        f"{format_seconds(meta['seconds'])}: {meta['successful']} successful "
        f"({100 * meta['success_rate']:.1f}%), {meta['mean_turns_successful']:.1f} turns per "
        f"successful episode; statuses {meta['statuses']}; expert failures "
        f"{meta['expert_failures']}"
        + (f"; MISSING parts {meta['failed_shards']}" if failed else "") + f" -> {path}")
    return meta
