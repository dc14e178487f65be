"""The typed run config: its sections and their defaults, the ``ConfigDict`` of experiment files,
the ``--config`` command line, derived keys. Imports nothing else of ``training/``."""
