"""A ScienceWorld state's valid actions in a few py4j round trips instead of one per action.

``scienceworld.ScienceWorldEnv.get_valid_action_object_combinations`` returns
``list(server.getValidActionObjectCombinations())``: py4j hands back a proxy of the Java list,
and ``list()`` over it asks the JVM for every element in turn, one socket round trip each. A
room has hundreds to a few thousand valid actions (2,726 in the kitchen of ``boil``), so that
copy costs the Python process far more than the JVM's own enumeration; the lettered-choice
agent asks for the list at every turn. Here the JVM joins slices of the list into strings
(``subList`` and ``java.lang.String.join``) and Python splits them: the same actions in the
same order. The slices are kept under ``SLICE_CHARS`` characters because a py4j answer longer
than the JVM's 8 KB write buffer stalls on the loopback socket (its tail waits for an
acknowledgement the Python side delays), whatever its length beyond that.
Timings: docs/PERFORMANCE.md, "ScienceWorld's valid actions in a few round trips".
"""

from __future__ import annotations

from typing import Any

#: joins the actions on the Java side; no valid action contains it (each is one command line)
SEPARATOR = "\n"
#: the characters a joined slice aims at: under the 8 KB above which a py4j answer stalls
SLICE_CHARS = 4000
#: the first slice's size in actions, before their mean length is known
FIRST_SLICE = 64


def valid_action_list(sim: Any) -> list[str]:
    """``sim``'s valid actions (``server.getValidActionObjectCombinations()``), in the JVM's
    order, through :func:`copy_java_list`. ``sim``: a ``scienceworld.ScienceWorldEnv`` or a
    shared-JVM ``World`` (``server`` and ``_gateway``). Two calls in one state need not agree:
    the simulator names some objects differently from call to call."""
    return copy_java_list(sim.server.getValidActionObjectCombinations(),
                          getattr(sim, "_gateway", None))


def copy_java_list(actions: Any, gateway: Any) -> list[str]:
    """A py4j Java list of strings as a Python list: slices joined in the JVM (``gateway``'s),
    each sized from the mean length so far to stay under ``SLICE_CHARS``, and split here.
    Anything that is not a py4j ``JavaList`` (a test's fake) is copied as it is; a slice whose
    pieces do not match its size (an element with a line break) makes the whole copy fall back
    to the element-by-element one."""
    from py4j.java_collections import JavaList

    if not isinstance(actions, JavaList):
        return list(actions)
    size = actions.size()
    join = gateway.jvm.java.lang.String.join
    copied: list[str] = []
    chars, step = 0, FIRST_SLICE
    while len(copied) < size:
        stop = min(size, len(copied) + step)
        joined = join(SEPARATOR, actions.subList(len(copied), stop))
        pieces = joined.split(SEPARATOR)
        if len(pieces) != stop - len(copied):
            return list(actions)
        copied += pieces
        chars += len(joined) + 1
        step = max(1, int(SLICE_CHARS * len(copied) / chars))
    return copied
