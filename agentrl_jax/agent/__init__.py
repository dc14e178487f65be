"""The agent side of multi-turn RL: prompts, action parsing, token-exact episodes, actor pool."""
