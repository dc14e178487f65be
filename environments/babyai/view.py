"""What the BabyAI agent sees, computed directly from the world grid.

``agent_view`` reproduces minigrid's ``gen_obs_grid`` + ``Grid.process_vis`` (the agent's 7x7
egocentric view with walls and closed doors blocking the line of sight) without building, rotating
and encoding a sliced ``Grid`` each step, which is most of the cost of a minigrid step.
``tests/test_env_babyai.py`` checks it cell by cell against minigrid's own implementation.
"""

from __future__ import annotations

import functools
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

    Keeps an opacity map of the world grid (walls and closed doors) padded by a view's width of
    opaque "outside" cells on every side, so the view needs no bounds checks. Only a toggle changes
    opacity (a door opening or closing): after an action that may change the cell in front of the
    agent call ``refresh(x, y)``; ``reset`` rebuilds the map for a new episode.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.reset()

    def reset(self) -> None:
        env = self.env
        width, height = env.grid.width, env.grid.height
        pad = self.pad = env.agent_view_size
        self.padded_width = pw = width + 2 * pad
        self.opaque = bytearray(b"\x01" * (pw * (height + 2 * pad)))
        self.inner = _padded_to_grid(width, height, pad)
        cells, opaque = env.grid.grid, self.opaque
        for y in range(height):
            row = (y + pad) * pw + pad
            for x in range(width):
                opaque[row + x] = 1 if _opaque(cells[y * width + x]) else 0
        self.offsets = _view_offsets(pw, env.agent_view_size)

    def refresh(self, x: int, y: int) -> None:
        grid = self.env.grid
        if 0 <= x < grid.width and 0 <= y < grid.height:
            cell = grid.grid[y * grid.width + x]
            self.opaque[(y + self.pad) * self.padded_width + x + self.pad] = 1 if _opaque(cell) else 0

    def look(self, seen: bytearray | None = None, collect: bool = True) -> list[SeenCell]:
        """The NON-EMPTY cells of the agent view that the agent can see, nearest rows first.

        Visibility is minigrid's rule (``Grid.process_vis``): starting from the agent, sight
        spreads sideways and forwards through cells that do not block it; cells beyond the grid
        block it. Cells left out are empty or unseen; along the agent's own row and straight ahead
        up to the first wall or closed door every cell is visible, so there an absent cell means an
        empty one. ``seen`` (a width x height bytearray), if given, gets a 1 for every visible cell;
        with ``collect=False`` only ``seen`` is updated and nothing is returned (cheaper).
        """
        env = self.env
        size = env.agent_view_size
        half = size // 2
        ax, ay = int(env.agent_pos[0]), int(env.agent_pos[1])
        pw, pad, opaque, inner = self.padded_width, self.pad, self.opaque, self.inner
        cells = env.grid.grid
        base = (ay + pad) * pw + ax + pad
        through = env.see_through_walls
        visible: list[SeenCell] = []
        mask = [True] * size if through else [False] * size
        mask[half] = True
        last = size - 1
        for forward, row_offsets in enumerate(self.offsets[env.agent_dir]):
            ks = [base + o for o in row_offsets]
            if through:
                nxt = [True] * size
            else:
                blocks = [opaque[k] for k in ks]
                if forward == 0:
                    blocks[half] = 0  # the agent's cell holds what it carries (never a wall or door)
                nxt = [False] * size
                for i in range(last):  # left to right
                    if mask[i] and not blocks[i]:
                        mask[i + 1] = nxt[i] = nxt[i + 1] = True
                for i in range(last, 0, -1):  # right to left
                    if mask[i] and not blocks[i]:
                        mask[i - 1] = nxt[i] = nxt[i - 1] = True
            for i in range(size):
                if mask[i]:
                    g = inner[ks[i]]
                    if g < 0:
                        if collect:
                            k = ks[i]
                            visible.append(_new(SeenCell, (k % pw - pad, k // pw - pad, forward, i - half, _OUTSIDE)))
                        continue
                    if seen is not None:
                        seen[g] = 1
                    if collect and cells[g] is not None:
                        k = ks[i]
                        visible.append(_new(SeenCell, (k % pw - pad, k // pw - pad, forward, i - half, cells[g])))
            if True not in nxt:
                break
            mask = nxt
        return visible


@functools.lru_cache(maxsize=64)
def _padded_to_grid(width: int, height: int, pad: int) -> tuple[int, ...]:
    """Padded index -> grid index, or -1 for the padding outside the grid."""
    padded_width = width + 2 * pad
    inner = [-1] * (padded_width * (height + 2 * pad))
    for y in range(height):
        for x in range(width):
            inner[(y + pad) * padded_width + x + pad] = y * width + x
    return tuple(inner)


@functools.lru_cache(maxsize=64)
def _view_offsets(padded_width: int, size: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """For each direction, each row of the view (nearest first), the padded-index offsets of its
    cells from the agent's cell, left to right."""
    half = size // 2
    table = []
    for fx, fy in DIR_TO_VEC:
        rx, ry = -fy, fx
        table.append(
            tuple(
                tuple((forward * fy + (i - half) * ry) * padded_width + forward * fx + (i - half) * rx for i in range(size))
                for forward in range(size)
            )
        )
    return tuple(table)


def agent_view(env: Any, seen: bytearray | None = None) -> list[SeenCell]:
    """One-off ``Sight(env).look(seen)`` (builds the opacity map each call)."""
    return Sight(env).look(seen)
