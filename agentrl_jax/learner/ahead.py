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
sharding of the learner's own arrays; nothing runs, nothing is donated), all at once on a thread
pool (XLA compiles outside the GIL: the wall time is about the longest program's), and jit's
cache keeps the executables for the real calls. The learner may be a loaded ``Learner`` or the
``shapes.AbstractLearner`` its config describes before the weights load. The scored LM head's
capacity (``learner/scored.py``) is static too: the learner's current one, which the trainer
first raises to the most scored tokens one trajectory can hold (``ScoredCapacity.reserve``); the
pack plans keep each row within it where that costs no extra rows
(``layouts.PackedRows.pack_plan``), so only a batch that cannot compiles one larger bucket in
its update. The trainer runs it on a background thread on accelerators (:class:`AheadCompile`),
from the described learner before the model load, beside that load, the engine's warm-up and the
first rollout, then checks the loaded learner against the description
(:meth:`AheadCompile.for_loaded`). The smaller programs of an update (placement, advantages,
shuffling) still compile on first use.
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
from agentrl_jax.learner.shapes import abstract_of, same_tree
from agentrl_jax.learner.token_space import logprob_call_rows

#: float32 per-token keys of a packed policy micro-batch (``packed_step.py``), and its int32
#: keys (``option_counts`` only with per-turn option limits)
_FLOAT_KEYS = ("loss_mask", "loss_weights", "old_logprobs", "advantages")
_INT_KEYS = ("tokens", "segment_ids", "positions", "option_counts")


def first_update_keys(learner: Any, sampler_logprobs: bool = True,
                      option_counts: bool = False) -> tuple[str, ...] | None:
    """The micro-batch keys of ``learner``'s packed policy update (``layouts.PackedRows``),
    or ``None`` where the update is not packed (no ``pack_length``, a critic, a supervised loss
    without a reference: those build other programs). ``sampler_logprobs``: the batch carries
    the sampler's log-probs (RL rollouts do), which turns on truncated importance weights with
    ``learner.tis_cap``. ``option_counts``: the batch carries per-turn option limits
    (``agent.option_limits``; an int32 key)."""
    cfg = learner.config
    if not cfg.pack_length or cfg.use_critic:
        return None
    if is_supervised(cfg.policy_loss) and not cfg.use_reference:
        return None
    keys = {"tokens", "segment_ids", "positions", *_FLOAT_KEYS}
    if cfg.use_reference and not cfg.kl_in_reward:
        keys.add("ref_logprobs")
    if cfg.tis_cap and sampler_logprobs and not is_supervised(cfg.policy_loss):
        keys.add("is_weights")
    if option_counts:
        keys.add("option_counts")
    return tuple(sorted(keys))


def first_update_calls(learner: Any, sampler_logprobs: bool = True, option_counts: bool = False
                       ) -> list[tuple[str, Callable[..., Any], tuple]]:
    """``(name, jitted function, abstract arguments)`` of each large program of ``learner``'s
    first packed update: the policy log-prob pass, the reference's (where it has one of another
    dtype than the parameters'; else it is the same program), the
    gradient accumulation and the optimiser apply (where it is one program); empty where the
    update is not packed (:func:`first_update_keys`). ``option_counts``: as for
    :func:`first_update_keys` (the log-prob passes then take one more int32 array)."""
    keys = first_update_keys(learner, sampler_logprobs, option_counts)
    if keys is None:
        return []
    cfg, shapes = learner.config, learner.shapes
    rows = shapes.row_sharding()
    params = abstract_of(learner.params)

    def rows_of(n: int, dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((n, cfg.pack_length), dtype, sharding=rows)

    # the scored LM head's capacity as it stands (scored.py): the first update compiles
    # another only where a packed row holds more scored tokens than it
    capacity = learner.scored_capacity.current(cfg.pack_length)
    policy_dtype = str(jax.tree.leaves(learner.params)[0].dtype)
    calls: list[tuple[str, Callable[..., Any], tuple]] = []
    # the log-prob pass's call shapes: full calls and the tail's (token_space.py)
    row_counts = sorted(set(logprob_call_rows(shapes.logprob_batch_size, cfg.micro_batch_size)),
                        reverse=True)
    for n_lp in row_counts:
        tail = " (tail calls)" if n_lp != row_counts[0] else ""
        lp_args = (rows_of(n_lp, np.int32), rows_of(n_lp, np.int32), rows_of(n_lp, np.int32))
        if capacity is not None:
            lp_args += (rows_of(n_lp, np.float32),)  # the loss mask
        if option_counts:
            lp_args += (rows_of(n_lp, np.int32),)
        policy = (shapes.packed_logprob_fn(policy_dtype, capacity, option_counts),
                  (params, *lp_args))
        calls.append((f"log-prob pass{tail}", *policy))
        if learner.ref_params is not None:
            reference = (shapes.packed_logprob_fn(cfg.reference_dtype, capacity, option_counts),
                         (abstract_of(learner.ref_params), *lp_args))
            # the policy's own program where the reference has the parameters' dtype: compiled
            # twice side by side it would take a second thread for nothing
            if not _same_call(reference, policy):
                calls.append((f"reference log-prob pass{tail}", *reference))
    mb = cfg.micro_batch_size
    micro = {k: rows_of(mb, np.int32 if k in _INT_KEYS else np.float32) for k in keys}
    steps = shapes.packed_steps(keys, capacity)
    grad_sum = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, np.float32, sharding=x.sharding), params)
    # the metric names (traced: the arguments are abstract, and a cast of real parameters
    # would allocate a copy of them)
    names = jax.eval_shape(lambda p, m: {k: jnp.zeros(()) for k in
                                         steps.metric_shapes(p, m)}, params, micro)
    metric_sum = abstract_of(steps.metric_zeros(names))
    calls.append(("gradient accumulation", steps.accumulate,
                  (params, grad_sum, metric_sum, micro, np.float32(1.0))))
    if hasattr(steps.apply, "lower"):  # offloaded optimiser state: a host loop, not one program
        calls.append(("optimiser apply", steps.apply,
                      (params, abstract_of(learner.opt_state), grad_sum)))
    return calls


