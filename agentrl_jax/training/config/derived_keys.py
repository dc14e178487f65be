"""Settings a run derives from another setting instead of taking them twice.

A fact that two sections need is set once: ``learner.temperature`` (what the learner divides the
logits by) is ``rollout.temperature`` (what the sampler used). ``RunConfig`` fills the derived
key from its source (``config.sections.RunConfig.__post_init__``), a config that still sets it is
refused with a one-line hint (``derived_key_problems``), and ``base_config()`` does not list it.
"""

from __future__ import annotations

from typing import Any, Mapping


def learner_temperature(sampling_temperature: float) -> float:
    """The temperature the learner divides the logits by: the sampler's (``rollout.temperature``),
    whose log-probs the ratio and the loss compare with; a greedy sampler (0) reports untempered
    log-probs (``rollout/contract.py``), i.e. temperature 1."""
    return float(sampling_temperature) if sampling_temperature > 0 else 1.0


#: keys of a section that a run's config does not take, as (section, key) -> the key to set
#: instead and why: the run fills them from that key (``RunConfig.__post_init__``), an old config
#: that still sets one is refused with this hint, and ``base_config()`` does not list them
DERIVED_KEYS: dict[tuple[str, str], str] = {
    ("learner", "temperature"): "set rollout.temperature instead (one setting: the learner "
                                "divides the logits by the sampler's temperature)"}


def derived_key_problems(section: str, values: Mapping[str, Any]) -> list[str]:
    """One line per key of ``values`` (the ``section`` of a config) that the run derives."""
    return [f"{section}.{key}: {hint}" for (where, key), hint in DERIVED_KEYS.items()
            if where == section and key in values]
