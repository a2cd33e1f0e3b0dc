"""The six ALFWorld task families and their task sentences, as the installed ``alfworld`` package defines them
(``alfworld.gen.goal_library``; imported lazily: ``alfworld`` is an optional dependency)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

TASK_TYPES: list[str] = [
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
]
"""The six ALFWorld task families, in ALFWorld's order (its task type ids 1-6)."""

TASK_SHORT_NAMES: dict[str, str] = dict(zip(TASK_TYPES, ["Pick", "Look", "Clean", "Heat", "Cool", "Pick2"]))
"""The short family names used in the ALFWorld paper's result tables."""


def _require_alfworld():
    try:
        from alfworld.gen import constants, goal_library
    except ImportError as error:  # pragma: no cover - exercised only without the extra installed
        raise ImportError(
            'The embedded ALFWorld needs the `alfworld` and `textworld` packages: pip install "taspo-trl[alfworld]"'
        ) from error
    return constants, goal_library


def describe_task(task_type: str, pddl_params: Mapping[str, Any], rng: random.Random) -> str:
    """The task sentence, filled from ALFWorld's templates exactly as its ``add_task_to_grammar`` does, but
    drawing the template from ``rng`` so generation stays deterministic."""
    _, goal_library = _require_alfworld()
    key = task_type + ("_slice" if pddl_params.get("object_sliced") else "")
    template = rng.choice(goal_library.gdict[key]["templates"])
    fields = {"obj": "object_target", "recep": "parent_target", "toggle": "toggle_target", "mrecep": "mrecep_target"}
    return template.format(**{slot: str(pddl_params.get(key) or "").lower() for slot, key in fields.items()})


def add_task_to_grammar(grammar: str, task_description: str) -> str:
    """Put the task sentence in the grammar's intro (ALFWorld's ``UNKNOWN GOAL`` placeholder)."""
    return grammar.replace("UNKNOWN GOAL", task_description)
