"""A run folder of two evaluation episodes for the viewer's tests: ``eval_episodes.jsonl.gz``
(the small per-episode records kept with published results: no messages or token ids), one
record written with ``parse_failures`` and ``context_tokens``, one from before the fields (the
viewer must show them as unknown, never as 0)."""

from __future__ import annotations

import gzip
import json
import os

#: row 0: with the counts (hand-chosen values); row 1: an older record without them
WITH_COUNTS = {"env": "babyai", "task_id": "GoToObj-3", "group_id": 0, "sample_index": 0,
               "step": 7, "status": "max_turns", "reward": 0.0, "success": False,
               "num_turns": 6, "invalid_actions": 4, "parse_failures": 3,
               "context_tokens": 1187}
WITHOUT_COUNTS = {"env": "textcraft", "task_id": "craft-9", "group_id": 1, "sample_index": 0,
                  "step": 7, "status": "done", "reward": 1.0, "success": True,
                  "num_turns": 2, "invalid_actions": 0}


def write_eval_counts_run(parent: str) -> str:
    """``parent/counts`` holding ``config.json`` and the two records, gzip-compressed as the
    run folders keep them; returns its path."""
    run = os.path.join(parent, "counts")
    os.makedirs(run)
    with open(os.path.join(run, "config.json"), "w") as f:
        json.dump({"env": {"names": "babyai,textcraft"}, "rollout": {"parser": "react"}}, f)
    with gzip.open(os.path.join(run, "eval_episodes.jsonl.gz"), "wt") as f:
        for record in (WITH_COUNTS, WITHOUT_COUNTS):
            f.write(json.dumps(record) + "\n")
    return run
