"""``python -m environments.scienceworld [--pool-size N] [--max-steps N] [server options]``.

--pool-size N                simulators at most (default 2 or $SCIENCEWORLD_POOL_SIZE; a JVM each,
                             ~1-2 GB, unless --worlds-per-jvm)
--worlds-per-jvm N           simulators (worlds) to a JVM, their calls one at a time (default 1)
--max-steps N                steps per episode before truncation (default 100)
--valid-actions-each-step    put the valid-action list into every step's info (slow)
--simplifications S          e.g. "easy" or "openDoors,teleportAction"
--tasks a,b                  serve only these task names
Sessions beyond the pool size wait for a JVM on create/reset (at most workers - pool - 4 at once).
"""

from __future__ import annotations

import argparse
import sys

from environments.core.cli import main
from environments.scienceworld.family import CONFIG, configure


def parse_family_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--pool-size", type=int, default=CONFIG.pool_size,
                        help="simulators at most")
    parser.add_argument("--worlds-per-jvm", type=int, default=CONFIG.worlds_per_jvm,
                        help="simulators (worlds) to a JVM, their calls one at a time")
    parser.add_argument("--max-steps", type=int, default=CONFIG.max_steps)
    parser.add_argument("--valid-actions-each-step", action="store_true", help="list valid actions every step (slow)")
    parser.add_argument("--simplifications", default=CONFIG.simplifications, help='e.g. "easy" or "openDoors,teleportAction"')
    parser.add_argument("--tasks", default=None, help="comma-separated task names to serve (default: all 30)")
    parser.add_argument("--workers", type=int, default=32)  # the server's option, read here and passed on
    family_args, rest = parser.parse_known_args(argv)
    return family_args, [*rest, "--workers", str(family_args.workers)]


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip(), "\n")
    family_args, rest = parse_family_args(sys.argv[1:])
    configure(
        pool_size=family_args.pool_size,
        worlds_per_jvm=family_args.worlds_per_jvm,
        # creates waiting for a JVM hold server threads: keep enough threads free for the calls
        # that give JVMs back (close, the last step of an episode)
        max_waiting=max(1, family_args.workers - family_args.pool_size - 4),
        max_steps=family_args.max_steps,
        valid_actions_each_step=family_args.valid_actions_each_step,
        simplifications=family_args.simplifications,
        tasks=family_args.tasks.split(",") if family_args.tasks else None,
    )
    main("scienceworld", rest)
