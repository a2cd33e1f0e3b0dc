"""Planner progress labels on a real generated ALFWorld game: every walkthrough step shortens the distance to the
goal by one; looking, checking the inventory, a command the game does not know and an empty (invalid) turn do not."""

from __future__ import annotations

import pytest

from taspo_trl.envs.alfworld.env import read_game_file
from taspo_trl.envs.alfworld.generator import generate_games
from taspo_trl.envs.alfworld.progress import goal_distances, made_progress


@pytest.fixture(scope="module")
def game(tmp_path_factory) -> dict:
    path = generate_games(tmp_path_factory.mktemp("progress"), 1, 0, "train", task_types=["pick_heat_then_place_in_recep"])[0]
    return read_game_file(path)


def test_walkthrough_steps_all_make_progress(game):
    walkthrough = game["walkthrough"]
    distances = goal_distances(game, walkthrough)
    # The walkthrough is the planner's plan from the start, so each step leaves one fewer to go, and the last wins.
    assert distances == list(range(len(walkthrough), -1, -1))
    assert made_progress(distances) == [True] * len(walkthrough)


def test_stalling_commands_make_no_progress(game):
    walkthrough = game["walkthrough"]
    stalls = ["look", "inventory", "fly to the moon", ""]
    distances = goal_distances(game, [walkthrough[0], *stalls, *walkthrough[1:]])
    n = len(walkthrough)
    assert distances == [n, n - 1, n - 1, n - 1, n - 1, n - 1, *range(n - 2, -1, -1)]
    assert made_progress(distances) == [True, False, False, False, False, *[True] * (n - 1)]


def test_unknown_distances_give_no_label():
    assert made_progress([3, None, 2, 1]) == [None, None, True]
    assert made_progress([2, 3, 3, 0]) == [False, False, True]
