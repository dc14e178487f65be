"""The ScienceWorld text environment (``TextEnvironment`` over a pooled simulator).

Episode protocol:

* ``reset("boil/var=21")`` borrows a simulator from the process-wide pool (blocking while all are
  lent), loads the task variation and returns the task description plus the first ``look around``.
* ``step(action)`` sends the free-text command to the simulator. The special action
  ``check valid actions`` lists every currently valid action (it is slow in the JVM, so
  it is computed only when asked, or at every step when ``valid_actions_each_step`` is set); it
  does not advance the simulator but counts as a step.
* Reward: ``(s_t - s_{t-1}) / 100`` with ``s`` the simulator's score (0-100) clamped at 0, so the
  rewards of an episode sum to ``max(final score, 0) / 100`` in [0, 1]. ``info["score"]`` is the
  raw current score (-100 after a fatal mistake, e.g. focusing on the wrong object).
* ``done`` when the simulator reports the task completed (``success`` = score 100) or failed
  (score < 0); ``truncated`` after ``max_steps`` steps. The simulator is returned to the pool as
  soon as the episode ends.
* Unknown commands ("No known action matches that input.") are normal steps with
  ``info["invalid_action"] = True``. Ambiguous ones make the simulator ask for a number: answering
  with that number is a normal action.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from environments.core.base import ResetResult, StepResult, TextEnvironment
from environments.scienceworld.catalog import make_task_id, parse_task_id, split_of
from environments.scienceworld.pool import SimulatorPool, get_pool
from environments.scienceworld.shortlist import shortlist
from environments.scienceworld.valid_actions import valid_action_list

log = logging.getLogger("environments.scienceworld")

VALID_ACTIONS_COMMANDS = ("check valid actions", "check available actions", "valid actions")
_INVALID_PREFIXES = ("No known action matches that input.", "Unknown action.")

INSTRUCTIONS = """You are an agent in ScienceWorld, a text-based simulation of a house, outdoors and \
laboratories where you carry out elementary science experiments. Every turn, answer with exactly \
one command. Command templates (replace OBJ with the name of an object you have seen):
{templates}
Notes: 'look around' describes the room; 'inventory' lists what you carry; 'task' repeats the task; \
'focus on OBJ' marks the object the task is about (focusing on a wrong object fails the task, so \
use it only when you are sure); 'wait' / 'wait1' let time pass. If the game answers that a command \
is ambiguous, reply with the number of the option you meant. Send 'check valid actions' to list \
every command that is valid right now. The score rises as you complete parts of the task; the \
episode ends when the task is completed or failed, or after {max_steps} commands."""

_FALLBACK_TEMPLATES = [
    "activate OBJ", "close OBJ", "connect OBJ to OBJ", "deactivate OBJ", "disconnect OBJ",
    "dunk OBJ in OBJ", "eat OBJ", "flush OBJ", "focus on OBJ", "go OBJ", "inventory",
    "look around", "look at OBJ", "look in OBJ", "mix OBJ", "move OBJ to OBJ", "open OBJ",
    "pick up OBJ", "pour OBJ in OBJ", "put down OBJ", "read OBJ", "reset task", "task",
    "use OBJ on OBJ", "wait", "wait1",
]  # fmt: skip


class ScienceWorldEnvironment(TextEnvironment):
    """One ScienceWorld episode at a time, on a simulator borrowed from a pool.

    max_steps: steps per episode before ``truncated``.
    valid_actions_each_step: put the valid-action list into every step's info (slow).
    simplifications: the simulator's simplification string ("" = none, "easy" = all).
    pool_getter: where simulators come from (default: the process-wide pool).
    """

    name = "scienceworld"

    def __init__(
        self,
        max_steps: int = 100,
        valid_actions_each_step: bool = False,
        simplifications: str = "",
        pool_getter: Callable[[], SimulatorPool] = get_pool,
    ) -> None:
        self.max_steps = max_steps
        self.valid_actions_each_step = valid_actions_each_step
        self.simplifications = simplifications
        self._pool_getter = pool_getter
        self._pool: SimulatorPool | None = None
        self._sim: Any = None
        self._task_id: str | None = None
        self._steps = 0
        self._score = 0
        self._closed = False
        self._task_description = ""
        self._observations: list[str] = []  # this episode's, for the short list's recency

    # -- simulator lending

    def _borrow(self) -> Any:
        if self._sim is None:
            self._pool = self._pool_getter()
            self._sim = self._pool.acquire()
        return self._sim

    def _give_back(self, broken: bool = False) -> None:
        sim, self._sim = self._sim, None
        if sim is not None and self._pool is not None:
            self._pool.release(sim, broken=broken)

    # -- protocol

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        """Start ``task_id`` (``"<task>/var=<n>"``). ScienceWorld variations are deterministic: ``seed`` is ignored."""
        if self._closed:
            raise RuntimeError("this ScienceWorld environment is closed")
        name, variation = parse_task_id(task_id)  # InvalidTaskError before borrowing anything
        sim = self._borrow()
        try:
            sim.load(name, variation, self.simplifications, generateGoldPath=False)
            sim.server.reset()
            look = sim.server.step("look around")
            description = sim.server.freeActionTaskDesc()
            templates = list(sim.server.getPossibleActions())
            score = int(round(100 * sim.server.getScore()))
        except Exception:
            self._give_back(broken=True)
            raise
        self._task_id = make_task_id(name, variation)
        self._steps = 0
        self._score = score
        self._task_description = description.strip()
        observation = f"{description.strip()}\n\n{look.strip()}"
        self._observations = [observation]
        info: dict[str, Any] = {
            "task_id": self._task_id,
            "task_name": name,
            "variation": variation,
            "split": split_of(name, variation),
            "max_steps": self.max_steps,
            "instructions": INSTRUCTIONS.format(
                templates="\n".join(f"  {t}" for t in (templates or _FALLBACK_TEMPLATES)), max_steps=self.max_steps
            ),
            "action_templates": templates,
            "score": score,
        }
        if self.valid_actions_each_step:
            info["available_actions"] = self._valid_actions()
        return ResetResult(observation=observation, info=info)

    def step(self, action: str) -> StepResult:
        if self._sim is None:
            raise RuntimeError("step() before reset(), or after the episode ended")
        self._steps += 1
        command = " ".join(str(action).split())
        info: dict[str, Any] = {"steps": self._steps, "invalid_action": False}
        try:
            if command.lower() in VALID_ACTIONS_COMMANDS:
                valid = self._valid_actions()
                info["available_actions"] = valid
                observation = "Valid actions: " + ", ".join(valid)
                score, completed = self._score, False
            else:
                observation = self._sim.server.step(command)
                score = int(round(100 * self._sim.server.getScore()))
                completed = bool(self._sim.server.getCompleted())
                info["invalid_action"] = observation.startswith(_INVALID_PREFIXES) or not command
                self._observations.append(observation)
                if self.valid_actions_each_step:
                    info["available_actions"] = self._valid_actions()
        except Exception:
            self._give_back(broken=True)
            raise
        reward = (max(score, 0) - max(self._score, 0)) / 100.0
        self._score = score
        done = completed or score < 0
        truncated = not done and self._steps >= self.max_steps
        info.update(score=score, success=bool(completed and score >= 100))
        if done or truncated:
            self._give_back()
        return StepResult(observation=observation, reward=reward, done=done, truncated=truncated, info=info)

    def close(self) -> None:
        """Return the simulator (if an episode is running) to the pool. Idempotent."""
        self._closed = True
        self._give_back()

    # -- helpers

    def valid_actions(self) -> list[str] | None:
        """The simulator's valid actions in the short list's order (``shortlist.shortlist`` of
        the task description and this episode's observations; None between episodes)."""
        if self._sim is None:
            return None
        return shortlist(self._valid_actions(), self._task_description, self._observations)

    def _valid_actions(self) -> list[str]:
        return sorted(valid_action_list(self._sim))

    @property
    def simulator(self) -> Any:
        """The simulator lent to this instance (None between episodes)."""
        return self._sim
