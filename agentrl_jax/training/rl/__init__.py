"""The RL training loop: the ``Trainer``, its steps, batches, horizon schedule, task sampling and
the checks that stop a run. Imports the rooms of ``training/`` below it, never ``jobs/``."""
