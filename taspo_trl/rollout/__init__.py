"""Rollouts: trajectory records, the batched multi-turn agent loop, generation backends, row layouts."""

from .layouts import Rows, build_rows
from .loop import run_agent_loop
from .records import Trajectory, Turn
from .trl_rollout import make_rollout_func

__all__ = [
    "Rows",
    "Trajectory",
    "Turn",
    "build_rows",
    "make_rollout_func",
    "run_agent_loop",
]
