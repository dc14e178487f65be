"""How often does the base model produce a valid action, per answer format?

    python benchmarks/analysis/action_format.py --env babyai --episodes 16
    python benchmarks/analysis/action_format.py --env textcraft --episodes 16 --turns 3 --styles action
    python benchmarks/analysis/action_format.py --experiment experiments/babyai.py:grpo_gpu \\
        --episodes 16 --turns 5 --styles recipe,choice,choice_letters,choice_space_letters

Runs ``--episodes`` base-model episodes per answer format through the real stack: the
environment server (started here on loopback), the embedded JAX engine and the actor pool, at the
sampling settings of ``--experiment`` (a family's experiment file and variant; without it
``base_config()`` for ``--env``; temperature 1). Every assistant turn is parsed with the style's
parser (a ``choice`` reply against the options listed in the observation before it) and counted as

* parsable: the parser found an action (otherwise the env is not stepped: an invalid turn, a
  parser failure);
* accepted (the valid-action share): parsable and the environment did not flag it as invalid;
* capped: the turn used all ``max_new_tokens`` (the model did not end its turn).

Per episode: its score (``eval_metrics.episode_score`` of ``eval_metrics.task_reward``: the
reward less its training-only shaping, clipped to [0, 1]), its return (the reward the trainer
would use, shaping included: deep search's ``--evidence-reward``) and its shaping, whether
it scores above 0 (the paper's pass) and completed (the environment's flag), its turns, its
context length in tokens and whether it ended at ``rollout.max_context``.

Styles (``--styles``, comma-separated): ``answer_styles.STYLES``, each described there
(``react``, ``action``, ``action_line``, ``recipe``: the experiment's own, and the lettered
``choice`` family down to ``choice_shuffled``). ``choice_shuffled``'s line adds how the shown
orders relate to the environment's (:class:`OrderRecorder`): turns shown in the environment's
order, in ``parsing.option_order``'s, and with the environment's first option at ``a``.

``--samples N`` runs N episodes of each task (a GRPO group) and adds the groups' line: the
groups whose episodes all score the same (flat by the task score) and those whose returns are
all the same (flat for the trainer, training-only shaping included), ``option_turns.flat_groups``.

CPU-friendly defaults: 16 episodes of 3 turns, ``max_context`` 2048 (``--experiment``: its own).
Prints one line per style and, with ``--json``, writes the numbers; ``--episodes_out`` writes
every episode's messages (gzip JSON lines) to read its replies afterwards. ``--action_example``
replaces the family's example action of the ``action`` prompt (``prompts.action_example``) for
the measurement: ``--action_example "turn left"`` is the prompt every family had before
2026-11-26 (BabyAI's example), ``""`` none.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gzip
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from agentrl_jax.agent import prompts  # noqa: E402
from agentrl_jax.agent.parsing import (  # noqa: E402
    get_parser,
    shuffled_options,
    takes_options,
)
from agentrl_jax.agent.trajectory import Trajectory  # noqa: E402
from agentrl_jax.training.config.experiment import to_run_config  # noqa: E402
from agentrl_jax.training.evaluation.eval_metrics import (  # noqa: E402
    episode_score,
    passes,
    task_reward,
)
from agentrl_jax.training.runtime import services  # noqa: E402
from answer_styles import (  # noqa: E402  (the styles' configs; tests reach them here)
    STYLES,
    base_of,
    style_config,
    whole_vocabulary_config,
)
from option_turns import (  # noqa: E402, F401  (the turn readers; tests reach them here)
    OrderRecorder,
    flat_groups,
    sample_replies,
    listed_options,
    replies_with_options,
    turn_contexts,
    turn_token_counts,
)


@dataclasses.dataclass
class FormatStats:
    """Per-turn and per-episode counts of one answer format."""

    style: str
    episodes: int = 0
    turns: int = 0
    parsable: int = 0
    accepted: int = 0
    capped: int = 0
    generated_tokens: int = 0
    successes: int = 0  # episodes completed (the env's flag) or scoring above 0 (older meaning)
    score_sum: float = 0.0  # sum of episode scores in [0, 1] (the task reward's)
    return_sum: float = 0.0  # sum of episode returns (reward, training-only shaping included)
    shaped: int = 0  # episodes with a training-only bonus (Trajectory.shaping > 0)
    scored: int = 0  # episodes with score > 0 (the paper's pass)
    completed: int = 0  # episodes with the environment's completion flag
    context_tokens: int = 0  # sum over episodes of the final context length
    max_context_tokens: int = 0
    context_limit: int = 0  # episodes ended by rollout.max_context
    seconds: float = 0.0
    # one [task id, score, turns] per episode (to split a family's tasks afterwards)
    episode_scores: list[list[Any]] = dataclasses.field(default_factory=list)
    # per episode (same order), its training-only bonus (Trajectory.shaping; 0: none)
    episode_shaping: list[float] = dataclasses.field(default_factory=list)
    # per episode, the context of each turn in tokens (:func:`turn_contexts`)
    turn_contexts: list[list[int]] = dataclasses.field(default_factory=list)
    # the shown option orders against the environment's (:func:`count_orders`): turns with at
    # least 2 options whose list the environment was seen to send, those shown in its order, in
    # parsing.option_order's for the run's seed, and with its first option at "a"
    order_turns: int = 0
    order_kept: int = 0
    order_formula: int = 0
    first_at_a: int = 0
    # tasks with more than one episode (``--samples``), and those whose episodes all have the
    # same task score / the same return (``option_turns.flat_groups``)
    groups: int = 0
    flat_by_score: int = 0
    flat_by_return: int = 0

    def rate(self, count: int) -> float:
        """``count`` per turn."""
        return count / self.turns if self.turns else 0.0

    def per_episode(self, value: float) -> float:
        """``value`` per episode."""
        return value / self.episodes if self.episodes else 0.0

    def line(self) -> str:
        return (f"{self.style:>7}: parsable {self.rate(self.parsable):6.1%} "
                f"({self.parsable}/{self.turns} turns), accepted by the env "
                f"{self.rate(self.accepted):6.1%}, hit the token cap {self.rate(self.capped):6.1%},"
                f" {self.generated_tokens / max(self.turns, 1):.1f} tokens/turn; episodes: "
                f"mean score {self.per_episode(self.score_sum):.3f}, score > 0 "
                f"{self.scored}/{self.episodes}, completed {self.completed}, "
                f"{self.per_episode(self.turns):.1f} turns, context "
                f"{self.per_episode(self.context_tokens):.0f} tokens (max "
                f"{self.max_context_tokens}), {self.context_limit} at the context limit; "
                f"{self.seconds:.0f} s")

    def shaping_line(self) -> str:
        """The training-only bonus (``Trajectory.shaping``): the episodes that got one and the
        mean return against the mean score."""
        return (f"shaping: a bonus in {self.shaped}/{self.episodes} episodes, mean return "
                f"{self.per_episode(self.return_sum):.4f} (mean score "
                f"{self.per_episode(self.score_sum):.4f})")

    def order_line(self) -> str:
        """The shown orders against the environment's (:func:`count_orders`)."""
        n = max(self.order_turns, 1)
        return (f"option order: {self.order_turns} turns of >= 2 options; in the environment's "
                f"order {self.order_kept / n:.1%}, in option_order's {self.order_formula / n:.1%}, "
                f"the environment's first option at a) {self.first_at_a / n:.1%}")

    def group_line(self) -> str:
        """The groups (``--samples``) that are flat by the task score and by the return."""
        return (f"groups: {self.groups} of >= 2 episodes; flat by task score "
                f"{self.flat_by_score}/{self.groups}, flat by return (shaping included) "
                f"{self.flat_by_return}/{self.groups}")

    def context_by_turn(self) -> list[float]:
        """``[T]``: the mean context of turn ``t`` (:func:`turn_contexts`) over the episodes
        that reached it."""
        means = []
        for turn in range(max((len(c) for c in self.turn_contexts), default=0)):
            values = [c[turn] for c in self.turn_contexts if len(c) > turn]
            means.append(sum(values) / len(values))
        return means


