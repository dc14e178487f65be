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

from collections.abc import Callable
from typing import NamedTuple

import jax

from agentrl_common.registry import Registry, snake_case


Array = jax.Array

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageOutput",
    "compute_advantages",
    "get_advantage_estimator",
    "register_advantage_estimator",
    "TURN_INPUTS",
    "is_turn_level",
    "LOGPROB_INPUTS",
    "is_logprob_level",
]


class AdvantageOutput(NamedTuple):
    """``advantages [B, T]`` (what the policy loss uses) and ``returns [B, T]``
    (value targets for GAE, discounted returns for REINFORCE++, = advantages for
    the outcome-only estimators, as in verl)."""

    advantages: Array
    returns: Array


#: name -> jitted estimator ``fn(*, rewards, loss_mask, group_ids, values, token_rewards,
#: gamma, lam, eps, whiten, method, chunk) -> AdvantageOutput``
ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", normalize=snake_case)

_STATIC = ("gamma", "lam", "eps", "whiten", "method", "chunk")

#: per-turn inputs of the turn-level estimators (``gigpo``): ``turn_ids [B, T]``,
#: ``turn_rewards [B, K]``, ``turn_anchors [B, K]`` (see ``training/batching.py``)
TURN_INPUTS = ("turn_ids", "turn_rewards", "turn_anchors")

#: names (normalised) of the estimators that take :data:`TURN_INPUTS`
_TURN_LEVEL: set[str] = set()

#: log-prob inputs of the preference estimators (``dpo``): ``logprobs [B, T]`` (the current
#: policy's, before the update) and ``ref_logprobs [B, T]`` (the frozen reference's)
LOGPROB_INPUTS = ("logprobs", "ref_logprobs")

#: names (normalised) of the estimators that take :data:`LOGPROB_INPUTS`
_LOGPROB_LEVEL: set[str] = set()


def register_advantage_estimator(name: str, *, jit: bool = True, overwrite: bool = False,
                                 static: tuple[str, ...] = (), turn_level: bool = False,
                                 logprob_level: bool = False):
    """Decorator: register an estimator under ``name`` (jitted with the standard
    static options, plus ``static`` names of its own scalar options, unless
    ``jit=False``). The function must accept the keyword-only signature of
    :func:`compute_advantages` (unused options may be ignored). ``turn_level``: it
    also takes the per-turn arrays :data:`TURN_INPUTS` (callers pass them only to
    such estimators). ``logprob_level``: it takes :data:`LOGPROB_INPUTS` (the learner
    then computes reference log-probs and passes both)."""

    def deco(fn: Callable) -> Callable:
        f = jax.jit(fn, static_argnames=_STATIC + tuple(static)) if jit else fn
        ADVANTAGE_ESTIMATORS.register(name, f, replace=overwrite)
        if turn_level:
            _TURN_LEVEL.add(snake_case(name))
        if logprob_level:
            _LOGPROB_LEVEL.add(snake_case(name))
        return f

    return deco


def is_turn_level(name: str) -> bool:
    """Whether estimator ``name`` takes the per-turn arrays (:data:`TURN_INPUTS`)."""
    return snake_case(name) in _TURN_LEVEL


def is_logprob_level(name: str) -> bool:
    """Whether estimator ``name`` takes policy / reference log-probs (:data:`LOGPROB_INPUTS`)."""
    return snake_case(name) in _LOGPROB_LEVEL


def get_advantage_estimator(name: str) -> Callable[..., AdvantageOutput]:
    """The registered (jitted) estimator called ``name`` (``-``/``_`` and case
    insensitive). Raises ``UnknownNameError`` (a ``ValueError``) listing the choices."""
    return ADVANTAGE_ESTIMATORS.get(name)


def compute_advantages(
    name: str,
    *,
    rewards: Array,
    loss_mask: Array,
    group_ids: Array | None = None,
    values: Array | None = None,
    token_rewards: Array | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    eps: float = 1e-6,
    whiten: bool = True,
    method: str = "auto",
    chunk: int = 64,
    turn_ids: Array | None = None,
    turn_rewards: Array | None = None,
    turn_anchors: Array | None = None,
    logprobs: Array | None = None,
    ref_logprobs: Array | None = None,
    **options,
) -> AdvantageOutput:
    """Single entry point: ``compute_advantages(cfg.adv_estimator, rewards=..., ...)``.

    Args:
      name: ``gae | grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline |
        gigpo``
        (aliases: ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``,
        ``drgrpo``) or any name added with :func:`register_advantage_estimator`.
      rewards: ``[B]`` outcome scores.
      loss_mask: ``[B, T]`` 1 on generated tokens.
      group_ids: ``[B]`` int task ids (group estimators).
      values: ``[B, T]`` critic values (``gae``).
      token_rewards: ``[B, T]`` optional per-token rewards (added on generated tokens).
      gamma: discount per generated token (``gae``, ``reinforce_pp``); per turn
        (``gigpo``).
      lam: GAE lambda.
      eps: ``grpo`` std epsilon: ``(R - mean) / (std + eps)``.
      whiten: whiten advantages over the batch's masked tokens (``gae``,
        ``reinforce_pp``; always on for ``reinforce_pp_baseline`` as in verl).
      method: recurrence implementation for ``gae`` / ``reinforce_pp``:
        ``auto | blocked | associative | scan | pallas`` (see :data:`~agentrl_jax.algorithms.gae.GAE_METHODS`;
        ``auto`` = ``scan`` on CPU, ``blocked`` on GPU/TPU).
      chunk: chunk length of the blocked scan.
      turn_ids, turn_rewards, turn_anchors: per-turn inputs of the turn-level
        estimators (``gigpo``; :data:`TURN_INPUTS`); ignored by the others, so a
        caller may always pass what its batch holds.
      logprobs, ref_logprobs: ``[B, T]`` policy (before the update) and reference
        log-probs of the preference estimators (``dpo``); ignored by the others.
      options: the estimator's own static options (``gigpo``: ``omega``,
        ``norm_std``; ``dpo``: ``beta``).

    Returns:
      ``AdvantageOutput(advantages [B, T], returns [B, T])`` (float32).
    """
    fn = get_advantage_estimator(name)
    if is_turn_level(name):
        options.update(turn_ids=turn_ids, turn_rewards=turn_rewards, turn_anchors=turn_anchors)
    if is_logprob_level(name):
        options.update(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return fn(
        rewards=rewards,
        loss_mask=loss_mask,
        group_ids=group_ids,
        values=values,
        token_rewards=token_rewards,
        gamma=gamma,
        lam=lam,
        eps=eps,
        whiten=whiten,
        method=method,
        chunk=chunk,
        **options,
    )


# the estimators register themselves on import (the package imports both): GAE in gae.py, the
# outcome-based group estimators in outcome.py, GiGPO in gigpo.py, DPO in dpo.py
