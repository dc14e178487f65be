"""Record expert episodes for behaviour cloning, through the RL rollout path.

``record_experts(config, env, episodes, out_dir)`` starts (or connects to) the environment
server of ``env`` exactly as a run does, and collects episodes with the RL actor pool, whose
rollout backend is an :class:`~agentrl_jax.agent.experts.ExpertBackend`: same HTTP protocol,
same prompts, same chat template, same answer format (``agent.prompt_style``,
``agent.response_prefix``, ``rollout.stop``) and the same context limit as RL. Output::

    <out_dir>/<env>.jsonl   one trajectory per line (``Trajectory.to_json``: token ids, loss
                            mask, messages, rewards, status, turn states)
    <out_dir>/<env>.meta.json
                            what the trajectories were recorded with: tokenizer fingerprint,
                            model, answer format, split, horizon, counts, success rate

The token ids are those of the config's model tokenizer; ``training/sft.py`` refuses data
recorded with another tokenizer or answer format (record again with the SFT config).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from typing import Any, Callable

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.experts import EXPERT_POLICIES, ExpertBackend
from agentrl_jax.agent.trajectory import Trajectory

META_SUFFIX = ".meta.json"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of the tokenizer's vocabulary, special tokens and chat template: equal
    fingerprints give equal token ids and chat renderings."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps([tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token],
                        default=str).encode())
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    return h.hexdigest()[:16]


def answer_format(config: Any) -> dict[str, Any]:
    """The parts of a config that decide a trajectory's token layout besides the tokenizer."""
    from agentrl_jax.training.services import stop_strings

    agent = config.get("agent", {}) or {}
    return {"prompt_style": agent.get("prompt_style", "react"),
            "response_prefix": agent.get("response_prefix", ""),
            "stop": stop_strings(config.rollout.get("stop", ())),
            "max_context": int(config.rollout.max_context)}


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


async def record_experts(config: Any, env: str, episodes: int, out_dir: str, *,
                         split: str = "train", horizon: int | None = None, offset: int = 0,
                         say: Callable[..., None] = print) -> dict[str, Any]:
    """Record ``episodes`` expert episodes of ``env`` (see the module docstring); returns the
    meta record (also written next to the trajectories)."""
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_jax.training import services
    from agentrl_jax.training.progress import EpisodeProgress, format_seconds, progress_mode

    if env not in EXPERT_POLICIES:
        raise ValueError(f"no expert for environment {env!r} (have {sorted(EXPERT_POLICIES)})")
    fmt = answer_format(config)
    horizon = int(horizon or config.train.eval_horizon)
    tokenizer = load_tokenizer(resolve_model_path(config.model.name))
    stops = fmt["stop"] or []
    if len(stops) > 1:
        raise ValueError(f"expert replies end with one stop string; rollout.stop is {stops}")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{env}.jsonl")
    t0 = time.monotonic()
    sub = config.copy_and_resolve_references() if hasattr(config, "copy_and_resolve_references") \
        else config
    with contextlib.ExitStack() as stack:
        async with contextlib.AsyncExitStack() as astack:
            with sub.unlocked() if hasattr(sub, "unlocked") else contextlib.nullcontext():
                sub.env.names = env
            urls = services.start_env_services(sub, stack)
            clients = services.make_env_clients(urls, sub, astack)
            ids = list(await clients[env].tasks(split))
            tasks = [TaskRef(env, t) for t in sample_tasks(ids, episodes, int(config.seed),
                                                           offset)]
            if len(tasks) < episodes:
                say(f"the {split} split of {env} has {len(ids)} tasks: recording {len(tasks)} "
                    "episodes (one per task; the experts are deterministic)")
            formatter = ChatFormatter(tokenizer)
            backend = ExpertBackend(formatter, fmt["response_prefix"],
                                    stops[0] if stops else None, tokenizer.eos_token_id)
            pool = ExpertPool(backend, clients, formatter, services.make_sampling(sub),
                              max_context=fmt["max_context"],
                              max_concurrency=int(sub.rollout.max_concurrency),
                              prompt_style=fmt["prompt_style"],
                              response_prefix=fmt["response_prefix"])
            async with EpisodeProgress(len(tasks), f"recording {env} experts",
                                       progress_mode(force_bar=bool(config.get("progress"))),
                                       float(config.get("progress_seconds", 30.0)), say) as bar:
                def progress(t: Trajectory) -> None:
                    backend.end_session(t.episode_id)  # frees the expert's replica
                    bar(t)
                trajectories, stats = await pool.collect(tasks, 1, horizon, progress=progress)
    with open(path, "w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_json()) + "\n")
    ok = [t for t in trajectories if t.ok]
    wins = [t for t in ok if t.success or t.reward > 0]
    meta = {"env": env, "split": split, "offset": offset, "horizon": horizon,
            "model": str(config.model.name), "tokenizer": tokenizer_fingerprint(tokenizer),
            **fmt, "episodes": len(trajectories), "statuses": stats.statuses,
            "successful": len(wins), "success_rate": len(wins) / max(len(trajectories), 1),
            "mean_turns_successful": (sum(t.num_turns for t in wins) / len(wins)) if wins
            else 0.0,
            "assistant_tokens_successful": sum(t.num_generated for t in wins),
            "tokens_successful": sum(len(t.token_ids) for t in wins),
            "seconds": round(time.monotonic() - t0, 1),
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with open(os.path.join(out_dir, f"{env}{META_SUFFIX}"), "w") as f:
        json.dump(meta, f, indent=2)
    say(f"recorded {len(trajectories)} {env} expert episodes ({split} split, horizon {horizon}) "
        f"in {format_seconds(meta['seconds'])}: {len(wins)} successful "
        f"({100 * meta['success_rate']:.1f}%), {meta['mean_turns_successful']:.1f} turns and "
        f"{meta['tokens_successful'] / max(len(wins), 1):.0f} tokens per successful episode; "
        f"statuses {stats.statuses} -> {path}")
    return meta


def record_experts_sync(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(record_experts(*args, **kwargs))
