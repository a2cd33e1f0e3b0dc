"""ALFWorld on the real TextWorld engine: one episode of one ``game.tw-pddl`` file.

Plays our generated games and the official ALFWorld ones (``$ALFWORLD_DATA/json_2.1.1/...``) alike, on the
engine of ``engine.py``. Commands are matched to the admissible ones modulo whitespace and case.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..base import StepResult, encode_task_prompt, matching_command
from .engine import open_engine
from .tasks import TASK_TYPES, add_task_to_grammar, describe_task

REQUIRED_GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")
TASK_LINE_PREFIX = "Your task is to: "
_GENERATE_HINT = "generate games with `taspo-alfworld generate --out DIR --per-type N --seed S`"
_TASK_IN_GRAMMAR = re.compile(r"Your task is to: (.*?)\"")


def read_game_file(game_file: str | Path) -> dict[str, Any]:
    """Read and check a ``.tw-pddl`` file before any engine work, with errors that name the file."""
    path = Path(game_file)
    if not path.is_file():
        raise FileNotFoundError(f"ALFWorld game file not found: {path} ({_GENERATE_HINT}, or point to $ALFWORLD_DATA).")
    try:
        game = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"ALFWorld game file {path} is not valid JSON: {error}") from error
    if not isinstance(game, dict):  # bad file content, not a bad argument: a ValueError like the checks below
        raise ValueError(f"ALFWorld game file {path} holds a {type(game).__name__}, not a JSON object.")  # noqa: TRY004
    for key in REQUIRED_GAME_KEYS:
        if not isinstance(game.get(key), str) or not game[key]:
            raise ValueError(
                f"ALFWorld game file {path} is missing the key {key!r} (needs {', '.join(REQUIRED_GAME_KEYS)})."
            )
    if game.get("solvable") is False:
        raise ValueError(f"ALFWorld game file {path} is marked unsolvable.")
    return game


def _traj_data(game: Mapping[str, Any], path: Path) -> Mapping[str, Any] | None:
    # Our files carry the traj_data fields themselves; official ones sit next to a traj_data.json.
    if "task_type" in game and "pddl_params" in game:
        return game
    sidecar = path.parent / "traj_data.json"
    if sidecar.is_file():
        try:
            return json.loads(sidecar.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
    return None


def infer_task_type(game: Mapping[str, Any], path: str | Path) -> str | None:
    """The game's family: from its metadata, a sibling ``traj_data.json``, or the official directory name."""
    traj_data = _traj_data(game, Path(path))
    if traj_data and traj_data.get("task_type") in TASK_TYPES:
        return traj_data["task_type"]
    for part in reversed(Path(path).parts):
        for task_type in TASK_TYPES:
            if part.startswith(task_type):
                return task_type
    return None


def _grammar_with_task(game: Mapping[str, Any], path: Path) -> str:
    """The grammar with the task sentence filled in, for raw files that still say ``UNKNOWN GOAL``."""
    grammar = game["grammar"]
    if "UNKNOWN GOAL" not in grammar:
        return grammar
    traj_data = _traj_data(game, path)
    if not traj_data or "pddl_params" not in traj_data:
        return grammar
    # Seeded by the path so a file always shows the same sentence.
    sentence = describe_task(traj_data["task_type"], traj_data["pddl_params"], random.Random(str(path)))
    return add_task_to_grammar(grammar, sentence)


def _task_sentence(grammar: str) -> str:
    """The task sentence the grammar's intro will show ("" when the grammar has none)."""
    match = _TASK_IN_GRAMMAR.search(grammar)
    return match.group(1).strip() if match else ""


