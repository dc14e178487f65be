"""A ScienceWorld state's valid actions in one py4j round trip.

``scienceworld.ScienceWorldEnv.get_valid_action_object_combinations`` returns
``list(server.getValidActionObjectCombinations())``: py4j hands back a proxy of the Java list,
and ``list()`` over it asks the JVM for every element in turn, one socket round trip each. A
room has hundreds to a few thousand valid actions (2,726 in the kitchen of ``boil``), so that
copy costs the Python process far more than the JVM's own enumeration; the lettered-choice
agent asks for the list at every turn. Here the JVM joins the list into one string
(``java.lang.String.join``) and Python splits it: the same actions, in the same order, in two
round trips. Timings: docs/PERFORMANCE.md, "ScienceWorld's valid actions in one round trip".
"""

from __future__ import annotations

from typing import Any

#: joins the actions on the Java side; no valid action contains it (each is one command line)
SEPARATOR = "\n"


def valid_action_list(sim: Any) -> list[str]:
    """``sim``'s valid actions (``server.getValidActionObjectCombinations()``), in the JVM's
    order. ``sim``: a ``scienceworld.ScienceWorldEnv`` or a shared-JVM ``World`` (``server`` and
    ``_gateway``). A result that is not a py4j Java list (a test's fake) is copied as it is; a
    joined string whose pieces do not match the list's size (an action with a line break)
    falls back to the element-by-element copy."""
    from py4j.java_collections import JavaList

    actions = sim.server.getValidActionObjectCombinations()
    if not isinstance(actions, JavaList):
        return list(actions)
    size = actions.size()
    if size == 0:
        return []
    joined = sim._gateway.jvm.java.lang.String.join(SEPARATOR, actions)
    pieces = joined.split(SEPARATOR)
    return pieces if len(pieces) == size else list(actions)
