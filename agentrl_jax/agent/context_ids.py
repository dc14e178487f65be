"""An episode's current context as an int32 array, kept up to date turn by turn.

Each turn an episode hands the rollout backend its whole current chunk
(``Trajectory.context_ids``: thousands of tokens late in an episode). As a list of Python ints,
the embedded engine converts every element each turn (``engine/prompt_ids.check_input_ids``);
as an ``array("i")`` extended by the ids appended since the previous turn it reads the array in
place, so a turn costs the new ids' conversion, not the whole context's
(``benchmarks/speed/turn_intake.py``). Backends that take such arrays say so
(``RolloutBackend.takes_id_arrays``); the others get the list.
"""

from __future__ import annotations

from array import array

from agentrl_jax.agent.trajectory import Trajectory


class ContextIds:
    """The current chunk of one trajectory (``Trajectory.context_ids``) as ``array("i")``:
    :meth:`of` extends it by the ids appended since the last call, and starts again when the
    trajectory starts a new chunk (a history window). The trajectory's ids are only ever
    appended, so the array's ids are always the chunk's first ``len(array)``."""

    def __init__(self) -> None:
        self._start = -1  # the chunk's first index in ``token_ids``
        self._ids = array("i")

    def of(self, trajectory: Trajectory) -> array:
        """The chunk's ids (the same array object until a new chunk starts: the caller must
        not keep it past its next call)."""
        start = trajectory.chunk_starts[-1] if trajectory.chunk_starts else 0
        if start != self._start:
            self._start, self._ids = start, array("i")
        have = start + len(self._ids)
        if have < len(trajectory.token_ids):
            self._ids.extend(trajectory.token_ids[have:])
        return self._ids


__all__ = ["ContextIds"]
