"""One episode for display: its turns, its token sequence, the loss-mask checks, and a plain-text
rendering.

* :func:`turns` splits the messages into turns: the agent's raw reply, the action the run's
  parser takes from it (``rollout.parser``; exactly what the episode did, since the reply text
  already starts with ``agent.response_prefix``), invalid replies (no parsable action, answered
  with ``INVALID_FORMAT_FEEDBACK``), the turn's reward and the observation that followed.
  Actions the environment rejected are not flagged per turn in the trajectory record (only
  counted in ``invalid_actions``), so they are recognised by the environments' own rejection
  messages (:data:`REJECTION_PATTERNS`) and the count is checked against ``invalid_actions``.
* :func:`token_view` lays out the learner's view: every token id with its loss mask, turn,
  behaviour log-probability and advantage, and :func:`mask_checks` verifies that the trained
  ids are exactly the model's replies (prompt and observations masked; each turn's trained ids
  decode to the reply text).
* :func:`group_advantages` recomputes the advantage of a training episode from its group's
  rewards for the group estimators whose advantage depends only on those
  (``grpo``: ``(R - mean_g) / (std_g + eps)`` with the unbiased std, ``dr_grpo``:
  ``R - mean_g``, ``rloo``: ``n / (n - 1) (R - mean_g)``; groups of one: 0), the learner's
  formulas in ``agentrl_jax.algorithms.advantages``. Trajectory files do not record advantages;
  for other estimators none is shown.
"""

from __future__ import annotations

import math
import re
import textwrap
from typing import Any, Callable, Sequence

import numpy as np

from agentrl_jax.agent.parsing import INVALID_FORMAT_FEEDBACK, ParsedAction, get_parser
from agentrl_jax.viewer.record import context_tokens, count_field, episode_fields, int_field

ERROR_STATUSES = ("env_error", "engine_error")
#: how the environment servers answer an action they do not understand (environments/*/env.py)
REJECTION_PATTERNS = (
    re.compile(r"'.*' is not a valid action here\.", re.S),  # BabyAI
    re.compile(r"^You do not see a [^\n]*\."),  # BabyAI: an object not in view
    re.compile(r"^The episode has ended\."),  # BabyAI, TextCraft: a step after the end
    re.compile(r"^Could not execute "),  # TextCraft
    re.compile(r"^(No known action matches that input\.|Unknown action\.)"),  # ScienceWorld
    re.compile(r"^Invalid action: "),  # MiniWoB++ (web navigation), deep search
)
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "drgrpo", "rloo")


def parser_for(name: str | None) -> Callable[[str], ParsedAction]:
    """The run's action parser (``react`` when the name is missing or unknown)."""
    try:
        return get_parser(name or "react")
    except ValueError:  # UnknownNameError
        return get_parser("react")


