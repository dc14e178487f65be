"""The jobs of the library: the RL training loop, evaluation, SFT, export, expert recording.

Sub-packages by job, each importing only those listed before it (``tests/test_architecture.py``
checks it; ``rl`` and ``jobs`` never import each other): ``config`` (the typed run config),
``evaluation`` (the paper's metrics), ``outputs`` (what a run writes and prints), ``runtime``
(services, policy, processes), ``preflight`` (checks before anything starts), ``rl`` (the RL
training loop) and ``jobs`` (evaluation, SFT, export, expert recording)."""
