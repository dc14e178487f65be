"""``benchmarks/speed/rl_step.py --fresh-process``: each variant runs in its own Python process (the
first trainer of a process updates slower than later ones, which favoured every variant after
the first), and the results are merged into one JSON in variant order."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_each_variant_runs_in_its_own_process(tmp_path):
    out = tmp_path / "steps.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "speed", "rl_step.py"), "--config",
           os.path.join(ROOT, "experiments", "smoke.py"), "--steps", "1",
           "--variants", "packed,no_remat", "--fresh-process", "--workdir", str(tmp_path / "w"),
           "--json", str(out), "--label", "test"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["fresh_process"] and data["label"] == "test" and data["device"]
    results = data["results"]
    assert [r["variant"] for r in results] == ["packed", "no_remat"]
    pids = {r["pid"] for r in results}
    assert len(pids) == 2 and os.getpid() not in pids  # two new processes, not this one
    assert all(len(r["steps"]) == 1 and r["summary"]["step_s"] > 0 for r in results)
    assert "(separate processes)" in done.stdout
