"""BabyAI RL only to the end of its curve (issue 28): ``babyai_grpo_gpu.py`` with a 1,350-s
training budget instead of 360 s, so one run (start-up and both evaluations included) takes
about 25 minutes on one H200.

* ScalingInter-RL 6 -> 13 -> 20 turns with 40 steps a phase (the 360-s config's 15 would put
  most of a long run at 20 turns, where a step costs ~3x one at 6);
* a held-out evaluation every 40 steps (128 test tasks x 4, 20 turns): the curve to its end;
* a checkpoint every 5 steps, and one at a SIGTERM (a GPU call's time limit through
  ``benchmarks/jobs_gpu.sh``'s ``resume`` jobs): the same command resumes a run cut off, and
  ``train.max_seconds`` counts the training of every session, so the budget stays 1,350 s
  however often it was cut (docs/TRAINING.md, "Time budget").

    python3 launch/run.py --config experiments/babyai_grpo_long_gpu.py --workdir runs/long
    bash benchmarks/jobs_gpu.sh --jobs benchmarks/jobs/babyai_long.txt --out runs/long \\
         --results docs/results/long --gpu-ids 0,1,2,3 --budget 575      # three calls
"""

from experiments.babyai_grpo_gpu import get_config as short_config


def long_run(c, max_seconds: float, eval_every: int, steps_per_phase: int):
    """``c`` turned into a resumable long run: its budget, a held-out curve every
    ``eval_every`` steps, a checkpoint every 5 steps (2 kept), ``steps_per_phase`` a phase."""
    c.train.max_seconds = max_seconds
    c.train.save_every = 5
    c.train.keep_checkpoints = 2
    c.train.eval_every = eval_every
    c.horizon.steps_per_phase = steps_per_phase
    return c


def get_config():
    return long_run(short_config(), max_seconds=1350.0, eval_every=40, steps_per_phase=40)
