"""The paper's evaluation metrics (Avg@k, Pass@k, success rate) and scoring held-out episodes.
Imports ``training/config/`` at most."""
