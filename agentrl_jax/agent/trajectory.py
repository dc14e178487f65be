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


def record_context_tokens(record: Mapping[str, Any]) -> int | None:
    """The final context length of an episode record (``Trajectory.to_json``, or a small
    evaluation record): its ``context_tokens`` when it has one, else
    ``len(token_ids) - chunk_starts[-1]`` (:attr:`Trajectory.context_tokens`); None when it has
    neither (a small record written before the field)."""
    if record.get("context_tokens") is not None:
        return int(record["context_tokens"])
    ids = record.get("token_ids")
    if not isinstance(ids, list):
        return None
    starts = record.get("chunk_starts") or [0]
    return len(ids) - int(starts[-1])


@dataclasses.dataclass
class Trajectory:
    """A multi-turn episode.

    token_ids [T]: prompt + (generated ids + observation ids) per turn, exactly as sampled.
      With a history window (``agent.history_turns``) the ids are the episode's *chunks*
      end to end: a chunk is one sequence the engine extended turn by turn; when the window
      drops a turn, the next turn's prompt (system, first user message, the kept turns) starts
      a new chunk. ``token_ids[a:b]`` of a chunk ``(a, b)`` is exactly what the engine was given
      for its turns (plus their replies), so each chunk is trained as its own row.
    chunk_starts [C]: where each chunk begins in ``token_ids`` (``[0]``: one chunk, the
      whole episode, as without a window).
    loss_mask [T]: 1 on ids the policy generated, 0 on prompt and observation ids (and on the
      earlier turns repeated in a later chunk's prompt: each generated id is trained once).
    logprobs [T]: the engine's logprob of each generated id (0 elsewhere).
    turn_ids [T]: the turn index of each id (-1 for the prompt, and for each chunk's prompt).
    turn_states [num_turns]: the anchor state (``anchor_state``) each turn acted from.
    reward: the episode's total environment reward (the return trained on).
    shaping: the part of ``reward`` that is training-only bonus: the sum of the steps'
      ``info[SHAPING_KEY]`` (``environments/core/base.py``, e.g. deep search's evidence reward;
      0 for most families). The task's own reward is ``reward - shaping``, what evaluation scores
      (``eval_metrics.outcome``).
    invalid_actions: turns without an accepted action: the parser could not read the reply
      (``parse_failures`` of them) or the environment refused the parsed action
      (``invalid_actions - parse_failures``).
    parse_failures: turns whose reply the parser could not read (``ParsedAction.action`` None:
      the environment was not stepped, the next observation is ``INVALID_FORMAT_FEEDBACK``).
    policy_version: the weights version (learner updates done) the episode started with.
    option_counts [T]: the option limit each generated id was sampled under (``agent.
      option_limits``: a turn listing ``n`` options samples only the first ``n`` option
      tokens, ``models/output_tokens.py``); 0 on every other id and on turns without a limit.
      The learner scores each id under the same limit (``RolloutBatch.option_counts``).
    turn_versions [num_turns]: the weights version of each assistant turn: the oldest version
      that produced any of its tokens (weights can change mid-episode, even mid-turn, when a
      rollout overlaps an update). ``oldest_version`` decides staleness.
    option_picks [num_turns]: in a multiple-choice episode (``rollout.parser="choice"``), the
      index of the option each reply chose in the environment's own order of its listed
      actions (0: the first it lists), -1 where the reply chose none (a parse failure); empty
      in an episode without options.
    letter_picks [num_turns]: the same choices as shown, the letter's index (0: ``a``): equal
      to ``option_picks`` unless ``agent.shuffle_options`` permuted the list.
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
    option_counts: list[int] = dataclasses.field(default_factory=list)
    chunk_starts: list[int] = dataclasses.field(default_factory=lambda: [0])
    prompt_length: int = 0
    messages: list[dict[str, str]] = dataclasses.field(default_factory=list)
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    turn_states: list[str] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    shaping: float = 0.0
    success: bool = False
    status: str = STATUS_DONE
    num_turns: int = 0
    invalid_actions: int = 0
    parse_failures: int = 0
    horizon: int = 0
    policy_version: int = 0
    turn_versions: list[int] = dataclasses.field(default_factory=list)
    option_picks: list[int] = dataclasses.field(default_factory=list)
    letter_picks: list[int] = dataclasses.field(default_factory=list)
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

    def chunk_bounds(self) -> list[tuple[int, int]]:
        """``[(start, end), ...]``: each chunk's span of ``token_ids`` (one training row
        each)."""
        starts = list(self.chunk_starts) or [0]
        ends = starts[1:] + [len(self.token_ids)]
        return list(zip(starts, ends))

    @property
    def context_tokens(self) -> int:
        """The length of the current chunk (:meth:`context_ids`): what the engine held at the
        end, prompt + every turn (without a history window, ``len(token_ids)``)."""
        return len(self.token_ids) - (self.chunk_starts[-1] if self.chunk_starts else 0)

    def context_ids(self) -> list[int]:
        """The current chunk: the ids the next turn's generation continues."""
        start = self.chunk_starts[-1] if self.chunk_starts else 0
        return self.token_ids[start:]

    def start_chunk(self, prompt_ids: list[int]) -> None:
        """End the current chunk and start a new one with ``prompt_ids`` (turn id -1, loss
        mask 0)."""
        self.chunk_starts.append(len(self.token_ids))
        self.append(prompt_ids, generated=False, turn=-1)

    def append(self, ids: list[int], generated: bool, turn: int,
               logprobs: list[float] | None = None, option_count: int = 0) -> None:
        """``ids`` at the end (``option_count``: the limit generated ids were sampled under;
        0: none)."""
        self.option_counts.extend([option_count if generated else 0] * len(ids))
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if generated else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.turn_ids.extend([turn] * len(ids))

    def to_json(self, step: int | None = None) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if step is not None:
            out["step"] = step
        return out
