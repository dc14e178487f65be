"""Host cost of one turn's context from the episode to the engine's int32 prompt: the episode's
list against its ``array("i")`` kept up to date (``agent/context_ids.py``), side by side in one
process. No device, no JAX.

Each turn an episode hands the rollout backend its whole current chunk. As a list (the path
before 2026-12-06, and today's for backends that take no arrays): ``Trajectory.context_ids``
(a slice), a copy for the call, and ``check_input_ids`` converting every element. As an array:
``ContextIds.of`` converts the ids appended since the previous turn and ``check_input_ids``
reads the array in place. An episode here grows by ``--turn-tokens`` ids a turn (a reply and an
observation) from a ``--prompt``-token prompt; each mode plays it turn by turn to each
``--lengths`` context and reports the mean cost a turn over the last ``--window`` turns before
that length (the turns a long episode spends there), medians of ``--repeats``.

    python benchmarks/speed/turn_intake.py --json out.json

The event loop holds the GIL for these microseconds; in the rollout's GIL-bound process (docs/
PERFORMANCE.md) they are the process's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from agentrl_jax.agent.context_ids import ContextIds  # noqa: E402
from agentrl_jax.agent.trajectory import Trajectory  # noqa: E402
from agentrl_jax.rollout.engine.prompt_ids import check_input_ids  # noqa: E402

VOCAB = 49152  # SmolLM2's


def play(mode: str, prompt: int, turn_tokens: int, length: int, window: int,
         seed: int) -> float:
    """Mean seconds a turn of the intake over the last ``window`` turns before ``length``."""
    rng = np.random.default_rng(seed)
    traj = Trajectory(env="e", task_id="t", group_id=0, sample_index=0)
    traj.append(rng.integers(3, VOCAB, size=prompt).tolist(), generated=False, turn=-1)
    turns = max(1, (length - prompt) // turn_tokens)
    context = ContextIds()
    spent, counted = 0.0, 0
    for turn in range(turns):
        t0 = time.perf_counter()
        if mode == "list":
            ids = check_input_ids(list(traj.context_ids()), VOCAB, None)
        else:
            ids = check_input_ids(context.of(traj), VOCAB, None)
        if turn >= turns - window:
            spent += time.perf_counter() - t0
            counted += 1
        assert len(ids) == len(traj.token_ids)
        if turn == turns - 1:  # (outside the timing) the engine's prompt is the whole chunk
            assert ids.tolist() == traj.token_ids
        traj.append(rng.integers(3, VOCAB, size=turn_tokens).tolist(), generated=False,
                    turn=turn)
    return spent / counted


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,3072,6144", help="context lengths (tokens)")
    p.add_argument("--prompt", type=int, default=300, help="the first prompt's tokens")
    p.add_argument("--turn-tokens", type=int, default=60, help="ids a turn appends")
    p.add_argument("--window", type=int, default=10, help="turns averaged before each length")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        times: dict[str, list[float]] = {"list": [], "array": []}
        for r in range(args.repeats):  # alternating, so load changes hit both alike
            for mode in ("list", "array"):
                times[mode].append(play(mode, args.prompt, args.turn_tokens, length,
                                        args.window, seed=r))
        old, new = (statistics.median(times[m]) * 1e6 for m in ("list", "array"))
        rows.append({"length": length, "list_us": old, "array_us": new, "ratio": old / new,
                     "samples_us": {m: [t * 1e6 for t in v] for m, v in times.items()}})
        print(f"context ~{length:>5} tokens: list {old:7.1f} us, array {new:6.1f} us a turn "
              f"({old / new:.2f}x)")
    out = {"args": vars(args), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