def turns(ep: dict[str, Any], parser: Callable[[str], ParsedAction]) -> dict[str, Any]:
    """``{system, first_observation, turns: [...], warnings: [...]}``.

    Each turn: ``index``, ``reply`` (the assistant message), ``action`` (parsed, or ``None``),
    ``invalid`` (the reply had no usable action), ``invalid_reason``, ``rejected`` (the
    environment answered with its rejection message), ``reward`` (the turn's environment
    reward; ``None`` when not recorded), ``observation`` (the next user message; ``None`` after
    the last turn) and ``feedback`` (the observation is the invalid-format feedback rather than
    the environment's answer). ``format_invalid`` / ``env_rejected`` count them;
    ``unlocated_invalid``: recorded ``invalid_actions`` not matched to a turn (a rejection on
    the last turn has no observation to show it, or an unknown message).
    """
    raw = ep.get("messages")
    messages = [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []
    rewards = ep.get("turn_rewards")
    rewards = rewards if isinstance(rewards, list) else []
    out: dict[str, Any] = {"system": None, "first_observation": None, "turns": [],
                           "warnings": []}
    i = 0
    if i < len(messages) and messages[i].get("role") == "system":
        out["system"] = str(messages[i].get("content") or "")
        i += 1
    if i < len(messages) and messages[i].get("role") == "user":
        out["first_observation"] = str(messages[i].get("content") or "")
        i += 1
    k = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant":
            out["warnings"].append(f"message {i} has role {m.get('role')!r} where an assistant "
                                   "reply was expected")
            i += 1
            continue
        reply = str(m.get("content") or "")
        parsed = parser(reply)
        nxt = messages[i + 1] if i + 1 < len(messages) else None
        observation = (str(nxt.get("content") or "")
                       if nxt is not None and nxt.get("role") == "user" else None)
        reward = rewards[k] if k < len(rewards) else None
        rejected = (parsed.action is not None and observation is not None
                    and any(p.search(observation) for p in REJECTION_PATTERNS))
        out["turns"].append({
            "index": k, "reply": reply, "action": parsed.action,
            "invalid": parsed.action is None, "invalid_reason": parsed.error,
            "rejected": rejected,
            "reward": float(reward) if isinstance(reward, (int, float)) else None,
            "observation": observation,
            "feedback": observation == INVALID_FORMAT_FEEDBACK})
        i += 2 if observation is not None else 1
        k += 1
    format_invalid = sum(t["invalid"] for t in out["turns"])
    rejected = sum(t["rejected"] for t in out["turns"])
    out["format_invalid"] = format_invalid
    out["env_rejected"] = rejected
    recorded = int_field(ep, "invalid_actions")
    out["unlocated_invalid"] = max(recorded - format_invalid - rejected, 0)
    return out


def group_advantages(rewards: Sequence[float], trained: Sequence[bool], estimator: str,
                     eps: float = 1e-6) -> np.ndarray | None:
    """Per-episode advantage of a group (every generated token of an episode gets it).

    ``rewards [G]`` outcome scores; ``trained [G]``: the episode has generated tokens and is in
    the update (error episodes are not); untrained members are left out of the statistics and
    get NaN. ``None`` for estimators this cannot recompute (see the module docstring).
    """
    name = estimator.lower().replace("-", "_")
    if name not in GROUP_ESTIMATORS:
        return None
    r = np.asarray(rewards, np.float64)
    valid = np.asarray(trained, bool)
    out = np.full(len(r), np.nan)
    n = int(valid.sum())
    if n == 0:
        return out
    if n < 2:
        out[valid] = 0.0
        return out
    mean = r[valid].mean()
    if name == "grpo":
        out[valid] = (r[valid] - mean) / (r[valid].std(ddof=1) + eps)
    elif name in ("dr_grpo", "drgrpo"):
        out[valid] = r[valid] - mean
    else:  # rloo
        out[valid] = n / (n - 1) * (r[valid] - mean)
    return out


def token_view(ep: dict[str, Any], strings: list[str] | None,
               advantage: float | None = None) -> dict[str, Any]:
    """The token sequence as the learner saw it: ``ids``, ``strings`` (each id decoded alone;
    ``None`` without a tokenizer), ``mask`` (loss mask), ``turn`` (-1: prompt), ``logprob``
    (behaviour log-probability; ``None`` where the mask is 0), ``advantage`` (the episode's
    advantage on trained ids, ``None`` elsewhere or when unknown)."""
    ids = [int(x) for x in ep.get("token_ids") or []]
    n = len(ids)
    mask = [int(bool(x)) for x in (ep.get("loss_mask") or [])][:n]
    mask += [0] * (n - len(mask))
    turn = [int(x) for x in (ep.get("turn_ids") or [])][:n]
    turn += [-1] * (n - len(turn))
    lps = list(ep.get("logprobs") or [])[:n]
    lps += [0.0] * (n - len(lps))
    logprob = [float(lp) if m and isinstance(lp, (int, float)) and math.isfinite(lp) else None
               for lp, m in zip(lps, mask)]
    adv = [advantage if (m and advantage is not None and math.isfinite(advantage)) else None
           for m in mask]
    return {"ids": ids, "strings": strings, "mask": mask, "turn": turn, "logprob": logprob,
            "advantage": adv, "n_tokens": n, "n_trained": sum(mask),
            "prompt_length": int_field(ep, "prompt_length")}


def mask_checks(ep: dict[str, Any], decode: Callable[[list[int]], str | None] | None,
                response_prefix: str = "") -> list[dict[str, Any]]:
    """Checks that only the model's own tokens are trained, each ``{name, ok, detail}``:

    * ``prompt untrained``: no id of the prompt (turn -1, the first ``prompt_length`` ids) has
      loss mask 1;
    * ``one trained span per turn``: within each turn the trained ids are one run at the start
      of the turn (the reply), followed only by untrained ids (the observation);
    * ``trained spans are the replies``: each turn's trained ids, decoded, equal that turn's
      assistant message minus ``response_prefix`` (needs the tokenizer; skipped without).
    """
    ids = [int(x) for x in ep.get("token_ids") or []]
    mask = [int(bool(x)) for x in (ep.get("loss_mask") or [])]
    turn = [int(x) for x in (ep.get("turn_ids") or [])]
    checks: list[dict[str, Any]] = []
    if not ids or len(mask) != len(ids) or len(turn) != len(ids):
        checks.append({"name": "record complete", "ok": False,
                       "detail": f"token_ids {len(ids)}, loss_mask {len(mask)}, turn_ids "
                                 f"{len(turn)}: not recorded or not aligned"})
        return checks
    plen = int_field(ep, "prompt_length")
    bad_prompt = [i for i in range(len(ids)) if mask[i] and (turn[i] < 0 or i < plen)]
    checks.append({"name": "prompt untrained", "ok": not bad_prompt,
                   "detail": "no prompt id has loss mask 1" if not bad_prompt else
                   f"{len(bad_prompt)} prompt ids have loss mask 1 (first at {bad_prompt[0]})"})
    spans: dict[int, list[int]] = {}
    bad_turns = []
    for k in sorted({t for t in turn if t >= 0}):
        pos = [i for i in range(len(ids)) if turn[i] == k]
        trained = [i for i in pos if mask[i]]
        spans[k] = [ids[i] for i in trained]
        if trained and trained != pos[:len(trained)]:
            bad_turns.append(k)
    checks.append({"name": "one trained span per turn", "ok": not bad_turns,
                   "detail": "each turn: the reply's ids (trained), then the observation's "
                             "(untrained)" if not bad_turns else
                   f"turns {bad_turns[:10]} have trained ids after untrained ones"})
    if decode is None:
        checks.append({"name": "trained spans are the replies", "ok": None,
                       "detail": "needs the run's tokenizer (not available)"})
        return checks
    messages = ep.get("messages") if isinstance(ep.get("messages"), list) else []
    replies = [str(m.get("content") or "") for m in messages
               if isinstance(m, dict) and m.get("role") == "assistant"]
    mismatched = []
    for k, reply in enumerate(replies):
        want = reply[len(response_prefix):] if reply.startswith(response_prefix) else reply
        got = decode(spans.get(k, []))
        if got is None or got != want:
            mismatched.append((k, got, want))
    if len(replies) != len(spans):
        mismatched.append((-1, f"{len(spans)} turns with ids", f"{len(replies)} replies"))
    checks.append({"name": "trained spans are the replies", "ok": not mismatched,
                   "detail": (f"all {len(replies)} replies: decoded trained ids == reply text"
                              if not mismatched else
                              f"{len(mismatched)} mismatches; first: turn {mismatched[0][0]}: "
                              f"{mismatched[0][1]!r} vs {mismatched[0][2]!r}")})
    return checks


def known(value: int | None) -> str:
    """A count as text, ``unknown`` when the record does not say (``None``)."""
    return "unknown" if value is None else str(value)


def render_text(ep: dict[str, Any], parser: Callable[[str], ParsedAction] | None = None,
                width: int = 100, system: bool = False) -> str:
    """A turn-by-turn plain-text rendering of an episode (notebooks, terminals): a header of
    its summary fields (the evaluation counts ``unknown`` when not recorded), its malformed
    fields, then each turn."""
    parser = parser or parser_for("react")
    view = turns(ep, parser)
    wrap = lambda s, ind="    ": "\n".join(  # noqa: E731
        textwrap.fill(line, width, initial_indent=ind, subsequent_indent=ind) or ind
        for line in str(s).splitlines() or [""])
    fields, malformed = episode_fields(ep)
    reward = fields.get("reward")
    lines = [(f"{fields.get('env')} / {fields.get('task_id')}  step {fields.get('step', '-')}  "
              f"status {fields.get('status')}  "
              f"reward {'-' if reward is None else f'{float(reward):.3f}'}  "
              f"turns {fields.get('num_turns')}  "
              f"invalid actions {fields.get('invalid_actions', 0)}"),
             (f"parse failures {known(count_field(ep, 'parse_failures'))}  "
              f"context tokens {known(context_tokens(ep))}")]
    lines += [f"[malformed] {name}: {why}" for name, why in malformed.items()]
    if system and view["system"]:
        lines += ["[system]", wrap(view["system"])]
    if view["first_observation"] is not None:
        lines += ["[observation 0]", wrap(view["first_observation"])]
    for t in view["turns"]:
        reward = "-" if t["reward"] is None else f"{t['reward']:.3f}"
        lines.append(f"[turn {t['index'] + 1}] reward {reward}")
        lines.append(wrap(t["reply"], "  > "))
        lines.append(f"    INVALID ({t['invalid_reason']})" if t["invalid"] else
                     f"    action: {t['action']}" + ("   [REJECTED by the environment]"
                                                   if t["rejected"] else ""))
        if t["observation"] is not None:
            lines.append(wrap(t["observation"]))
    if fields.get("error"):
        lines.append(f"[error] {fields['error']}")
    return "\n".join(lines)
