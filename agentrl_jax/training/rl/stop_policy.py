"""When a run saves and when it stops: the checkpoint cadence, the time budget, SIGTERM and the
non-finite stop (``Trainer``'s collaborators, ``training/rl/trainer.py``).

:class:`StopPolicy` owns the clock of ``train.max_seconds`` (a budget over every session of a
run: a checkpoint carries the seconds trained so far), the reason the session stopped
(``stopped``: ``total_steps | time_budget | plateau | terminated``), SIGTERM (a request to stop at a
safe point: the rollout or evaluation in flight is cancelled, an update in progress finishes)
and the last step finished. :class:`Checkpoints` owns the checkpoints this session saved or
restored (``saved_step``) and the sentence that tells a user how to go on from them.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from agentrl_jax.training.outputs.progress import timed
from agentrl_jax.training.rl.failed_steps import RunFailure
from agentrl_jax.training.rl.nonfinite import nonfinite_message, nonfinite_values
from agentrl_jax.training.runtime import distributed

if TYPE_CHECKING:
    from agentrl_jax.learner.learner import Learner
    from agentrl_jax.training.config.sections import TrainConfig

#: why a session's training ended (``summary.json``'s ``sessions[].stopped``)
STOP_REASONS = ("total_steps", "time_budget", "plateau", "terminated")


class StopPolicy:
    """Whether a step saves, whether the loop stops, and why it stopped.

    ``clock``: seconds of a monotonic clock (a fake one in tests); ``say``: the terminal's
    line printer; ``multi_process``: the processes of one run agree on the time budget (and
    SIGTERM is not caught: they would have to agree on the step)."""

    def __init__(self, train: TrainConfig, say: Callable[[str], None],
                 multi_process: bool = False, clock: Callable[[], float] = time.monotonic):
        self.total_steps = int(train.total_steps)
        self.save_every = int(train.save_every)
        self.max_seconds = float(train.max_seconds)
        self.say = say
        self.multi_process = multi_process
        self.clock = clock
        self.stopped = "total_steps"  # why training ended: one of STOP_REASONS
        self.terminate_requested = False  # SIGTERM during the loop
        self.step_done = 0  # the last training step finished in this process
        # seconds of the training loop before this session (from the checkpoint it resumes)
        self.trained_seconds_before = 0.0
        self._loop_started: float | None = None  # clock() when this session's loop began
        self._in_flight: set[asyncio.Future] = set()  # what SIGTERM cancels

    # ------------------------------------------------------------------ the time budget
    def start_clock(self) -> None:
        """The training loop starts: ``train_seconds()`` counts from here."""
        self._loop_started = self.clock()

    def stop_clock(self) -> None:
        """The training loop ended: the final evaluation is not training."""
        self.trained_seconds_before, self._loop_started = self.train_seconds(), None

    def train_seconds(self) -> float:
        """Seconds of the training loop over every session of this run so far (the step-0
        evaluation and the set-up before the loop are not counted; evaluations inside it are):
        what ``train.max_seconds`` bounds. Checkpoints carry it, so a run killed and started
        again spends only what is left of its budget."""
        if self._loop_started is None:
            return self.trained_seconds_before
        return self.trained_seconds_before + self.clock() - self._loop_started

    def budget_spent_before(self, start_step: int, total: int) -> bool:
        """True (and ``stopped = "time_budget"``, with a line) when the sessions before this one
        spent ``train.max_seconds`` already and steps ``start_step .. total - 1`` are left:
        none of them runs."""
        spent = bool(self.max_seconds) and self.trained_seconds_before >= self.max_seconds
        if not (spent and start_step < total):
            return False
        self.say(f"time budget of {self.max_seconds:.0f} s already spent "
                 f"({self.trained_seconds_before:.0f} s of training up to step {start_step}); "
                 "no more training (a larger train.max_seconds trains on)")
        self.stopped = "time_budget"
        return True

    def out_of_time(self) -> bool:
        """``train_seconds() > train.max_seconds`` (0: no budget); several processes agree
        (any one out of time stops all)."""
        out = bool(self.max_seconds) and self.train_seconds() > self.max_seconds
        if self.multi_process:  # stop together
            out = distributed.agree_any(out)
        return out

    def save_due(self, step: int, out_of_time: bool, plateau: bool = False) -> bool:
        """Step ``step`` (1-based, just finished) is checkpointed: every ``train.save_every``
        steps, at ``train.total_steps`` and when the time budget or a plateau ends the loop."""
        return (step % self.save_every == 0 or step == self.total_steps or out_of_time
                or plateau)

    def stop_after(self, step: int, out_of_time: bool, plateau: str | None = None) -> bool:
        """Whether the loop ends after step ``step`` (1-based, checkpointed if due): SIGTERM
        asked for it, the time budget is spent (``stopped = "time_budget"``) or the held-out
        curve is flat (``plateau``: why, ``PlateauWatch.describe``; ``stopped = "plateau"``),
        each with a line."""
        if self.terminate_requested:
            return True
        if out_of_time:
            self.say(f"time budget of {self.max_seconds:.0f} s reached after step {step}; "
                     "stopping")
            self.stopped = "time_budget"
            return True
        if plateau:
            self.say(f"held-out curve flat after step {step}: {plateau}; stopping "
                     "(train.stop_on_plateau)")
            self.stopped = "plateau"
            return True
        return False

    # ------------------------------------------------------------------ SIGTERM
    def track(self, task: asyncio.Future) -> asyncio.Future:
        """``task`` (a rollout, an evaluation) is cancelled by SIGTERM while it runs."""
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return task

    async def cancellable(self, work: Awaitable[object]) -> bool:
        """Run ``work`` as a task that SIGTERM cancels; False when it did (True: it finished)."""
        task = self.track(asyncio.ensure_future(work))
        try:
            await task
        except asyncio.CancelledError:
            if not self.terminate_requested:
                raise
            return False
        return True

    def catch_sigterm(self, on: bool) -> None:
        """While the loop runs (one process), SIGTERM asks it to stop at a safe point;
        elsewhere SIGTERM keeps its default (the process ends)."""
        if self.multi_process:  # the processes would have to agree on the step: not handled
            return
        try:
            loop = asyncio.get_running_loop()
            if on:
                loop.add_signal_handler(signal.SIGTERM, self.on_sigterm)
            else:
                loop.remove_signal_handler(signal.SIGTERM)
        except (NotImplementedError, RuntimeError, ValueError):  # no signals here (a thread)
            pass

    def on_sigterm(self) -> None:
        """SIGTERM: stop at a safe point (the work in flight is cancelled)."""
        if self.terminate_requested:
            return
        self.terminate_requested = True
        self.say(f"SIGTERM: stopping at a safe point ({self.step_done} steps done; the "
                 "rollout or evaluation in flight is cancelled, an update in progress "
                 "finishes, then a checkpoint if the last step has none)")
        for task in list(self._in_flight):
            task.cancel()

    async def cancel_in_flight(self) -> None:
        """Cancel the work still in flight (an interrupted run) and wait for it, before the
        engine and the environment clients close under it."""
        for task in list(self._in_flight):
            await cancel(task)

    # ------------------------------------------------------------------ non-finite updates
    @staticmethod
    def check_update(step: int, metrics: Mapping[str, float], saved_step: int | None,
                     workdir: str) -> None:
        """Raise ``RunFailure`` when update ``step`` (1-based) went non-finite
        (``training/rl/nonfinite.py``): before its weights reach the backend or a checkpoint."""
        values = nonfinite_values(metrics)
        if values:
            raise RunFailure(nonfinite_message(step, values, saved_step, workdir))


async def cancel(task: asyncio.Future) -> None:
    """Cancel an in-flight rollout and wait until its episodes have closed their envs."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class Checkpoints:
    """The checkpoints of this session: ``saved_step`` (the last one saved or restored; None:
    none yet), whether this session wrote one (its writes finish in the background)."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.saved_step: int | None = None
        self.saved_this_session = False

    def restored(self, step: int) -> None:
        """The run resumed from the checkpoint of ``step`` (0: a new run)."""
        self.saved_step = step or None

    def save(self, learner: Learner, step: int, cursor: int, train_seconds: float,
             sampler: Mapping[str, Any] | None = None) -> None:
        """Checkpoint ``step`` with the task cursor, the task sampler's other entries
        (``sampler``: ``TaskSampler.state``, its ``cursor`` the same; only a cursor for the
        permutation) and the seconds trained (the write finishes in the background)."""
        extra = {k: v for k, v in (sampler or {}).items() if k not in ("step", "cursor")}
        with timed(self.say, f"saving checkpoint step {step}"):
            learner.save({"step": step, "cursor": cursor, **extra,
                          "train_seconds": round(train_seconds, 3)},
                         step=step, force=True)
        self.saved_step = step
        self.saved_this_session = True

    def resume_hint(self) -> str:
        """How the same command goes on: from the last checkpoint, or from the start."""
        return (f"the same command resumes from the checkpoint of step {self.saved_step}"
                if self.saved_step else "the same command starts it again")
