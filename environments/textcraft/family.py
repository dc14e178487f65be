"""The TextCraft family as registered in ``environments.registry``."""

from environments.textcraft.expert import TextCraftExpertPolicy
from environments.registry import Family
from environments.textcraft.catalog import TextCraftCatalog
from environments.textcraft.env import TextCraftEnv

# A TextCraft step takes microseconds: serve it on the event loop.
FAMILY = Family(name="textcraft", env_factory=TextCraftEnv, catalog_factory=TextCraftCatalog, inline=True,
                expert=TextCraftExpertPolicy, action_example="get 1 oak log")
