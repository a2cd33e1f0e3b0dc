"""Reward functions whose answers are checked where they are made.

TRL turns a reward function's list into a tensor deep inside ``_calculate_rewards``: a function that returns a
number instead of a list, a list of the wrong length or a string in it stops the run there with a traceback
that names neither the function nor the fix. ``checked_reward_funcs`` wraps each plain function so that such an
answer raises a ``TypeError`` naming the function, what it returned and what it must return.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


def reward_output_problem(output: Any, count: int) -> str | None:
    """What is wrong with a reward function's ``output`` for ``count`` completions, or None when nothing is."""
    if isinstance(output, (str, bytes, dict)) or not hasattr(output, "__len__") or not hasattr(output, "__iter__"):
        return f"a {type(output).__name__} ({_short(output)})"
    if len(output) != count:
        return f"{len(output)} values for {count} completions"
    for position, value in enumerate(output):
        if value is None:
            continue
        if isinstance(value, (str, bytes)) or not _reads_as_float(value):
            return f"a {type(value).__name__} ({_short(value)}) at position {position}"
    return None


def _reads_as_float(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def checked_reward_function(func: Any) -> Any:
    """``func`` wrapped to check its answers; models, model names and async functions are left as they are."""
    if (
        not callable(func)
        or isinstance(func, (str, torch.nn.Module))
        or inspect.iscoroutinefunction(func)
        or getattr(func, "_taspo_checked", False)
    ):
        return func
    name = getattr(func, "__name__", type(func).__name__)
    where = f"{getattr(func, '__module__', None) or '?'}.{getattr(func, '__qualname__', name)}"

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        output = func(*args, **kwargs)
        completions = kwargs.get("completions", args[1] if len(args) > 1 else None)
        count = len(completions) if completions is not None else len(output) if hasattr(output, "__len__") else 1
        problem = reward_output_problem(output, count)
        if problem is not None:
            raise TypeError(
                f"reward function {name!r} ({where}) returned {problem}; a reward function must return a list "
                f"with one float per completion ({count} here), or None for a completion it does not score."
            )
        return output

    checked.__name__ = name  # TRL names the reward's metrics after it
    checked._taspo_checked = True  # type: ignore[attr-defined]
    return checked


def checked_reward_funcs(funcs: Any) -> Any:
    """``funcs`` (one function or a list) with every plain function checked (``checked_reward_function``)."""
    if isinstance(funcs, list):
        return [checked_reward_function(f) for f in funcs]
    return checked_reward_function(funcs) if funcs is not None else None


def reward_func_list(funcs: Any) -> list[Any]:
    """``reward_funcs`` as TRL accepts it (None, one function or a list) as a list."""
    return [] if funcs is None else list(funcs) if isinstance(funcs, list) else [funcs]
