"""How long is deep search's options block, how long do ``choice_gpu``'s episodes get, and what do
the listed actions still solve? Per split of the built-in ``search`` task set, no model:

    python benchmarks/analysis/deepsearch_options.py --json results/deepsearch_options/after.json

* **Coverage**: the share of questions that the oracle restricted to the listed actions
  (``expert.listed_oracle_solves``) answers within 5 and within 10 turns.
* **Options tokens a turn**: the options block that ``choice_gpu``'s prompt shows after an
  observation (``agent.parsing.options_block`` of ``valid_actions``), in SmolLM2 tokens (the
  tokenizer of the run), over every turn of the walks below: mean, median, max; and the options
  a turn.
* **Context after 5 and 10 turns**: each question's *walk*, a ``choice_gpu`` episode of 10 turns
  that picks a listed search uniformly at random each turn (seeded; an answer would end it), its
  token ids built by the agent's own ``ChatFormatter`` exactly as ``agent/episode.py`` builds
  them (system prompt of the ``choice`` style, first observation + options, then per turn the
  reply (one letter token), the passages + options, the ``"Action:"`` prefix); median, mean and
  max over the split's questions. The typical episode is the median.
* **What the oracle needs** (``--oracle_needs``): per question the oracle solves within 10
  turns, its turns (searches + the answer) and the *window* its choices need: at turn ``j`` a
  search or answer whose text first appears (normalised, whole words) in the passages of the
  search at turn ``i < j`` needs that observation in the prompt, which a history window of
  ``agent.history_turns = N`` keeps when ``N >= j - i``; a query taken from the question needs
  only the first message, which every window keeps (0). The window a question needs is the
  largest ``j - i`` over its actions (the options block itself is rebuilt by the server from
  everything the episode has shown, so no window changes what is listed).
* **Random choice**: the share of episodes that end with a correct answer when every turn picks
  uniformly among all listed options (``--seeds`` seeds per question), within 5 and 10 turns:
  what a policy that has learned nothing would score at step 0.

The script uses only ``admissible_actions`` / ``after_search`` / ``listed_oracle_solves``, so the
same file measures an older checkout: ``git archive <commit> | tar -x -C /tmp/old``, copy this
file into ``/tmp/old/benchmarks/analysis/`` and run it there (it puts its own tree first on the
import path, so ``PYTHONPATH`` alone does not choose the tree). docs/ENVIRONMENTS.md quotes both.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Any, Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.agent.chat import ChatFormatter  # noqa: E402
from agentrl_jax.agent.parsing import options_block  # noqa: E402
from agentrl_jax.agent.prompts import first_user_message, system_prompt  # noqa: E402
from agentrl_jax.models.pretrained import resolve_model_path  # noqa: E402
from agentrl_jax.models.tokenizer import load_tokenizer  # noqa: E402
from environments.deepsearch.admissible import admissible_actions, after_search  # noqa: E402
from environments.deepsearch.backend import BackendConfig, SearchBackend  # noqa: E402
from environments.deepsearch.corpus import Passage  # noqa: E402
from environments.deepsearch.env import INSTRUCTIONS, format_passages, parse_tool_call  # noqa: E402
from environments.deepsearch.expert import listed_oracle_solves  # noqa: E402
from environments.deepsearch.scoring import exact_match, normalize_answer  # noqa: E402

SPLITS = ("train", "dev", "test")
#: ``experiments/deepsearch.py:grpo_gpu``: 3 passages a search, ``--max-steps 30``, 4,096 tokens
PASSAGES, MAX_STEPS, CONTEXT = 3, 30, 4096
RESPONSE_PREFIX = "Action:"


class CachedSearch:
    """``search(query)``: the passages the environment returns (its retriever,
    ``PASSAGES``), cached."""

    def __init__(self, backend: SearchBackend) -> None:
        self.backend = backend
        self.cache: dict[str, list[tuple[Passage, float]]] = {}

    def results(self, query: str) -> list[tuple[Passage, float]]:
        if query not in self.cache:
            self.cache[query] = list(self.backend.retriever.search(query, PASSAGES))
        return self.cache[query]

    def __call__(self, query: str) -> list[Passage]:
        return [p for p, _ in self.results(query)]


def first_context(formatter: ChatFormatter, system: str, question: str, listed: list[str]) -> int:
    """The context in tokens before the first reply of a ``choice_gpu`` episode: the system
    prompt, the first user message (the question and the options block of ``listed``) and the
    ``"Action:"`` prefix."""
    first = first_user_message(f"Question: {question}\n{options_block(listed)}")
    return len(formatter.prompt_ids(system, first)) + len(formatter.encode_text(RESPONSE_PREFIX))


def turn_tokens(
    formatter: ChatFormatter,
    system: str,
    results: Sequence[tuple[Passage, float]],
    listed: list[str],
) -> int:
    """The tokens one search turn adds to the context: the reply (one letter token), the
    observation (the passages ``results`` and the options block of ``listed``, the actions listed
    after it) and the ``"Action:"`` prefix, as ``agent/episode.py`` appends them."""
    reply = formatter.encode_text(" a")  # one letter token, as the restricted policy replies
    observation = f"{format_passages(results)}\n{options_block(listed)}"
    return (
        len(reply)
        + len(formatter.observation_ids(system, observation, reply))
        + len(formatter.encode_text(RESPONSE_PREFIX))
    )


def walk(
    question: str,
    search: CachedSearch,
    formatter: ChatFormatter,
    system: str,
    rng: random.Random,
    turns: int,
) -> dict[str, Any]:
    """One question's walk (module docstring): the context in tokens after each turn ``[turns]``
    and the options block's tokens and options at each turn."""
    searched: list[str] = []
    seen: list[Passage] = []
    listed = admissible_actions(question, searched, seen)
    context = first_context(formatter, system, question, listed)
    block_tokens, block_options, contexts = (
        [len(formatter.encode_text(options_block(listed)))],
        [len(listed)],
        [],
    )
    for _ in range(turns):
        queries = [parse_tool_call(a)[1] for a in listed if parse_tool_call(a)[0] == "search"]
        if not queries:
            break
        query = rng.choice(queries)
        results = search.results(query)
        searched, seen = after_search(searched, seen, query, [p for p, _ in results])
        listed = admissible_actions(question, searched, seen)
        context += turn_tokens(formatter, system, results, listed)
        contexts.append(context)
        block_tokens.append(len(formatter.encode_text(options_block(listed))))
        block_options.append(len(listed))
    return {"contexts": contexts, "block_tokens": block_tokens, "block_options": block_options}


