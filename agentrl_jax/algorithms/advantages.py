"""Advantage estimators for multi-turn agentic RL (GAE, GRPO, Dr.GRPO, RLOO,
REINFORCE++, REINFORCE++-baseline), chosen by name from config.

Batch contract (``B`` trajectories, ``T`` tokens each):

* ``rewards [B]``: outcome score of each trajectory. It is placed on the trajectory's
  LAST GENERATED token (:func:`~agentrl_jax.algorithms.masked.place_outcome_reward`).
* ``loss_mask [B, T]``: 1 on generated tokens, 0 on prompt / observation / padding.
  Observation spans (mask 0) may sit in the middle of a trajectory.
* ``group_ids [B]`` int: samples of the same task share an id (any values, any order).
* ``values [B, T]``: critic values (GAE only).
* ``token_rewards [B, T]`` (optional): extra per-token rewards (e.g. per-turn rewards
  or a KL penalty from :func:`~agentrl_jax.algorithms.kl.kl_penalized_token_rewards`);
  entries on mask-0 tokens are ignored.

The arrays travel as one :class:`AdvantageInputs` (a pytree), the scalar options as one
:class:`AdvantageSettings` (hashable, static under ``jit``); an estimator is registered as an
:class:`AdvantageEstimator` record: its function ``fn(inputs, settings, **own_options)``, the
optional inputs it reads (``values``: it needs a critic; ``ref_logprobs``: a reference model;
the per-turn arrays: a turn-level batch), its own static options and what it needs of the
learner's loss. Callers read these facts from the record, never from the name.

Every estimator returns ``AdvantageOutput(advantages [B, T], returns [B, T])`` with
zeros on mask-0 tokens and on fully masked rows, finite for groups of one,
zero-variance groups and fully masked rows. All estimators are ``jax.jit``-ed;
scalar options (``gamma``, ``lam``, ``eps``, ``whiten``, ``method``, ``chunk``) are
static (pass Python numbers): one compilation per configuration.

Multi-turn rule (GAE and REINFORCE++): at a mask-0 token the running advantage /
return and the "next value" pass through unchanged, so credit from a later turn
flows back across observation spans to earlier turns; discounting (``gamma``,
``gamma*lam``) is applied per generated token only.

Example::

    out = compute_advantages("grpo", rewards=r, loss_mask=m, group_ids=g)
    adv, ret = out  # or out.advantages, out.returns
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from agentrl_common.registry import Registry, snake_case


Array = jax.Array

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageSettings",
    "compute_advantages",
    "get_advantage_estimator",
    "register_advantage_estimator",
    "TURN_INPUTS",
    "is_turn_level",
    "LOGPROB_INPUTS",
    "is_logprob_level",
    "min_group_size",
]


class AdvantageOutput(NamedTuple):
    """``advantages [B, T]`` (what the policy loss uses) and ``returns [B, T]``
    (value targets for GAE, discounted returns for REINFORCE++, = advantages for
    the outcome-only estimators, as in verl)."""

    advantages: Array
    returns: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdvantageInputs:
    """The arrays of one batch (``B`` trajectories, ``T`` tokens, ``K`` turn slots), the one
    input type of every estimator; the optional ones are None where a batch or an estimator
    has none.

    rewards: ``[B]`` outcome score of each trajectory.
    loss_mask: ``[B, T]`` 1 on generated tokens, 0 on prompt / observation / padding.
    group_ids: ``[B]`` int, samples of the same task share an id (group estimators).
    values: ``[B, T]`` critic values (``gae``).
    token_rewards: ``[B, T]`` extra per-token rewards (added on generated tokens).
    turn_ids: ``[B, T]`` int, the turn of each token, -1 outside turns (``gigpo``).
    turn_rewards: ``[B, K]`` per-turn rewards (``gigpo``; None: the outcome on the last turn).
    turn_anchors: ``[B, K]`` int, hashed state each turn acts in, -1 for no turn (``gigpo``).
    logprobs: ``[B, T]`` the policy's log-probs before the update (``dpo``).
    ref_logprobs: ``[B, T]`` the frozen reference's log-probs (``dpo``).
    """

    rewards: Array
    loss_mask: Array
    group_ids: Array | None = None
    values: Array | None = None
    token_rewards: Array | None = None
    turn_ids: Array | None = None
    turn_rewards: Array | None = None
    turn_anchors: Array | None = None
    logprobs: Array | None = None
    ref_logprobs: Array | None = None


#: the optional fields of :class:`AdvantageInputs` (an estimator declares those it reads)
OPTIONAL_INPUTS = tuple(f.name for f in dataclasses.fields(AdvantageInputs))[2:]

#: per-turn inputs of the turn-level estimators (``gigpo``): ``turn_ids [B, T]``,
#: ``turn_rewards [B, K]``, ``turn_anchors [B, K]`` (see ``training/rl/batching.py``)
TURN_INPUTS = ("turn_ids", "turn_rewards", "turn_anchors")

#: log-prob inputs of the preference estimators (``dpo``): ``logprobs [B, T]`` (the current
#: policy's, before the update) and ``ref_logprobs [B, T]`` (the frozen reference's)
LOGPROB_INPUTS = ("logprobs", "ref_logprobs")


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
    """The scalar options every estimator takes (static under ``jit``: one compilation per
    value).

    gamma: discount per generated token (``gae``, ``reinforce_pp``); per turn (``gigpo``).
    lam: GAE lambda.
    eps: std epsilon of the group estimators: ``(R - mean) / (std + eps)``.
    whiten: whiten advantages over the batch's masked tokens (``gae``, ``reinforce_pp``).
    method: recurrence implementation for ``gae`` / ``reinforce_pp``:
      ``auto | blocked | associative | scan | pallas`` (``auto`` = ``scan`` on CPU, ``blocked``
      on GPU/TPU; :data:`~agentrl_jax.algorithms.gae.GAE_METHODS`).
    chunk: chunk length of the blocked scan.
    """

    gamma: float = 1.0
    lam: float = 1.0
    eps: float = 1e-6
    whiten: bool = True
    method: str = "auto"
    chunk: int = 64


#: the field names of :class:`AdvantageSettings`
SETTINGS = tuple(f.name for f in dataclasses.fields(AdvantageSettings))


@dataclasses.dataclass(frozen=True, eq=False)
class AdvantageEstimator:
    """A registered estimator.

    fn: ``fn(inputs: AdvantageInputs, settings: AdvantageSettings, **options) ->
      AdvantageOutput`` (jitted: ``settings`` and ``options`` static).
    inputs: the optional :class:`AdvantageInputs` fields it reads (others are passed as None).
    options: the names of its own static options (``gigpo``: ``omega``, ``norm_std``).
    supervised_loss: it needs a supervised policy loss (``dpo``: its advantages are the
      gradient weights of ``-A * logp``).
    loss_agg_mode: the loss aggregation it needs (None: any).
    episode_scalar: its advantage of a row is one number broadcast on the row's generated
      tokens, a function of the row's outcome score and its group's scores only (``grpo``,
      ``dr_grpo``, ``rloo``). Such an estimator can score an episode once and give that score
      to every training row the episode is split into (``agent.history_turns``,
      ``training/rl/batching.py``); the others (GAE's per-token values, REINFORCE++'s
      per-token returns and batch whitening, GiGPO's turns) cannot.
    min_group_size: the fewest samples per group (``train.samples_per_task``) with which its
      advantages can be non-zero: 2 for a group baseline (a group of one is its own baseline,
      so its advantage is 0: GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline, DPO's pairs); a run
      with fewer is refused before it starts.
    """

    fn: Callable[..., AdvantageOutput]
    inputs: frozenset[str] = frozenset()
    options: tuple[str, ...] = ()
    supervised_loss: bool = False
    loss_agg_mode: str | None = None
    episode_scalar: bool = False
    min_group_size: int = 1

    def __post_init__(self) -> None:
        unknown = sorted(set(self.inputs) - set(OPTIONAL_INPUTS))
        if unknown:
            raise ValueError(f"unknown estimator inputs {unknown}; known: {list(OPTIONAL_INPUTS)}")
        object.__setattr__(self, "inputs", frozenset(self.inputs))

    @property
    def needs_critic(self) -> bool:
        """It reads critic ``values``."""
        return "values" in self.inputs

    @property
    def turn_level(self) -> bool:
        """It reads the per-turn arrays (:data:`TURN_INPUTS`)."""
        return bool(self.inputs & set(TURN_INPUTS))

    @property
    def needs_reference(self) -> bool:
        """It reads policy and reference log-probs (:data:`LOGPROB_INPUTS`)."""
        return bool(self.inputs & set(LOGPROB_INPUTS))

    def select(self, inputs: AdvantageInputs) -> AdvantageInputs:
        """``inputs`` with the optional arrays it does not read set to None (so a caller may
        pass all it has, and the compiled function does not depend on unread arrays)."""
        return dataclasses.replace(inputs, **{k: None for k in OPTIONAL_INPUTS
                                              if k not in self.inputs})

    def __call__(self, inputs: AdvantageInputs, settings: AdvantageSettings = AdvantageSettings(),
                 **options: Any) -> AdvantageOutput:
        return self.fn(self.select(inputs), settings, **options)


#: name -> :class:`AdvantageEstimator`
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator", normalize=snake_case, expected=AdvantageEstimator)


def register_advantage_estimator(name: str, *, inputs: tuple[str, ...] = (),
                                 options: tuple[str, ...] = (), jit: bool = True,
                                 overwrite: bool = False, supervised_loss: bool = False,
                                 loss_agg_mode: str | None = None, episode_scalar: bool = False,
                                 min_group_size: int = 1):
    """Decorator: register ``fn(inputs, settings, **options)`` under ``name`` as an
    :class:`AdvantageEstimator` (jitted with ``settings`` and ``options`` static unless
    ``jit=False``); returns the record. ``inputs``: the optional :class:`AdvantageInputs`
    fields it reads; ``episode_scalar`` and ``min_group_size``: see
    :class:`AdvantageEstimator`."""

    def deco(fn: Callable) -> AdvantageEstimator:
        f = jax.jit(fn, static_argnames=("settings",) + tuple(options)) if jit else fn
        record = AdvantageEstimator(f, frozenset(inputs), tuple(options),
                                    supervised_loss=supervised_loss, loss_agg_mode=loss_agg_mode,
                                    episode_scalar=episode_scalar,
                                    min_group_size=min_group_size)
        ADVANTAGE_ESTIMATORS.register(name, record, replace=overwrite)
        return record

    return deco


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The registered estimator called ``name`` (``-``/``_`` and case insensitive). Raises
    ``UnknownNameError`` (a ``ValueError``) listing the choices."""
    return ADVANTAGE_ESTIMATORS.get(name)


def is_turn_level(name: str) -> bool:
    """Whether estimator ``name`` takes the per-turn arrays (:data:`TURN_INPUTS`)."""
    return get_advantage_estimator(name).turn_level


def is_logprob_level(name: str) -> bool:
    """Whether estimator ``name`` takes policy / reference log-probs (:data:`LOGPROB_INPUTS`)."""
    return get_advantage_estimator(name).needs_reference


def min_group_size(name: str) -> int:
    """The fewest samples per group with which estimator ``name`` can give a non-zero
    advantage (:class:`AdvantageEstimator`)."""
    return get_advantage_estimator(name).min_group_size


def compute_advantages(name: str, *, rewards: Array, loss_mask: Array, **kwargs: Any
                       ) -> AdvantageOutput:
    """Single entry point: ``compute_advantages(cfg.advantage_estimator, rewards=..., ...)``.

    Args:
      name: ``gae | grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline | gigpo |
        dpo`` (aliases: ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``, ``drgrpo``)
        or any name added with :func:`register_advantage_estimator`.
      rewards, loss_mask: see :class:`AdvantageInputs`.
      kwargs: the optional arrays of :class:`AdvantageInputs` (those the estimator does not
        read are ignored, so a caller may always pass what its batch holds), the fields of
        :class:`AdvantageSettings`, and the estimator's own static options (``gigpo``:
        ``omega``, ``norm_std``; ``dpo``: ``beta``).

    Returns:
      ``AdvantageOutput(advantages [B, T], returns [B, T])`` (float32).
    """
    estimator = get_advantage_estimator(name)
    arrays = {k: kwargs.pop(k) for k in OPTIONAL_INPUTS if k in kwargs}
    settings = AdvantageSettings(**{k: kwargs.pop(k) for k in SETTINGS if k in kwargs})
    return estimator(AdvantageInputs(rewards, loss_mask, **arrays), settings, **kwargs)


# the estimators register themselves on import (the package imports both): GAE in gae.py, the
# outcome-based group estimators in outcome.py, GiGPO in gigpo.py, DPO in dpo.py
