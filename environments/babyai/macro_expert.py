"""A BabyAI expert that acts in macros: ``BabyAIBot``'s primitive solution of a task, shortened
with the text environment's macro actions (``go to`` / ``pick up`` / ``go through``).

The bot (``expert.BabyAIBotExpert``) solves a level one primitive step at a time (turn, move,
pick up, toggle), 7.8 turns per solved task on average and none at all within 20 turns on the
larger levels (docs/RESULTS.md, "What limits BabyAI"); a policy cloned from it acts the same
way. :func:`macro_plan` replays the bot's solution ``a_1 .. a_T`` on the text environment and,
from each state ``s_i`` it reaches, tries every macro the environment offers there on a copy of
the environment: a macro that ends in a state of the bot's own path ``s_j`` with ``j > i + 1``
(same grid, agent pose and carried object: ``BabyAIEnv.state_key``) replaces ``a_{i+1} .. a_j``,
the furthest such ``j`` wins, and a macro that completes the mission ends the plan. From ``s_j``
the bot's own next primitive ``a_{j+1}`` applies unchanged (the state is the same; a macro only
changes which cells the agent has seen, which primitives do not read). The plan is replayed on
the environment as it is built, so it is exactly what the server will do with it; when it does
not solve the task but the bot's primitives did, the primitives are the plan.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

from environments.babyai.env import BabyAIEnv
from environments.babyai.expert import BabyAIBotExpert, BabyAIExpertPolicy

MACRO_PREFIXES = ("go to ", "pick up ", "go through ")


@dataclasses.dataclass(frozen=True)
class MacroPlan:
    """``actions``: the plan's text actions; ``primitives``: the bot's solution it shortens;
    ``bot_solved`` / ``solved``: whether the bot's primitives / the plan solve the task."""

    actions: tuple[str, ...]
    primitives: tuple[str, ...]
    bot_solved: bool
    solved: bool


def bot_solution(task_id: str, max_steps: int = 256, expert: BabyAIBotExpert | None = None,
                 before_act: Callable[[], None] | None = None) -> tuple[list[str], bool]:
    """The bot's primitive actions from the start of ``task_id`` until it has none, the level
    ends or ``max_steps``; and whether the level ended in success. ``expert``: the bot to use,
    fresh on ``task_id`` (default: a new ``BabyAIBotExpert``); ``before_act()`` runs before each
    of its steps (the recorder resets its bounded subgoal stack's read count there)."""
    expert = expert or BabyAIBotExpert(task_id)
    actions: list[str] = []
    while len(actions) < max_steps:
        if before_act is not None:
            before_act()
        action = expert.act()
        if action is None:
            break
        actions.append(action)
        reward, terminated, truncated = expert.mirror()
        if terminated or truncated:
            return actions, terminated and reward > 0
    return actions, False


def _path_index(task_id: str, primitives: list[str]) -> dict[str, int]:
    """``state_key -> i``: the furthest position ``i`` of the bot's path (``s_0`` = the start)
    in each state it passes through."""
    env = BabyAIEnv()
    env.reset(task_id)
    index = {env.state_key(): 0}
    for i, action in enumerate(primitives, 1):
        result = env.step(action)
        index[env.state_key()] = i
        if result.done or result.truncated:
            break
    env.close()
    return index


def shorten(task_id: str, primitives: list[str]) -> tuple[list[str], bool]:
    """The macro plan of the module docstring for the bot's ``primitives``, and whether it
    solves the task on the text environment."""
    index = _path_index(task_id, primitives)
    env = BabyAIEnv()
    env.reset(task_id)
    plan: list[str] = []
    i, solved = 0, False
    while i < len(primitives):
        best, best_j = primitives[i], i + 1
        for action in env.available_actions():
            if not action.startswith(MACRO_PREFIXES):
                continue
            trial = copy.deepcopy(env)
            result = trial.step(action)
            if result.info.get("invalid_action"):
                continue
            if result.done and result.info.get("success"):
                best, best_j = action, len(primitives)  # completes the mission: nothing is left
                break
            j = index.get(trial.state_key(), -1)
            if j > best_j and not (result.done or result.truncated):
                best, best_j = action, j
        result = env.step(best)
        plan.append(best)
        if result.done or result.truncated:
            solved = bool(result.done and result.info.get("success"))
            break
        i = best_j
    env.close()
    return plan, solved


def macro_plan(task_id: str, max_steps: int = 256, expert: BabyAIBotExpert | None = None,
               before_act: Callable[[], None] | None = None) -> MacroPlan:
    """The bot's solution of ``task_id`` (:func:`bot_solution`, same arguments) and its macro
    shortening (:func:`shorten`); the primitives themselves when shortening loses a solved
    task."""
    primitives, bot_solved = bot_solution(task_id, max_steps, expert, before_act)
    actions, solved = shorten(task_id, primitives)
    if bot_solved and not solved:
        actions, solved = list(primitives), True
    return MacroPlan(tuple(actions), tuple(primitives), bot_solved, solved)


class BabyAIMacroExpertPolicy:
    """``BabyAIBot``'s solution shortened with macro actions (``macro_plan``), planned on the
    first call with the bounded bot of :class:`BabyAIExpertPolicy`, then one action a turn."""

    def __init__(self, task_id: str):
        self.task_id = task_id
        self.actions: list[str] | None = None

    def act(self, observation: str) -> str | None:
        if self.actions is None:
            bot = BabyAIExpertPolicy(self.task_id)
            self.actions = list(macro_plan(self.task_id, expert=bot.expert,
                                           before_act=bot.stack.reset).actions)
        return self.actions.pop(0) if self.actions else None
