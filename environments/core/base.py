"""The contract every text environment implements.

An environment family (BabyAI, TextCraft, ...) provides:

* a ``TextEnvironment`` subclass: one episode-capable instance that the HTTP server core creates,
  resets, steps and closes. All its methods are synchronous and may block (a JVM, a browser); the
  server runs them off the event loop and serializes the calls made on one instance.
* a ``TaskCatalog``: the deterministic train / test task ids of the family.

The server core (``environments/core/server.py``) turns any family into the HTTP protocol; the
client (``environments/core/client.py``) is what the actor pool uses.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Protocol, Sequence


class InvalidTaskError(ValueError):
    """Raised by ``reset`` / ``TaskCatalog.resolve`` for a task id or index that does not exist.

    The server maps it to HTTP 404 with the message.
    """


#: ``info`` key of a step's training-only bonus: the part of its ``reward`` that is shaping, not
#: the task's outcome (e.g. deep search's evidence reward). The trainer's return keeps it; the
#: evaluation's score (Avg@k, Pass@k) takes it out again.
SHAPING_KEY = "shaping"


@dataclasses.dataclass
class StepResult:
    """The outcome of one ``step``.

    observation: the text the agent sees next.
    reward: the reward of this step (families with outcome rewards give it on the final step).
    done: the episode ended (success or failure decided by the environment).
    truncated: the episode was cut by the environment's own step limit.
    info: JSON-serialisable extras. Conventional keys: ``success`` (bool), ``score`` (float),
      ``invalid_action`` (bool: the env did not understand the action; this is a normal step),
      ``available_actions`` (list[str], where the family has them), ``steps`` (int), and
      ``SHAPING_KEY`` (float: the part of ``reward`` that is a training-only bonus, reward
      shaping; evaluation scores an episode by its rewards minus these parts).
    """

    observation: str
    reward: float
    done: bool
    truncated: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ResetResult:
    """The first observation of an episode.

    info must include ``task_id`` (str), ``max_steps`` (int) and ``instructions`` (str: a
    description of the action syntax for the agent's system prompt); ``available_actions`` where
    the family has them.
    """

    observation: str
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class TaskCatalog(abc.ABC):
    """Deterministic train / test split of a family's task ids."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    @abc.abstractmethod
    def task_ids(self, split: str) -> Sequence[str]:
        """All task ids of ``split`` in a fixed order (raises ``InvalidTaskError`` on bad split)."""

    def resolve(self, split: str, index: int) -> str:
        """The task id at ``index`` of ``split`` (wrapping modulo the split size is NOT done)."""
        ids = self.task_ids(split)
        if not 0 <= index < len(ids):
            raise InvalidTaskError(f"index {index} out of range for split {split!r} ({len(ids)} tasks)")
        return ids[index]


#: the most actions a session may ask to have listed after each observation (``list_actions``)
MAX_LISTED_ACTIONS = 200


def action_list_text(actions: Sequence[str], limit: int) -> str:
    """The line appended to an observation by ``list_actions``: at most ``limit`` actions, in the
    family's order, then how many were left out, e.g.
    ``"Valid actions: look around, inventory, go to kitchen (and 41 more)."``."""
    shown = list(actions[:limit])
    more = len(actions) - len(shown)
    return "Valid actions: " + ", ".join(shown) + (f" (and {more} more)." if more > 0 else ".")


class TextEnvironment(abc.ABC):
    """One environment instance. Not thread-safe: the server serializes calls per instance.

    Families with admissible actions override ``valid_actions``; the server appends them to the
    observation for sessions created with ``list_actions`` (``action_list_text``), unless the
    family's observations list them already (``lists_actions_in_observation``).
    """

    name: ClassVar[str]
    #: True where every observation already ends with the list of available actions (BabyAI)
    lists_actions_in_observation: ClassVar[bool] = False
    #: False: leave the family's own action list out of the observation text (a session created
    #: with ``"action_text": false``; the server sets it before every reset). Only families that
    #: list actions in their observations (``lists_actions_in_observation``) read it; they still
    #: give the actions in ``info``.
    action_text: bool = True

    @abc.abstractmethod
    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        """Start an episode of ``task_id``; raises ``InvalidTaskError`` for an unknown id."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one text action. An action the env does not understand is a normal step."""

    def valid_actions(self) -> list[str] | None:
        """The actions the environment accepts in the current state, most useful first (the
        server lists the first ``list_actions`` of them); ``None`` where the family has no such
        list. Called only between steps of a running episode."""
        return None

    def close(self) -> None:
        """Release every resource (processes, threads, browsers). Idempotent."""


class ExpertStuck(RuntimeError):
    """An expert that cannot produce its next action in bounded work."""


class ExpertPolicy(Protocol):
    """One episode's expert (a family's ``Family.expert`` is ``factory(task_id) ->
    ExpertPolicy``): ``act(observation)`` with the latest observation (the first call: the first
    observation) returns the next action, or ``None`` when it has none. A factory whose work
    must not be interrupted by a signal sets ``interruptible = False``."""

    def act(self, observation: str) -> str | None: ...
