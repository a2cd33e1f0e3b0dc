"""Trainers: thin glue from TRL's ``GRPOTrainer`` to the rollout and credit modules."""

from .grpo import AgentGRPOConfig, AgentGRPOTrainer, environment_reward

CONFIGS = {"grpo": AgentGRPOConfig}
TRAINERS = {"grpo": AgentGRPOTrainer}

__all__ = ["AgentGRPOConfig", "AgentGRPOTrainer", "CONFIGS", "TRAINERS", "environment_reward"]
