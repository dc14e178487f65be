"""Experiment configs, one file per environment family with named variants
(``--config experiments/babyai.py:grpo_gpu``; ``common.py`` says how a file is laid out),
importable as a package."""
