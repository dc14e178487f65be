"""The base model's prior over a family's admissible actions, scored TWOSOME-style, at step 0.

    python benchmarks/analysis/action_scoring.py --experiment experiments/textcraft.py:choice_gpu \\
        --episodes 16 --turns 5 --policies uniform,lm_sum,lm_mean --json out.json

Issue 47 item 4 names, among the agent options that could let the 135M model start learning,
"the admissible actions scored by their sequence log-likelihood and sampled among" (TWOSOME, Tan
et al. 2024). Lettered options give every turn a valid action, but the letters carry no meaning
for the model (docs/RESULTS.md, "The CPU learning check at temperature 1"): does the model's
likelihood of the actions' *text* make a better policy than chance before any training? This
script answers that without building the option: it plays each family's episodes itself.

Per turn: the environment lists its admissible actions (``agent.list_valid_actions`` of the
experiment, else the family's own ``available_actions`` as BabyAI's; at most 26, as the lettered
options; shown in the observation as text: ``agent.actions_in_observation``); the
prompt is the ``action`` answer format's (system prompt with the family's instructions and
example action, the conversation so far, the assistant turn opened with ``"Action:"``); each
listed action ``a`` is scored by the model as the reply ``" " + a + "\\n"`` (the recipe's replies
end at their line break), with HF ``transformers`` (PyTorch, CPU) on the same SmolLM2 weights:

* ``lm_sum``: ``log p(a) = sum_t log p(token_t | prompt, tokens_<t)``, an action sampled from
  ``softmax(log p(a))`` over the listed ones (temperature 1: the policy the model's likelihoods
  define, restricted to the admissible actions);
* ``lm_mean``: the same over the per-token mean log-probability (TWOSOME's token normalisation:
  long actions are not penalised for their length);
* ``lm_greedy``: the action of highest mean log-probability (deterministic);
* ``uniform``: an action drawn uniformly from the listed ones, no model (the chance policy the
  others are measured against);
* ``first``: always the first listed action, no model (what the list's own order is worth:
  a server that lists the goal's actions first hands a policy that learns to answer " a" a
  heuristic, not a skill).

The chosen action goes to the environment as its text. Per policy: the episodes' mean task
score (Avg@k over ``--samples`` k episodes a task: ``eval_metrics.episode_score`` of
``eval_metrics.task_reward``), Pass@k (tasks with an episode scoring > 0), the share of
episodes scoring > 0, the completed share (the environment's flag), the mean turns, the mean
number of listed actions a turn, and (model policies) the mean probability the policy gives the
action it chose. Tasks: ``--episodes`` ids of ``--split``, evenly spaced (as
``action_format.py``'s step-0 tables) or, ``--sample stratified``, spread over the split's task
groups as evaluations choose them; the same tasks and sampling seeds for every policy;
``--samples`` episodes of each task. Model cost a turn: a forward of the prompt's new tokens
(the episode's earlier prompt stays cached) and one batched forward of the listed actions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import json
import math
import os
import random
import sys
import time
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

POLICIES = ("uniform", "first", "lm_sum", "lm_mean", "lm_greedy")
#: the policies that need no model
MODEL_FREE = frozenset({"uniform", "first"})


@dataclasses.dataclass
class PolicyStats:
    """One policy's episodes: their scores and counts (summed; ``line`` averages)."""

    policy: str
    episodes: int = 0
    score_sum: float = 0.0
    scored: int = 0
    completed: int = 0
    turns: int = 0
    listed: int = 0
    invalid: int = 0
    chosen_prob_sum: float = 0.0
    seconds: float = 0.0
    samples: int = 1
    scores: list[float] = dataclasses.field(default_factory=list)  # task by task, its samples
    task_ids: list[str] = dataclasses.field(default_factory=list)  # each score's task

    def pass_at_k(self) -> float:
        """The share of tasks where any of their ``samples`` episodes scores > 0."""
        groups = [self.scores[i:i + self.samples]
                  for i in range(0, len(self.scores), self.samples)]
        return sum(any(x > 0 for x in g) for g in groups) / max(len(groups), 1)

    def line(self) -> str:
        n, t = max(self.episodes, 1), max(self.turns, 1)
        chosen = (f", chosen action's probability {self.chosen_prob_sum / t:.3f}"
                  if self.policy not in MODEL_FREE else "")
        return (f"{self.policy:>10}: Avg@{self.samples} {self.score_sum / n:.3f}, "
                f"Pass@{self.samples} {self.pass_at_k():.3f}, score > 0 "
                f"{self.scored}/{self.episodes}, completed {self.completed}/{self.episodes}, "
                f"{self.turns / n:.2f} turns, {self.listed / t:.1f} listed actions a turn, "
                f"{self.invalid} invalid turns{chosen} ({self.seconds:.0f} s)")


