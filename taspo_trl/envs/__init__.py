"""Environment adapters, the registry that maps a config name to an environment factory and its task-row
builder, the registry of each environment's expert (the oracle that expert demonstrations replay) and the registry
of each environment's rules for the rule-based analyzer (``envs.analysis.RuleSet``)."""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping, Protocol

from .analysis import RuleSet
from .base import (
    AgentEnv,
    EnvFactory,
    PromptTemplate,
    StepResult,
    TaskRowBuilder,
    encode_task_prompt,
    task_spec_from_row,
)


class Expert(Protocol):
    """One episode's expert: given what the environment showed before a turn, the rationale and the action
    (exactly what ``step`` receives) of that turn. Called once per turn, from reset on, so it may keep state."""

    def __call__(self, observation: str, admissible: list[str] | None, rng: random.Random) -> tuple[str, str]: ...


ExpertFactory = Callable[[Mapping[str, Any], AgentEnv], Expert]
"""Builds the expert of one episode from its task spec and its environment (freshly reset). A factory may also take
``informed=True``: an expert that acts as if told where things are, as TASPO's privileged context tells the policy
(the ALFWorld expert then searches nowhere first); the ``sft`` warm start's privileged-context demonstrations
(``AgentSFTConfig.demonstration_pi_episodes``) need it."""


def _alfworld() -> EnvFactory:
    from .alfworld import alfworld_env_factory

    return alfworld_env_factory


def _search() -> EnvFactory:
    from .search import search_env_factory

    return search_env_factory


def _webshop() -> EnvFactory:
    from .webshop import webshop_env_factory

    return webshop_env_factory


# The built-in row builders import their environment on first use, like the factory loaders above.
def _alfworld_rows(settings: Mapping[str, Any], max_turns: int | None) -> list[dict[str, Any]]:
    from .alfworld.rows import alfworld_rows_from_settings

    return alfworld_rows_from_settings(settings, max_turns)


def _search_rows(settings: Mapping[str, Any], max_turns: int | None) -> list[dict[str, Any]]:
    from .search.data import search_rows_from_settings

    return search_rows_from_settings(settings, max_turns)


def _webshop_rows(settings: Mapping[str, Any], max_turns: int | None) -> list[dict[str, Any]]:
    from .webshop import webshop_rows_from_settings

    return webshop_rows_from_settings(settings, max_turns)


_REGISTRY: dict[str, Callable[[], EnvFactory]] = {}
_ROWS: dict[str, TaskRowBuilder] = {}


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


def register_env(name: str, factory_loader: Callable[[], EnvFactory], rows: TaskRowBuilder | None = None) -> None:
    """Makes ``environment: NAME`` in a config resolve to your environment (``factory_loader()`` returns the
    factory). ``rows`` builds its dataset rows (``envs.base.TaskRowBuilder``), so that ``taspo-train`` and
    ``taspo-eval`` run it by name; without it, build the dataset in Python and pass it to the trainer."""
    _REGISTRY[name] = factory_loader
    if rows is None:
        _ROWS.pop(name, None)  # a registration replaces any earlier one, builder included
    else:
        _ROWS[name] = rows


register_env("alfworld", _alfworld, rows=_alfworld_rows)
register_env("search", _search, rows=_search_rows)
register_env("webshop", _webshop, rows=_webshop_rows)


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


def _alfworld_rules() -> RuleSet:
    from .alfworld.analysis import ALFWorldRules

    return ALFWorldRules()


def _search_rules() -> RuleSet:
    from .search.analysis import SearchQARules

    return SearchQARules()


def _webshop_rules() -> RuleSet:
    from .webshop.analysis import WebShopRules

    return WebShopRules()


_ANALYZER_RULES: dict[str, Callable[[], RuleSet]] = {
    "alfworld": _alfworld_rules, "webshop": _webshop_rules, "search": _search_rules,
}


