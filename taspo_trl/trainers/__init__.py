"""Trainers: thin glue from TRL's ``GRPOTrainer`` to the rollout and credit modules.

``CONFIGS``/``TRAINERS`` map a recipe's ``method:`` to its config class and trainer: ``grpo``, ``taspo``,
``alignopsd`` and every comparison method of ``baselines.BASELINES`` (one ``BaselineTrainer``).
"""

from .alignopsd import AlignOPSDConfig, AlignOPSDTrainer
from .baselines import BASELINES, BaselineConfig, BaselineTrainer
from .grpo import AgentGRPOConfig, AgentGRPOTrainer, environment_reward
from .taspo import TASPOConfig, TASPOTrainer

CONFIGS = {
    "grpo": AgentGRPOConfig,
    "taspo": TASPOConfig,
    "alignopsd": AlignOPSDConfig,
    **{name: BaselineConfig for name in BASELINES},
}
TRAINERS = {
    "grpo": AgentGRPOTrainer,
    "taspo": TASPOTrainer,
    "alignopsd": AlignOPSDTrainer,
    **{name: BaselineTrainer for name in BASELINES},
}

__all__ = [
    "BASELINES",
    "CONFIGS",
    "TRAINERS",
    "AgentGRPOConfig",
    "AgentGRPOTrainer",
    "AlignOPSDConfig",
    "AlignOPSDTrainer",
    "BaselineConfig",
    "BaselineTrainer",
    "TASPOConfig",
    "TASPOTrainer",
    "environment_reward",
]
