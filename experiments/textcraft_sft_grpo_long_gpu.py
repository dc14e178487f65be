"""TextCraft SFT -> RL to the end of its curve (issue 28): ``textcraft_sft_grpo_gpu.py`` (GRPO +
ScalingInter-RL from the behaviour-cloned policy, all 118 held-out goals x 4) with a 1,200-s
training budget instead of 110 s; a held-out evaluation every 25 steps (the curve), a checkpoint
every 5 steps, and a SIGTERM (a GPU call's time limit) checkpoints too, so the same command
resumes a run cut off within the same budget (docs/TRAINING.md, "Time budget"). The SFT policy
comes from ``launch/sft.py --config experiments/textcraft_sft_gpu.py`` (its 240 s by default):

    bash benchmarks/jobs_gpu.sh --jobs benchmarks/jobs/textcraft_long.txt --out runs/long \\
         --results docs/results/long --gpu-ids 0,1 --budget 575         # four calls
"""

from experiments.babyai_grpo_long_gpu import long_run
from experiments.textcraft_sft_grpo_gpu import get_config as short_config


def get_config():
    return long_run(short_config(), max_seconds=1200.0, eval_every=25, steps_per_phase=20)
