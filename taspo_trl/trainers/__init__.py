"""Trainers: thin glue from TRL's ``GRPOTrainer`` to the rollout and credit modules."""

from .grpo import AgentGRPOConfig, AgentGRPOTrainer, environment_reward
from .taspo import TASPOConfig, TASPOTrainer

CONFIGS = {"grpo": AgentGRPOConfig, "taspo": TASPOConfig}
TRAINERS = {"grpo": AgentGRPOTrainer, "taspo": TASPOTrainer}

__all__ = [
    "CONFIGS",
    "TRAINERS",
    "AgentGRPOConfig",
    "AgentGRPOTrainer",
    "TASPOConfig",
    "TASPOTrainer",
    "environment_reward",
]
