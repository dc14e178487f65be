"""Evaluate a trained or untrained policy: Avg@k and Pass@k on an environment's test split."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from typing import Any

from agentrl_jax.training import services
from agentrl_jax.training.evaluation import EvalResult, evaluate
from agentrl_jax.training.trainer import load_policy


async def run_evaluation(config: Any, checkpoint_dir: str | None = None, step: int | None = None,
                         k: int = 4, num_tasks: int = 64, horizon: int | None = None,
                         output: str | None = None, split: str = "test") -> EvalResult:
    """Evaluate ``config``'s policy (restored from ``checkpoint_dir`` at ``step`` if given)."""
    horizon = int(horizon or config.train.eval_horizon)
    with contextlib.ExitStack() as stack:
        async with contextlib.AsyncExitStack() as astack:
            urls = services.start_env_services(config, stack)
            clients = services.make_env_clients(urls, config, astack)
            model, tokenizer, model_path = load_policy(config)
            params_source = model
            if checkpoint_dir:
                from agentrl_jax.learner.learner import Learner

                learner = Learner(model, dict(config.learner), checkpoint_dir=checkpoint_dir)
                stack.callback(learner.close)
                if learner.checkpointer.latest_step() is None:
                    raise FileNotFoundError(f"no checkpoint in {checkpoint_dir}")
                learner.restore(step)
                params_source = learner.policy_model()
            backend = services.make_backend(config, params_source, tokenizer, model_path)
            astack.push_async_callback(backend.aclose)
            pool = services.make_actor_pool(config, backend, clients, tokenizer,
                                            model.cfg.eos_token_ids)
            tasks = await services.task_refs(clients, split, num_tasks)
            result, trajectories = await evaluate(pool, tasks, k=k, horizon=horizon,
                                                  seed=int(config.seed))
    if output:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w") as f:
            json.dump({"checkpoint": checkpoint_dir, "step": step, "horizon": horizon,
                       "split": split, **dataclasses.asdict(result)}, f, indent=2)
        with open(os.path.splitext(output)[0] + "_trajectories.jsonl", "w") as f:
            for t in trajectories:
                f.write(json.dumps(t.to_json()) + "\n")
    return result


def evaluate_sync(*args: Any, **kwargs: Any) -> EvalResult:
    return asyncio.run(run_evaluation(*args, **kwargs))
