"""Bytes per training episode in the trajectory log, plain and gzip (one member per step): the
arithmetic behind ``train.trajectory_share`` and ``train.compress_trajectories``.

    python benchmarks/speed/trajectory_log_size.py [--steps 4 --tasks 16 --samples 8 --turns 20]

Episodes are real BabyAI episodes (the in-process environment, the training split's tasks) with
uniformly random actions from the level's action words, rendered with the SmolLM2 chat template
and the run's answer format, exactly as ``Trajectory.to_json`` logs them; the generated tokens
get random log-probs (floats print with every digit, as the engine's do). The file sizes of a
real run also depend on the policy (longer answers, earlier successes), so the printed ratio is
an estimate for BabyAI-like runs, not a guarantee.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done")


def episode(env, tokenizer, task_id: str, group: int, sample: int, turns: int,
            rng: np.random.Generator) -> dict:
    from agentrl_jax.agent.prompts import first_user_message, system_prompt
    from agentrl_jax.agent.trajectory import Trajectory

    reset = env.reset(task_id)
    messages = [{"role": "system", "content": system_prompt(reset.info["instructions"], "babyai",
                                                            "action")},
                {"role": "user", "content": first_user_message(reset.observation)}]
    t = Trajectory(env="babyai", task_id=task_id, group_id=group, sample_index=sample,
                   episode_id=f"ep-{group}-{sample}")
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    t.append(list(prompt), False, -1)
    t.prompt_length = len(prompt)
    for turn in range(turns):
        action = "Action: " + ACTIONS[rng.integers(len(ACTIONS))] + "\n"
        ids = tokenizer.encode(action, add_special_tokens=False)
        t.append(ids, True, turn, list(-rng.exponential(0.5, len(ids))))
        messages.append({"role": "assistant", "content": action.strip()})
        step = env.step(action.split(":", 1)[1].strip())
        messages.append({"role": "user", "content": step.observation})
        obs = tokenizer.encode(f"<|im_end|>\n<|im_start|>user\n{step.observation}<|im_end|>\n"
                               "<|im_start|>assistant\n", add_special_tokens=False)
        t.append(obs, False, turn)
        t.num_turns = turn + 1
        t.turn_states.append(f"{rng.integers(2**63):016x}")
        t.turn_rewards.append(float(step.reward))
        t.turn_versions.append(0)
        if step.done:
            break
    t.messages = messages
    return t.to_json(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from environments.babyai.catalog import BabyAICatalog
    from environments.babyai.env import BabyAIEnv

    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    env = BabyAIEnv()
    tasks = BabyAICatalog().task_ids("train")
    rng = np.random.default_rng(0)
    plain = packed = episodes = 0
    for step in range(args.steps):
        lines = []
        for g in range(args.tasks):
            task = tasks[int(rng.integers(len(tasks)))]
            lines += [json.dumps(episode(env, tokenizer, task, g, s, args.turns, rng))
                      for s in range(args.samples)]
        data = "".join(line + "\n" for line in lines).encode()
        plain += len(data)
        packed += len(gzip.compress(data, compresslevel=6, mtime=0))
        episodes += len(lines)
    print(json.dumps({"episodes": episodes, "plain_bytes_per_episode": round(plain / episodes),
                      "gzip_bytes_per_episode": round(packed / episodes),
                      "gzip_ratio": round(plain / packed, 2)}))


if __name__ == "__main__":
    main()