def choice_distribution(logps: Sequence[Sequence[float]], policy: str) -> list[float]:
    """The probability of each listed action under ``policy`` from its tokens' log-probs
    (``logps[i]``: action ``i``'s per-token log-probs): ``lm_sum`` softmax of the sums,
    ``lm_mean`` softmax of the means, ``lm_greedy`` one-hot on the highest mean (the first of
    equals), ``uniform`` 1/K each, ``first`` one-hot on the first."""
    k = len(logps)
    if policy == "uniform":
        return [1.0 / k] * k
    if policy == "first":
        return [1.0] + [0.0] * (k - 1)
    means = [sum(lp) / len(lp) for lp in logps]
    if policy == "lm_greedy":
        best = max(range(k), key=lambda i: means[i])
        return [1.0 if i == best else 0.0 for i in range(k)]
    values = [sum(lp) for lp in logps] if policy == "lm_sum" else means
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]


class ActionScorer:
    """Per-token log-probs of candidate replies after a prompt, with an HF ``transformers``
    causal LM on the CPU. The KV cache of the last prompt is kept: a prompt that extends it (the
    next turn of the same episode) forwards only its new tokens (after the longest common
    prefix); the replies then run as one batch on a copy of that cache, right-padded (causal
    attention: a pad never reaches the positions before it)."""

    def __init__(self, model: Any):
        import torch

        self.torch = torch
        self.model = model.eval()
        self._ids: list[int] = []
        self._cache: Any = None
        self._last: Any = None  # log-probs after the cached prompt's last token, [vocab]

    @classmethod
    def load(cls, path: str) -> ActionScorer:
        """The model at ``path`` (a model directory or a GGUF file, which transformers
        dequantises: the shipped SmolLM2) in float32."""
        import torch
        from transformers import AutoModelForCausalLM

        kwargs: dict[str, Any] = {"dtype": torch.float32}
        if path.endswith(".gguf"):
            kwargs["gguf_file"] = os.path.basename(path)
            path = os.path.dirname(path)
        return cls(AutoModelForCausalLM.from_pretrained(path, **kwargs))

    def _prompt(self, prompt: list[int]) -> None:
        """The cache and last log-probs of ``prompt``, from the kept ones where they share a
        prefix."""
        torch = self.torch
        common = 0
        for a, b in zip(self._ids, prompt):
            if a != b:
                break
            common += 1
        if common == len(prompt) == len(self._ids):
            return
        keep = min(common, len(prompt) - 1)  # at least one token to forward: its logits
        if self._cache is None or keep == 0:
            self._cache, keep = None, 0
        elif keep < len(self._ids):
            self._cache.crop(keep - len(self._ids))
        out = self.model(torch.tensor([prompt[keep:]]), past_key_values=self._cache,
                         use_cache=True)
        self._cache, self._ids = out.past_key_values, list(prompt)
        self._last = torch.log_softmax(out.logits[0, -1].double(), -1)

    def score(self, prompt: Sequence[int], candidates: Sequence[Sequence[int]]
              ) -> list[list[float]]:
        """``[[log p(c_t | prompt, c_<t) for t] for c in candidates]`` (each candidate at
        least one token)."""
        torch = self.torch
        with torch.no_grad():
            self._prompt(list(prompt))
            result = [[float(self._last[c[0]])] for c in candidates]
            longest = max(len(c) for c in candidates)
            if longest > 1:
                cache = copy.deepcopy(self._cache)
                cache.batch_repeat_interleave(len(candidates))
                ids = [list(c[:-1]) + [0] * (longest - len(c)) for c in candidates]
                logits = self.model(torch.tensor(ids), past_key_values=cache,
                                    use_cache=True).logits
                logps = torch.log_softmax(logits.double(), -1)  # [candidates, longest - 1, vocab]
                for row, c in enumerate(candidates):
                    result[row] += [float(logps[row, i, t]) for i, t in enumerate(c[1:])]
        return result


