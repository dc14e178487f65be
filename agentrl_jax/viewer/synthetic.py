"""Synthetic runs: a run directory shaped like the trainer's (``trajectories_train.jsonl``,
``trajectories_eval.jsonl``, ``metrics.jsonl``, ``config.json``, ``summary.json``) with made-up
episodes, for the viewer's tests and its speed benchmark (``benchmarks/speed/viewer_index.py``).

Invalid turns come in the two kinds the real system has: an empty reply (no action after the
``Action:`` prefix; answered with ``INVALID_FORMAT_FEEDBACK``, the environment is not stepped) and
an action the environment rejects (answered with the environment's rejection message).

Episodes are real :class:`~agentrl_jax.agent.trajectory.Trajectory` records (as ``to_json``), so
their fields and layout are the trainer's: prompt ids (loss mask 0), then per turn the reply's
ids (loss mask 1, with log-probabilities) and the observation's ids (loss mask 0). 
"""

from __future__ import annotations

import json
import os
import random
from typing import Callable

from agentrl_jax.agent.parsing import INVALID_FORMAT_FEEDBACK
from agentrl_jax.agent.trajectory import ERROR_STATUSES, Trajectory
from agentrl_jax.training.evaluation import eval_metrics

WORDS = ("red blue green yellow purple grey ball box key door wall room left right forward "
         "pick drop toggle open closed locked you see a the in front of to your near far "
         "craft planks sticks stone iron get inventory table").split()
ACTIONS = {"babyai": ("go forward", "turn left", "turn right", "pick up", "toggle", "drop"),
           "textcraft": ("inventory", "get 1 oak log", "craft 4 oak planks using 1 oak log",
                         "craft 1 stick using 2 oak planks")}
NONSENSE = ("fly to the moon", "open sesame", "go go go", "think harder")
REJECTIONS = {"babyai": "'{}' is not a valid action here.\n",
              "textcraft": "Could not execute {}\n"}
STATUSES = (("done", 0.3), ("max_turns", 0.57), ("context_limit", 0.08), ("env_error", 0.03),
            ("engine_error", 0.02))


