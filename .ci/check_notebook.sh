#!/usr/bin/env bash
# Execute notebooks/quickstart.ipynb top to bottom on CPU (the smoke config: small settings) with
# nbclient; any cell error fails this script. Its measured time: the README, "Tests".
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export JAX_PLATFORMS=cpu QUICKSTART_WORKDIR="$work/quickstart"
python3 - <<'PYEOF'
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

path = "notebooks/quickstart.ipynb"
nb = nbformat.read(path, as_version=4)
client = NotebookClient(nb, timeout=900, kernel_name="python3",
                        resources={"metadata": {"path": "notebooks"}})
t0 = time.time()
try:
    client.execute()
except CellExecutionError as e:
    print(f"{path}: a cell failed after {time.time() - t0:.0f} s:\n{e}", file=sys.stderr)
    sys.exit(1)
cells = sum(c.cell_type == "code" for c in nb.cells)
print(f"{path}: {cells} code cells executed without error in {time.time() - t0:.0f} s")
PYEOF
