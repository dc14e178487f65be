"""Checks of a run before anything starts: the config against this host, the first prompt's room,
the device memory estimate. Imports the rooms of ``training/`` below it, not ``rl/`` or
``jobs/``."""
