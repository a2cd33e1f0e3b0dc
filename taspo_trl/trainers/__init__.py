"""Trainers: thin glue from TRL's ``GRPOTrainer`` to the rollout and credit modules.

A recipe's ``method:`` names a trainer of its own (``TRAINER_METHODS``: ``grpo``, ``taspo``, ``alignopsd``) or a
credit method of ``credit.registry`` (the comparison methods and any registered later with ``register_credit``),
which ``BaselineTrainer`` runs; ``method_classes`` resolves either, ``method_names`` lists both.
"""

from ..credit.registry import CREDIT_METHODS
from .alignopsd import AlignOPSDConfig, AlignOPSDTrainer
from .baselines import BaselineConfig, BaselineTrainer
from .grpo import AgentGRPOConfig, AgentGRPOTrainer, environment_reward
from .taspo import TASPOConfig, TASPOTrainer

TRAINER_METHODS = {
    "grpo": (AgentGRPOConfig, AgentGRPOTrainer),
    "taspo": (TASPOConfig, TASPOTrainer),
    "alignopsd": (AlignOPSDConfig, AlignOPSDTrainer),
}
"""The methods with a trainer of their own: name -> (config class, trainer class)."""


def method_classes(method: str) -> tuple[type, type]:
    """The config class and trainer of a recipe's ``method:``; KeyError when nothing has that name."""
    if method in TRAINER_METHODS:
        return TRAINER_METHODS[method]
    if method in CREDIT_METHODS:
        return BaselineConfig, BaselineTrainer
    raise KeyError(method)


def method_settings(method: str) -> dict[str, str]:
    """The config settings that select ``method`` within its config class: ``{"baseline": method}`` for a credit
    method (``BaselineConfig`` runs all of them), none for a trainer of its own or another name."""
    return {"baseline": method} if method in CREDIT_METHODS else {}


def method_names() -> list[str]:
    """Every name ``method:`` takes now: the trainers' own, then the registered credit methods."""
    return [*TRAINER_METHODS, *CREDIT_METHODS]


__all__ = [
    "TRAINER_METHODS",
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
    "method_names",
    "method_settings",
]