def count_turns(stats: FormatStats, trajectories: list[Trajectory], parser: Any,
                max_new_tokens: int, max_context: int | None = None) -> None:
    """Add the trajectories' turns and episodes to ``stats``; an invalid turn is either
    unparsable (the env was not stepped) or flagged by the environment, so ``accepted =
    parsable - (invalid_actions - unparsable)``. A parser that ``takes_options`` reads each
    reply against the options of the observation before it. ``max_context``: an episode whose
    status is ``context_limit`` counts as ended there."""
    with_options = takes_options(parser)
    for t in trajectories:
        if not t.ok:
            continue
        pairs = replies_with_options(t)
        parsable = sum((parser(text, options) if with_options else parser(text)).action
                       is not None for text, options in pairs)
        stats.episodes += 1
        stats.turns += len(pairs)
        stats.parsable += parsable
        stats.accepted += parsable - (t.invalid_actions - (len(pairs) - parsable))
        stats.capped += sum(n >= max_new_tokens for n in turn_token_counts(t))
        stats.generated_tokens += t.num_generated
        score = episode_score(task_reward(t.reward, t.shaping))
        stats.successes += int(t.success or score > 0)
        stats.score_sum += score
        stats.return_sum += float(t.reward)
        stats.shaped += int(t.shaping > 0)
        stats.episode_shaping.append(float(t.shaping))
        stats.scored += int(passes(score))
        stats.completed += int(bool(t.success))
        length = len(t.context_ids())
        stats.context_tokens += length
        stats.max_context_tokens = max(stats.max_context_tokens, length)
        stats.context_limit += int(t.status == "context_limit")
        stats.episode_scores.append([t.task_id, score, len(pairs)])
        stats.turn_contexts.append(turn_contexts(t))


