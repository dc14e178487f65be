"""The jobs besides RL training: evaluation of a policy, SFT, export to Hugging Face, recording
expert episodes. Imports the rooms of ``training/`` below it, never ``rl/``."""
