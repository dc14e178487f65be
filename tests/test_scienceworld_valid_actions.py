"""environments/scienceworld/valid_actions.py without a JVM: a stand-in Java list whose slices a
stand-in JVM joins (the real JVM's copy is compared with the package's in
tests/test_env_scienceworld.py)."""

from __future__ import annotations

from types import SimpleNamespace

from py4j.java_collections import JavaList

from environments.scienceworld.valid_actions import valid_action_list


class Listed(JavaList):
    """A py4j ``JavaList`` stand-in holding Python strings (no gateway behind it)."""

    def __init__(self, items: list[str]) -> None:  # JavaList's own needs a gateway
        self.items = items

    def size(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def subList(self, start: int, stop: int) -> "Listed":  # noqa: N802 (java.util.List's name)
        return Listed(self.items[start:stop])


def sim_listing(actions: list[str]) -> SimpleNamespace:
    """A simulator whose server lists ``actions`` and whose JVM joins a list's slices."""
    listed = Listed(actions)
    string = SimpleNamespace(join=lambda sep, items: sep.join(items.items))
    return SimpleNamespace(
        server=SimpleNamespace(getValidActionObjectCombinations=lambda: listed),
        _gateway=SimpleNamespace(jvm=SimpleNamespace(java=SimpleNamespace(
            lang=SimpleNamespace(String=string)))))


def test_valid_action_list_splits_the_joined_list_and_falls_back_on_a_line_break():
    assert valid_action_list(sim_listing(["open door", "look around"])) == [
        "open door", "look around"]
    many = [f"focus on object number {i}" for i in range(3000)]  # ~80k characters: many slices
    assert valid_action_list(sim_listing(many)) == many
    assert valid_action_list(sim_listing([])) == []
    # an action holding the separator: the pieces do not match the size, the copy is taken
    assert valid_action_list(sim_listing(["say\nhello", "wait"])) == ["say\nhello", "wait"]
    plain = SimpleNamespace(server=SimpleNamespace(
        getValidActionObjectCombinations=lambda: ("b", "a")))
    assert valid_action_list(plain) == ["b", "a"]  # not a Java list: copied as it is