class ALFWorldEnv:
    """One episode of an ALFWorld game, following :class:`taspo_trl.envs.base.AgentEnv`.

    Reward is 1.0 on the step that wins, else 0.0. The episode ends when the game is won or after
    ``max_turns`` steps (``info["truncated"]``). Any command is accepted: one that equals an admissible command
    modulo whitespace and case plays it, one the game does not know gets its normal answer, "Nothing happens.".
    """

    action_tag = "action"
    stall_commands = ("look", "inventory")
    """Commands that change nothing in the game: what a stalling agent repeats (``play_expert``'s ``stall_rate``)."""

    def __init__(self, game_file: str | Path, max_turns: int = 50) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.game_file = Path(game_file)
        self.max_turns = max_turns
        self._game = read_game_file(self.game_file)
        self._game["grammar"] = _grammar_with_task(self._game, self.game_file)
        self.task_type = infer_task_type(self._game, self.game_file)
        walkthrough = self._game.get("walkthrough")
        self.walkthrough: list[str] | None = list(walkthrough) if walkthrough else None
        self._task = _task_sentence(self._game["grammar"])
        self._engine = None
        self._admissible: list[str] = []
        self._turns = 0
        self._done = False
        self._won = False
        self._last_observation = ""

    @property
    def task(self) -> str:
        """The task sentence, e.g. "put a clean apple in fridge."."""
        return self._task

    @property
    def admissible_commands(self) -> list[str]:
        return list(self._admissible)

    @property
    def turns(self) -> int:
        """Steps taken since the last reset."""
        return self._turns

    def _load(self):
        try:
            return open_engine(self._game)
        except KeyError as error:
            raise ValueError(
                f"ALFWorld game file {self.game_file} is unsolvable: Fast Downward proved its goal unreachable "
                f"(KeyError {error}); regenerate it."
            ) from error

    def reset(self) -> str:
        """Start the episode; returns the intro (the room and the "Your task is to: ..." line)."""
        if self._engine is None:
            self._engine = self._load()
        state = self._engine.reset()
        self._turns, self._done, self._won = 0, False, bool(state["won"])
        self._admissible = list(state["admissible_commands"])
        self._last_observation = state.feedback
        if TASK_LINE_PREFIX in state.feedback:  # what the game shows beats the grammar-text guess made in __init__
            self._task = state.feedback.rsplit(TASK_LINE_PREFIX, 1)[1].strip()
        return state.feedback

    def step(self, action: str) -> StepResult:
        """Play one command; never raises for any text."""
        if self._engine is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return StepResult(self._last_observation, 0.0, True, self._info(truncated=not self._won))
        command = action if isinstance(action, str) else ""
        command = matching_command(command, self._admissible)
        state, _, _ = self._engine.step(command)
        self._turns += 1
        self._won = bool(state["won"])
        self._admissible = list(state["admissible_commands"])
        self._last_observation = state.feedback
        truncated = not self._won and self._turns >= self.max_turns
        self._done = self._won or truncated
        return StepResult(state.feedback, 1.0 if self._won else 0.0, self._done, self._info(truncated))

    def _info(self, truncated: bool) -> dict[str, Any]:
        return {
            "won": self._won,
            "admissible_commands": list(self._admissible),
            "truncated": truncated,
            "turn": self._turns,
        }

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def alfworld_env_factory(spec: Mapping[str, Any]) -> ALFWorldEnv:
    """The agent loop's ``EnvFactory``: ``{"game_file": ..., "max_turns": 50}`` -> a fresh episode."""
    if "game_file" not in spec:
        raise ValueError(f"ALFWorld task spec needs a 'game_file' key, got keys {sorted(spec)}.")
    return ALFWorldEnv(spec["game_file"], max_turns=int(spec.get("max_turns", 50)))


def task_spec_rows(game_files: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Dataset rows naming one game each: ``{"prompt", "game_file", "task_type"}``.

    ``prompt`` holds the whole task spec as JSON (``encode_task_prompt``), so the rows also work with TRL's
    ``rollout_func``, which only sees prompts. Reads each file (cheap JSON, no engine), so a missing or corrupt
    file fails here, before training starts.
    """
    rows = []
    for game_file in game_files:
        game = read_game_file(game_file)
        task = _task_sentence(_grammar_with_task(game, Path(game_file))) or "solve the ALFWorld task"
        spec = {"env": "alfworld", "game_file": str(game_file), "task": task}
        task_type = infer_task_type(game, game_file) or "unknown"
        rows.append({"prompt": encode_task_prompt({**spec, "task_type": task_type}), "game_file": str(game_file), "task_type": task_type})
    return rows