async def play(policy: str, task: Any, sample: int, client: Any, tokenizer: Any,
               scorer: ActionScorer | None, args: argparse.Namespace, stats: PolicyStats) -> None:
    """One episode of ``task`` under ``policy``; its outcome added to ``stats``."""
    from agentrl_jax.agent.prompts import first_user_message, system_prompt
    from agentrl_jax.training.evaluation.eval_metrics import episode_score, task_reward

    rng = random.Random(f"{args.seed}/{task.task_id}/{sample}")
    created = await client.create(task_id=task.task_id, seed=args.seed + sample)
    env_id, observation, info = created
    messages = [{"role": "system", "content": system_prompt(info.get("instructions", ""),
                                                             task.env, "action")},
                {"role": "user", "content": first_user_message(observation)}]
    reward, shaping, completed, turns = 0.0, 0.0, False, 0
    try:
        for _ in range(args.turns):
            actions = [str(a) for a in info.get("listed_actions")
                       or info.get("available_actions") or []][:26]
            if not actions:
                break
            stats.listed += len(actions)
            if scorer is None:
                probs = choice_distribution([[0.0]] * len(actions), policy)
            else:
                text = tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True) + "Action:"
                prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
                replies = [tokenizer(f" {a}\n", add_special_tokens=False)["input_ids"]
                           for a in actions]
                probs = choice_distribution(scorer.score(prompt, replies), policy)
            i = rng.choices(range(len(actions)), weights=probs)[0]
            stats.chosen_prob_sum += probs[i]
            turns += 1
            step = await client.step(env_id, actions[i])
            reward += step.reward
            shaping += float(step.info.get("shaping", 0.0) or 0.0)
            stats.invalid += bool(step.info.get("invalid_action"))
            completed = completed or bool(step.info.get("success"))
            if step.done or step.truncated:
                break
            observation, info = step.observation, step.info
            messages += [{"role": "assistant", "content": f"Action: {actions[i]}"},
                         {"role": "user", "content": observation}]
    finally:
        await client.close(env_id)
    score = episode_score(task_reward(reward, shaping))
    stats.episodes += 1
    stats.turns += turns
    stats.score_sum += score
    stats.scores.append(score)
    stats.task_ids.append(task.task_id)
    stats.scored += score > 0
    stats.completed += completed


async def measure(args: argparse.Namespace) -> list[PolicyStats]:
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_jax.training.config.command_line import load_experiment
    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.runtime import services

    c = load_experiment(args.experiment)
    c.env.replicas = 1
    c.agent.actions_in_observation = True
    c.agent.list_valid_actions = min(int(c.agent.list_valid_actions or 26), 26)
    c.rollout.max_concurrency = max(1, args.episodes)
    config = to_run_config(c)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; known: {list(POLICIES)}")
    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    scorer = ActionScorer.load(path) if set(policies) - MODEL_FREE else None
    results = []
    with contextlib.ExitStack() as stack:
        async with contextlib.AsyncExitStack() as astack:
            urls = services.start_env_services(config, stack)
            clients = services.make_env_clients(urls, config, astack)
            tasks = await services.task_refs(clients, args.split, args.episodes,
                                             sample=args.sample)
            for policy in policies:
                stats = PolicyStats(policy, samples=args.samples)
                t0 = time.monotonic()
                for task in tasks:
                    for sample in range(args.samples):
                        await play(policy, task, sample, clients[task.env], tokenizer,
                                   None if policy in MODEL_FREE else scorer, args, stats)
                stats.seconds = time.monotonic() - t0
                print(stats.line(), flush=True)
                results.append(stats)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", required=True, help="a family's experiment, e.g. "
                   "experiments/textcraft.py:choice_gpu (its servers and action-list length)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--episodes", type=int, default=16, help="tasks")
    p.add_argument("--samples", type=int, default=1, help="episodes of each task")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--policies", default="uniform,lm_sum,lm_mean", help=f"of {list(POLICIES)}")
    p.add_argument("--split", default="train")
    p.add_argument("--sample", default="spaced", choices=("spaced", "stratified"),
                   help="which tasks: evenly spaced ids (action_format.py's step-0 tables) or "
                        "spread over the split's task groups (what evaluations use)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the numbers here")
    args = p.parse_args(argv)
    print(f"{args.experiment}: {args.episodes} tasks x {args.samples} episodes x {args.turns} "
          f"turns per policy, model {args.model}", flush=True)
    results = asyncio.run(measure(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "policies": [dataclasses.asdict(r) for r in results]},
                      f, indent=2)


if __name__ == "__main__":
    main()
