"""Store a results folder's large JSON-lines files gzip-compressed, as committed runs are kept.

    python3 benchmarks/analysis/compact_results.py results/NAME [more folders]

Every plain ``*.jsonl`` over 64 KiB under the folders (recursively) becomes ``*.jsonl.gz``
(``gzip -n -9``: deterministic, lossless; checked to decompress to the same bytes before the
plain file is removed); smaller ones stay plain. Why: every call to the lent GPU machine copies
the whole tracked tree under a 64 MiB limit (results/README.md). The analysis scripts and the
viewer read both forms (``agentrl_common.jsonl_files.find_run_file``);
``benchmarks/analysis/learning_report.py --out`` (and so ``benchmarks/gpu/jobs.sh --results``)
already writes them this way.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from agentrl_common.jsonl_files import COMPRESS_ABOVE_BYTES, store_compact_tree  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="results folders to compact")
    p.add_argument("--above", type=int, default=COMPRESS_ABOVE_BYTES,
                   help="compress files larger than this many bytes")
    args = p.parse_args(argv)
    for folder in args.folders:
        if not os.path.isdir(folder):
            p.error(f"{folder} is not a folder")
    for folder in args.folders:
        for path in store_compact_tree(folder, args.above):
            print(f"compressed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