def count_orders(stats: FormatStats, trajectories: list[Trajectory],
                 lists: dict[tuple[str, ...], set[tuple[str, ...]]], seed: int) -> None:
    """Add each turn's shown options (of at least 2) to ``stats``' order counts, against the
    environment's lists with the same contents (``OrderRecorder.lists``): shown in an
    environment order, in ``shuffled_options(that order, seed)``, with its first at ``a``."""
    for t in trajectories:
        if not t.ok:
            continue
        for _, shown in replies_with_options(t):
            sent = lists.get(tuple(sorted(shown)), set())
            if len(shown) < 2 or not sent:
                continue
            stats.order_turns += 1
            stats.order_kept += int(tuple(shown) in sent)
            stats.order_formula += int(any(shuffled_options(list(e), seed) == shown
                                           for e in sent))
            stats.first_at_a += int(any(e[0] == shown[0] for e in sent))


@contextlib.contextmanager
def example_action(example: str | None) -> Iterator[None]:
    """Within the block, the ``action`` prompt's example action is ``example`` for every family
    (``""``: no example) instead of the family's own (``prompts.action_example``); ``None``
    changes nothing. The episodes run in this process (``rollout.actor_workers`` 0), so the
    system prompts they build read it."""
    if example is None:
        yield
        return
    own = prompts.action_example
    prompts.action_example = lambda env_name: example or None
    try:
        yield
    finally:
        prompts.action_example = own


def episode_record(style: str, t: Trajectory) -> dict[str, Any]:
    """One line of ``--episodes_out``: the style, the episode's outcome and counts, and its
    messages (system prompt, observations, replies)."""
    return {"style": style, "task_id": t.task_id, "status": t.status, "reward": t.reward,
            "shaping": t.shaping, "success": t.success,
            "num_turns": t.num_turns, "invalid_actions": t.invalid_actions,
            "parse_failures": t.parse_failures, "messages": t.messages}


async def sample_tasks(clients: Any, args: argparse.Namespace) -> list:
    """``--episodes`` task references of ``--split``: evenly spaced over the split
    (``--sample spaced``, the default, which the committed step-0 tables used), spread over its
    task groups (``--sample stratified``, what evaluations use: ``runtime/task_sample.py``), or
    its first ones (``--sample first``: for a catalog interleaved across tasks, such as
    MiniWoB's, one episode of each of the first tasks; an evenly spaced sample of an interleaved
    split can land on a few tasks only)."""
    if args.sample == "first":
        return (await services.task_refs(clients, args.split))[: args.episodes]
    return await services.task_refs(clients, args.split, args.episodes, sample=args.sample)


