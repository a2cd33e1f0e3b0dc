"""Environment adapters, the registry that maps a config name to an environment factory, and the registry of
each environment's expert (the oracle that expert demonstrations replay)."""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping, Protocol

from .base import AgentEnv, EnvFactory, PromptTemplate, StepResult, encode_task_prompt, task_spec_from_row


class Expert(Protocol):
    """One episode's expert: given what the environment showed before a turn, the rationale and the action
    (exactly what ``step`` receives) of that turn. Called once per turn, from reset on, so it may keep state."""

    def __call__(self, observation: str, admissible: list[str] | None, rng: random.Random) -> tuple[str, str]: ...


ExpertFactory = Callable[[Mapping[str, Any], AgentEnv], Expert]
"""Builds the expert of one episode from its task spec and its environment (freshly reset)."""


def _alfworld() -> EnvFactory:
    from .alfworld import alfworld_env_factory

    return alfworld_env_factory


def _search() -> EnvFactory:
    from .search import search_env_factory

    return search_env_factory


def _webshop() -> EnvFactory:
    from .webshop import webshop_env_factory

    return webshop_env_factory


_REGISTRY: dict[str, Callable[[], EnvFactory]] = {"alfworld": _alfworld, "search": _search, "webshop": _webshop}


def _alfworld_expert() -> ExpertFactory:
    from .alfworld.expert import ALFWorldExpert

    return ALFWorldExpert


def _search_expert() -> ExpertFactory:
    from .search.oracle import SearchExpert

    return SearchExpert


def _webshop_expert() -> ExpertFactory:
    from .webshop.oracle import WebShopExpert

    return WebShopExpert


_EXPERTS: dict[str, Callable[[], ExpertFactory]] = {
    "alfworld": _alfworld_expert, "search": _search_expert, "webshop": _webshop_expert,
}


def register_env(name: str, factory_loader: Callable[[], EnvFactory]) -> None:
    """Makes ``env: NAME`` in a config resolve to your environment (``factory_loader()`` returns the factory)."""
    _REGISTRY[name] = factory_loader


def register_expert(name: str, expert_loader: Callable[[], ExpertFactory]) -> None:
    """Gives environment ``name`` an expert (``expert_loader()`` returns the factory), for demonstrations and
    the ``sft`` warm start."""
    _EXPERTS[name] = expert_loader


def get_expert_factory(name: str) -> ExpertFactory:
    if name not in _EXPERTS:
        raise ValueError(
            f"Environment {name!r} has no expert to demonstrate with. Known: {sorted(_EXPERTS)}; add yours with "
            "taspo_trl.envs.register_expert()."
        )
    return _EXPERTS[name]()


def get_env_factory(name: str) -> EnvFactory:
    if name not in _REGISTRY:
        raise ValueError(f"Unknown environment {name!r}. Known: {sorted(_REGISTRY)}; add yours with register_env().")
    return _REGISTRY[name]()


__all__ = [
    "AgentEnv",
    "EnvFactory",
    "Expert",
    "ExpertFactory",
    "PromptTemplate",
    "StepResult",
    "encode_task_prompt",
    "get_env_factory",
    "get_expert_factory",
    "register_env",
    "register_expert",
    "task_spec_from_row",
]
