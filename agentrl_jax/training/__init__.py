"""The RL trainer loop and its schedules."""
