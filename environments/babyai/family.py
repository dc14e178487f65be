"""The BabyAI family as registered in ``environments.registry``."""

from environments.babyai.catalog import BabyAICatalog
from environments.babyai.env import BabyAIEnv
from environments.babyai.expert import BabyAIExpertPolicy
from environments.babyai.macro_expert import BabyAIMacroExpertPolicy
from environments.registry import Family

# A BabyAI step is a few hundred microseconds of pure Python: serve it on the event loop.
FAMILY = Family(name="babyai", env_factory=BabyAIEnv, catalog_factory=BabyAICatalog, inline=True,
                expert=BabyAIExpertPolicy,
                expert_variants={"babyai_macro": BabyAIMacroExpertPolicy},
                action_example="turn left")
