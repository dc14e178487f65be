"""The Markdown table of ``family_shortfall.py``'s summary: one block of rows per family (its
best from-scratch arm, step 0, the trivial tasks apart, the CPU step-0 rows), the notes, and
every arm seed by seed."""

from __future__ import annotations

import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(os.path.dirname(HERE)))
from family_arms import FAMILY_NAMES

from environments.miniwob.family import TRIVIAL_TASKS


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _seeds_text(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def _ends(e: dict | None) -> str:
    if e is None:
        return "-"
    return " / ".join(_pct(e[k]) for k in ("success", "turn_limit", "context_limit", "other"))


def _gap_text(gap: float) -> str:
    """Points still missing (``+x pts``), or ``met (x pts above)`` once the target is reached."""
    return f"met ({abs(100 * gap):.1f} pts above)" if gap <= 0 else f"{100 * gap:+.1f} pts"


def _row(name: str, target: str, what: str, score: str, gap: str, e: dict) -> str:
    """One row of the headline table from an evaluation (:func:`pooled`) or a CPU row."""
    tokens = "-" if e["tokens_mean"] is None else f"{e['tokens_mean']:,.0f} / {e['tokens_max']:,}"
    if e.get("diagnosed_seeds") and e["diagnosed_seeds"] < e["seeds"]:
        tokens += f" ({e['diagnosed_seeds']} of {e['seeds']} seeds)"
    parse = _pct(e["parse_failures_per_turn"])
    return (
        f"| {name} | {target} | {what} | {score} | {gap} | {_pct(e['valid_action_share'])} |"
        f" {_pct(e['reward_rate'])} | {tokens} | {_ends(e.get('endings'))} | {parse} |"
    )


def _family_rows(name: str, fs: dict[str, Any]) -> list[str]:
    """The headline table's rows of one family: its best arm's final evaluation and step 0
    (else every arm's evaluations), web navigation's trivial tasks apart, the CPU step 0."""
    t = fs["target"]
    rows: list[tuple[str, str, str, dict]] = []
    if fs["best"] is not None:
        best = next(  # an arm's name may repeat on another split
            a for a in fs["arms"] if (a["arm"], a["split"]) == (fs["best"], fs["best_split"])
        )
        what = f"{best['arm']} ({best['split']})"
        score = (
            f"gain {100 * fs['best_value']:+.1f} pts"
            if t["kind"] == "gain"
            else _num(fs["best_value"])
        )
        rows.append(
            (
                f"{what}, final, {_seeds_text(best['final']['seeds'])}",
                score,
                _gap_text(fs["gap"]),
                best["final"],
            )
        )
        rows.append(("the same, step 0", _num(best["first"]["headline"]), "", best["first"]))
        for which in ("final", "first"):
            if "trivial" in best[which]:
                rows.append(
                    (
                        (
                            f"the same, {'step 0' if which == 'first' else 'final'}: the "
                            "trivial tasks alone"
                        ),
                        _num(best[which]["trivial"]["avg"]),
                        "",
                        best[which]["trivial"],
                    )
                )
    else:
        gap = f"{100 * fs['gap_from_step0']:+.1f} pts from step 0"
        for a in fs["arms"]:
            note = "" if a["counts"] else f"; {a['note']}"
            rows.append(
                (
                    (
                        f"{a['arm']} ({a['split']}), step 0, "
                        f"{_seeds_text(a['first']['seeds'])}{note}"
                    ),
                    _num(a["first"]["headline"]),
                    gap if a["counts"] else "",
                    a["first"],
                )
            )
            if "final" in a:
                rows.append(
                    (
                        f"the same, final, {_seeds_text(a['final']['seeds'])}",
                        _num(a["final"]["headline"]),
                        "",
                        a["final"],
                    )
                )
        if not any(a["counts"] for a in fs["arms"]) and rows:
            rows[0] = rows[0][:2] + (gap,) + rows[0][3:]
    for c in fs["cpu_step0"]:
        score = _num(c["avg"])
        if "non_trivial" in c:
            score = f"{_num(c['non_trivial']['avg'])} (all tasks {_num(c['avg'])})"
        rows.append(
            (
                (
                    f"CPU step 0, `{c['style']}` ({c['episodes']} {c['split']} tasks x 1, "
                    f"{c['turn_horizon']} turns)"
                ),
                score,
                "",
                c,
            )
        )
    return [
        _row(name if i == 0 else "", t["text"] if i == 0 else "", *r) for i, r in enumerate(rows)
    ]


def _arm_row(name: str, a: dict[str, Any]) -> str:
    """One row of the arms table: each seed's headline score and its last training phase (an
    arm not counted toward the target says why after its split)."""
    seeds = ", ".join(
        _num(r["first"]["headline"])
        + " -> "
        + (_num(r["final"]["headline"]) if "final" in r else "(none)")
        for r in a["runs"]
    )
    train = "; ".join(
        f"{_pct(x['success_rate'])} / {_pct(x['flat_group_share'])} / "
        f"{_pct(x['context_limit_share'])} / "
        + (
            "-"
            if x["row_tokens_mean"] is None
            else f"{x['row_tokens_mean']:,.0f}, {x['row_tokens_max']:,}"
        )
        for x in (r["training"] for r in a["runs"])
        if x
    )
    counted = "" if a["counts"] else f"; not counted: {a['note']}"
    return (
        f"| {name} | {a['arm']} ({a['split']}{counted}) | {a['seeds_with_final']} of "
        f"{len(a['runs'])} | {seeds} | {train} |"
    )


def markdown(summary: dict[str, Any]) -> str:
    """The headline table (a block of rows per family), then every arm's seeds."""
    head = [
        (
            "| family | target | from scratch: what | score | gap | valid actions / turn | "
            "score > 0 | context tokens, mean / max | ended: success / turn limit / context / "
            "other | parser failures / turn |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    arms = [
        (
            "| family | arm (split) | seeds with a final eval | headline score: step 0 -> final, "
            "per seed | training, last phase: success / flat groups / context-limit endings / "
            "learner row tokens (mean, max) |"
        ),
        "|---|---|---|---|---|",
    ]
    for family, fs in summary["families"].items():
        name = FAMILY_NAMES[family]
        head += _family_rows(name, fs)
        arms += [_arm_row(name, a) for a in fs["arms"]]
    notes = [
        (
            "Web navigation's score and the numbers of its rows are over the non-trivial "
            f"tasks (all but {', '.join(TRIVIAL_TASKS)}) unless a row says otherwise; a CPU "
            "row's other columns are over all its tasks. `-`: not in the committed files."
        )
    ]
    return "\n".join(head + [""] + notes + [""] + arms) + "\n"