def random_choice_solves(
    question: str, golden: Sequence[str], search: CachedSearch, rng: random.Random, turns: int
) -> int | None:
    """The turn (1-based) at which a uniformly random choice among the listed options answers
    correctly, None when it answers wrongly or runs out of ``turns``."""
    searched: list[str] = []
    seen: list[Passage] = []
    for turn in range(1, turns + 1):
        listed = admissible_actions(question, searched, seen)
        if not listed:
            return None
        tool, argument = parse_tool_call(rng.choice(listed))
        if tool == "answer":
            return turn if exact_match(argument, golden) == 1.0 else None
        searched, seen = after_search(searched, seen, argument, search(argument))
    return None


def oracle_needs(
    question: str,
    golden: Sequence[str],
    path: Sequence[str],
    search: Callable[[str], Sequence[Passage]],
) -> dict[str, int] | None:
    """What the listed oracle needs for ``question`` (module docstring): ``{"turns": T,
    "window": W}``, or None when it does not answer correctly within 10 turns. ``T``: its
    actions; ``W``: the largest number of turns between an action and the search whose
    passages first showed its text (0: the question shows it)."""
    trace: list[tuple[str, str]] = []
    if not listed_oracle_solves(question, golden, path, search, max_turns=10, trace=trace):
        return None
    shown: list[str] = []  # per search turn, its passages' normalised text
    window = 0
    for turn, (tool, argument) in enumerate(trace):
        needle = f" {normalize_answer(argument)} "
        if needle not in f" {normalize_answer(question)} ":
            sources = [i for i, text in enumerate(shown) if needle in text]
            window = max(window, turn - sources[0]) if sources else window
        if tool == "search":
            passages = search(argument)
            shown.append(
                " " + " ".join(normalize_answer(f"{p.title} {p.text}") for p in passages) + " "
            )
    return {"turns": len(trace), "window": window}


def _counts(values: Sequence[int]) -> dict[str, int]:
    return {str(v): sum(x == v for x in values) for v in sorted(set(values))}


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 1),
        "median": statistics.median(values),
        "max": max(values),
    }


