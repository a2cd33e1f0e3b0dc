"""A user's own environment registered with its task rows: the module that ``--env_module tests.helpers.user_env``
imports into ``taspo-train`` and ``taspo-eval`` (tests/envs/test_user_env.py). Importing it is the whole
registration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taspo_trl.envs import encode_task_prompt, register_env
from tests.helpers.toy_envs import locker_factory


def locker_rows(settings: Mapping[str, Any], max_turns: int | None) -> list[dict[str, Any]]:
    """One task per locker that may hold the key (1-5), the first ``max_tasks``; the split names the family."""
    targets = list(range(1, 6))[: settings["max_tasks"]]
    family = f"lockers-{settings['task_split']}"
    return [
        {"prompt": encode_task_prompt({"target": target, "max_turns": max_turns or 4, "task_type": family})}
        for target in targets
    ]


register_env("lockers", lambda: locker_factory, rows=locker_rows)
