"""Policy / value / entropy losses and token log-prob helpers (pure, jit-able).

Shapes: ``[B, T]`` per-token arrays (``B`` trajectories, ``T`` tokens), logits
``[B, T, V]``. ``loss_mask [B, T]`` is 1 on generated tokens. Each loss returns
``(scalar_loss, metrics)`` where ``metrics`` is a flat ``dict[str, scalar Array]``.

Policy loss (PPO clipped surrogate, verl ``compute_policy_loss_vanilla`` semantics)::

    log_ratio = clip(logp - logp_old, -20, 20);  ratio = exp(log_ratio)
    l1 = -A * ratio
    l2 = -A * clip(ratio, 1 - clip_low, 1 + clip_high)        # clip-higher: clip_high > clip_low
    l  = max(l1, l2)
    dual clip (c > 1, only where A < 0):  l = min(l, -A * c)   # bounds the loss of very large ratios
    loss = aggregate(l, loss_mask, agg)

``POLICY_LOSSES`` holds :class:`PolicyLoss` records (the function, its default options, whether
it is supervised): ``ppo`` (symmetric clip 0.2, no dual clip), ``ppo_dual_clip``
(+ ``dual_clip=3``; this is what verl's ``vanilla`` always does), ``clip_higher``
(``clip_low=0.2, clip_high=0.28``, DAPO). All three are the same function
:func:`ppo_policy_loss` with different defaults; :meth:`PolicyLoss.options` overrides only the
options a caller sets (the learner's ``clip_ratio_low`` / ``clip_ratio_high`` / ``dual_clip``
when not None). ``sft``: the supervised loss of behaviour cloning, ``-A * logp``
(:func:`sft_policy_loss`).

Aggregation modes: :mod:`agentrl_jax.algorithms.aggregation`.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from agentrl_common.registry import Registry, snake_case

from .aggregation import aggregate_loss
from .kl import kl_estimate
from .masked import as_mask, masked_mean

Array = jax.Array
Metrics = dict[str, Array]

# ----------------------------------------------------------------- policy loss

@dataclasses.dataclass(frozen=True, eq=False)
class PolicyLoss:
    """A registered policy loss.

    fn: ``fn(logprobs [B,T], old_logprobs [B,T], advantages [B,T], loss_mask [B,T], *, agg,
      max_len, denom, token_weights, is_weights, **options) -> (loss, metrics)``.
    defaults: the entry's own options (``ppo``: ``clip_low``, ``clip_high``, ``dual_clip``);
      the entry *is* these numbers: ``ppo`` and ``ppo_dual_clip`` differ only here.
    supervised: no importance ratio (no old log-probs needed): the learner skips the "old"
      log-prob pass.

    Calling the record calls ``fn`` with ``defaults`` under the keywords given.
    """

    fn: Callable[..., tuple[Array, Metrics]]
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    supervised: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", types.MappingProxyType(dict(self.defaults)))

    def options(self, **overrides: Any) -> dict[str, Any]:
        """The entry's defaults, each replaced by ``overrides[key]`` where that is not None;
        overrides of options the entry does not have (a clip bound for ``sft``) are ignored."""
        return {k: (v if overrides.get(k) is None else overrides[k])
                for k, v in self.defaults.items()}

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Array, Metrics]:
        return self.fn(*args, **{**self.defaults, **kwargs})


#: name -> :class:`PolicyLoss`
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", normalize=snake_case,
                                               expected=PolicyLoss)


def _masked_max(x: Array, m: Array) -> Array:
    return jnp.where(jnp.any(m > 0), jnp.max(jnp.where(m > 0, x, -jnp.inf)), 0.0)


def _masked_min(x: Array, m: Array) -> Array:
    return jnp.where(jnp.any(m > 0), jnp.min(jnp.where(m > 0, x, jnp.inf)), 0.0)


def ppo_policy_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    loss_mask: Array,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token_mean",
    max_len: int | None = None,
    denom: Array | float | None = None,
    log_ratio_clamp: float = 20.0,
    token_weights: Array | None = None,
    is_weights: Array | None = None,
) -> tuple[Array, Metrics]:
    """PPO clipped surrogate with asymmetric bounds and optional dual clip.

    Args:
      logprobs: ``[B, T]`` log-probs of the sampled tokens under the current policy
        (the only input gradients flow through).
      old_logprobs: ``[B, T]`` behaviour log-probs (rollout log-probs or recomputed
        by the learner before the update: the caller decides).
      advantages: ``[B, T]``.
      loss_mask: ``[B, T]``.
      clip_low / clip_high: ratio clipped to ``[1 - clip_low, 1 + clip_high]``;
        ``clip_high=None`` means ``clip_low`` (symmetric, vanilla PPO).
      dual_clip: ``c > 1`` enables dual clip: for ``A < 0`` the loss is capped at
        ``-A * c`` (Ye et al. 2019); ``None`` disables.
      agg, max_len, denom: see :func:`aggregate_loss`.
      log_ratio_clamp: ``logp - logp_old`` is clamped to ``[-x, x]`` before ``exp``.
      token_weights: ``[B, T]`` aggregation weights (:func:`aggregation_weights`); replaces
        ``agg`` / ``max_len`` / ``denom``.
      is_weights: ``[B, T]`` importance weights multiplying each token's loss (truncated
        importance sampling of the behaviour / learner mismatch: ``min(pi_old / mu, C)``).

    Returns:
      ``(loss, metrics)`` with metrics ``pg_loss``, ``pg_clipfrac`` (any clip active),
      ``pg_clipfrac_high`` (A>0, ratio > 1+clip_high), ``pg_clipfrac_low``
      (A<0, ratio < 1-clip_low), ``pg_clipfrac_dual`` (dual clip active),
      ``ppo_kl`` (= masked mean of ``logp_old - logp``, the k1 approx KL),
      ``ppo_kl_k3``, ``ratio_mean``, ``ratio_max``, ``ratio_min``.
    """
    if clip_high is None:
        clip_high = clip_low
    m = as_mask(loss_mask)
    A = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
    old = jax.lax.stop_gradient(jnp.asarray(old_logprobs, jnp.float32))
    log_ratio = jnp.clip(jnp.asarray(logprobs, jnp.float32) - old, -log_ratio_clamp, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    l1 = -A * ratio
    l2 = -A * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = l2 > l1
    loss_mat = jnp.maximum(l1, l2)
    if dual_clip is not None:
        if not dual_clip > 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        l3 = -A * dual_clip
        dual_active = (loss_mat > l3) & (A < 0)
        loss_mat = jnp.where(A < 0, jnp.minimum(loss_mat, l3), loss_mat)
    else:
        dual_active = jnp.zeros_like(clipped)
    if is_weights is not None:
        loss_mat = loss_mat * jax.lax.stop_gradient(jnp.asarray(is_weights, jnp.float32))
    loss = aggregate_loss(loss_mat, m, agg, max_len=max_len, denom=denom,
                          token_weights=token_weights)
    sg = jax.lax.stop_gradient
    metrics = {
        "pg_loss": sg(loss),
        "pg_clipfrac": masked_mean(clipped.astype(jnp.float32), m),
        "pg_clipfrac_high": masked_mean((clipped & (A > 0)).astype(jnp.float32), m),
        "pg_clipfrac_low": masked_mean((clipped & (A < 0)).astype(jnp.float32), m),
        "pg_clipfrac_dual": masked_mean(dual_active.astype(jnp.float32), m),
        "ppo_kl": sg(masked_mean(-log_ratio, m)),
        "ppo_kl_k3": sg(masked_mean(jnp.exp(-log_ratio) - 1.0 + log_ratio, m)),
        "ratio_mean": sg(masked_mean(ratio, m)),
        "ratio_max": sg(_masked_max(ratio, m)),
        "ratio_min": sg(_masked_min(ratio, m)),
    }
    return loss, metrics


def sft_policy_loss(
    logprobs: Array,
    old_logprobs: Array | None,
    advantages: Array,
    loss_mask: Array,
    *,
    agg: str = "token_mean",
    max_len: int | None = None,
    denom: Array | float | None = None,
    token_weights: Array | None = None,
    is_weights: Array | None = None,
) -> tuple[Array, Metrics]:
    """Supervised (behaviour-cloning) loss: the weighted negative log-likelihood of the masked
    tokens, ``l = -A * logp`` aggregated like the policy losses.

    With ``advantages = loss_mask`` (what ``training/jobs/sft.py`` passes) this is the NLL of the
    assistant tokens only (prompt and observation tokens have mask 0), per token for
    ``token_mean``. ``old_logprobs`` and ``is_weights`` are not used (no ratio).
    Metrics: ``pg_loss`` (the loss) and ``nll`` (the unweighted aggregated NLL).
    """
    del old_logprobs, is_weights
    m = as_mask(loss_mask)
    lp = jnp.asarray(logprobs, jnp.float32)
    A = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
    loss = aggregate_loss(-A * lp, m, agg, max_len=max_len, denom=denom,
                          token_weights=token_weights)
    nll = aggregate_loss(-lp, m, agg, max_len=max_len, denom=denom, token_weights=token_weights)
    return loss, {"pg_loss": jax.lax.stop_gradient(loss), "nll": jax.lax.stop_gradient(nll)}


# (``clip_high`` None: symmetric, ``1 + clip_low``)
POLICY_LOSSES.register("ppo", PolicyLoss(
    ppo_policy_loss, {"clip_low": 0.2, "clip_high": None, "dual_clip": None}))
POLICY_LOSSES.register("ppo_dual_clip", PolicyLoss(
    ppo_policy_loss, {"clip_low": 0.2, "clip_high": None, "dual_clip": 3.0}))
POLICY_LOSSES.register("clip_higher", PolicyLoss(
    ppo_policy_loss, {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": None}))
POLICY_LOSSES.register("sft", PolicyLoss(sft_policy_loss, supervised=True))


def is_supervised(name: str) -> bool:
    """Whether policy loss ``name`` is supervised (its entry's ``supervised``)."""
    return POLICY_LOSSES.get(name).supervised


def get_policy_loss(name: str) -> PolicyLoss:
    """``ppo | ppo_dual_clip | clip_higher | sft`` (or any registered name)."""
    return POLICY_LOSSES.get(name)


# ----------------------------------------------------------------- value loss


def value_loss(
    values_pred: Array,
    old_values: Array,
    returns: Array,
    loss_mask: Array,
    *,
    clip_range: float | None = 0.2,
    agg: str = "token_mean",
    max_len: int | None = None,
    denom: Array | float | None = None,
) -> tuple[Array, Metrics]:
    """Clipped critic loss (verl ``compute_value_loss``)::

        v_clip = clip(v, v_old - eps_v, v_old + eps_v)
        loss   = 0.5 * aggregate(max((v - R)^2, (v_clip - R)^2))

    ``clip_range=None`` gives the plain ``0.5 * (v - R)^2``. Metrics: ``vf_loss``,
    ``vf_clipfrac`` (clipped branch strictly larger), ``vpred_mean``.
    """
    m = as_mask(loss_mask)
    v = jnp.asarray(values_pred, jnp.float32)
    R = jax.lax.stop_gradient(jnp.asarray(returns, jnp.float32))
    l1 = jnp.square(v - R)
    if clip_range is None:
        lm = l1
        clipped = jnp.zeros_like(l1, bool)
    else:
        old = jax.lax.stop_gradient(jnp.asarray(old_values, jnp.float32))
        v_clip = jnp.clip(v, old - clip_range, old + clip_range)
        l2 = jnp.square(v_clip - R)
        lm = jnp.maximum(l1, l2)
        clipped = l2 > l1
    loss = 0.5 * aggregate_loss(lm, m, agg, max_len=max_len, denom=denom)
    metrics = {
        "vf_loss": jax.lax.stop_gradient(loss),
        "vf_clipfrac": masked_mean(clipped.astype(jnp.float32), m),
        "vpred_mean": jax.lax.stop_gradient(masked_mean(v, m)),
    }
    return loss, metrics


# ----------------------------------------------------------------- logits helpers


def _scaled(logits: Array, temperature: float) -> Array:
    z = jnp.asarray(logits).astype(jnp.float32)
    return z if temperature == 1.0 else z / temperature


def log_probs_from_logits(logits: Array, targets: Array, *, temperature: float = 1.0) -> Array:
    """``log softmax(logits / temperature)[target]`` -> ``[B, T]``.

    Computed as ``z[target] - logsumexp(z)`` (stable; XLA fuses the reduction, no
    ``[B, T, V]`` log-softmax output is materialised in the forward pass).
    ``targets[b, t]`` is the token whose probability is read at position ``t``
    (usually ``tokens[b, t + 1]``: shift before calling).
    """
    z = _scaled(logits, temperature)
    picked = jnp.take_along_axis(z, jnp.asarray(targets)[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(z, axis=-1)


def entropy_from_logits(logits: Array, *, temperature: float = 1.0) -> Array:
    """Categorical entropy ``H = logsumexp(z) - sum softmax(z) * z`` -> ``[B, T]``
    (stable for large logits; ``-inf`` logits allowed; float32 internally)."""
    z = _scaled(logits, temperature)
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jnp.exp(z - lse[..., None])
    return lse - jnp.sum(p * _finite(z), axis=-1)


def _finite(z: Array) -> Array:
    """``-inf`` logits (masked vocabulary entries) have ``p = 0``: use 0 instead of
    ``0 * -inf = nan`` (also keeps the gradient finite)."""
    return jnp.where(jnp.isneginf(z), 0.0, z)


def log_probs_and_entropy(
    logits: Array,
    targets: Array,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Array, Array]:
    """Token log-probs and entropies ``([B, T], [B, T])`` from one logsumexp.

    With ``chunk_size`` the time axis is processed in chunks of that many tokens
    under ``lax.map`` + ``jax.checkpoint``: the float32 upcast and the softmax of only
    one ``[B, chunk, V]`` slice are live at a time, in the forward and in the
    backward pass (the gradient w.r.t. ``logits`` is still ``[B, T, V]``).
    """

    def body(z_chunk, tgt_chunk):
        z = _scaled(z_chunk, temperature)
        lse = jax.nn.logsumexp(z, axis=-1)
        picked = jnp.take_along_axis(z, tgt_chunk[..., None].astype(jnp.int32), axis=-1)[..., 0]
        p = jnp.exp(z - lse[..., None])
        return picked - lse, lse - jnp.sum(p * _finite(z), axis=-1)

    targets = jnp.asarray(targets)
    T = logits.shape[1]
    if chunk_size is None or chunk_size >= T:
        return body(logits, targets)
    return _chunked_over_time(jax.checkpoint(body), logits, targets, chunk_size)


def entropy_from_logits_chunked(logits: Array, chunk_size: int = 512, *, temperature: float = 1.0) -> Array:
    """:func:`entropy_from_logits` processed ``chunk_size`` tokens at a time (see
    :func:`log_probs_and_entropy` for the memory behaviour) -> ``[B, T]``."""
    T = logits.shape[1]
    if chunk_size >= T:
        return entropy_from_logits(logits, temperature=temperature)
    dummy = jnp.zeros(logits.shape[:2], jnp.int32)
    fn = jax.checkpoint(lambda z, _t: (entropy_from_logits(z, temperature=temperature),))
    return _chunked_over_time(fn, logits, dummy, chunk_size)[0]


def _chunked_over_time(fn, logits: Array, targets: Array, chunk: int):
    """Apply ``fn(logits[:, s:s+chunk], targets[:, s:s+chunk]) -> tuple of [B, chunk]``
    over time chunks with ``lax.map`` (dynamic slices of the closed-over arrays, no
    transposed copy of ``logits``); pads ``T`` up to a multiple of ``chunk``."""
    B, T = logits.shape[:2]
    n = -(-T // chunk)
    pad = n * chunk - T
    if pad:
        logits = jnp.pad(logits, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))

    def one(i):
        s = i * chunk
        z = jax.lax.dynamic_slice_in_dim(logits, s, chunk, axis=1)
        t = jax.lax.dynamic_slice_in_dim(targets, s, chunk, axis=1)
        return fn(z, t)

    outs = jax.lax.map(one, jnp.arange(n))
    res = tuple(jnp.moveaxis(o, 0, 1).reshape(B, n * chunk)[:, :T] for o in outs)
    return res


# ----------------------------------------------------------------- composite actor loss


def actor_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    loss_mask: Array,
    *,
    policy_loss: str,
    ref_logprobs: Array | None = None,
    kl_coef: float,
    kl_estimator: str,
    entropy: Array | None = None,
    entropy_coef: float,
    agg: str,
    max_len: int | None = None,
    denom: Array | float | None = None,
    token_weights: Array | None = None,
    **policy_kwargs,
) -> tuple[Array, Metrics]:
    """``total = pg_loss + kl_coef * kl_loss - entropy_coef * aggregate(entropy)``.

    ``policy_loss`` names an entry of :data:`POLICY_LOSSES`; ``policy_kwargs``
    override its defaults (``clip_low``, ``clip_high``, ``dual_clip``, ...). The loss settings
    (``policy_loss``, ``kl_coef``, ``kl_estimator``, ``entropy_coef``, ``agg``) have no
    default here: the learner section (``learner/config.py``) holds them.
    ``ref_logprobs`` (needed when ``kl_coef != 0``) and ``entropy [B, T]`` (e.g. from
    :func:`log_probs_and_entropy`) are optional. AgentGym-RL uses ``ppo``, clip 0.2,
    ``kl_coef=1e-3`` with ``low_var_kl`` and ``entropy_coef=1e-3``.
    ``token_weights [B, T]`` (:func:`aggregation_weights`) replace ``agg`` / ``max_len`` /
    ``denom`` in every term.
    Metrics: the policy loss's metrics plus ``kl_loss``, ``entropy``, ``total_loss``.
    """
    m = as_mask(loss_mask)
    pg, metrics = get_policy_loss(policy_loss)(
        logprobs, old_logprobs, advantages, m, agg=agg, max_len=max_len, denom=denom,
        token_weights=token_weights, **policy_kwargs
    )
    total = pg
    if ref_logprobs is not None:
        kl_mat = kl_estimate(logprobs, jax.lax.stop_gradient(ref_logprobs), kl_estimator)
        kl = aggregate_loss(kl_mat, m, agg, max_len=max_len, denom=denom,
                            token_weights=token_weights)
        metrics["kl_loss"] = jax.lax.stop_gradient(kl)
        if kl_coef:
            total = total + kl_coef * kl
    elif kl_coef:
        raise ValueError("kl_coef != 0 needs ref_logprobs")
    if entropy is not None:
        ent = aggregate_loss(entropy, m, agg, max_len=max_len, denom=denom,
                             token_weights=token_weights)
        metrics["entropy"] = jax.lax.stop_gradient(ent)
        if entropy_coef:
            total = total - entropy_coef * ent
    elif entropy_coef:
        raise ValueError("entropy_coef != 0 needs entropy [B, T]")
    metrics["total_loss"] = jax.lax.stop_gradient(total)
    return total, metrics
