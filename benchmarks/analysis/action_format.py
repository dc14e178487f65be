"""How often does the base model produce a parsable action, per prompt style?

    python benchmarks/analysis/action_format.py --env babyai --episodes 16
    python benchmarks/analysis/action_format.py --env textcraft --episodes 16 --turns 3 --styles action

Runs ``--episodes`` base-model episodes per prompt style through the real stack: the environment
server (started here on loopback), the embedded JAX engine and the actor pool, at the experiment's
sampling settings (temperature 1). Every assistant turn is parsed with the configured parser and
counted as

* parsable: the parser found an action (otherwise the env is not stepped: an invalid turn);
* accepted: parsable and the environment did not flag it as an invalid action;
* capped: the turn used all ``max_new_tokens`` (the model did not end its turn).

Styles (``--styles``, comma-separated):

* ``react``: ``agent.prompt_style="react"`` (Thought + Action lines), no response prefix,
  ``rollout.max_new_tokens=128``: the format for larger models;
* ``action``: ``agent.prompt_style="action"``, every turn opened with ``"Action:"``,
  ``rollout.max_new_tokens=24`` (``experiments/babyai.py:grpo_scaling_gpu10min``);
* ``action_line``: ``action`` whose turns also end at their first line break
  (``rollout.stop=("\n",)``): the default of ``training/config/experiment.py::base_config``.

CPU-friendly defaults: 16 episodes of 3 turns, ``max_context`` 2048. Prints one line per style
and, with ``--json``, writes the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.agent.parsing import get_parser  # noqa: E402
from agentrl_jax.agent.trajectory import Trajectory  # noqa: E402
from agentrl_jax.training.runtime import services  # noqa: E402
from agentrl_jax.training.config.experiment import base_config, to_run_config  # noqa: E402
from agentrl_jax.training.config.sections import RunConfig  # noqa: E402

#: (prompt_style, response_prefix, max_new_tokens, stop strings) per style name
STYLES: dict[str, tuple[str, str, int, tuple[str, ...]]] = {
    "react": ("react", "", 128, ()),
    "action": ("action", "Action:", 24, ()),
    "action_line": ("action", "Action:", 24, ("\n",)),
}


@dataclasses.dataclass
class FormatStats:
    """Per-turn counts of one prompt style."""

    style: str
    episodes: int = 0
    turns: int = 0
    parsable: int = 0
    accepted: int = 0
    capped: int = 0
    generated_tokens: int = 0
    successes: int = 0
    seconds: float = 0.0

    def rate(self, count: int) -> float:
        return count / self.turns if self.turns else 0.0

    def line(self) -> str:
        return (f"{self.style:>7}: parsable {self.rate(self.parsable):6.1%} "
                f"({self.parsable}/{self.turns} turns), accepted by the env "
                f"{self.rate(self.accepted):6.1%}, hit the token cap {self.rate(self.capped):6.1%},"
                f" {self.generated_tokens / max(self.turns, 1):.1f} tokens/turn, "
                f"{self.successes}/{self.episodes} episodes solved, {self.seconds:.0f} s")


def turn_token_counts(t: Trajectory) -> list[int]:
    """Generated tokens of each assistant turn (``turn_ids`` of the ``loss_mask == 1`` ids)."""
    counts = [0] * t.num_turns
    for turn, generated in zip(t.turn_ids, t.loss_mask):
        if generated and 0 <= turn < len(counts):
            counts[turn] += 1
    return counts


def count_turns(stats: FormatStats, trajectories: list[Trajectory], parser: Any,
                max_new_tokens: int) -> None:
    """Add the trajectories' turns to ``stats``; an invalid turn is either unparsable (the env
    was not stepped) or flagged by the environment, so ``accepted = parsable - (invalid_actions
    - unparsable)``."""
    for t in trajectories:
        if not t.ok:
            continue
        replies = [m["content"] for m in t.messages if m["role"] == "assistant"]
        parsable = sum(parser(text).action is not None for text in replies)
        stats.episodes += 1
        stats.turns += len(replies)
        stats.parsable += parsable
        stats.accepted += parsable - (t.invalid_actions - (len(replies) - parsable))
        stats.capped += sum(n >= max_new_tokens for n in turn_token_counts(t))
        stats.generated_tokens += t.num_generated
        stats.successes += int(t.success or t.reward > 0)


def sample_replies(trajectories: list[Trajectory], n: int, width: int = 100) -> list[str]:
    """The first assistant reply of the first ``n`` episodes, cut to ``width`` characters."""
    replies = [next((m["content"] for m in t.messages if m["role"] == "assistant"), "")
               for t in trajectories[:n]]
    return [r[:width] for r in replies]


def style_config(args: argparse.Namespace, style: str) -> RunConfig:
    """The ``RunConfig`` that measures answer style ``style`` (:data:`STYLES`) with ``args``."""
    prompt_style, prefix, max_new_tokens, stop = STYLES[style]
    c = base_config()
    c.env.names = args.env
    c.model.name = args.model
    c.rollout.max_context = args.max_context
    c.rollout.max_concurrency = args.episodes
    c.rollout.max_new_tokens = args.max_new_tokens or max_new_tokens
    c.rollout.temperature = args.temperature
    c.agent.prompt_style = prompt_style
    c.agent.response_prefix = prefix
    c.rollout.stop = stop
    return to_run_config(c)


async def measure(args: argparse.Namespace) -> list[FormatStats]:
    from agentrl_jax.training.runtime.policy import load_policy

    styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    configs = {s: style_config(args, s) for s in styles}
    first = configs[styles[0]]
    results = []
    with contextlib.ExitStack() as stack:
        async with contextlib.AsyncExitStack() as astack:
            urls = services.start_env_services(first, stack)
            clients = services.make_env_clients(urls, first, astack)
            t0 = time.monotonic()
            model, tokenizer, path = load_policy(first)
            print(f"loaded {args.model} in {time.monotonic() - t0:.1f} s", flush=True)
            backend = services.make_backend(first, model, tokenizer, path,
                                            episodes=args.episodes)
            astack.push_async_callback(backend.aclose)
            tasks = await services.task_refs(clients, args.split, args.episodes)
            for style in styles:
                c = configs[style]
                pool = services.make_actor_pool(c, backend, clients, tokenizer,
                                                model.cfg.eos_token_ids)
                stats = FormatStats(style)
                t0 = time.monotonic()
                trajectories, _ = await pool.collect(tasks, n_samples=1, horizon=args.turns,
                                                     seed=args.seed)
                stats.seconds = time.monotonic() - t0
                count_turns(stats, trajectories, get_parser(c.rollout.parser),
                            int(c.rollout.max_new_tokens))
                print(stats.line(), flush=True)
                for text in sample_replies(trajectories, args.show):
                    print(f"      e.g. {text!r}", flush=True)
                results.append(stats)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="babyai", help="environment family")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--episodes", type=int, default=16, help="episodes per style (one per task)")
    p.add_argument("--turns", type=int, default=3, help="horizon of each episode")
    p.add_argument("--styles", default="react,action,action_line", help=f"of {sorted(STYLES)}")
    p.add_argument("--max_new_tokens", type=int, default=0, help="0: the style's default")
    p.add_argument("--max_context", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--split", default="train")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=2, help="print this many example replies")
    p.add_argument("--json", default=None, help="write the numbers here")
    args = p.parse_args()
    print(f"{args.env}: {args.episodes} episodes x {args.turns} turns per style, "
          f"temperature {args.temperature}, model {args.model}", flush=True)
    results = asyncio.run(measure(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "styles": [dataclasses.asdict(r) for r in results]},
                      f, indent=2)


if __name__ == "__main__":
    main()
