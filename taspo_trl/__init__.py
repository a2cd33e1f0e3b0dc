"""taspo-trl: TASPO and AlignOPSD credit assignment for multi-turn LLM agents, as a plugin for Hugging Face TRL.

Names are imported lazily so light entry points (``taspo-alfworld``) don't pay for importing TRL and torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "AgentGRPOConfig": "taspo_trl.trainers.grpo",
    "AgentGRPOTrainer": "taspo_trl.trainers.grpo",
    "environment_reward": "taspo_trl.trainers.grpo",
    "TASPOConfig": "taspo_trl.trainers.taspo",
    "AlignOPSDConfig": "taspo_trl.trainers.alignopsd",
    "AlignOPSDTrainer": "taspo_trl.trainers.alignopsd",
    "TASPOTrainer": "taspo_trl.trainers.taspo",
    "BaselineConfig": "taspo_trl.trainers.baselines",
    "BaselineTrainer": "taspo_trl.trainers.baselines",
    "encode_task_prompt": "taspo_trl.envs.base",
    "as_trl_environment": "taspo_trl.envs.trl_style",
    "make_rollout_func": "taspo_trl.rollout.trl_rollout",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'taspo_trl' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
