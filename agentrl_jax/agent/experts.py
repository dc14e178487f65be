"""Expert policies behind the rollout-backend interface, for recording behaviour-cloning data.

An :class:`ExpertBackend` stands where the LLM engine stands: the actor pool, the episodes, the
environment servers (HTTP), the prompts and the chat formatting are exactly those of RL, and
each "generation" is an expert's action written the way the policy answers in RL: after the
turn's response prefix (``agent.response_prefix``, e.g. ``"Action:"``: ``" go to red ball 1"``)
and ending with the turn's stop string (``"\\n"``; the engine keeps the token that completed the
stop, so the policy's turn ends with it too) or, without one, the model's EOS token. A recorded
trajectory therefore has the token layout RL trains on, and behaviour cloning trains on its
``loss_mask`` (the action tokens only).

Experts by environment family (``EXPERT_POLICIES``), each reading what the agent reads:

* ``babyai``: minigrid's ``BabyAIBot`` on a local replica of the task's level (primitive
  actions; ``environments/babyai/expert.py``);
* ``textcraft``: the recipe expert, planning from the crafting commands of the first
  observation and the answers to its actions (``environments/textcraft/expert.py``);
* ``scienceworld``: the task's gold action sequence from the ScienceWorld package
  (``environments/scienceworld/expert.py``);
* ``miniwob``: the rule-based expert over the text observation (``environments/miniwob/
  expert.py``).

An expert with no action left (``None``) or that fails (minigrid's bot asserts on some
levels) ends its episode as an ``engine_error``: such episodes are counted and never trained
on.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.rollout.base import GenerateResult, RolloutBackend, RolloutError


class ExpertPolicy(Protocol):
    """One episode's expert: ``act(observation)`` with the latest observation (the first call:
    the first observation) returns the next action, or ``None`` when it has none."""

    def act(self, observation: str) -> str | None: ...


class BabyAIExpertPolicy:
    """``BabyAIBot`` on a local replica; each call first mirrors the previous action."""

    def __init__(self, task_id: str):
        from environments.babyai.expert import BabyAIBotExpert

        self.expert = BabyAIBotExpert(task_id)
        self._acted = False

    def act(self, observation: str) -> str | None:
        if self._acted:
            self.expert.mirror()
        self._acted = True
        return self.expert.act()


class TextCraftExpertPolicy:
    """The recipe expert: built from the first observation, then told each answer."""

    def __init__(self, task_id: str):
        self.expert: Any = None

    def act(self, observation: str) -> str | None:
        from environments.textcraft.expert import TextCraftExpert

        if self.expert is None:
            self.expert = TextCraftExpert(observation)
            return self.expert.act()
        return self.expert.act(observation)


class ScienceWorldExpertPolicy:
    """The task's gold action sequence, one action a turn."""

    def __init__(self, task_id: str):
        from environments.scienceworld.expert import gold_path

        self.actions = list(gold_path(task_id))

    def act(self, observation: str) -> str | None:
        return self.actions.pop(0) if self.actions else None


class MiniWoBExpertPolicy:
    """The rule-based MiniWoB++ expert for the task named by the task id."""

    def __init__(self, task_id: str):
        from environments.miniwob.catalog import parse_task_id
        from environments.miniwob.expert import MiniWoBExpert

        self.task, _ = parse_task_id(task_id)
        self.expert = MiniWoBExpert()

    def act(self, observation: str) -> str | None:
        return self.expert.act(self.task, observation)


#: environment family -> ``factory(task_id) -> ExpertPolicy``
EXPERT_POLICIES: dict[str, Callable[[str], ExpertPolicy]] = {
    "babyai": BabyAIExpertPolicy,
    "textcraft": TextCraftExpertPolicy,
    "scienceworld": ScienceWorldExpertPolicy,
    "miniwob": MiniWoBExpertPolicy,
}


def reply_text(action: str, response_prefix: str, stop: str | None) -> str:
    """The policy's reply for ``action``: continues ``response_prefix`` (a space after a prefix
    that does not end in one; ``"Action: "`` first when there is no prefix) and ends with
    ``stop`` (``None``: nothing; the caller appends EOS)."""
    if response_prefix:
        text = action if response_prefix.endswith((" ", "\n")) else " " + action
    else:
        text = "Action: " + action
    return text + (stop or "")


class ExpertBackend(RolloutBackend):
    """A rollout backend whose replies are expert actions (see the module docstring).

    ``sessions`` maps each episode's session id to its trajectory (filled by the caller
    before the episode runs, e.g. :class:`~agentrl_jax.training.experts.ExpertPool`); the
    expert of a session is created on its first turn from the trajectory's environment and
    task, and sees the trajectory's latest user message (the observation)."""

    name = "expert"

    def __init__(self, formatter: Any, response_prefix: str, stop: str | None,
                 eos_token_id: int | None,
                 policies: Mapping[str, Callable[[str], ExpertPolicy]] = EXPERT_POLICIES):
        if stop is None and eos_token_id is None:
            raise ValueError("an expert turn needs a stop string or an EOS token to end with")
        self.formatter, self.response_prefix, self.stop = formatter, response_prefix, stop
        self.eos_token_id = eos_token_id
        self.policies = dict(policies)
        self.sessions: dict[str, Trajectory] = {}
        self._experts: dict[str, ExpertPolicy] = {}

    def expert_for(self, session_id: str) -> ExpertPolicy:
        if session_id not in self._experts:
            traj = self.sessions[session_id]
            if traj.env not in self.policies:
                raise RolloutError(f"no expert for environment {traj.env!r} "
                                   f"(have {sorted(self.policies)})")
            self._experts[session_id] = self.policies[traj.env](traj.task_id)
        return self._experts[session_id]

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        if session_id not in self.sessions:
            raise RolloutError(f"unknown expert session {session_id!r}")
        traj = self.sessions[session_id]
        observation = next(m["content"] for m in reversed(traj.messages) if m["role"] == "user")
        try:
            action = self.expert_for(session_id).act(observation)
        except RolloutError:
            raise
        except Exception as e:  # noqa: BLE001 -- an expert's own failure ends only its episode
            raise RolloutError(f"the expert failed: {type(e).__name__}: {e}") from e
        if action is None:
            raise RolloutError("the expert has no action")
        ids = self.formatter.encode_text(reply_text(action, self.response_prefix, self.stop))
        if self.stop is None:
            ids.append(self.eos_token_id)
        return GenerateResult(output_ids=ids, output_logprobs=[0.0] * len(ids),
                              finish_reason="stop", prompt_tokens=len(input_ids))

    def end_session(self, session_id: str) -> None:
        """Forget a finished episode (its expert holds a simulator replica)."""
        self.sessions.pop(session_id, None)
        self._experts.pop(session_id, None)

    async def update_weights(self, params=None, *, path=None, version=None):
        raise RolloutError("an expert backend has no weights")

    async def health(self):
        return True

    async def aclose(self):
        self._experts.clear()
