"""An expert for BabyAI tasks: minigrid's ``BabyAIBot`` on a local replica of the level.

The bot needs the simulator's state, which a client of the HTTP server does not have, so the
expert builds its own copy of the task's level from the same seed (minigrid's level generation is
deterministic), asks the bot for a primitive action, returns it as text, and applies the same
action to its copy. Its reward / termination can then be compared with what the server answers.
"""

from __future__ import annotations

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
