"""The runs and targets ``family_shortfall.py`` reads: issue 47's target per family
(:data:`TARGETS`), the from-scratch arms and their committed run folders (:data:`ARMS`), the
step-0 CPU measurements (:data:`CPU_STEP0`) and the diagnosis files of full evaluation
trajectories (:data:`DIAGNOSIS_FILES`). Paths are relative to the repository root."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Target:
    """One family's target: ``kind`` "avg" (final headline Avg@k >= ``value``) or "gain"
    (final - step-0 headline Avg@k >= ``value``), over ``tasks`` ("all" or "non_trivial")."""

    kind: str
    value: float
    tasks: str
    text: str


@dataclasses.dataclass(frozen=True)
class Arm:
    """A from-scratch recipe: its run folders (one per training seed), the split it was
    evaluated on and whether it counts toward the target (``counts``; False: ``note`` says why,
    e.g. not the target's tasks, or a score the environment's option order gives away)."""

    family: str
    name: str
    runs: tuple[str, ...]
    split: str
    counts: bool = True
    note: str = ""


TARGETS: dict[str, Target] = {
    "babyai": Target("avg", 0.80, "all", "Avg@4 >= 0.80"),
    "textcraft": Target("avg", 0.40, "all", "Avg@4 >= 0.40"),
    "scienceworld": Target("gain", 0.10, "all", "score +10 points over step 0"),
    "webnav": Target("avg", 0.40, "non_trivial", "Avg@4 >= 0.40 on the non-trivial tasks"),
    "deepsearch": Target("avg", 0.30, "all", "Avg@4 >= 0.30 on the new tasks"),
}
FAMILY_NAMES = {
    "babyai": "BabyAI",
    "textcraft": "TextCraft",
    "scienceworld": "ScienceWorld",
    "webnav": "web navigation",
    "deepsearch": "deep search",
}


def _seeds(stem: str, n: int = 3) -> tuple[str, ...]:
    """``stem``, ``stem_s1`` .. ``stem_s{n-1}``."""
    return (stem,) + tuple(f"{stem}_s{i}" for i in range(1, n))


def _numbered(stem: str, n: int = 3) -> tuple[str, ...]:
    """``stem_s0`` .. ``stem_s{n-1}``."""
    return tuple(f"{stem}_s{i}" for i in range(n))


ARMS: tuple[Arm, ...] = (
    Arm(
        "babyai",
        "grpo_gpu, ScalingInter-RL 6->13->20 (360 s)",
        _seeds("results/table/babyai_grpo"),
        "test",
    ),
    Arm("babyai", "fixed 6 turns (360 s)", _seeds("results/table/babyai_fixed6"), "test"),
    Arm("babyai", "fixed 20 turns (360 s)", _seeds("results/table/babyai_fixed20"), "test"),
    Arm("babyai", "free text, 45 steps", _seeds("results/choice_dev/babyai_action_dev"), "dev"),
    Arm(
        "babyai",
        "lettered choices, 45 steps",
        _seeds("results/choice_dev/babyai_choice_dev"),
        "dev",
    ),
    Arm(
        "babyai",
        "choice restricted to letters, 45 steps",
        _seeds("results/choice_scratch/babyai_choicer_dev"),
        "dev",
    ),
    Arm(
        "babyai",
        "4-turn history window, 45 steps",
        _seeds("results/history_dev/babyai_window4_dev"),
        "dev",
    ),
    Arm(
        "babyai",
        "bf16 learner, 45 steps",
        ("results/bf16_learner_dev/babyai_bf16_learner_dev",),
        "dev",
    ),
    *(
        Arm("babyai", f"{what}, 120 equal steps", _numbered(f"results/scaling_equal_steps/{stem}"),
            "test")
        for what, stem in (
            ("ScalingInter-RL 6->13->20", "babyai_eq_scaling"),
            ("fixed 20 turns", "babyai_eq_fixed20"),
            ("GiGPO, ScalingInter-RL 6->13->20", "babyai_eq_gigpo"),
        )
    ),
    Arm(
        "textcraft",
        "choice restricted to letters, goal-first option order, 45 steps",
        _numbered("results/textcraft_choice_test/textcraft_choice_test"),
        "test",
        counts=False,
        note="the server lists the goal's craft first: always the first option, no model, "
        "scores 0.739",
    ),
    *(
        Arm("textcraft", f"{what}, goal-first option order, 120 equal steps",
            _numbered(f"results/scaling_equal_steps_textcraft/{stem}"), "test", counts=False,
            note="the goal-first option order, as above")
        for what, stem in (
            ("ScalingInter-RL 10->20->30", "textcraft_eq_scaling"),
            ("fixed 10 turns", "textcraft_eq_fixed10"),
            ("fixed 30 turns", "textcraft_eq_fixed30"),
        )
    ),
    Arm(
        "textcraft",
        "choice restricted to letters, options shuffled each turn, 45 steps",
        _numbered("results/textcraft_shuffled_test/textcraft_shuffled_test"),
        "test",
    ),
    Arm(
        "textcraft",
        "options shuffled each turn, goals drawn by learnability (rate 1), 45 steps",
        _numbered("results/textcraft_shuffled_learn_dev/textcraft_shuffled_learn_dev"),
        "dev",
    ),
    Arm(
        "textcraft",
        "grpo_gpu before each family had its own example action (420 s, shared GPU)",
        ("results/textcraft_shared_gpu",),
        "test",
    ),
    Arm(
        "scienceworld",
        "grpo_gpu, free text (cut before its final evaluation)",
        ("results/families_gpu/sciworld_grpo",),
        "test",
    ),
    Arm(
        "scienceworld",
        "lettered choices (26 listed), 45 steps",
        (
            "results/sciworld_choice_dev/sciworld_choice_dev_s0",
            "results/sciworld_choice_dev/sciworld_choice_dev_s1",
            "results/sciworld_choice_dev/sciworld_choice_dev_s2",
        ),
        "dev",
    ),
    Arm(
        "webnav",
        "grpo_gpu, free text (360 s; seed 1 cut before its final evaluation)",
        ("results/webnav/webnav_grpo", "results/webnav/webnav_grpo_s1"),
        "test",
    ),
    Arm(
        "webnav",
        "choice restricted to letters, the page's option order, 45 steps",
        _numbered("results/webnav_choice_dev/webnav_choice_dev"),
        "dev",
    ),
    Arm(
        "webnav",
        "choice restricted to letters, options shuffled each turn, 45 steps",
        _numbered("results/webnav_choice_dev/webnav_shuffled_dev"),
        "dev",
    ),
    Arm(
        "webnav",
        "choice restricted to letters, the page's option order, 45 steps",
        _numbered("results/webnav_choice_test/webnav_choice_test"),
        "test",
    ),
    Arm(
        "webnav",
        "choice restricted to letters, options shuffled each turn, 45 steps",
        _numbered("results/webnav_choice_test/webnav_shuffled_test"),
        "test",
        note="seed 0 on one H200 (tree 37945b4), seeds 1 and 2 on one H100 (tree 3226759)",
    ),
    Arm(
        "deepsearch",
        "grpo_gpu, free text, old lookup task set (100 s)",
        (
            "results/families_gpu/deepsearch_grpo",
            "results/table/deepsearch_grpo_s1",
            "results/table/deepsearch_grpo_s2",
        ),
        "test",
        counts=False,
        note="old lookup task set (wiki- ids), not the target's",
    ),
    Arm(
        "deepsearch",
        "choice restricted to letters, 10 turns, 45 steps",
        _seeds("results/choice_scratch/deepsearch_choicer_dev"),
        "dev",
    ),
    Arm(
        "deepsearch",
        "choice restricted to letters, options shuffled, 10 turns, 45 steps",
        _seeds("results/deepsearch_shuffled_dev/deepsearch_shuffled_dev"),
        "dev",
    ),
    Arm(
        "deepsearch",
        "options shuffled, evidence reward 0.3 (training only), 10 turns, 45 steps",
        _seeds("results/deepsearch_evidence_dev/deepsearch_evidence_dev"),
        "dev",
    ),
    Arm(
        "deepsearch",
        "options shuffled, evidence reward 0.3 on the answer's article only, 10 turns, 45 steps",
        _seeds("results/deepsearch_answer_evidence_dev/deepsearch_answer_evidence_dev"),
        "dev",
    ),
)

#: per family, the step-0 CPU measurements (file, style): the free-text recipe, then the
#: family's ``choice_gpu`` arm (each turn restricted to its own options' letters where measured)
CPU_STEP0: dict[str, tuple[tuple[str, str], ...]] = {
    "babyai": (
        ("results/choice_step0_cpu/babyai_train.json", "recipe"),
        ("results/choice_step0_cpu/babyai_train_option_limits.json", "choice_option_limits"),
    ),
    "textcraft": (
        ("results/choice_step0_cpu/textcraft_train.json", "recipe"),
        ("results/choice_step0_cpu/textcraft_train_option_limits.json", "choice_option_limits"),
    ),
    "scienceworld": (
        ("results/choice_step0_cpu/sciworld_train.json", "recipe"),
        (
            "results/choice_step0_cpu/sciworld_train_10turns_options_only.json",
            "choice_options_only",
        ),
    ),
    "webnav": (
        ("results/choice_step0_cpu/webnav_train.json", "recipe"),
        ("results/choice_step0_cpu/webnav_train_option_limits.json", "choice_option_limits"),
    ),
    "deepsearch": (
        ("results/choice_step0_cpu/deepsearch_train.json", "recipe"),
        ("results/choice_step0_cpu/deepsearch_train_option_limits.json", "choice_option_limits"),
    ),
}

#: ``episode_diagnosis.py`` outputs on full evaluation trajectories: {path: {step: summary}}
#: keyed by the trajectory path, whose parent folder name is the run's name in the same
#: ``results/`` folder as the diagnosis file
DIAGNOSIS_FILES = (
    "results/families_gpu/diagnosis_wave1.json",
    "results/families_gpu/diagnosis_deepsearch.json",
)
