"""BabyAI (minigrid) as text: a text view of what the agent sees, primitive and macro actions."""
