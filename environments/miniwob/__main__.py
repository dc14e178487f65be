"""``python -m environments.miniwob [--max-steps 15] [--tasks a,b] [server options]``.

Each session owns one headless Chromium (~1 GB): bound them with --max-sessions.
Chromium / chromedriver: MINIWOB_CHROME_BINARY / MINIWOB_CHROMEDRIVER, else /usr/bin/chromium
and /usr/bin/chromedriver (Debian packages chromium and chromium-driver).
"""

from __future__ import annotations

import argparse
import sys

from environments.core.cli import main
from environments.miniwob.family import CONFIG, configure


def parse_family_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--max-steps", type=int, default=CONFIG.max_steps)
    parser.add_argument("--settle", type=float, default=CONFIG.settle_s, help="seconds to wait after each action")
    parser.add_argument("--tasks", default=None, help="comma-separated subset of the supported tasks")
    parser.add_argument("--train-seeds", type=int, default=CONFIG.train_seeds,
                        help="training seed range 0..N-1 (the dev seeds 950..999 are always left out)")
    parser.add_argument("--test-seeds", type=int, default=CONFIG.test_seeds)
    return parser.parse_known_args(argv)


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip(), "\nfamily options: --max-steps --settle --tasks --train-seeds --test-seeds\n")
    family_args, rest = parse_family_args(sys.argv[1:])
    configure(
        max_steps=family_args.max_steps,
        settle_s=family_args.settle,
        tasks=family_args.tasks.split(",") if family_args.tasks else None,
        train_seeds=family_args.train_seeds,
        test_seeds=family_args.test_seeds,
    )
    main("miniwob", rest)