def register_analyzer_rules(name: str, rules_loader: Callable[[], RuleSet]) -> None:
    """Gives environment ``name`` rules for the rule-based analyzer (``analyzer: rule``; ``rules_loader()`` returns
    an ``envs.analysis.RuleSet``), which writes TASPO's guidance, ``success_skills`` and OPID's step skills
    offline. Without them, those methods need an LLM analyzer on that environment."""
    _ANALYZER_RULES[name] = rules_loader


def analyzer_rules_names() -> tuple[str, ...]:
    """The environments with rules for the rule-based analyzer, in registration order."""
    return tuple(_ANALYZER_RULES)


def get_analyzer_rules(name: str) -> RuleSet:
    if name not in _ANALYZER_RULES:
        raise ValueError(
            f"Environment {name!r} has no rules for the rule-based analyzer. Known: {sorted(_ANALYZER_RULES)}; add "
            "yours with taspo_trl.envs.register_analyzer_rules(), or use an LLM analyzer (analyzer: openai or "
            "transformers)."
        )
    return _ANALYZER_RULES[name]()


def _check_registered(name: str) -> None:
    if name not in _REGISTRY:
        raise ValueError(
            f"Unknown environment {name!r}. Known: {sorted(_REGISTRY)}; add yours with "
            "taspo_trl.envs.register_env() (for taspo-train and taspo-eval: in a module named by --env_module)."
        )


def get_env_factory(name: str) -> EnvFactory:
    _check_registered(name)
    return _REGISTRY[name]()


# What a task spec must hold for each built-in environment (one of each tuple), and how to build such rows.
_TASK_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "alfworld": (("game_file",), "taspo_trl.envs.alfworld.task_spec_rows(generate_games(...))"),
    "webshop": (("goal_index", "goal"), "taspo_trl.envs.webshop.webshop_task_rows(...)"),
    "search": (("golden_answers",), "taspo_trl.envs.search.data.search_task_rows(...)"),
}


def check_task_rows(environment: str, rows: Any) -> None:
    """Refuse, in one line naming the fix, a dataset whose first row is not a task of the built-in ``environment``
    (a plain TRL prompt dataset, say, where every episode would fail to start and train on reward 0).
    Environments registered by the user, and datasets without indexable rows, are not checked."""
    if environment not in _TASK_KEYS or rows is None or not hasattr(rows, "__getitem__") or not len(rows):
        return
    needed, builder = _TASK_KEYS[environment]
    row = dict(rows[0])
    try:
        spec = task_spec_from_row(row)
    except ValueError:
        spec = {}
    if not any(key in spec for key in needed):
        raise ValueError(
            f"train_dataset row 0 is not a task of environment {environment!r}: its columns are {sorted(row)} and "
            f"its task spec lacks {' or '.join(repr(k) for k in needed)} (a plain TRL prompt dataset?). Build the "
            f"rows with {builder}, set environment= to the environment the rows are for, or pass "
            "environment_factory= (TRL's) for your own environment."
        )


def build_task_rows(
    environment: str, settings: Mapping[str, Any], max_turns: int | None = None
) -> list[dict[str, Any]]:
    """The dataset rows (one task each) of a registered environment, from its ``TaskRowBuilder``."""
    _check_registered(environment)
    if environment not in _ROWS:
        raise ValueError(
            f"Environment {environment!r} was registered without a task-row builder: pass rows= to "
            "taspo_trl.envs.register_env(), or build the dataset in Python and pass it to the trainer."
        )
    rows = _ROWS[environment](settings, max_turns)
    if not rows:
        raise ValueError(f"No tasks found for environment {environment!r} with {dict(settings)}.")
    return rows


__all__ = [
    "AgentEnv",
    "EnvFactory",
    "Expert",
    "ExpertFactory",
    "PromptTemplate",
    "RuleSet",
    "StepResult",
    "TaskRowBuilder",
    "analyzer_rules_names",
    "build_task_rows",
    "encode_task_prompt",
    "get_analyzer_rules",
    "get_env_factory",
    "get_expert_factory",
    "register_analyzer_rules",
    "register_env",
    "register_expert",
    "task_spec_from_row",
]
