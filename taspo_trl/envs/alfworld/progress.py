"""Which actions of a played ALFWorld episode made progress: the planner's distance to the goal, step by step.

Fast Downward, asked from any state, returns a plan to the goal; its length is the distance used here. An action
"made progress" when the distance after it is shorter than before it. Replaying a trajectory's commands in a fresh
engine reproduces its states exactly (the engine is deterministic), so labels can be computed after the fact for
any rollout, e.g. to check whether a credit method gives more weight to the actions that mattered
(``benchmarks/credit_quality.py``).

No cache: replanning costs about a tenth of an engine step (the step's admissible-command derivation
dominates), so remembering distances by state would save almost nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..base import matching_command
from .engine import open_engine


def _distance(state: Any) -> int | None:
    # The planner returns an empty plan both at the goal and when it finds none; only ``won`` tells them apart.
    if state["won"]:
        return 0
    plan = state.get("policy_commands") or []
    return len(plan) if plan else None


def goal_distances(game: Mapping[str, Any], commands: Sequence[str]) -> list[int | None]:
    """Planner distances to the goal before the first command and after each one (``len(commands) + 1`` values).

    ``commands`` are sent exactly as the agent loop sends them: a turn without a valid action block is ``""``,
    which the game answers with "Nothing happens." and leaves the state as it was; a command that names an
    admissible one in other case or spacing plays that one, as ``ALFWorldEnv.step`` does. A state from which the
    planner finds no plan gets ``None``.
    """
    engine = open_engine(game, with_plan=True)
    try:
        state = engine.reset()
        distances = [_distance(state)]
        for command in commands:
            state, _, _ = engine.step(matching_command(command, state["admissible_commands"]))
            distances.append(_distance(state))
    finally:
        engine.close()
    return distances


def made_progress(distances: Sequence[int | None]) -> list[bool | None]:
    """Per action, whether the distance to the goal went down (``None`` where either side is unknown)."""
    return [
        None if before is None or after is None else after < before
        for before, after in zip(distances[:-1], distances[1:])
    ]
