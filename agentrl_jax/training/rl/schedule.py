"""Interaction-horizon schedules: ScalingInter-RL and fixed horizons.

ScalingInter-RL (AgentGym-RL) trains with a monotone schedule of the maximum number of
agent-environment turns: ``phases[k]`` turns for training steps ``[k*K, (k+1)*K)``, and the last
phase's limit after that. Example BabyAI: ``phases=(6, 13, 20), steps_per_phase=100``.

The horizon is a pure function of the global step, so a resumed run gets exactly the horizon the
interrupted run would have had (the reference code's resume was off by one phase boundary).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from agentrl_jax.training.config.sections import HorizonConfig


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
    def from_config(cls, config: HorizonConfig | Mapping[str, Any]) -> "HorizonSchedule":
        """The schedule of a ``HorizonConfig`` (``training/config/sections.py``) or of a mapping
        of its keys (``{"type": "scaling_inter", "phases": [6, 13, 20], "steps_per_phase":
        100}``, ``{"type": "fixed", "turns": 20}``; the other keys take their defaults). A bad
        value raises ``ValueError``."""
        from agentrl_jax.training.config.sections import HorizonConfig

        if not isinstance(config, HorizonConfig):
            config = HorizonConfig(**dict(config))
        if config.type == "fixed":
            return cls.fixed(config.turns)
        return cls(phases=tuple(config.phases), steps_per_phase=config.steps_per_phase)


def scored_tokens_bound(schedule: HorizonSchedule, max_new_tokens: int) -> int:
    """The most tokens one trajectory of the run generates (the learner's scored tokens): its
    longest horizon x ``max_new_tokens`` a turn. The trainer reserves it as the scored LM
    head's capacity (``learner/scored.py``) before the first update."""
    return int(schedule.max_horizon) * int(max_new_tokens)
