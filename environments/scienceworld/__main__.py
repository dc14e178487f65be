"""``python -m environments.scienceworld [--pool-size N] [--max-steps N] [server options]``."""

from __future__ import annotations

import argparse
import sys

from environments.core.cli import main
from environments.scienceworld.family import CONFIG, configure


def parse_family_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--pool-size", type=int, default=CONFIG.pool_size, help="JVMs at most (each ~1.9 GB)")
    parser.add_argument("--max-steps", type=int, default=CONFIG.max_steps)
    parser.add_argument("--valid-actions-each-step", action="store_true", help="list valid actions every step (slow)")
    parser.add_argument("--simplifications", default=CONFIG.simplifications, help='e.g. "easy" or "openDoors,teleportAction"')
    parser.add_argument("--tasks", default=None, help="comma-separated task names to serve (default: all 30)")
    return parser.parse_known_args(argv)


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip(), "\nfamily options: --pool-size --max-steps --valid-actions-each-step --simplifications --tasks\n")
    family_args, rest = parse_family_args(sys.argv[1:])
    configure(
        pool_size=family_args.pool_size,
        max_steps=family_args.max_steps,
        valid_actions_each_step=family_args.valid_actions_each_step,
        simplifications=family_args.simplifications,
        tasks=family_args.tasks.split(",") if family_args.tasks else None,
    )
    main("scienceworld", rest)
