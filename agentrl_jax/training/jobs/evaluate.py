"""Evaluate a trained or untrained policy on an environment's test split: Avg@k, Pass@k and the
success rate (``training/evaluation/eval_metrics.py``).

The embedded engine is sized by what is evaluated (``k x tasks`` episodes), not by the config's
``train.*`` values; every long phase reports progress (see ``training/outputs/progress.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Callable

from agentrl_jax import compile_notice
from agentrl_jax.training.runtime import services
from agentrl_jax.training.evaluation.held_out import EvalResult, evaluate
from agentrl_jax.training.outputs.progress import (EpisodeProgress, TurnCounter, format_seconds,
                                           progress_mode, timed)
from agentrl_jax.training.config.sections import RunConfig
from agentrl_jax.training.runtime.policy import load_policy


def _restore_policy(config: RunConfig, model: Any, checkpoint_dir: str, step: int | None,
                    stack: contextlib.ExitStack) -> tuple[Any, int]:
    """The policy of checkpoint ``step`` (None: the latest) and that step."""
    from agentrl_jax.learner.learner import Learner

    learner = Learner(model, config.learner, checkpoint_dir=checkpoint_dir)
    stack.callback(learner.close)
    latest = learner.checkpointer.latest_step()
    if latest is None:
        raise FileNotFoundError(f"no checkpoint in {checkpoint_dir}")
    learner.restore(step)
    return learner.policy_model(), int(latest if step is None else step)


def _write_output(output: str, result: EvalResult, trajectories: list, checkpoint_dir: str | None,
                  step: int | None, horizon: int, split: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump({"checkpoint": checkpoint_dir, "step": step, "horizon": horizon,
                   "split": split, **dataclasses.asdict(result)}, f, indent=2)
    with open(os.path.splitext(output)[0] + "_trajectories.jsonl", "w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_json()) + "\n")


async def run_evaluation(config: RunConfig, checkpoint_dir: str | None = None,
                         step: int | None = None, k: int = 4, num_tasks: int = 64,
                         horizon: int | None = None, output: str | None = None,
                         split: str = "test",
                         say: Callable[..., None] = print, progress: str | None = None,
                         progress_interval_s: float | None = None,
                         trajectories_out: list | None = None) -> EvalResult:
    """Evaluate ``config``'s policy (restored from ``checkpoint_dir`` at ``step`` if given).

    ``k`` samples of each of ``num_tasks`` test tasks per environment (``train.eval_sample``:
    spread over the split's task groups by default, ``runtime/task_sample.py``). ``progress``: ``bar`` / ``lines`` / ``off`` (default: a bar on a terminal,
    lines every ``progress_interval_s`` (config ``progress_seconds``) otherwise).
    ``trajectories_out``: a list that receives the evaluation's trajectories.
    """
    horizon = int(horizon or config.train.eval_horizon)
    mode = progress or progress_mode(force_bar=config.progress)
    interval = float(config.progress_seconds if progress_interval_s is None
                     else progress_interval_s)
    compile_notice.set_announcer(say)  # the engine's compiles after its warm-up get a line
    with contextlib.ExitStack() as stack:
        stack.callback(compile_notice.set_announcer, None)
        async with contextlib.AsyncExitStack() as astack:
            with timed(say, f"starting environment servers {services.env_names(config)}"):
                urls = services.start_env_services(config, stack)
            say(services.describe_urls(urls))
            clients = services.make_env_clients(urls, config, astack)
            tasks = await services.task_refs(clients, split, num_tasks,
                                             filters=services.task_filters(config),
                                             sample=config.train.eval_sample)
            episodes = k * len(tasks)
            with timed(say, f"loading model {config.model.name}"):
                model, tokenizer, model_path = load_policy(config)
            policy = model
            if checkpoint_dir:
                with timed(say, f"restoring checkpoint {checkpoint_dir}"
                           + (f" step {step}" if step is not None else " (latest)")):
                    policy, step = _restore_policy(config, model, checkpoint_dir, step, stack)
            with timed(say, f"starting rollout backend {config.rollout.backend}"):
                backend = services.make_backend(config, policy, tokenizer, model_path,
                                                episodes=episodes)
            astack.push_async_callback(services.close_backend, backend)
            say(services.describe_backend(backend, episodes))
            counter = TurnCounter(backend)
            pool = services.make_actor_pool(config, counter, clients, tokenizer,
                                            model.cfg.eos_token_ids)
            t0 = time.monotonic()
            async with EpisodeProgress(episodes, f"eval ({split}, k={k})", mode, interval,
                                       say, counter=counter) as bar:
                result, trajectories = await evaluate(
                    pool, tasks, k=k, horizon=horizon, seed=int(config.seed), progress=bar,
                    min_scored=config.train.eval_min_scored)
            say(f"evaluated {len(tasks)} tasks x k={k} ({episodes} episodes, horizon "
                f"{horizon}) in {format_seconds(time.monotonic() - t0)}")
    if output:
        _write_output(output, result, trajectories, checkpoint_dir, step, horizon, split)
    if trajectories_out is not None:
        trajectories_out.extend(trajectories)
    return result


def evaluate_sync(*args: Any, **kwargs: Any) -> EvalResult:
    return asyncio.run(run_evaluation(*args, **kwargs))
