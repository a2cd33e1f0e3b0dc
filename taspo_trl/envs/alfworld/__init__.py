"""Embedded ALFWorld: a generator of ``game.tw-pddl`` problems for the six task families and an adapter that
plays any ALFWorld game on the real TextWorld/ALFWorld engine. ``alfworld`` and ``textworld`` are optional
(``pip install "taspo-trl[alfworld]"``) and imported only when a game is generated or played."""

from .env import ALFWorldEnv, alfworld_env_factory, task_spec_rows
from .generator import find_game_files, generate_games
from .rows import alfworld_game_files, alfworld_rows_from_settings
from .tasks import TASK_SHORT_NAMES, TASK_TYPES

__all__ = [
    "TASK_SHORT_NAMES",
    "TASK_TYPES",
    "ALFWorldEnv",
    "alfworld_env_factory",
    "alfworld_game_files",
    "alfworld_rows_from_settings",
    "find_game_files",
    "generate_games",
    "task_spec_rows",
]
