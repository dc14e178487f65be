"""Text environments served over one HTTP protocol (see docs/ENVIRONMENTS.md)."""
