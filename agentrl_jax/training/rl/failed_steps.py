"""Counting consecutive failed training steps (``train.max_failed_steps``).

A step *fails* when none of its episodes can be trained on for a reason that is not the
policy's own: every episode ended with an error status (``engine_error``: e.g. sampling
parameters the rollout backend rejects; ``env_error``: environment servers failing), ended
without a generated token (``context_limit`` before the first turn: a first prompt longer
than ``rollout.max_context`` allows) or was too stale for ``train.max_staleness``. Such a step updates nothing, and the same cause
usually fails the next one too, so after ``limit`` failed steps in a row the run stops
instead of going on training nothing. Groups dropped because their rewards are all equal
(``train.skip_flat_groups``) do not make a step fail: that is what sparse rewards look like
early in training, not a fault.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from agentrl_jax.agent.trajectory import ERROR_STATUSES, Trajectory

#: the most characters of an episode's error message quoted in the stop message
ERROR_CHARS = 300


def first_error(trajectories: Sequence[Trajectory]) -> str | None:
    """The first line of the first error message among ``trajectories`` that had nothing to
    train on (an error status, or no generated token) (cut to ``ERROR_CHARS``), or None."""
    for t in trajectories:
        if (t.status in ERROR_STATUSES or not t.num_generated) and t.error:
            line = str(t.error).strip().splitlines()[0] if str(t.error).strip() else ""
            return line[:ERROR_CHARS] + ("..." if len(line) > ERROR_CHARS else "")
    return None


class FailedSteps:
    """Consecutive failed steps; ``limit`` of them in a row stop the run (0: never)."""

    def __init__(self, limit: int):
        if limit < 0:
            raise ValueError(f"limit must be >= 0 (got {limit})")
        self.limit = int(limit)
        self.consecutive = 0
        self.last_statuses: dict[str, int] = {}
        self.last_error: str | None = None

    def record(self, usable: int, statuses: Mapping[str, int],
               trajectories: Sequence[Trajectory] = ()) -> str | None:
        """Record one step and return why the run must stop, else None.

        ``usable``: the step's episodes (over all processes) that ended without an error,
        generated at least one token and are fresh enough to train on, before flat groups
        are skipped; ``statuses``: the step's
        episode count per status; ``trajectories``: this process's episodes (for the error
        quoted in the message)."""
        if usable > 0:
            self.consecutive = 0
            return None
        self.consecutive += 1
        self.last_statuses = {k: int(v) for k, v in statuses.items() if v}
        self.last_error = first_error(trajectories) or self.last_error
        if not self.limit or self.consecutive < self.limit:
            return None
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.last_statuses.items())) or "none"
        error = self.last_error or ("on another process" if any(
            k in ERROR_STATUSES for k in self.last_statuses) else "none")
        return (f"{self.consecutive} steps in a row had no episode to train on "
                f"(train.max_failed_steps={self.limit}); the last one's episodes: {counts}; "
                f"error: {error}")


class RunFailure(RuntimeError):
    """The run cannot go on or its result does not count: an environment server died and could
    not be restarted (``env.max_restarts``), too many episodes ended with ``env_error``
    (``train.max_env_error_rate`` over ``train.env_error_window`` steps), too many steps in a
    row had no episode to train on (``train.max_failed_steps``, ``training/rl/failed_steps.py``),
    an update went non-finite (``training/rl/nonfinite.py``), the environment servers could not
    list their tasks, the rollout engine's KV cache does not fit its device's free memory, or
    the final evaluation scored too few of its tasks
    (``train.eval_min_scored``).
    ``launch/run.py`` prints the message and exits with :data:`EXIT_RUN_FAILED`."""


#: exit code of ``launch/run.py`` for a :class:`RunFailure`
EXIT_RUN_FAILED = 3
