"""What a run writes and prints: its workdir's files (config, logs, summary, report, lock), write
failures, progress lines. Imports ``training/config/`` and ``training/evaluation/``."""
