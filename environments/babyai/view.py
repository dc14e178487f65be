"""What the BabyAI agent sees, computed directly from the world grid.

``agent_view`` reproduces minigrid's ``gen_obs_grid`` + ``Grid.process_vis`` (the agent's 7x7
egocentric view with walls and closed doors blocking the line of sight) without building, rotating
and encoding a sliced ``Grid`` each step, which is most of the cost of a minigrid step.
``tests/test_env_babyai.py`` checks it cell by cell against minigrid's own implementation.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# minigrid's DIR_TO_VEC: 0 east, 1 south, 2 west, 3 north
DIR_TO_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))
_OUTSIDE = "outside"  # a cell beyond the grid: minigrid shows it as a wall


class SeenCell(NamedTuple):
    """A visible cell: world position, egocentric offsets (forward >= 0, right < 0 is left), content."""

    x: int
    y: int
    forward: int
    right: int
    obj: Any  # a minigrid WorldObj, None for an empty cell, or _OUTSIDE


_new = tuple.__new__  # builds a SeenCell without the Python-level NamedTuple.__new__ (hot loop)


def _opaque(cell: Any) -> bool:
    """Does this cell block the line of sight? (walls and closed doors do)"""
    return cell is not None and not cell.see_behind()


class Sight:
    """Line-of-sight computation for one episode of one environment.

    Keeps a per-cell opacity map of the world grid (walls and closed doors). Only a toggle
    changes it (a door opening or closing), so after every action that may change the cell in
    front of the agent, call ``refresh(x, y)``; ``reset`` rebuilds it for a new episode.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.opaque = bytearray()
        self.reset()

    def reset(self) -> None:
        grid = self.env.grid
        self.opaque = bytearray(1 if _opaque(cell) else 0 for cell in grid.grid)

    def refresh(self, x: int, y: int) -> None:
        grid = self.env.grid
        if 0 <= x < grid.width and 0 <= y < grid.height:
            self.opaque[y * grid.width + x] = 1 if _opaque(grid.grid[y * grid.width + x]) else 0

    def look(self, seen: bytearray | None = None) -> list[SeenCell]:
        """The NON-EMPTY cells of the agent view that the agent can see, nearest rows first.

        Visibility is minigrid's rule (``Grid.process_vis``): starting from the agent, sight
        spreads sideways and forwards through cells that do not block it; cells beyond the grid
        block it. Cells left out are empty or unseen; along the agent's own row and straight ahead
        up to the first wall or closed door every cell is visible, so there an absent cell means an
        empty one. ``seen`` (a width x height bytearray), if given, gets a 1 for every visible cell.
        """
        env = self.env
        size = env.agent_view_size
        half = size // 2
        ax, ay = int(env.agent_pos[0]), int(env.agent_pos[1])
        fx, fy = DIR_TO_VEC[env.agent_dir]
        rx, ry = -fy, fx
        grid = env.grid
        width, height, cells, opaque = grid.width, grid.height, grid.grid, self.opaque
        through = env.see_through_walls
        visible: list[SeenCell] = []
        columns = range(size)
        mask = [True] * size if through else [False] * size
        mask[half] = True
        for forward in columns:
            x0 = ax + forward * fx - half * rx
            y0 = ay + forward * fy - half * ry
            # index of each cell of this row in the world grid, -1 beyond it (blocks sight)
            index = [
                (y0 + i * ry) * width + x0 + i * rx if 0 <= x0 + i * rx < width and 0 <= y0 + i * ry < height else -1
                for i in columns
            ]
            if through:
                nxt = [True] * size
            else:
                # the agent's own cell never blocks: minigrid puts the carried object (never a
                # wall or door) or nothing there
                blocks = [k < 0 or (opaque[k] == 1 and not (forward == 0 and i == half)) for i, k in enumerate(index)]
                nxt = [False] * size
                for i in range(size - 1):  # left to right
                    if mask[i] and not blocks[i]:
                        mask[i + 1] = nxt[i] = nxt[i + 1] = True
                for i in range(size - 1, 0, -1):  # right to left
                    if mask[i] and not blocks[i]:
                        mask[i - 1] = nxt[i] = nxt[i - 1] = True
            for i in columns:
                if mask[i]:
                    k = index[i]
                    if k < 0:
                        visible.append(_new(SeenCell, (x0 + i * rx, y0 + i * ry, forward, i - half, _OUTSIDE)))
                        continue
                    if seen is not None:
                        seen[k] = 1
                    if cells[k] is not None:
                        visible.append(_new(SeenCell, (x0 + i * rx, y0 + i * ry, forward, i - half, cells[k])))
            if not any(nxt):
                break
            mask = nxt
        return visible


def agent_view(env: Any, seen: bytearray | None = None) -> list[SeenCell]:
    """One-off ``Sight(env).look(seen)`` (builds the opacity map each call)."""
    return Sight(env).look(seen)