def _fake_encode(rng: random.Random) -> Callable[[str], list[int]]:
    """Token ids for text without a tokenizer: one id per word-ish piece."""
    def encode(text: str) -> list[int]:
        r = rng.random
        return [3 + int(r() * 49149) for _ in range(max(1, len(text) // 4))]
    return encode


def make_episode(rng: random.Random, env: str, task_id: str, group_id: int, sample_index: int,
                 step: int, horizon: int, encode: Callable[[str], list[int]] | None = None,
                 prompt_words: int = 60, obs_words: int = 12, invalid_rate: float = 0.2,
                 response_prefix: str = "Action:") -> dict:
    """One episode as the trainer logs it (``Trajectory.to_json(step)``). ``encode``: text ->
    token ids (a real tokenizer's, or a fake one by default)."""
    encode = encode or _fake_encode(rng)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    t = Trajectory(env=env, task_id=task_id, group_id=group_id, sample_index=sample_index,
                   episode_id=f"ep-{rng.getrandbits(64):016x}", horizon=horizon,
                   policy_version=step)
    status = rng.choices([s for s, _ in STATUSES], [w for _, w in STATUSES])[0]
    system = f"You are an agent in {env}. " + words(prompt_words)
    observation = f"Your goal: {words(4)}. You see {words(obs_words)}."
    t.messages = [{"role": "system", "content": system}, {"role": "user", "content": observation}]
    prompt = encode(system) + encode(observation) + (encode(response_prefix)
                                                      if response_prefix else [])
    t.prompt_length = len(prompt)
    t.append(prompt, generated=False, turn=-1)
    turns = horizon if status == "max_turns" else rng.randint(1, horizon)
    if status in ERROR_STATUSES:
        turns = rng.randint(0, horizon)
    for k in range(turns):
        u = rng.random()
        kind = "valid" if u >= invalid_rate else "empty" if u < invalid_rate / 2 else "rejected"
        reply = ("\n" if kind == "empty" else f" {rng.choice(NONSENSE)}" if kind == "rejected"
                 else f" {rng.choice(ACTIONS.get(env, ACTIONS['babyai']))}")
        ids = encode(reply)
        t.append(ids, generated=True, turn=k,
                 logprobs=[-rng.expovariate(2.0) for _ in ids])
        t.num_turns += 1
        t.messages.append({"role": "assistant", "content": response_prefix + reply})
        last = k == turns - 1
        success = status == "done" and last and rng.random() < 0.7
        r = round(rng.uniform(0.2, 1.0), 3) if success else 0.0
        t.turn_rewards.append(r)
        t.reward += r
        t.success = t.success or success
        if kind != "valid":
            t.invalid_actions += 1
            t.parse_failures += kind == "empty"
        if last:
            break
        obs = f"You see {words(obs_words)}."
        if kind == "empty":
            obs = INVALID_FORMAT_FEEDBACK
        elif kind == "rejected":
            obs = REJECTIONS.get(env, REJECTIONS["babyai"]).format(reply.strip()) + obs
        t.messages.append({"role": "user", "content": obs})
        t.append(encode(obs) + (encode(response_prefix) if response_prefix else []),
                 generated=False, turn=k)
    t.status = status
    if status in ERROR_STATUSES:
        t.error = f"{'step' if status == 'env_error' else 'generate'}: synthetic failure {k}" \
            if turns else "create: synthetic failure"
    t.elapsed_s = round(rng.uniform(0.1, 30.0), 3)
    # Trajectory.to_json(step) without dataclasses.asdict's deep copies (faster; same dict)
    return {**vars(t), "step": step}


def write_synthetic_run(run_dir: str, train_episodes: int, eval_steps: tuple[int, ...] = (0,),
                        eval_tasks: int = 8, eval_samples: int = 2, seed: int = 0,
                        group_size: int = 4, horizon: int = 6,
                        encode: Callable[[str], list[int]] | None = None,
                        episode_kwargs: dict | None = None, config: dict | None = None,
                        fast_json: bool = False) -> str:
    """Write a synthetic run to ``run_dir`` and return it: ``train_episodes`` training episodes
    (groups of ``group_size``, 2 environments, ``group_size x 4`` episodes per step), an
    evaluation of ``eval_tasks x eval_samples`` episodes at each of ``eval_steps``, a metrics
    row per step and per evaluation, ``config.json`` and ``summary.json``. ``fast_json``: write
    the episode lines with orjson (the same JSON without spaces; faster for big runs)."""
    rng = random.Random(seed)
    if fast_json:
        import orjson

        def dumps(x: dict) -> str:
            return orjson.dumps(x).decode()
    else:
        dumps = json.dumps
    os.makedirs(run_dir, exist_ok=True)
    kw = dict(episode_kwargs or {})
    per_step = group_size * 4
    steps = max(1, -(-train_episodes // per_step))
    envs = ("babyai", "textcraft")
    with open(os.path.join(run_dir, "trajectories_train.jsonl"), "w") as f:
        n = 0
        for step in range(steps):
            for g in range(4):
                env = envs[(step + g) % 2]
                task = (f"BabyAI-GoToObj-v0/seed={rng.randrange(10**6)}" if env == "babyai"
                        else f"textcraft/{rng.randrange(500)}")
                for s in range(group_size):
                    if n == train_episodes:
                        break
                    ep = make_episode(rng, env, task, g, s, step, horizon, encode, **kw)
                    f.write(dumps(ep) + "\n")
                    n += 1
    evals = {}
    with open(os.path.join(run_dir, "trajectories_eval.jsonl"), "w") as f:
        for step in eval_steps:
            episodes = []
            for task_i in range(eval_tasks):
                env = envs[task_i % 2]
                task = (f"BabyAI-GoToObj-v0/seed={1000000 + task_i}" if env == "babyai"
                        else f"textcraft/test-{task_i}")
                for s in range(eval_samples):
                    ep = make_episode(rng, env, task, task_i, s, step, horizon, encode, **kw)
                    f.write(dumps(ep) + "\n")
                    episodes.append(ep)
            scores = eval_metrics.score(eval_metrics.outcomes(episodes), eval_samples)
            evals[str(step)] = {"k": eval_samples, "num_tasks": eval_tasks,
                                "avg_at_k": scores.avg_at_k, "pass_at_k": scores.pass_at_k,
                                "success_rate": scores.success_rate,
                                "mean_reward": 0.0, "dropped": 0, "per_env": {},
                                "scoring": eval_metrics.SCORING}
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"step": step, "time": 1.0 + step,
                                "rollout/mean_reward": 0.1 + 0.02 * step + rng.uniform(0, .05),
                                "rollout/success_rate": 0.1 + 0.01 * step,
                                "actor/entropy": 2.0 - 0.01 * step, "actor/ppo_kl": 1e-3,
                                "train/step_seconds": 10.0 + rng.uniform(0, 2),
                                "train/horizon": float(horizon)}) + "\n")
        for step in eval_steps:
            f.write(json.dumps({"step": step, "time": 1.0 + step,
                                f"eval/avg@{eval_samples}": evals[str(step)]["avg_at_k"],
                                "eval/success_rate": evals[str(step)]["success_rate"]}) + "\n")
    cfg = config or {"model": {"name": "synthetic"}, "env": {"names": ",".join(envs)},
                     "learner": {"advantage_estimator": "grpo"},
                     "train": {"total_steps": steps, "samples_per_task": group_size,
                               "max_staleness": 0},
                     "rollout": {"parser": "react"}, "agent": {"response_prefix": "Action:"}}
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({"start_step": 0, "final_step": steps, "evals": evals}, f, indent=2)
    return run_dir
