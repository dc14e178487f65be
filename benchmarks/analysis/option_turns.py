"""The turns of an answer-format measurement (``action_format.py``), read from its trajectories:
each turn's generated tokens and context, the options block an observation listed, each reply
with the options before it, the option lists the environment sent (:class:`OrderRecorder`,
to tell a shown order from the environment's), sample replies, and which groups of episodes are
flat (:func:`flat_groups`)."""

from __future__ import annotations

from typing import Any, Sequence

from agentrl_jax.agent.parsing import CHOICE_LABELS
from agentrl_jax.agent.trajectory import Trajectory


def turn_token_counts(t: Trajectory) -> list[int]:
    """Generated tokens of each assistant turn (``turn_ids`` of the ``loss_mask == 1`` ids)."""
    counts = [0] * t.num_turns
    for turn, generated in zip(t.turn_ids, t.loss_mask):
        if generated and 0 <= turn < len(counts):
            counts[turn] += 1
    return counts


def turn_contexts(t: Trajectory) -> list[int]:
    """``[num_turns]``: the tokens the engine held when each assistant turn ended, its prompt
    plus its reply: for turn ``k`` whose last generated id is at ``i`` in chunk ``[s, e)``,
    ``i + 1 - s``. With the whole history it grows every turn; with a history window
    (``agent.history_turns``, one chunk a turn past the window) it stops growing. A turn
    with no generated id counts as 0."""
    last = [-1] * t.num_turns
    for i, (turn, generated) in enumerate(zip(t.turn_ids, t.loss_mask)):
        if generated and 0 <= turn < len(last):
            last[turn] = i
    bounds = t.chunk_bounds()
    return [next((i + 1 - s for s, e in bounds if s <= i < e), 0) if i >= 0 else 0 for i in last]


OPTIONS_MARKER = "Options: "


def listed_options(observation: str) -> list[str]:
    """The options of the last ``parsing.options_block`` line of ``observation`` (``"Options:
    a) turn left, b) go to red ball 1"`` -> ``["turn left", "go to red ball 1"]``); [] when it
    lists none. An option is the text from its label to the next label in order."""
    start = observation.rfind(OPTIONS_MARKER)
    if start < 0:
        return []
    line = observation[start + len(OPTIONS_MARKER):].split("\n", 1)[0]
    if not line.startswith(f"{CHOICE_LABELS[0]}) "):
        return []
    options: list[str] = []
    position = 3
    for label in CHOICE_LABELS[1:]:
        nxt = line.find(f", {label}) ", position)
        if nxt < 0:
            break
        options.append(line[position:nxt])
        position = nxt + len(f", {label}) ")
    options.append(line[position:])
    return options


def replies_with_options(t: Trajectory) -> list[tuple[str, list[str]]]:
    """Each assistant reply of ``t`` with the options listed in the message before it."""
    pairs, previous = [], ""
    for message in t.messages:
        if message["role"] == "assistant":
            pairs.append((message["content"], listed_options(previous)))
        previous = message["content"]
    return pairs


class OrderRecorder:
    """An environment client that records the option lists the environment sends (its
    ``listed_actions``, else ``available_actions``, of every ``create`` and ``step``) by their
    sorted contents, and forwards everything to ``client``."""

    def __init__(self, client: Any):
        self.client = client
        self.lists: dict[tuple[str, ...], set[tuple[str, ...]]] = {}

    def _record(self, info: dict[str, Any]) -> None:
        options = tuple(str(o) for o in (info.get("listed_actions")
                                         or info.get("available_actions") or []))
        self.lists.setdefault(tuple(sorted(options)), set()).add(options)

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        created = await self.client.create(*args, **kwargs)
        self._record(created[2])
        return created

    async def step(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.client.step(*args, **kwargs)
        self._record(result.info)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def flat_groups(episode_scores: Sequence[Sequence[Any]], episode_shaping: Sequence[float]
                ) -> tuple[int, int, int]:
    """``(groups, flat by score, flat by return)`` of episodes grouped by task:
    ``episode_scores[i] = [task id, score, turns]`` and ``episode_shaping[i]`` its training-only
    bonus. Groups: tasks with at least 2 episodes; flat by score: all their scores equal; flat by
    return: all ``score + shaping`` equal (the reward the trainer uses, for a task reward in
    [0, 1]), within 1e-9. A flat group has advantage 0 under GRPO."""
    by_task: dict[str, list[tuple[float, float]]] = {}
    for (task, score, _), shaping in zip(episode_scores, episode_shaping):
        by_task.setdefault(str(task), []).append((float(score), float(score) + float(shaping)))
    groups = flat_score = flat_return = 0
    for values in by_task.values():
        if len(values) < 2:
            continue
        scores, returns = [v[0] for v in values], [v[1] for v in values]
        groups += 1
        flat_score += int(max(scores) - min(scores) <= 1e-9)
        flat_return += int(max(returns) - min(returns) <= 1e-9)
    return groups, flat_score, flat_return


def sample_replies(trajectories: list[Trajectory], n: int, width: int = 100) -> list[str]:
    """The first assistant reply of the first ``n`` episodes, cut to ``width`` characters."""
    replies = [next((m["content"] for m in t.messages if m["role"] == "assistant"), "")
               for t in trajectories[:n]]
    return [r[:width] for r in replies]
