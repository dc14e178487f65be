"""Asynchronous actor pool: many episodes in flight, each stepping its own environment.

``collect`` starts ``n_samples`` episodes per task (a GRPO group) and runs up to
``max_concurrency`` at once. In the default asynchronous mode each episode loops on its own:
a fast episode never waits for a slow one, and the rollout backend batches whatever requests are
in flight (continuous batching). ``lockstep=True`` reproduces the reference system's synchronous
rounds (every episode generates, then every episode steps) for comparison.

Failures: an environment or engine failure ends that episode with status ``env_error`` /
``engine_error``; it is counted and dropped from training, never scored as reward 0.

``workers=N`` runs the episodes of asynchronous collects in ``N`` worker processes (the backend
stays here; ``agentrl_jax.agent.workers``): one process's host work caps the rollout's turn
rate below what several GPUs' engines consume (docs/PERFORMANCE.md, "Actor workers").
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.episode import Episode, TaskRef, start_episode
from agentrl_jax.agent.loop_times import LoopTimes
from agentrl_jax.agent.parsing import ParsedAction
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.rollout.contract import SamplingParams


@dataclasses.dataclass
class RolloutStats:
    episodes: int
    dropped: int
    statuses: dict[str, int]
    mean_reward: float
    success_rate: float
    mean_turns: float
    generated_tokens: int
    wall_s: float

    def as_metrics(self, prefix: str = "rollout/") -> dict[str, float]:
        out = {f"{prefix}{k}": float(v) for k, v in dataclasses.asdict(self).items()
               if not isinstance(v, dict)}
        out.update({f"{prefix}status/{k}": float(v) for k, v in self.statuses.items()})
        return out


def summarize(trajectories: Sequence[Trajectory], wall_s: float) -> RolloutStats:
    ok = [t for t in trajectories if t.ok]
    n = max(len(ok), 1)
    return RolloutStats(
        episodes=len(trajectories), dropped=len(trajectories) - len(ok),
        statuses=dict(Counter(t.status for t in trajectories)),
        mean_reward=sum(t.reward for t in ok) / n,
        success_rate=sum(t.success for t in ok) / n,
        mean_turns=sum(t.num_turns for t in ok) / n,
        generated_tokens=sum(t.num_generated for t in ok), wall_s=wall_s)


class ActorPool:
    """Runs episodes against env servers (``env_clients[name]``) and a rollout backend."""

    def __init__(self, backend: Any, env_clients: Mapping[str, Any], formatter: ChatFormatter,
                 sampling: SamplingParams, *, max_context: int, max_concurrency: int,
                 parser: Callable[..., ParsedAction], prompt_style: str, response_prefix: str,
                 history_turns: int, history_stride: int, option_limits: bool,
                 shuffle_options: bool,
                 env_errors: tuple[type[BaseException], ...] | None = None,
                 progress: Callable[[Trajectory], None] | None = None,
                 workers: int = 0, direct_workers: bool = True,
                 worker_group: Any = None):
        """The run's settings have one source, the typed config (``rollout.max_context``,
        ``rollout.max_concurrency``, ``rollout.parser``, ``agent.prompt_style``,
        ``agent.response_prefix``, ``agent.history_turns``, ``agent.history_stride``,
        ``agent.option_limits``, ``agent.shuffle_options``): they have no defaults here, and
        ``training.runtime.services.make_actor_pool`` passes the config's. ``workers`` /
        ``direct_workers`` (``rollout.actor_workers`` / ``rollout.actor_workers_direct``)
        default to in-process episodes. ``worker_group``: a ``workers.WorkerGroup`` of
        ``workers`` processes spawned ahead (``WorkerGroup.spawn``, beside the model load) and
        not yet set up; this pool gives it its setup and owns it from here."""
        if env_errors is None:
            from environments.core.client import EnvConnectionError, EnvServerError
            env_errors = (EnvConnectionError, EnvServerError, OSError, asyncio.TimeoutError)
        self.backend, self.env_clients, self.formatter = backend, dict(env_clients), formatter
        self.sampling, self.max_context = sampling, max_context
        self.max_concurrency, self.parser, self.env_errors = max_concurrency, parser, env_errors
        self.progress = progress
        self.prompt_style, self.response_prefix = prompt_style, response_prefix
        # > 0: each prompt keeps only the last this many turns (episode.py, "History window")
        self.history_turns = int(history_turns)
        self.history_stride = int(history_stride)  # turns a full window drops at once
        self.option_limits = bool(option_limits)  # per-turn option limits (episode.py)
        self.shuffle_options = bool(shuffle_options)  # options in a seeded order (episode.py)
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.workers = int(workers)
        # workers post to HTTP rollout servers themselves when the backend can say how
        # (``client_spec()``: SGLangBackend, EngineServers); else every request is relayed here
        self.direct_workers = bool(direct_workers)
        if worker_group is not None and (worker_group.n != self.workers
                                         or worker_group.setup is not None):
            raise ValueError(f"worker_group: {worker_group.n} processes spawned ahead without a "
                             f"setup expected, for workers={self.workers}")
        self._group: Any = worker_group
        # the last in-process collect's episodes' time by kind of work, summed (loop_times.py);
        # empty after a collect in worker processes (their episodes' clocks stay there)
        self.loop_times = LoopTimes()

    def _worker_group(self) -> Any:
        if self._group is None or self._group.setup is None:
            from agentrl_jax.agent.workers import WorkerGroup, WorkerSetup
            missing = [n for n, c in self.env_clients.items() if not hasattr(c, "config")]
            if missing:
                raise TypeError(f"workers need EnvClient-like clients with config(); {missing} "
                                "have none")
            per_worker = -(-self.max_concurrency // self.workers)
            setup = WorkerSetup(
                tokenizer=self.formatter.tokenizer, eos_token_ids=self.formatter.eos_token_ids,
                fast_format=self.formatter.fast,
                env_clients={n: c.config() for n, c in self.env_clients.items()},
                sampling=self.sampling, max_context=self.max_context,
                max_concurrency=per_worker, parser=self.parser,
                prompt_style=self.prompt_style, response_prefix=self.response_prefix,
                history_turns=self.history_turns, history_stride=self.history_stride,
                option_limits=self.option_limits, shuffle_options=self.shuffle_options,
                direct=self.backend.client_spec()
                if self.direct_workers and hasattr(self.backend, "client_spec") else None)
            if self._group is None:
                self._group = WorkerGroup(self.workers, setup)
            else:  # spawned ahead: its processes read this when the first collect connects
                self._group.setup = setup
        return self._group

    def close(self) -> None:
        """Stop the worker processes (``workers > 0``); a later collect starts new ones."""
        if self._group is not None:
            self._group.close()
            self._group = None

    def episode(self, task: TaskRef, group_id: int, sample_index: int, horizon: int,
                policy_version: int, seed: int | None,
                version_fn: Callable[[], int] | None = None) -> Episode:
        """One episode of ``task`` with this pool's clients, backend and settings
        (:func:`~agentrl_jax.agent.episode.start_episode`)."""
        return start_episode(task, group_id, sample_index, horizon, policy_version, seed,
                             env_clients=self.env_clients, backend=self.backend,
                             formatter=self.formatter, parser=self.parser,
                             sampling=self.sampling, max_context=self.max_context,
                             env_errors=self.env_errors, prompt_style=self.prompt_style,
                             response_prefix=self.response_prefix, version_fn=version_fn,
                             history_turns=self.history_turns,
                             history_stride=self.history_stride,
                             option_limits=self.option_limits,
                             shuffle_options=self.shuffle_options)

    def episodes_for(self, tasks: Sequence[TaskRef], n_samples: int, horizon: int,
                     policy_version: int = 0, seed: int | None = None,
                     version_fn: Callable[[], int] | None = None) -> list[Episode]:
        return [self.episode(task, g, i, horizon, policy_version, seed, version_fn)
                for g, task in enumerate(tasks) for i in range(n_samples)]

    async def collect(self, tasks: Sequence[TaskRef], n_samples: int, horizon: int,
                      policy_version: int = 0, seed: int | None = None, lockstep: bool = False,
                      progress: Callable[[Trajectory], None] | None = None,
                      version_fn: Callable[[], int] | None = None
                      ) -> tuple[list[Trajectory], RolloutStats]:
        """Run ``n_samples`` episodes of each task; trajectories come back in (group, sample)
        order, failed ones included (``Trajectory.ok`` is False for them). ``policy_version``:
        the weights version at the start; ``version_fn``: the version served now, read before
        every turn (weights that change mid-rollout; each turn records its version)."""
        start = time.monotonic()
        progress = progress or self.progress
        self.loop_times = LoopTimes()
        if self.workers and not lockstep:
            for task in tasks:
                if task.env not in self.env_clients:
                    raise KeyError(f"no environment client for {task.env!r} "
                                   f"(have {sorted(self.env_clients)})")
            specs = [(task, g, i) for g, task in enumerate(tasks) for i in range(n_samples)]
            trajectories = await self._worker_group().collect(
                self.backend, specs, horizon, policy_version, seed, progress, version_fn)
            return trajectories, summarize(trajectories, time.monotonic() - start)
        episodes = self.episodes_for(tasks, n_samples, horizon, policy_version, seed, version_fn)
        if lockstep:
            await self._run_lockstep(episodes, progress)
        else:
            gate = asyncio.Semaphore(self.max_concurrency)

            async def run(episode: Episode) -> None:
                queued = time.perf_counter()
                async with gate:
                    episode.times.gate_s += time.perf_counter() - queued
                    await episode.run()
                if progress:
                    progress(episode.trajectory)

            await asyncio.gather(*(run(e) for e in episodes))
        trajectories = [e.trajectory for e in episodes]
        for e in episodes:
            self.loop_times.add(e.times)
        return trajectories, summarize(trajectories, time.monotonic() - start)

    async def _run_lockstep(self, episodes: list[Episode],
                            progress: Callable[[Trajectory], None] | None) -> None:
        """Synchronous rounds in waves of ``max_concurrency``: everyone generates, then everyone
        steps; a round lasts as long as its slowest member."""
        for first in range(0, len(episodes), self.max_concurrency):
            wave = episodes[first:first + self.max_concurrency]
            try:
                await asyncio.gather(*(e.start() for e in wave))
                while True:
                    active = [e for e in wave if not e.finished]
                    if not active:
                        break
                    await asyncio.gather(*(e.generate_turn() for e in active))
                    await asyncio.gather(*(e.env_turn() for e in active if not e.finished))
            finally:
                await asyncio.gather(*(e.close() for e in wave))
            if progress:
                for e in wave:
                    progress(e.trajectory)
