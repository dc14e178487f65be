"""The update stage of a training step: ``TrainBatch`` -> the learner -> the rollout backend.

With episodes to train on: (``rollout.release_kv_during_update``, no overlapping rollout) the
backend frees its KV cache -> the batch's rows (``stages.training_rows``) -> ``Learner.update``
in a worker thread -> a non-finite update stops the run (``StopPolicy.check_update``) before
its weights go anywhere -> ``backend.sync_weights`` (version ``step + 1``) -> the KV cache is
allocated again. Without: a warning, and the learner's step counter still moves on (the
schedule too). Either way the weights are version ``step + 1`` afterwards: without that, every
later rollout would be stamped one version behind and dropped as stale.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Callable

from agentrl_jax import compile_notice
from agentrl_jax.learner.batch import UpdateOptions
from agentrl_jax.training.outputs.progress import timed
from agentrl_jax.training.rl.stages import BatchSettings, TrainBatch, training_rows
from agentrl_jax.training.rl.stop_policy import Checkpoints, StopPolicy
from agentrl_jax.training.runtime import hostmem
from agentrl_jax.training.runtime.policy import LearnerWeights

if TYPE_CHECKING:
    from agentrl_jax.learner.ahead import AheadCompile
    from agentrl_jax.learner.batch import RolloutBatch
    from agentrl_jax.learner.learner import Learner
    from agentrl_jax.rollout.contract import RolloutBackend

log = logging.getLogger(__name__)


@dataclasses.dataclass
class UpdateResult:
    """What the update of step ``step`` (0-based) did: ``updated`` (False: nothing to train
    on), ``weights_version`` (the version the backend's weights are now: ``step + 1``) and
    ``metrics`` (``rollout/kv_released_gib``, the learner's, ``perf/weight_sync_s``, in that
    order; empty without an update)."""

    step: int
    updated: bool
    weights_version: int
    metrics: dict[str, float]


class LearnerUpdate:
    """Trains the learner on a step's batch and syncs its weights to the backend. Owns whether
    this process compiled its train step yet (the first update is announced as a whole) and
    the background compile of accelerators (``learner/ahead.py``), waited for first."""

    def __init__(self, learner: Learner, backend: RolloutBackend | None,
                 say: Callable[..., None], *, settings: BatchSettings,
                 release_kv: bool = False, multi_process: bool = False, is_main: bool = True,
                 ahead: AheadCompile | None = None):
        self.learner, self.backend, self.say = learner, backend, say
        self.settings = settings
        self.overlap = settings.max_staleness >= 1  # a rollout runs during the update
        self.release_kv = release_kv and not self.overlap
        self.multi_process, self.is_main = multi_process, is_main
        self.ahead_compile = ahead
        self.compiled = False

    async def run(self, batch: TrainBatch, stop: StopPolicy, checkpoints: Checkpoints,
                  workdir: str) -> UpdateResult:
        """The update stage of ``batch`` (module docstring); a non-finite update raises
        ``RunFailure`` naming the last checkpoint of ``checkpoints``."""
        step, version = batch.step, batch.step + 1
        if not batch.trainable:
            log.warning("step %d: no trajectory to train on (%s, %d flat groups); no update",
                        step + 1, batch.stats.statuses, batch.flat_groups)
            self.learner.update_step += 1  # the step still counts, so the schedule moves on
            return UpdateResult(step, False, version, {})
        metrics: dict[str, float] = {}
        if self.release_kv:
            try:  # no rollout runs until the sync
                freed = await self.backend.release_kv_cache()
            except RuntimeError as e:  # a request still running (e.g. not yet aborted)
                log.warning("step %d: KV cache kept for the update: %s", step + 1, e)
                freed = 0
            metrics["rollout/kv_released_gib"] = freed / 2 ** 30
        rows = training_rows(batch, self.settings, self.multi_process)
        update = await self.update_learner(rows, self.multi_process)
        # before the weights reach the backend or a checkpoint
        stop.check_update(version, update, checkpoints.saved_step, workdir)
        metrics.update(update)
        t_sync = time.monotonic()
        await self.backend.sync_weights(self.weights(copy=self.overlap), version)
        metrics["perf/weight_sync_s"] = time.monotonic() - t_sync
        if "rollout/kv_released_gib" in metrics:  # before the next rollout
            await self.backend.resume_kv_cache()
        hostmem.release_freed_memory()  # the update's temporaries
        return UpdateResult(step, True, version, metrics)

    async def update_learner(self, rows: RolloutBatch,
                             process_local: bool) -> dict[str, float]:
        """``learner.update`` in a worker thread; the first one of this process compiles the
        train step (minutes for a large model on CPU), which is announced as a whole; a later
        compile (a new length bucket) is announced by ``compile_notice``."""
        options = UpdateOptions(log=False, process_local=process_local)
        call = lambda: self.learner.update(rows, options)  # noqa: E731
        if self.compiled:
            return await asyncio.to_thread(call)
        if self.ahead_compile is not None:  # its compiles first: none is done twice
            await asyncio.to_thread(self.ahead_compile.wait)
            self.ahead_compile = None
        # this phase's compiles are not announced one by one: the line below says them
        with timed(self.say, "first update (compiles the train step)"):
            update = await asyncio.to_thread(compile_notice.quietly, call)
        self.compiled = True
        return update

    def weights(self, copy: bool = False) -> LearnerWeights:
        """The learner's weights as ``backend.sync_weights`` takes them."""
        return LearnerWeights(self.learner, copy=copy, multi_process=self.multi_process,
                              is_main=self.is_main)
