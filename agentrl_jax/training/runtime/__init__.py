"""What a job runs on: environment servers and the rollout backend (``services``), the policy and
its learner and checkpoints (``policy``), the JAX processes of a run, host memory. Imports
``training.config.experiment``, ``training.evaluation.held_out`` and ``training.outputs``."""
