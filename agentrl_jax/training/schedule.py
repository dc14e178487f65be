"""Interaction-horizon schedules: ScalingInter-RL and fixed horizons.

ScalingInter-RL (AgentGym-RL) trains with a monotone schedule of the maximum number of
agent-environment turns: ``phases[k]`` turns for training steps ``[k*K, (k+1)*K)``, and the last
phase's limit after that. Example BabyAI: ``phases=(6, 13, 20), steps_per_phase=100``.

The horizon is a pure function of the global step, so a resumed run gets exactly the horizon the
interrupted run would have had (the reference code's resume was off by one phase boundary).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class HorizonSchedule:
    """``phases``: turn limits per phase (non-decreasing); ``steps_per_phase``: K."""

    phases: tuple[int, ...]
    steps_per_phase: int = 100

    def __post_init__(self) -> None:
        if not self.phases or any(p < 1 for p in self.phases):
            raise ValueError(f"horizon phases must be positive integers, got {self.phases}")
        if any(b < a for a, b in zip(self.phases, self.phases[1:])):
            raise ValueError(f"ScalingInter phases must be non-decreasing, got {self.phases}")
        if self.steps_per_phase < 1:
            raise ValueError(f"steps_per_phase must be >= 1, got {self.steps_per_phase}")

    def phase(self, step: int) -> int:
        """Index of the phase that training step ``step`` (0-based) belongs to."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return min(step // self.steps_per_phase, len(self.phases) - 1)

    def horizon(self, step: int) -> int:
        """Maximum turns for episodes collected at training step ``step``."""
        return self.phases[self.phase(step)]

    @property
    def max_horizon(self) -> int:
        return self.phases[-1]

    @classmethod
    def fixed(cls, turns: int) -> "HorizonSchedule":
        return cls(phases=(int(turns),), steps_per_phase=1)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "HorizonSchedule":
        """``{"type": "scaling_inter", "phases": [6, 13, 20], "steps_per_phase": 100}`` or
        ``{"type": "fixed", "turns": 20}``."""
        kind = config.get("type", "scaling_inter")
        if kind == "fixed":
            return cls.fixed(int(config["turns"]))
        if kind == "scaling_inter":
            phases: Sequence[int] = config["phases"]
            return cls(phases=tuple(int(p) for p in phases),
                       steps_per_phase=int(config.get("steps_per_phase", 100)))
        raise ValueError(f"unknown horizon schedule type {kind!r} (scaling_inter, fixed)")
