"""taspo-trl: TASPO and AlignOPSD credit assignment for multi-turn LLM agents, as a plugin for Hugging Face TRL."""

from .rollout import encode_task_prompt, make_rollout_func
from .trainers import AgentGRPOConfig, AgentGRPOTrainer, environment_reward

__version__ = "0.1.0"

__all__ = ["AgentGRPOConfig", "AgentGRPOTrainer", "encode_task_prompt", "environment_reward", "make_rollout_func"]
