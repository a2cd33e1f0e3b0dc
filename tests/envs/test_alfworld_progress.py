"""Planner progress labels on a real generated ALFWorld game: every walkthrough step shortens the distance to the
goal by one; looking, checking the inventory, a command the game does not know and an empty (invalid) turn do not."""

from __future__ import annotations

import pytest

from taspo_trl.envs.alfworld.env import read_game_file
from taspo_trl.envs.alfworld.generator import generate_games
from taspo_trl.envs.alfworld.progress import goal_distances, made_progress


@pytest.fixture(scope="module")
def game_file(tmp_path_factory):
    return generate_games(tmp_path_factory.mktemp("progress"), 1, 0, "train", task_types=["pick_heat_then_place_in_recep"])[0]


@pytest.fixture(scope="module")
def game(game_file) -> dict:
    return read_game_file(game_file)


def test_walkthrough_steps_all_make_progress(game):
    walkthrough = game["walkthrough"]
    distances = goal_distances(game, walkthrough)
    # The walkthrough is the planner's plan from the start, so each step leaves one fewer to go, and the last wins.
    assert distances == list(range(len(walkthrough), -1, -1))
    assert made_progress(distances) == [True] * len(walkthrough)


def test_commands_in_other_case_and_spacing_replay_as_the_environment_plays_them(game_file, game):
    from taspo_trl.envs.alfworld.env import ALFWorldEnv

    walkthrough = game["walkthrough"]
    written = ["  " + command.upper().replace(" ", "   ") + " " for command in walkthrough]  # as a policy may write
    env = ALFWorldEnv(game_file)
    env.reset()
    assert [env.step(command).info["won"] for command in written][-1]  # the environment plays them and wins
    env.close()
    # so the replay must reach the same states: one step closer to the goal each time
    assert goal_distances(game, written) == list(range(len(walkthrough), -1, -1))


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
