"""The ALFWorld tasks ``taspo-train`` and ``taspo-eval`` run on: the games of a folder, generated there first when
it holds none."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from taspo_trl.envs.alfworld.env import task_spec_rows
from taspo_trl.envs.alfworld.generator import find_game_files, generate_games


def alfworld_game_files(games_dir: str | Path, per_type: int, seed: int, split: str) -> list[Path]:
    """The ``.tw-pddl`` files of a folder, generating ``per_type`` games per family there when it has none."""
    games_dir = Path(games_dir)
    files = find_game_files(games_dir) if games_dir.exists() else []
    if not files:
        print(
            f"[taspo] no games in {games_dir}: generating {per_type} per task family (split={split}, seed={seed})",
            flush=True,
        )
        files = generate_games(games_dir, per_type, seed, split)
    return sorted(files)


def alfworld_rows_from_settings(settings: Mapping[str, Any], max_turns: int | None) -> list[dict[str, Any]]:
    """ALFWorld's ``TaskRowBuilder``: the games of ``games_dir`` (generated with ``games_per_type``, ``games_seed``
    and ``games_split`` when it has none), the first ``max_tasks`` of them when set. The rows carry no turn
    limit, so ``max_turns`` is left to the agent loop."""
    files = alfworld_game_files(
        settings["games_dir"], settings["games_per_type"], settings["games_seed"], settings["games_split"]
    )
    return task_spec_rows(files[: settings["max_tasks"]] if settings["max_tasks"] else files)
