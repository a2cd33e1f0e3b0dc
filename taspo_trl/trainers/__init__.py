"""Trainers: thin glue from TRL's ``GRPOTrainer`` to the rollout and credit modules.

``CONFIGS``/``TRAINERS`` map a recipe's ``method:`` to its config class and trainer: ``grpo``, ``taspo``,
``alignopsd`` and every comparison method of ``baselines.BASELINES`` (one ``BaselineTrainer``). ``method_classes``
also resolves a credit method registered later (``credit.registry.register_credit``), which ``BaselineTrainer``
runs.
"""

from ..credit.registry import CREDIT_METHODS
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


def method_classes(method: str) -> tuple[type, type]:
    """The config class and trainer of a recipe's ``method:``; KeyError when nothing has that name."""
    if method in CONFIGS:
        return CONFIGS[method], TRAINERS[method]
    if method in CREDIT_METHODS:
        return BaselineConfig, BaselineTrainer
    raise KeyError(method)


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
    "method_classes",
]
