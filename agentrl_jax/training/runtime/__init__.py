"""What a job runs on: environment servers and the rollout backend (``services``), the policy and
its learner and checkpoints (``policy``), the JAX processes of a run, host memory. Imports
``training/config/``, ``training/evaluation/`` and ``training/outputs/``."""
