"""Experiment configs (ml-collections ``get_config()`` files), importable as a package."""
