"""One episode's record: token-exact ids, loss mask, behaviour logprobs, rewards and status."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Mapping

# Status values. Trajectories with an *_error status are dropped from training (never trained on
# as reward 0); the others are real outcomes of the policy.
STATUS_DONE = "done"  # the environment ended the episode
STATUS_MAX_TURNS = "max_turns"  # the horizon (ScalingInter turn limit) was reached
STATUS_CONTEXT_LIMIT = "context_limit"  # the token history no longer fits the context
STATUS_ENV_ERROR = "env_error"  # an environment server failed
STATUS_ENGINE_ERROR = "engine_error"  # the rollout backend failed
ERROR_STATUSES = (STATUS_ENV_ERROR, STATUS_ENGINE_ERROR)

#: ``info`` key under which an environment may report its state (an opaque string equal for
#: equal environment states); GiGPO's anchor states use it, else the observation text
STATE_KEY = "state_key"


def anchor_state(observation: str, info: Mapping[str, Any] | None = None) -> str:
    """A 16-hex-digit digest naming the environment state an agent acts from: the
    environment's own ``info["state_key"]`` when it reports one, else the observation text
    (GiGPO's anchor state: turns of one task's episodes with equal digests form a step
    group)."""
    key = (info or {}).get(STATE_KEY)
    text = f"key:{key}" if key is not None else f"obs:{observation}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


@dataclasses.dataclass
class Trajectory:
    """A multi-turn episode.

    token_ids [T]: prompt + (generated ids + observation ids) per turn, exactly as sampled.
    loss_mask [T]: 1 on ids the policy generated, 0 on prompt and observation ids.
    logprobs [T]: the engine's logprob of each generated id (0 elsewhere).
    turn_ids [T]: the turn index of each id (-1 for the prompt).
    turn_states [num_turns]: the anchor state (``anchor_state``) each turn acted from.
    reward: the episode's total environment reward (the outcome score trained on).
    policy_version: the weights version (learner updates done) the episode started with.
    turn_versions [num_turns]: the weights version of each assistant turn: the oldest version
      that produced any of its tokens (weights can change mid-episode, even mid-turn, when a
      rollout overlaps an update). ``oldest_version`` decides staleness.
    """

    env: str
    task_id: str
    group_id: int
    sample_index: int
    episode_id: str = ""  # also the rollout session id (prefix-cache key)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turn_ids: list[int] = dataclasses.field(default_factory=list)
    prompt_length: int = 0
    messages: list[dict[str, str]] = dataclasses.field(default_factory=list)
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    turn_states: list[str] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    status: str = STATUS_DONE
    num_turns: int = 0
    invalid_actions: int = 0
    horizon: int = 0
    policy_version: int = 0
    turn_versions: list[int] = dataclasses.field(default_factory=list)
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status not in ERROR_STATUSES

    @property
    def oldest_version(self) -> int:
        """The oldest weights version any turn was generated with (the start version when no
        turn was generated)."""
        return min(self.turn_versions) if self.turn_versions else self.policy_version

    @property
    def mixed_versions(self) -> bool:
        """Whether the turns come from more than one weights version."""
        return len(set(self.turn_versions)) > 1

    @property
    def num_generated(self) -> int:
        return int(sum(self.loss_mask))

    def append(self, ids: list[int], generated: bool, turn: int,
               logprobs: list[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if generated else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.turn_ids.extend([turn] * len(ids))

    def to_json(self, step: int | None = None) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if step is not None:
            out["step"] = step
        return out
