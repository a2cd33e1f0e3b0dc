"""A games folder is checked on the real engine before training or evaluation builds its rows: one that yields
no playable game fails at once, naming the folder and the fix."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from taspo_trl.envs.alfworld.generator import game_logic
from taspo_trl.envs.alfworld.rows import PLAYABLE_PROBES, alfworld_game_files, alfworld_rows_from_settings
from tests.helpers.alfworld_games import tiny_kitchen_problem, write_game


def _settings(games_dir: Path, max_tasks: int | None = None) -> dict:
    return {"games_dir": str(games_dir), "games_per_type": 1, "games_seed": 0, "games_split": "train",
            "max_tasks": max_tasks}


def _game(path: Path, problem: str) -> Path:
    domain, grammar = game_logic()
    return write_game(path / "game.tw-pddl", pddl_domain=domain,
                      grammar=grammar.replace("UNKNOWN GOAL", "put some apple in fridge"), pddl_problem=problem)


def test_a_folder_of_games_the_engine_cannot_start_fails_naming_the_folder(tmp_path):
    folder = tmp_path / "games"
    _game(folder / "a", "(define (problem cut_off) (:domain alfred)")  # the problem text ends mid-way
    _game(folder / "b", tiny_kitchen_problem().replace("(:goal", "(:goalx"))  # no goal section
    with pytest.raises(ValueError) as excinfo:
        alfworld_rows_from_settings(_settings(folder), None)
    message = str(excinfo.value)
    assert f"no playable ALFWorld game in games_dir {folder}" in message
    assert str(folder / "a" / "game.tw-pddl") in message and str(folder / "b" / "game.tw-pddl") in message
    assert f"Delete {folder} to generate fresh games there" in message


def test_one_playable_game_is_enough(tmp_path):
    folder = tmp_path / "games"
    _game(folder / "a", "(define (problem cut_off) (:domain alfred)")
    _game(folder / "b", tiny_kitchen_problem())
    rows = alfworld_rows_from_settings(_settings(folder), None)
    assert [Path(row["game_file"]).parent.name for row in rows] == ["a", "b"]


def test_only_the_first_games_are_tried(tmp_path):
    folder = tmp_path / "games"
    for n in range(PLAYABLE_PROBES):
        _game(folder / f"{n}", "(define (problem cut_off)")
    _game(folder / "z", tiny_kitchen_problem())  # sorted last: past the probes
    with pytest.raises(ValueError, match=f"could not start the first {PLAYABLE_PROBES}"):
        alfworld_rows_from_settings(_settings(folder), None)


def test_a_truncated_game_file_names_the_file_and_the_folder_fix(tmp_path):
    folder = tmp_path / "games"
    good = _game(folder / "a", tiny_kitchen_problem())
    cut = folder / "b" / "game.tw-pddl"
    cut.parent.mkdir()
    cut.write_text(good.read_text()[:200])
    with pytest.raises(ValueError) as excinfo:
        alfworld_rows_from_settings(_settings(folder), None)
    message = str(excinfo.value)
    assert f"{cut} is not valid JSON" in message and f"Delete {folder}" in message


def test_max_tasks_limits_the_games_that_are_read(tmp_path):
    folder = tmp_path / "games"
    _game(folder / "a", tiny_kitchen_problem())
    (folder / "b").mkdir()
    (folder / "b" / "game.tw-pddl").write_text("{")  # never read: past max_tasks
    rows = alfworld_rows_from_settings(_settings(folder, max_tasks=1), None)
    assert len(rows) == 1 and json.loads(rows[0]["prompt"])["game_file"].endswith("a/game.tw-pddl")


def _files_in_child(folder: Path, queue) -> None:
    queue.put([str(p) for p in alfworld_game_files(folder, 1, 0, "train")])


def test_a_process_reading_the_folder_while_another_generates_it_gets_every_game(tmp_path):
    """The ranks of one launch share games_dir: a rank that lists it while another rank is still generating
    must wait for all six games, not start on the ones written so far."""
    folder = tmp_path / "games"
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_files_in_child, args=(folder, queue))
    child.start()
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".games.tmp-*")):  # the child is generating now
        assert child.is_alive() and time.monotonic() < deadline, "the child never started generating"
        time.sleep(0.01)
    here = [str(p) for p in alfworld_game_files(folder, 1, 0, "train")]
    there = queue.get(timeout=120)
    child.join(timeout=60)
    assert len(here) == 6 and here == there
    assert not list(tmp_path.glob(".games.tmp-*"))  # the staging folder is gone
