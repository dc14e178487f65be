"""The BabyAI levels of minigrid, their task ids, and quiet level construction."""

from __future__ import annotations

import functools
import re

from environments.core.base import InvalidTaskError

MAX_SEED_DIGITS = 18  # seeds 0 .. 10**18 - 1
# The canonical form only (matched with fullmatch): ASCII digits, no leading zero, no sign, no
# surrounding whitespace -- so one task has exactly one id, and int() never sees thousands of digits.
TASK_ID_RE = re.compile(rf"(BabyAI-[A-Za-z0-9]+-v[0-9]+)/seed=(0|[1-9][0-9]{{0,{MAX_SEED_DIGITS - 1}}})", re.ASCII)


def _silence_minigrid() -> None:
    """Stop minigrid's level generator from printing to stdout.

    ``RoomGridLevel._gen_grid`` prints "Sampling rejected: ..." each time it redraws a level, and
    ``MissionSpace.contains`` prints on bad missions; a server's stdout must stay clean. Shadowing
    the modules' ``print`` is local to those two modules and thread-safe (unlike redirecting
    ``sys.stdout``).
    """
    from minigrid.core import mission
    from minigrid.envs.babyai.core import roomgrid_level

    def _quiet(*args: object, **kwargs: object) -> None:
        return None

    roomgrid_level.print = _quiet  # type: ignore[attr-defined]
    mission.print = _quiet  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=1)
def level_names() -> tuple[str, ...]:
    """All BabyAI level ids registered by minigrid, sorted (96 with minigrid 3.2)."""
    import gymnasium
    import minigrid  # noqa: F401  (registers the levels)

    _silence_minigrid()
    return tuple(sorted(name for name in gymnasium.registry if name.startswith("BabyAI-")))


def task_id(level: str, seed: int) -> str:
    return f"{level}/seed={seed}"


def parse_task_id(task: str) -> tuple[str, int]:
    """``"BabyAI-GoToLocal-v0/seed=123"`` -> ``("BabyAI-GoToLocal-v0", 123)`` (canonical ids only)."""
    match = TASK_ID_RE.fullmatch(task)
    if match is None or match.group(1) not in level_names():
        raise InvalidTaskError(f"unknown BabyAI task {task[:100]!r}; expected '<BabyAI level id>/seed=<n>' (n: 0 to {MAX_SEED_DIGITS} digits, no leading zero)")
    return match.group(1), int(match.group(2))


def make_level(level: str):
    """A fresh, unwrapped minigrid environment of ``level`` (no gymnasium checker wrappers)."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    if level not in level_names():
        raise InvalidTaskError(f"unknown BabyAI level {level!r}")
    spec = gymnasium.registry[level]
    return load_env_creator(spec.entry_point)(**spec.kwargs)
