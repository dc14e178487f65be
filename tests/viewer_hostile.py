"""A hostile run folder for the viewer's tests: every field a run folder can hold (episode
fields, messages, token arrays, config keys and values, summary, metrics keys, evaluation files,
the small evaluation records' counts, the run directory's own name) carries script payloads, and
some episodes are malformed (fields of the wrong type). Each payload, if it ran, would set
``window.__pwned`` or the page title."""

from __future__ import annotations

import json
import os
import random

from agentrl_jax.viewer.synthetic import make_episode

PAGE_TITLE = "agentrl-jax viewer"
#: markup that runs script when inserted as HTML (attribute breakouts and script-end included)
PAYLOADS = (
    '<img src=x onerror="window.__pwned=1;document.title=1337">',
    '"><img src=x onerror=window.__pwned=2>',
    "'><svg onload=window.__pwned=3>",
    "</script><script>window.__pwned=4</script>",
    '<iframe srcdoc="<script>parent.__pwned=5</script>"></iframe>',
    "<details open ontoggle=window.__pwned=6>",
)
RUN_NAME = "run<img src=x onerror=window.__pwned=7>"  # a directory name is data too
#: the fields the probe of issue 52 found inserted unescaped (numbers in a well-formed record)
PROBE_FIELDS = ("step", "num_turns", "horizon", "policy_version", "group_id", "sample_index")
#: what the malformed record (row 2) gets wrong, besides its containers
OTHER_BAD_FIELDS = ("invalid_actions", "prompt_length", "reward", "elapsed_s", "success")
STRING_FIELDS = ("env", "task_id", "episode_id", "status", "error")
#: the evaluation counts of the small records (``eval_episodes.jsonl``), payloads in both rows
EVAL_COUNT_FIELDS = ("parse_failures", "context_tokens")


def payload(i: int) -> str:
    return PAYLOADS[i % len(PAYLOADS)]


def hostile_episodes(seed: int = 3) -> list[dict]:
    """Episodes of ``trajectories_train.jsonl``: row 0 every string hostile (fields and
    messages) with valid numbers and tokens; row 1 the probe's case, :data:`PROBE_FIELDS`
    holding payloads in an otherwise well-formed record; row 2 malformed: containers of the
    wrong type (messages, token ids, turn rewards), ``invalid_actions: "<x>"`` and the other
    numbers payloads; row 3 a well-formed episode; row 4 the probe's headline case alone
    (``step`` holding an ``<img onerror>``, everything else well-formed)."""
    rng = random.Random(seed)
    base = lambda: make_episode(rng, "babyai", "GoToObj-0", 0, 0, 1, 5)  # noqa: E731
    strings = base()
    for i, name in enumerate(STRING_FIELDS):
        strings[name] = payload(i)
    for i, m in enumerate(strings["messages"]):
        m["content"] = payload(i) + " " + m["content"]
    strings["messages"].append({"role": payload(2), "content": payload(3)})
    numbers = base()
    for i, name in enumerate(PROBE_FIELDS):
        numbers[name] = payload(i)
    numbers["turn_rewards"] = [payload(0), payload(1)]  # per-turn rewards: shown as "–"
    numbers["chunk_starts"] = [payload(4)]  # the context cannot be read: unknown
    containers = base()
    for i, name in enumerate(OTHER_BAD_FIELDS):
        containers[name] = payload(i)
    containers.update(invalid_actions="<x>", messages=7, turn_rewards={"a": payload(0)},
                      token_ids=[payload(1), 5], loss_mask="<b>", logprobs=payload(2))
    step_only = base()
    step_only["step"] = payload(0)
    return [strings, numbers, containers, base(), step_only]


def hostile_eval_summaries() -> list[dict]:
    """The small evaluation records (``eval_episodes.jsonl``: no messages or tokens): row 0 the
    counts :data:`EVAL_COUNT_FIELDS` holding payloads as strings, row 1 inside a list and as a
    dict key; every other field well-formed."""
    base = {"env": "babyai", "task_id": "GoToObj-0", "group_id": 0, "sample_index": 0,
            "step": 2, "status": "max_turns", "reward": 0.0, "success": False, "num_turns": 4,
            "invalid_actions": 1}
    strings = {**base, "parse_failures": payload(0), "context_tokens": payload(1)}
    nested = {**base, "parse_failures": [payload(2)], "context_tokens": {payload(3): 1}}
    return [strings, nested]


def write_hostile_run(parent: str) -> str:
    """The hostile run directory under ``parent`` (see the module doc); returns its path."""
    run = os.path.join(parent, RUN_NAME)
    os.makedirs(run)
    config = {"model": {"name": payload(0)}, "env": {"names": payload(1)},
              "learner": {"advantage_estimator": "grpo", payload(2): payload(3)},
              "rollout": {"parser": "react"}, payload(4): {payload(5): 1}}
    summary = {"final_step": payload(0), "mean_step_seconds": payload(1),
               "first_reward": payload(2), "last_reward": payload(3), "finished_step": 1,
               "evals": {"1": {"k": payload(4), "avg_at_k": payload(5),
                               "per_env": {payload(0): {"avg@1": payload(1)}}}}}
    with open(os.path.join(run, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(run, "summary.json"), "w") as f:
        json.dump(summary, f)
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        for step in (1, 2):
            f.write(json.dumps({"step": step, "rollout/mean_reward": 0.5 * step,
                                payload(step): 1.0, "eval/avg@1": payload(0),
                                f"eval/{payload(1)}/avg@1": payload(2)}) + "\n")
        f.write('{"step": Infinity, "rollout/mean_reward": 1}\n{"step": NaN}\n')
    with open(os.path.join(run, "trajectories_train.jsonl"), "w") as f:
        for ep in hostile_episodes():
            f.write(json.dumps(ep) + "\n")
        f.write('["not", "an", "object"]\n')
    with open(os.path.join(run, "eval_episodes.jsonl"), "w") as f:
        for ep in hostile_eval_summaries():
            f.write(json.dumps(ep) + "\n")
    rng = random.Random(4)
    with open(os.path.join(run, "trajectories_eval.jsonl"), "w") as f:
        for step in (0, 2):  # two evaluated steps: the before / after view has something
            for s in range(2):
                ep = make_episode(rng, payload(step), payload(s + 1), 0, s, step, 5)
                ep["messages"][-1]["content"] = payload(s + 3)
                f.write(json.dumps(ep) + "\n")
    with open(os.path.join(run, f"eval{payload(0)[:20].replace('/', '')}.json"), "w") as f:
        json.dump({"avg_at_k": payload(1), "step": 2, "k": payload(2),
                   "per_env": {payload(3): {"avg@1": payload(4)}}}, f)
    return run
