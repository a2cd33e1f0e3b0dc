"""The ALFWorld tasks ``taspo-train`` and ``taspo-eval`` run on: the games of a folder, generated there first when
it holds none, checked on the engine before any work starts."""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...models import owned_temporary_dir
from .env import ALFWorldEnv, task_spec_rows
from .generator import find_game_files, generate_games

PLAYABLE_PROBES = 3
"""Games tried on the engine, in order, before a folder counts as unplayable: one load is seconds."""


def alfworld_game_files(games_dir: str | Path, per_type: int, seed: int, split: str) -> list[Path]:
    """The ``.tw-pddl`` files of a folder, generating ``per_type`` games per family there when it has none."""
    games_dir = Path(games_dir)
    files = find_game_files(games_dir) if games_dir.exists() else []
    return sorted(files or _generate_once(games_dir, per_type, seed, split))


def _generate_once(games_dir: Path, per_type: int, seed: int, split: str) -> list[Path]:
    """Generate into a staging folder next to ``games_dir`` and rename the split into place, under a lock there.

    The ranks of one launch share a ``games_dir``: one generates while the others wait, and none can list the
    folder half-written (a rank that read fewer games than the others would start with a different dataset)."""
    games_dir.mkdir(parents=True, exist_ok=True)
    with open(games_dir.parent / f".{games_dir.name}.generate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if files := find_game_files(games_dir):  # another process generated them while this one waited
            return files
        print(
            f"[taspo] no games in {games_dir}: generating {per_type} per task family (split={split}, seed={seed})",
            flush=True,
        )
        staging = owned_temporary_dir(games_dir)  # a killed generation's leftover is swept by the next one
        try:
            generate_games(staging, per_type, seed, split)
            # generate_games writes under <folder>/<split>/, so the split folder moves in with one rename.
            if (staging / split).exists():
                os.replace(staging / split, games_dir / split)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return find_game_files(games_dir)


@functools.lru_cache(maxsize=256)
def _engine_error(path: Path, _mtime_ns: int, _size: int) -> str | None:
    """Why the engine cannot start this game, or ``None`` when it resets; cached per file version, so building
    rows from one folder again (a second recipe, another split) costs nothing."""
    try:
        env = ALFWorldEnv(path)
        try:
            env.reset()
        finally:
            env.close()
    except ImportError:  # the engine itself is missing: its own message names the install command
        raise
    except Exception as error:  # noqa: BLE001 - whatever the engine raises on this file, the game is unplayable
        return f"{type(error).__name__}: {' '.join(str(error).split())}"[:300]
    return None


def check_playable(game_files: Sequence[Path], games_dir: str | Path) -> None:
    """Raise ``ValueError`` naming ``games_dir`` and the fix unless one of its first ``PLAYABLE_PROBES`` games
    loads and resets on the engine: a folder of broken games would otherwise fail every episode of the run."""
    errors = []
    for path in game_files[:PLAYABLE_PROBES]:
        stat = Path(path).stat()
        error = _engine_error(Path(path).resolve(), stat.st_mtime_ns, stat.st_size)
        if error is None:
            return
        errors.append(f"{path}: {error}")
    raise ValueError(
        f"no playable ALFWorld game in games_dir {games_dir}: the engine could not start the first "
        f"{len(errors)} ({'; '.join(errors)}). {_folder_fix(games_dir)}"
    )


def _folder_fix(games_dir: str | Path) -> str:
    return (
        f"Delete {games_dir} to generate fresh games there, or point games_dir at a folder of valid games "
        "(e.g. $ALFWORLD_DATA/json_2.1.1/train)."
    )


def alfworld_rows_from_settings(settings: Mapping[str, Any], max_turns: int | None) -> list[dict[str, Any]]:
    """ALFWorld's ``TaskRowBuilder``: the games of ``games_dir`` (generated with ``games_per_type``, ``games_seed``
    and ``games_split`` when it has none), the first ``max_tasks`` of them when set. Every file is read and the
    first is started on the engine (``check_playable``), so a broken folder fails here, before training. The rows
    carry no turn limit, so ``max_turns`` is left to the agent loop."""
    games_dir = settings["games_dir"]
    files = alfworld_game_files(games_dir, settings["games_per_type"], settings["games_seed"], settings["games_split"])
    files = files[: settings["max_tasks"]] if settings["max_tasks"] else files
    try:
        rows = task_spec_rows(files)
    except ValueError as error:  # a corrupt file: the fix is about the folder it came from
        raise ValueError(f"{str(error).rstrip('.')}. {_folder_fix(games_dir)}") from error
    check_playable(files, games_dir)
    return rows
