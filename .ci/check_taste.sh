#!/usr/bin/env bash
# CI: the README's CPU taste command exactly as the README prints it (read from README.md),
# with the real SmolLM2 model; fails on a non-zero exit, a summary.json without the expected
# fields, more than 15 min of wall time or more than 8 GB peak RSS (.ci/check_taste.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 .ci/check_taste.py "$@"
