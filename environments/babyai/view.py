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


def _opaque(cell: Any) -> bool:
    if cell is None:
        return False
    if cell is _OUTSIDE:
        return True
    return not cell.see_behind()


def agent_view(env: Any) -> list[SeenCell]:
    """The cells of ``env``'s agent view that the agent can see (minigrid's visibility rule)."""
    size = env.agent_view_size
    half = size // 2
    ax, ay = int(env.agent_pos[0]), int(env.agent_pos[1])
    fx, fy = DIR_TO_VEC[env.agent_dir]
    rx, ry = -fy, fx
    grid = env.grid
    width, height, cells = grid.width, grid.height, grid.grid

    # view[j][i]: column i (left to right), row j (far to near); the agent sits at (half, size - 1)
    view: list[list[Any]] = []
    for j in range(size):
        forward = size - 1 - j
        x0 = ax + forward * fx - half * rx
        y0 = ay + forward * fy - half * ry
        row = []
        for i in range(size):
            x, y = x0 + i * rx, y0 + i * ry
            row.append(cells[y * width + x] if 0 <= x < width and 0 <= y < height else _OUTSIDE)
        view.append(row)
    under_agent = view[size - 1][half]
    view[size - 1][half] = env.carrying  # as minigrid does: the agent's cell holds what it carries

    if env.see_through_walls:
        mask = [[True] * size for _ in range(size)]
    else:
        mask = _visibility(view, size, half)
    view[size - 1][half] = under_agent  # report the world cell under the agent (e.g. an open door)

    seen = []
    for j in range(size):
        forward = size - 1 - j
        x0 = ax + forward * fx - half * rx
        y0 = ay + forward * fy - half * ry
        row, row_mask = view[j], mask[j]
        for i in range(size):
            if row_mask[i]:
                seen.append(SeenCell(x0 + i * rx, y0 + i * ry, forward, i - half, row[i]))
    return seen


def _visibility(view: list[list[Any]], size: int, half: int) -> list[list[bool]]:
    """minigrid's ``Grid.process_vis`` on the egocentric view (indices swapped to [row][col])."""
    opaque = [[_opaque(cell) for cell in row] for row in view]
    mask = [[False] * size for _ in range(size)]
    mask[size - 1][half] = True
    for j in reversed(range(size)):
        row, row_opaque = mask[j], opaque[j]
        above = mask[j - 1] if j > 0 else None
        for i in range(size - 1):
            if not row[i] or row_opaque[i]:
                continue
            row[i + 1] = True
            if above is not None:
                above[i + 1] = True
                above[i] = True
        for i in reversed(range(1, size)):
            if not row[i] or row_opaque[i]:
                continue
            row[i - 1] = True
            if above is not None:
                above[i - 1] = True
                above[i] = True
    return mask
