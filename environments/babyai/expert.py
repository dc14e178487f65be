"""An expert for BabyAI tasks: minigrid's ``BabyAIBot`` on a local replica of the level.

The bot needs the simulator's state, which a client of the HTTP server does not have, so the
expert builds its own copy of the task's level from the same seed (minigrid's level generation is
deterministic), asks the bot for a primitive action, returns it as text, and applies the same
action to its copy. Its reward / termination can then be compared with what the server answers.
"""

from __future__ import annotations

from typing import Any

from environments.core.base import ExpertStuck

from environments.babyai.levels import make_level, parse_task_id

ACTION_TEXT = {0: "turn left", 1: "turn right", 2: "move forward", 3: "pickup", 4: "drop", 5: "toggle"}

# levels the bot cannot solve (its own docstring)
BOT_UNSOLVABLE = frozenset(
    {"BabyAI-PutNextS5N2Carrying-v0", "BabyAI-PutNextS6N3Carrying-v0", "BabyAI-PutNextS7N4Carrying-v0", "BabyAI-KeyInBox-v0"}
)


class BabyAIBotExpert:
    """Suggests text actions for ``task_id`` and mirrors them on a local minigrid environment."""

    def __init__(self, task_id: str) -> None:
        from minigrid.utils.baby_ai_bot import BabyAIBot

        level, seed = parse_task_id(task_id)
        self.env = make_level(level)
        self.env.reset(seed=seed)
        self.bot = BabyAIBot(self.env)
        self._action: int | None = None

    @property
    def mission(self) -> str:
        return self.env.mission

    def act(self) -> str | None:
        """The next action as text, or None when the bot considers the mission done."""
        action = int(self.bot.replan())
        if action not in ACTION_TEXT:
            return None
        self._action = action
        return ACTION_TEXT[action]

    def mirror(self) -> tuple[float, bool, bool]:
        """Apply the last suggested action locally; returns (reward, terminated, truncated)."""
        assert self._action is not None, "call act() first"
        _, reward, terminated, truncated, _ = self.env.step(self._action)
        return float(reward), bool(terminated), bool(truncated)


# ---------------------------------------------------------- the family's experts (the recorder's)

class BoundedSubgoalStack(list):
    """A list for ``BabyAIBot.stack`` that raises :class:`ExpertStuck` instead of growing
    without end: on ``append`` past ``max_len`` subgoals, and on the ``max_reads``-th read
    (``stack[-1]``: one per iteration of the bot's ``while self.stack`` planning loop) since the
    last :meth:`reset` (called before each ``replan``). The bot only appends, pops and reads
    the top, so a plan that cycles without growing is caught by the read budget."""

    def __init__(self, items: Any = (), max_len: int = 200, max_reads: int = 2000):
        super().__init__(items)
        if max_len < 1 or max_reads < 1:
            raise ValueError(f"max_len and max_reads must be >= 1 (got {max_len}, {max_reads})")
        self.max_len, self.max_reads = int(max_len), int(max_reads)
        self.reads = 0

    def reset(self) -> None:
        self.reads = 0

    def append(self, item: Any) -> None:
        if len(self) >= self.max_len:
            raise ExpertStuck(f"the bot's plan grew past {self.max_len} subgoals "
                              f"(top: {type(super().__getitem__(-1)).__name__})")
        super().append(item)

    def __getitem__(self, index: Any) -> Any:
        self.reads += 1
        if self.reads > self.max_reads:
            raise ExpertStuck(f"the bot replanned more than {self.max_reads} times for one "
                              f"action ({len(self)} subgoals)")
        return super().__getitem__(index)


class BabyAIExpertPolicy:
    """``BabyAIBot`` on a local replica; each call first mirrors the previous action. The
    bot's subgoal stack is a :class:`BoundedSubgoalStack` (the bot never returns on some
    levels)."""

    def __init__(self, task_id: str, max_subgoals: int = 200, max_replans: int = 2000):
        self.expert = BabyAIBotExpert(task_id)
        self.stack = BoundedSubgoalStack(self.expert.bot.stack, max_subgoals, max_replans)
        self.expert.bot.stack = self.stack
        self._acted = False

    def act(self, observation: str) -> str | None:
        if self._acted:
            self.expert.mirror()
        self._acted = True
        self.stack.reset()
        return self.expert.act()
