"""The jobs besides RL training: evaluation of a policy, SFT, export to Hugging Face, recording
expert episodes. Never imports ``training.rl``."""