def _same_call(a: tuple[Callable[..., Any], tuple], b: tuple[Callable[..., Any], tuple]) -> bool:
    """Whether two ``(jitted function, abstract arguments)`` are one program: the same function
    object and equal argument trees (shapes, dtypes, shardings)."""
    return a[0] is b[0] and same_tree(a[1], b[1])


def compile_first_update(learner: Any, sampler_logprobs: bool = True,
                         workers: int | None = None, option_counts: bool = False
                         ) -> dict[str, float]:
    """Compile the programs of :func:`first_update_calls` without running them, all at once on
    ``workers`` threads (default: one per program, ``compile_notice.compile_ahead_timed``);
    returns ``{name: seconds its lower + compile took}`` (empty where the update is not
    packed). A program whose compile fails raises here, after the others finished."""
    calls = first_update_calls(learner, sampler_logprobs, option_counts)
    seconds = compile_notice.compile_ahead_timed([(fn, args) for _, fn, args in calls], workers)
    return {name: s for (name, _, _), s in zip(calls, seconds)}


class AheadCompile:
    """:func:`compile_first_update` on a background thread; :meth:`wait` before the first
    update (a failure there is logged by ``say`` and left to the update, which compiles as
    before). ``learner``: a ``Learner``, or the ``shapes.AbstractLearner`` of one not loaded
    yet (then :meth:`for_loaded` checks the loaded one against it). ``beside``: what the
    compile runs beside, for the message. ``programs``: how many were compiled; ``seconds``:
    the wall time of them all (they compile side by side); ``timings``: ``{program: seconds}``
    of each. ``option_counts``: the updates' batches carry per-turn option limits
    (``agent.option_limits``): their programs take one more int32 array."""

    def __init__(self, learner: Any, say: Callable[[str], None] | None = None,
                 workers: int | None = None, option_counts: bool = False,
                 beside: str = "the engine's start-up and the first rollout"):
        self.say, self.beside, self.described = say, beside, learner
        self.option_counts = option_counts
        self.programs = 0
        self.seconds = 0.0
        self.timings: dict[str, float] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(learner, workers),
                                        name="learner-compile-ahead", daemon=True)
        self._thread.start()

    def _run(self, learner: Any, workers: int | None) -> None:
        t0 = time.monotonic()
        try:
            self.timings = compile_first_update(learner, workers=workers,
                                                option_counts=self.option_counts)
            self.programs = len(self.timings)
        except Exception as e:  # noqa: BLE001 - the first update compiles what is missing
            self.error = e
        self.seconds = time.monotonic() - t0

    def for_loaded(self, learner: Any) -> "AheadCompile":
        """This compile, where it was started from an ``AbstractLearner`` that ``learner``
        (the loaded ``Learner``) matches or from ``learner`` itself; else (the description
        was wrong: those programs are not the learner's) a new one from ``learner``, said
        with the parts that differ. The first one is not waited for."""
        if self.described is learner:
            return self
        different = self.described.differences(learner)
        if not different:
            return self
        if self.say is not None:
            self.say("the train step compiled ahead of the model load is not the loaded "
                     f"learner's ({', '.join(different)} differ); compiling it again")
        return AheadCompile(learner, self.say, option_counts=self.option_counts)

    def wait(self) -> None:
        """Until the compiles are done; says how long they took, or why they failed."""
        self._thread.join()
        self.described = None  # the description is not needed any more
        if self.say is None:
            return
        if self.error is not None:
            self.say(f"compiling the train step ahead of time failed ({self.error!r}); "
                     "the first update compiles it")
        elif self.programs:
            each = ", ".join(f"{name} {compile_notice.format_seconds(s)}"
                             for name, s in sorted(self.timings.items(), key=lambda kv: -kv[1]))
            self.say(f"train step compiled ahead of time: {self.programs} programs in "
                     f"{compile_notice.format_seconds(self.seconds)} wall, side by side "
                     f"({each}; beside {self.beside})")


__all__ = ["AheadCompile", "compile_first_update", "first_update_calls", "first_update_keys"]
