"""A step without an update must not make later rollouts stale.

The smoke config's random model never earns a reward, so with ``train.skip_flat_groups`` every
group is flat and no step updates. Before the fix, the engine's weight version stayed at the
last update while the step counter moved on: from the second step on every rollout was stamped
one version behind and dropped as stale (``max_staleness=0``), so training could never resume.
The reference: the weights never changed, so nothing is stale.
"""

from __future__ import annotations

import json
import os

from test_e2e import _run


def test_steps_without_an_update_leave_later_rollouts_fresh(tmp_path, compile_cache_env):
    workdir = str(tmp_path / "run")
    out = _run(workdir, compile_cache_env, "--config.train.total_steps=3",
               "--config.train.skip_flat_groups=True")
    assert "run finished" in out
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    steps = [m for m in rows if "train/horizon" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["rollout/flat_groups_skipped"] == 2 for m in steps)  # 2 tasks, all rewards 0
    assert all(m["rollout/stale_dropped"] == 0 for m in steps), [m["rollout/stale_dropped"]
                                                                  for m in steps]
    assert all(m["rollout/episodes"] == 4 for m in steps)
