"""Trainers: thin glue from TRL's ``GRPOTrainer`` to the rollout and credit modules.

Every ``method:`` of a recipe is an entry of the one registry, ``credit.registry.CREDIT_METHODS``: the trainers'
own (``grpo``, ``taspo``, ``alignopsd``, registered below with their config and trainer classes) and the credit
functions that ``BaselineTrainer`` runs (the comparison methods and any registered later with ``register_credit``).
``method_classes`` resolves a name to its classes, ``method_names`` lists them.
"""

from ..credit.registry import CREDIT_METHODS, register_method
from .alignopsd import AlignOPSDConfig, AlignOPSDTrainer
from .baselines import BaselineConfig, BaselineTrainer
from .grpo import AgentGRPOConfig, AgentGRPOTrainer, environment_reward
from .taspo import TASPOConfig, TASPOTrainer

register_method("grpo", config=AgentGRPOConfig, trainer=AgentGRPOTrainer, title="GRPO",
                summary="outcome advantage on every token")
register_method("taspo", config=TASPOConfig, trainer=TASPOTrainer, title="TASPO",
                summary="analyzer-aligned privileged credit")
register_method("alignopsd", config=AlignOPSDConfig, trainer=AlignOPSDTrainer, title="AlignOPSD",
                summary="decision-aligned rectification, semi-Markov credit")


def method_classes(method: str) -> tuple[type, type]:
    """The config class and trainer of a recipe's ``method:``; KeyError when nothing has that name."""
    entry = CREDIT_METHODS[method]
    return (entry.config, entry.trainer) if entry.trainer else (BaselineConfig, BaselineTrainer)


def method_settings(method: str) -> dict[str, str]:
    """The config settings that select ``method`` within its config class: ``{"baseline": method}`` for a credit
    function (``BaselineConfig`` runs all of them), none for a trainer of its own or another name."""
    entry = CREDIT_METHODS.get(method)
    return {"baseline": method} if entry is not None and entry.trainer is None else {}


def method_names() -> list[str]:
    """Every name ``method:`` takes now: the trainers' own first, then the credit functions, each in registration
    order."""
    return sorted(CREDIT_METHODS, key=lambda name: CREDIT_METHODS[name].trainer is None)


__all__ = [
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
