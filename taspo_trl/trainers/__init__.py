"""Trainers: thin glue from TRL's ``GRPOTrainer`` to the rollout and credit modules."""

from .alignopsd import AlignOPSDConfig, AlignOPSDTrainer
from .grpo import AgentGRPOConfig, AgentGRPOTrainer, environment_reward
from .taspo import TASPOConfig, TASPOTrainer

CONFIGS = {"grpo": AgentGRPOConfig, "taspo": TASPOConfig, "alignopsd": AlignOPSDConfig}
TRAINERS = {"grpo": AgentGRPOTrainer, "taspo": TASPOTrainer, "alignopsd": AlignOPSDTrainer}

__all__ = [
    "CONFIGS",
    "TRAINERS",
    "AgentGRPOConfig",
    "AlignOPSDConfig",
    "AlignOPSDTrainer",
    "AgentGRPOTrainer",
    "TASPOConfig",
    "TASPOTrainer",
    "environment_reward",
]