async def measure(args: argparse.Namespace) -> list[FormatStats]:
    from agentrl_jax.training.runtime.policy import load_policy, restrict_policy

    styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    unknown = [s for s in styles if s not in STYLES]
    if unknown:
        raise SystemExit(f"unknown style(s) {unknown}; known: {sorted(STYLES)}")
    base = to_run_config(base_of(args))
    configs = {s: style_config(args, s) for s in styles}
    whole = whole_vocabulary_config(args)
    if args.action_example is not None and whole.rollout.actor_workers:
        raise SystemExit("--action_example needs the episodes in this process "
                         "(rollout.actor_workers 0)")
    results = []
    records: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(example_action(args.action_example))
        urls = services.start_env_services(base, stack)
        t0 = time.monotonic()
        model, tokenizer, path = load_policy(whole)
        unrestricted = model.cfg
        print(f"loaded {args.model} in {time.monotonic() - t0:.1f} s", flush=True)
        tasks = None
        for style in styles:
            c = configs[style]
            async with contextlib.AsyncExitStack() as style_stack:
                clients = {name: OrderRecorder(client) for name, client in
                           services.make_env_clients(urls, c, style_stack).items()}
                if tasks is None:
                    tasks = await sample_tasks(clients, args)
                model.cfg = unrestricted
                if c.model.output_tokens:
                    restrict_policy(model, tokenizer, c.model.output_tokens)
                backend = services.make_backend(c, model, tokenizer, path,
                                                episodes=args.episodes * args.samples)
                style_stack.push_async_callback(backend.aclose)
                pool = services.make_actor_pool(c, backend, clients, tokenizer,
                                                model.cfg.eos_token_ids)
                stats = FormatStats(style)
                t0 = time.monotonic()
                trajectories, _ = await pool.collect(tasks, n_samples=args.samples,
                                                     horizon=args.turns, seed=args.seed)
                stats.seconds = time.monotonic() - t0
                count_turns(stats, trajectories, get_parser(c.rollout.parser),
                            int(c.rollout.max_new_tokens))
                count_orders(stats, trajectories, {k: v for client in clients.values()
                                                   for k, v in client.lists.items()},
                             args.seed)
                print(stats.line(), flush=True)
                if stats.order_turns:
                    print(f"      {stats.order_line()}", flush=True)
                if stats.shaped or stats.return_sum != stats.score_sum:
                    print(f"      {stats.shaping_line()}", flush=True)
                stats.groups, stats.flat_by_score, stats.flat_by_return = flat_groups(
                    stats.episode_scores, stats.episode_shaping)
                if stats.groups:
                    print(f"      {stats.group_line()}", flush=True)
                by_turn = ", ".join(f"{v:.0f}" for v in stats.context_by_turn())
                print(f"      context by turn (mean tokens): {by_turn}", flush=True)
                for text in sample_replies(trajectories, args.show):
                    print(f"      e.g. {text!r}", flush=True)
                results.append(stats)
                records += [episode_record(style, t) for t in trajectories]
        model.cfg = unrestricted
    if args.episodes_out:
        with gzip.open(args.episodes_out, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="babyai", help="environment family (without --experiment)")
    p.add_argument("--experiment", default=None,
                   help="PATH[:VARIANT] of an experiment file: its settings (e.g. "
                        "experiments/sciworld.py:grpo_gpu)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--episodes", type=int, default=16, help="tasks per style")
    p.add_argument("--samples", type=int, default=1, help="episodes of each task (a group)")
    p.add_argument("--concurrency", type=int, default=0,
                   help="episodes in flight at most (0: all); ScienceWorld: its simulators")
    p.add_argument("--server_args", default=None,
                   help="the environment server's arguments instead of the experiment's")
    p.add_argument("--turns", type=int, default=3, help="horizon of each episode")
    p.add_argument("--styles", default="react,action,action_line", help=f"of {sorted(STYLES)}")
    p.add_argument("--max_new_tokens", type=int, default=0, help="0: the style's default")
    p.add_argument("--max_context", type=int, default=0,
                   help="0: the experiment's (without --experiment: 2048)")
    p.add_argument("--history_turns", type=int, default=None,
                   help="agent.history_turns (the history window; 0: the whole history); "
                        "default: the experiment's")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--split", default="train")
    p.add_argument("--sample", default="spaced", choices=("spaced", "stratified", "first"),
                   help="which tasks of the split: evenly spaced, spread over its task groups "
                        "(as evaluations sample), or the first --episodes (one of each task "
                        "where the split is interleaved across tasks, as MiniWoB's is)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=2, help="print this many example replies")
    p.add_argument("--json", default=None, help="write the numbers here")
    p.add_argument("--episodes_out", default=None,
                   help="write every episode's messages here (gzip JSON lines)")
    p.add_argument("--action_example", default=None,
                   help="the action prompt's example action for every family instead of the "
                        "family's own ('turn left': the prompt before 2026-11-26; '': none)")
    args = p.parse_args(argv)
    source = args.experiment or f"base_config, env {args.env}"
    print(f"{source}: {args.episodes} tasks x {args.samples} episodes x {args.turns} turns "
          f"per style, "
          f"temperature {args.temperature}, model {args.model}", flush=True)
    results = asyncio.run(measure(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "styles": [dataclasses.asdict(r) for r in results]},
                      f, indent=2)


if __name__ == "__main__":
    main()
