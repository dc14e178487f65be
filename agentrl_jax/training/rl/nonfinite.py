"""Stopping a run whose update went non-finite (``learning_rate=1e10``, a loss that overflows).

After each update the trainer looks at what the learner already sends back: the losses and
gradient norms of the step (``actor/pg_loss``, ``actor/grad_norm``, ``critic/vf_loss``, ...)
and ``learner/params_finite`` (every parameter finite after the update, one reduction on the
devices, ``learner/update.py``). One non-finite value stops the run in that step, before the
weights reach the rollout backend and before any checkpoint of them: the last checkpoint is the
last good state, and the same command resumes from it (with a setting changed).
"""

from __future__ import annotations

import math
from typing import Mapping

#: the metric sections whose losses and gradient norms are checked
CHECKED_SECTIONS = ("actor/", "critic/")
#: the endings of the checked metric names (the per-step losses and the gradients' global norm)
CHECKED_ENDINGS = ("loss", "grad_norm", "nll", "entropy")
#: 1.0 when every parameter is finite after the update, else 0.0
PARAMS_FINITE = "learner/params_finite"


def nonfinite_values(metrics: Mapping[str, float]) -> list[str]:
    """The checked metrics of one update that are not finite (``"actor/pg_loss=nan"``), and
    ``"parameters"`` when ``learner/params_finite`` is 0; [] when the update is sound."""
    out = [f"{name}={value}" for name, value in sorted(metrics.items())
           if name.startswith(CHECKED_SECTIONS) and name.endswith(CHECKED_ENDINGS)
           and not math.isfinite(float(value))]
    if PARAMS_FINITE in metrics and not float(metrics[PARAMS_FINITE]) >= 1.0:
        out.append("parameters")
    return out


def nonfinite_message(step: int, values: list[str], saved_step: int | None,
                      workdir: str) -> str:
    """The one line of a run stopped at ``step`` (1-based) by ``values`` (from
    :func:`nonfinite_values`); ``saved_step``: the last checkpoint (None: none yet)."""
    kept = (f"nothing was saved after the checkpoint of step {saved_step}; once a setting is "
            f"changed (e.g. a smaller learner.learning_rate), the same command resumes from it"
            if saved_step else "no checkpoint was saved; once a setting is changed (e.g. a "
            "smaller learner.learning_rate), the same command starts the run again")
    return (f"stopped at step {step}: the update went non-finite ({', '.join(values)}); "
            f"{kept} (workdir {workdir})")
