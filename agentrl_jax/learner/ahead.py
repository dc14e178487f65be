"""Compile the learner's first update ahead of time, while the run does other things.

A run's first update compiles the packed update's large programs (docs/PERFORMANCE.md, "Engine
start-up", says how long), and until now it did so only when the first batch arrived,
after the engine's start-up, the step-0 evaluation and the first rollout. With packed rows
(``learner.pack_length``) their shapes do not depend on the batch:

    packed log-prob pass   (params, tokens, segment_ids, positions [logprob_batch_size, P]
                            and, with the scored LM head, loss_mask; and the same at
                            [micro_batch_size, P], its tail calls: token_space.py)
    gradient accumulation  (params, grad_sum, metric_sum, micro [micro_batch_size, P], share)
    optimiser apply        (params, opt_state, grad_sum)

so :func:`compile_first_update` lowers and compiles them from abstract values (shape, dtype and
sharding of the learner's own arrays; nothing runs, nothing is donated) and jit's cache keeps
the executables for the real calls. The scored LM head's capacity (``learner/scored.py``) is
static too: the learner's current one, which the trainer first raises to the most scored tokens
one trajectory can hold (``ScoredCapacity.reserve``); the pack plans keep each row within it
where that costs no extra rows (``layouts.PackedRows.pack_plan``), so only a batch that cannot
compiles one larger bucket in its update. The trainer runs it on a background thread on
accelerators (:class:`AheadCompile`), beside the engine's warm-up and the first rollout. The
smaller programs
of an update (placement, advantages, shuffling) still compile on first use.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import compile_notice
from agentrl_jax.algorithms import is_supervised
from agentrl_jax.learner.token_space import logprob_call_rows

#: float32 per-token keys of a packed policy micro-batch (``packed_step.py``), and its int32
#: keys (``option_counts`` only with per-turn option limits)
_FLOAT_KEYS = ("loss_mask", "loss_weights", "old_logprobs", "advantages")
_INT_KEYS = ("tokens", "segment_ids", "positions", "option_counts")


def _abstract(tree: Any) -> Any:
    """``tree``'s arrays as ``jax.ShapeDtypeStruct`` (shape, dtype, sharding)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def first_update_keys(learner: Any, sampler_logprobs: bool = True,
                      option_counts: bool = False) -> tuple[str, ...] | None:
    """The micro-batch keys of ``learner``'s packed policy update (``layouts.PackedRows``),
    or ``None`` where the update is not packed (no ``pack_length``, a critic, a supervised loss
    without a reference: those build other programs). ``sampler_logprobs``: the batch carries
    the sampler's log-probs (RL rollouts do), which turns on truncated importance weights with
    ``learner.tis_cap``. ``option_counts``: the batch carries per-turn option limits
    (``agent.option_limits``; an int32 key)."""
    cfg = learner.config
    if not cfg.pack_length or learner.critic_params is not None:
        return None
    if is_supervised(cfg.policy_loss) and learner.ref_params is None:
        return None
    keys = {"tokens", "segment_ids", "positions", *_FLOAT_KEYS}
    if learner.ref_params is not None and not cfg.kl_in_reward:
        keys.add("ref_logprobs")
    if cfg.tis_cap and sampler_logprobs and not is_supervised(cfg.policy_loss):
        keys.add("is_weights")
    if option_counts:
        keys.add("option_counts")
    return tuple(sorted(keys))


def compile_first_update(learner: Any, sampler_logprobs: bool = True,
                         workers: int | None = None, option_counts: bool = False) -> int:
    """Compile the first packed update's log-prob pass(es), gradient accumulation and
    optimiser apply for ``learner`` without running them; returns how many programs were
    compiled (0 where the update is not packed: :func:`first_update_keys`)."""
    keys = first_update_keys(learner, sampler_logprobs, option_counts)
    if keys is None:
        return 0
    cfg = learner.config
    rows = learner.row_sharding()
    params = _abstract(learner.params)

    def rows_of(n: int, dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((n, cfg.pack_length), dtype, sharding=rows)

    # the scored LM head's capacity as it stands (scored.py): the first update compiles
    # another only where a packed row holds more scored tokens than it
    capacity = learner.scored_capacity.current(cfg.pack_length)
    calls: list[tuple[Callable[..., Any], tuple]] = []
    # the log-prob pass's call shapes: full calls and the tail's (token_space.py)
    for n_lp in sorted(set(logprob_call_rows(learner.logprob_batch_size,
                                             cfg.micro_batch_size))):
        lp_args = (rows_of(n_lp, np.int32), rows_of(n_lp, np.int32), rows_of(n_lp, np.int32))
        if capacity is not None:
            lp_args += (rows_of(n_lp, np.float32),)  # the loss mask
        if option_counts:
            lp_args += (rows_of(n_lp, np.int32),)
        calls.append((learner.packed_logprob_fn(str(jax.tree.leaves(learner.params)[0].dtype),
                                                capacity, option_counts), (params, *lp_args)))
        if learner.ref_params is not None:
            calls.append((learner.packed_logprob_fn(cfg.reference_dtype, capacity,
                                                    option_counts),
                          (_abstract(learner.ref_params), *lp_args)))
    mb = cfg.micro_batch_size
    micro = {k: rows_of(mb, np.int32 if k in _INT_KEYS else np.float32) for k in keys}
    steps = learner.packed_steps(keys, capacity)
    grad_sum = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, np.float32, sharding=x.sharding), params)
    # the metric names (traced: the arguments are abstract, and a cast of real parameters
    # would allocate a copy of them)
    names = jax.eval_shape(lambda p, m: {k: jnp.zeros(()) for k in
                                         steps.metric_shapes(p, m)}, params, micro)
    metric_sum = _abstract(steps.metric_zeros(names))
    calls.append((steps.accumulate, (params, grad_sum, metric_sum, micro, np.float32(1.0))))
    if hasattr(steps.apply, "lower"):  # offloaded optimiser state: a host loop, not one program
        calls.append((steps.apply, (params, _abstract(learner.opt_state), grad_sum)))
    return compile_notice.compile_ahead(calls, workers)


class AheadCompile:
    """:func:`compile_first_update` on a background thread; :meth:`wait` before the first
    update (a failure there is logged by ``say`` and left to the update, which compiles as
    before)."""

    def __init__(self, learner: Any, say: Callable[[str], None] | None = None,
                 option_counts: bool = False):
        """``option_counts``: the updates' batches carry per-turn option limits
        (``agent.option_limits``): their programs take one more int32 array."""
        self.say = say
        self.option_counts = option_counts
        self.programs = 0
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(learner,),
                                        name="learner-compile-ahead", daemon=True)
        self._thread.start()

    def _run(self, learner: Any) -> None:
        t0 = time.monotonic()
        try:
            self.programs = compile_first_update(learner, option_counts=self.option_counts)
        except Exception as e:  # noqa: BLE001 - the first update compiles what is missing
            self.error = e
        self.seconds = time.monotonic() - t0

    def wait(self) -> None:
        """Until the compiles are done; says how long they took, or why they failed."""
        self._thread.join()
        if self.say is None:
            return
        if self.error is not None:
            self.say(f"compiling the train step ahead of time failed ({self.error!r}); "
                     "the first update compiles it")
        elif self.programs:
            self.say(f"train step compiled ahead of time: {self.programs} programs in "
                     f"{compile_notice.format_seconds(self.seconds)} (beside the engine's "
                     "start-up and the first rollout)")


__all__ = ["AheadCompile", "compile_first_update", "first_update_keys"]
