"""Environment adapters and the registry that maps a config name to an environment factory."""

from __future__ import annotations

from typing import Callable

from .base import AgentEnv, EnvFactory, PromptTemplate, StepResult


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


def register_env(name: str, factory_loader: Callable[[], EnvFactory]) -> None:
    """Makes ``env: NAME`` in a config resolve to your environment (``factory_loader()`` returns the factory)."""
    _REGISTRY[name] = factory_loader


def get_env_factory(name: str) -> EnvFactory:
    if name not in _REGISTRY:
        raise ValueError(f"Unknown environment {name!r}. Known: {sorted(_REGISTRY)}; add yours with register_env().")
    return _REGISTRY[name]()


__all__ = ["AgentEnv", "EnvFactory", "PromptTemplate", "StepResult", "get_env_factory", "register_env"]
