"""Where an episode's wall time goes: cheap, always-on accumulators of the agent loop.

Each ``Episode`` owns a :class:`LoopTimes`; every coroutine of the episode adds the time it spent
in one of four kinds of work (``time.perf_counter`` deltas, no device work, no locks):

* ``gen_s``: awaiting the rollout backend's ``generate`` (queueing, prefill, decode, the hop
  back from the engine thread and the event loop's delay in resuming the episode);
* ``engine_s``: the part of ``gen_s`` the engine itself reports as the request's latency
  (``GenerateResult.latency_s``: from the request's creation to its result), so
  ``gen_s - engine_s`` is the hand-off and event-loop wait around the engine;
* ``env_s``: awaiting the environment server (``create`` / ``step`` / ``close`` round trips,
  event-loop delay included);
* ``host_s``: the episode's own synchronous work in between (chat template, tokenising the
  observation, detokenising the reply, parsing, bookkeeping);
* ``gate_s``: waiting for a place among the pool's ``max_concurrency`` episodes in flight.

For one episode ``gate_s + gen_s + env_s + host_s`` is its wall time from being queued to
ending (up to the few statements between the timers). The actor pool sums its episodes'
accumulators (``ActorPool.loop_times``): divided by the episode count, the mean episode's
critical path by kind.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class LoopTimes:
    """Seconds (summed over turns, and over episodes when merged) by kind of work."""

    gate_s: float = 0.0
    gen_s: float = 0.0
    engine_s: float = 0.0
    env_s: float = 0.0
    host_s: float = 0.0
    wall_s: float = 0.0  # the episodes' own wall times (queueing included), summed
    turns: int = 0
    env_calls: int = 0
    episodes: int = 0

    def add(self, other: "LoopTimes") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def accounted_s(self) -> float:
        """The measured parts: ``gate + gen + env + host`` (``engine_s`` is inside ``gen_s``)."""
        return self.gate_s + self.gen_s + self.env_s + self.host_s

    def as_dict(self) -> dict[str, float]:
        d = dataclasses.asdict(self)
        d["accounted_s"] = self.accounted_s
        return d


__all__ = ["LoopTimes"]