def measure_split(
    backend: SearchBackend,
    split: str,
    search: CachedSearch,
    formatter: ChatFormatter,
    system: str,
    seeds: int,
    log: Callable[[str], None],
    oracle_needs_too: bool = False,
) -> dict[str, Any]:
    items = [backend.items[i] for i in backend.catalog.task_ids(split)]
    t0 = time.time()
    solved = {
        turns: sum(
            listed_oracle_solves(i.question, i.golden_answers, i.path, search, max_turns=turns)
            for i in items
        )
        for turns in (5, 10)
    }
    walks = [
        walk(i.question, search, formatter, system, random.Random(f"walk/{i.id}"), 10)
        for i in items
    ]
    random_turns = [
        random_choice_solves(
            i.question, i.golden_answers, search, random.Random(f"random/{seed}/{i.id}"), 10
        )
        for i in items
        for seed in range(seeds)
    ]
    block_tokens = [t for w in walks for t in w["block_tokens"]]
    needs = (
        [oracle_needs(i.question, i.golden_answers, i.path, search) for i in items]
        if oracle_needs_too
        else []
    )
    result = {
        "questions": len(items),
        "listed_oracle_solves": {
            f"{t}_turns": {"solved": n, "share": round(n / len(items), 4)}
            for t, n in solved.items()
        },
        "options_block_tokens": _stats(block_tokens),
        "options_per_turn": _stats([n for w in walks for n in w["block_options"]]),
        "first_turn_options_block_tokens": _stats([w["block_tokens"][0] for w in walks]),
        "context_after_turns": {
            str(t): _stats([w["contexts"][t - 1] for w in walks if len(w["contexts"]) >= t])
            for t in (1, 5, 10)
        },
        "walks_over_context": sum(
            bool(w["contexts"]) and w["contexts"][-1] > CONTEXT for w in walks
        ),
        "random_choice_correct": {
            f"{t}_turns": round(
                sum(r is not None and r <= t for r in random_turns) / len(random_turns), 4
            )
            for t in (5, 10)
        },
        "seconds": round(time.time() - t0, 1),
    }
    if oracle_needs_too:
        solved_needs = [n for n in needs if n is not None]
        result["oracle_needs"] = {
            "turns": _counts([n["turns"] for n in solved_needs]),
            "window": _counts([n["window"] for n in solved_needs]),
        }
        log(
            f"{split:5s} the oracle's turns (count of questions) {result['oracle_needs']['turns']}"
            f", the window its choices need {result['oracle_needs']['window']}"
        )
    c = result["context_after_turns"]
    block, rand = result["options_block_tokens"], result["random_choice_correct"]
    log(
        f"{split:5s} {len(items)} questions: listed oracle {solved[5]}/{len(items)} (5 turns), "
        f"{solved[10]}/{len(items)} (10 turns); options block {block.get('mean')} tokens "
        f"a turn (median {block.get('median')}, max {block.get('max')}), "
        f"{result['options_per_turn'].get('mean')} options; context after 5 / 10 turns "
        f"(median) {c['5'].get('median')} / {c['10'].get('median')} (max "
        f"{c['10'].get('max')}); random choice correct "
        f"{rand['5_turns']:.3f} / {rand['10_turns']:.3f}"
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splits", default=",".join(SPLITS), help="comma-separated splits")
    parser.add_argument("--seeds", type=int, default=4, help="random-choice episodes per question")
    parser.add_argument("--model", default="smollm2", help="the tokenizer's model (name or path)")
    parser.add_argument(
        "--oracle_needs",
        action="store_true",
        help="also the oracle's turns and the history window its choices need",
    )
    parser.add_argument("--json", default="", help="write the numbers to this file")
    args = parser.parse_args(argv)
    splits = [s for s in args.splits.split(",") if s]
    unknown = [s for s in splits if s not in SPLITS]
    if unknown or args.seeds < 1:
        parser.error(f"splits must be among {SPLITS} (got {unknown}) and --seeds >= 1")
    backend = SearchBackend(BackendConfig(), "search")
    formatter = ChatFormatter(load_tokenizer(resolve_model_path(args.model)))
    system = system_prompt(
        INSTRUCTIONS.format(k=PASSAGES, max_steps=MAX_STEPS), "deepsearch", "choice"
    )
    search = CachedSearch(backend)
    report: dict[str, Any] = {
        "args": vars(args),
        "system_prompt_tokens": len(formatter.encode_text(system)),
        "context": CONTEXT,
        "splits": {},
    }
    for split in splits:
        report["splits"][split] = measure_split(
            backend, split, search, formatter, system, args.seeds, print, args.oracle_needs
        )
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
