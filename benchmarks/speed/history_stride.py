"""What a history window's stride saves: the same rollout with ``agent.history_stride`` 1, 2, 4.

    python benchmarks/speed/history_stride.py \\
        --set "model.random_init={'hidden_size': 64, 'intermediate_size': 128, 'num_layers': 2, \\
              'num_heads': 4, 'num_kv_heads': 2, 'head_dim': 16}" \\
        --set train.tasks_per_step=8 --set train.samples_per_task=4 --json OUT.json   # CPU

A windowed episode (``agent.history_turns = N``) starts a new prompt, a *chunk*, whenever its
window drops turns (``agent/episode.py``, "History window"): the engine prefills it again
beyond the prefix it shares with the session's previous sequence, and the learner trains it as
one more row that repeats the kept turns as context. With stride ``K`` a full window drops
``K`` turns at once, so a chunk starts every ``K`` turns instead of every turn. This plays the
first training step's tasks of ``--config`` (default: TextCraft's 8-turn window recipe) through
the trainer's own rollout (``training/runtime/services.py``: environment servers, the embedded
engine, the actor pool) once per stride and round, the strides alternating within a round and
every stride's round ``r`` drawing with the same seed; the engine's prefix cache is flushed
before each rollout, as a weight sync does. Per rollout:

* the engine's counters (``EngineStats``): prompt tokens asked for, of them cached (reused from
  the session's previous sequence) and prefilled;
* the learner's share of it (``Trajectory.chunk_bounds``): rows (one a chunk), their tokens
  and the generated (trained) tokens among them;
* turns, context-limit endings, the mean score and the wall time (on a CPU only the tokens
  are a figure to quote; the seconds are this machine's).

Nothing is trained; the weights are the config's initial ones (``--set model.random_init=...``
for a tiny random model on a CPU: the token counts depend on the episodes' lengths, not on the
model's size).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.speed.rollout_profile import load_config, rollout_services  # noqa: E402

_ENGINE_COUNTERS = ("prompt_tokens", "cached_tokens", "prefill_tokens", "generated_tokens")


def rollout_view(trajectories: list[Any]) -> dict[str, float]:
    """The learner's side of a rollout's ``trajectories``: rows (chunks), their tokens, the
    generated tokens, turns, context-limit endings and the mean score."""
    from agentrl_jax.agent.trajectory import STATUS_CONTEXT_LIMIT

    ok = [t for t in trajectories if t.ok]
    return {"episodes": len(ok),
            "learner_rows": sum(len(t.chunk_starts) for t in ok),
            "learner_tokens": sum(len(t.token_ids) for t in ok),
            "trained_tokens": sum(int(sum(t.loss_mask)) for t in ok),
            "turns": sum(t.num_turns for t in ok),
            "context_limit": sum(t.status == STATUS_CONTEXT_LIMIT for t in ok),
            "mean_score": statistics.fmean(t.reward for t in ok) if ok else 0.0}


async def measure(config: Any, strides: list[int], rounds: int, horizon: int | None,
                  say=print) -> dict[str, Any]:
    """Play the first training step's tasks ``rounds`` times per stride (alternating); returns
    ``{"horizon", "episodes", "runs": {stride: [view, ...]}}``."""
    from agentrl_jax.rollout.engine.engine import Engine
    from agentrl_jax.training.outputs.progress import TurnCounter
    from agentrl_jax.training.rl.task_sampler import TaskSampler
    from agentrl_jax.training.runtime import services
    from agentrl_jax.training.runtime.policy import load_policy

    model, tokenizer, model_path = load_policy(config)
    if horizon is None:  # the last phase: where the window matters most
        horizon = int(config.horizon.phases[-1] if config.horizon.type == "scaling_inter"
                      else config.horizon.turns)
    runs: dict[int, list[dict[str, float]]] = {k: [] for k in strides}
    async with rollout_services(config, model, tokenizer, model_path) as (clients, backend):
        if not isinstance(backend, Engine):
            raise SystemExit("needs one embedded engine (rollout.backend='embedded', "
                             "rollout.engine_replicas=1)")
        eos_ids = model.cfg.eos_token_ids
        tasks = TaskSampler(await services.task_refs(clients, "train"),
                            seed=int(config.seed)).next(int(config.train.tasks_per_step))
        samples = int(config.train.samples_per_task)
        for r in range(rounds):
            for stride in strides:
                agent = config.agent.replace(history_stride=stride)
                pool = services.make_actor_pool(config.replace(agent=agent),
                                                TurnCounter(backend), clients, tokenizer,
                                                eos_ids)
                await backend.flush_cache()  # as a weight sync does
                before = {k: getattr(backend.stats, k) for k in _ENGINE_COUNTERS}
                start = time.perf_counter()
                try:
                    trajectories, _ = await pool.collect(tasks, samples, horizon,
                                                         seed=int(config.seed) + r)
                finally:
                    pool.close()
                view = {"wall_s": time.perf_counter() - start,
                        **{k: getattr(backend.stats, k) - before[k]
                           for k in _ENGINE_COUNTERS},
                        **rollout_view(trajectories)}
                runs[stride].append(view)
                say(f"round {r} stride {stride}: " + ", ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in view.items()))
    return {"horizon": horizon, "episodes": len(tasks) * samples, "runs": runs}


def summarize(runs: dict[int, list[dict[str, float]]]) -> dict[int, dict[str, float]]:
    """Per stride the mean of every field over its rounds, and the first stride's mean over
    this one's for the token counts and the wall (``x_<field>``: how many times fewer)."""
    means = {k: {f: statistics.fmean(v[f] for v in vs) for f in vs[0]} for k, vs in runs.items()}
    base = means[next(iter(means))]
    for m in means.values():
        for f in ("prefill_tokens", "learner_rows", "learner_tokens", "wall_s"):
            m[f"x_{f}"] = base[f] / m[f] if m[f] else float("nan")
    return means


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/textcraft.py:choice_shuffled_window_gpu")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--strides", default="1,2,4", help="comma list; the first is the baseline")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--horizon", type=int, default=None,
                   help="turns per episode (default: the config's last horizon phase)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    config = load_config(args.config, args.set)
    if not config.agent.history_turns:
        raise SystemExit("the config has no history window (agent.history_turns = 0)")
    strides = [int(k) for k in args.strides.split(",")]
    report = asyncio.run(measure(config, strides, args.rounds, args.horizon))
    report.update(config=args.config, sets=args.set, history_turns=config.agent.history_turns,
                  summary=summarize(report["runs"]))
    print(f"\n{report['episodes']} episodes, horizon {report['horizon']}, window "
          f"{report['history_turns']}; means over {args.rounds} rounds\n\n"
          "| stride | prompt tokens | cached | prefilled | learner rows | learner tokens | "
          "trained | turns | context endings | mean score | wall s |\n|---|" + "---|" * 10)
    for k, m in report["summary"].items():
        print(f"| {k} | {m['prompt_tokens']:,.0f} | {m['cached_tokens']:,.0f} | "
              f"{m['prefill_tokens']:,.0f} ({m['x_prefill_tokens']:.2f}x fewer) | "
              f"{m['learner_rows']:,.0f} ({m['x_learner_rows']:.2f}x) | "
              f"{m['learner_tokens']:,.0f} ({m['x_learner_tokens']:.2f}x) | "
              f"{m['trained_tokens']:,.0f} | {m['turns']:,.0f} | {m['context_limit']:.1f} | "
              f"{m['mean_score']:.3f} | {m['wall_s']:.1f} ({m['x_wall_s']:.2f}x) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
