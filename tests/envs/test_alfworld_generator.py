"""The embedded ALFWorld generator: solvable games for all six families, determinism, split partition,
ALFWorld-style names, unsolvable-problem handling and the ``taspo-alfworld`` CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from taspo_trl.envs.alfworld import generator
from taspo_trl.envs.alfworld.cli import main as cli_main
from taspo_trl.envs.alfworld.generator import (
    SPLITS,
    UNSEEN_OBJECT_TYPES,
    GenerationError,
    SolveReport,
    check_solvable,
    generate_game,
    generate_games,
    load_floorplan,
    split_floorplans,
    task_choices,
)
from taspo_trl.envs.alfworld.tasks import TASK_SHORT_NAMES, TASK_TYPES


@pytest.fixture(scope="session")
def train_games(tmp_path_factory) -> dict[str, Path]:
    """One train game per family, generated once for the whole session."""
    paths = generate_games(tmp_path_factory.mktemp("alfworld_train"), per_type=1, seed=0, split="train")
    return {json.loads(p.read_text())["task_type"]: p for p in paths}


@pytest.fixture(scope="session")
def unseen_games(tmp_path_factory) -> dict[str, Path]:
    paths = generate_games(tmp_path_factory.mktemp("alfworld_unseen"), per_type=1, seed=0, split="eval_unseen")
    return {json.loads(p.read_text())["task_type"]: p for p in paths}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_task_types_are_alfworlds_six_families_in_order():
    assert TASK_TYPES == [
        "pick_and_place_simple",
        "look_at_obj_in_light",
        "pick_clean_then_place_in_recep",
        "pick_heat_then_place_in_recep",
        "pick_cool_then_place_in_recep",
        "pick_two_obj_and_place",
    ]
    assert [TASK_SHORT_NAMES[t] for t in TASK_TYPES] == ["Pick", "Look", "Clean", "Heat", "Cool", "Pick2"]


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_every_family_yields_a_solvable_game_file(train_games, task_type):
    path = train_games[task_type]
    game = _load(path)
    assert path.name == "game.tw-pddl"
    assert path.parts[-3].startswith(task_type)  # ALFWorld's directory naming, so paths name the family too
    for key in ("pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough", "task_type", "pddl_params"):
        assert key in game
    assert game["solvable"] is True
    assert game["walkthrough"] and all(isinstance(c, str) for c in game["walkthrough"])
    assert "UNKNOWN GOAL" not in game["grammar"]
    assert f"Your task is to: {game['task_desc']}." in game["grammar"]
    assert game["scene"]["floor_plan"] == f"FloorPlan{game['scene']['scene_num']}"
    receptacles = set(re.findall(r"\(receptacleType (\S+) ", game["pddl_problem"]))
    assert 3 <= len(receptacles) <= 20


def test_problems_use_alfworlds_mangled_thor_ids(train_games):
    problem = _load(train_games["pick_clean_then_place_in_recep"])["pddl_problem"]
    assert re.search(r"\bSink_bar_[\w]+_bar_SinkBasin - receptacle", problem)
    assert "SinkBasin_bar_" not in problem  # would print "sinkbasinbasin"
    names = re.findall(r"^\s+(\S+) - (?:object|receptacle)$", problem, flags=re.MULTILINE)
    assert names and all("_bar_" in name and not re.search(r"[|+.]", name) for name in names)


def test_same_seed_gives_identical_files_and_other_seeds_differ(tmp_path, train_games):
    again = generate_games(tmp_path / "again", per_type=1, seed=0, split="train", task_types=["pick_and_place_simple"])
    assert again[0].read_bytes() == train_games["pick_and_place_simple"].read_bytes()
    other = generate_game("pick_and_place_simple", "train", seed=1)
    assert other["pddl_problem"] != _load(train_games["pick_and_place_simple"])["pddl_problem"]


def test_eval_seen_shares_floorplans_with_train_but_draws_other_instances(train_games):
    seen = generate_game("pick_and_place_simple", "eval_seen", seed=0)
    train = _load(train_games["pick_and_place_simple"])
    assert seen["pddl_problem"] != train["pddl_problem"]
    assert seen["scene"]["scene_num"] in split_floorplans("train")
    assert seen["pddl_params"]["object_target"] not in UNSEEN_OBJECT_TYPES


def test_split_partition_holds_out_floorplans_and_target_types():
    unseen_floorplans = set(split_floorplans("eval_unseen"))
    assert not unseen_floorplans & set(split_floorplans("train"))
    assert split_floorplans("train") == split_floorplans("eval_seen")
    for split in SPLITS:
        for task_type in TASK_TYPES:
            choices = [c for n in split_floorplans(split) for c in task_choices(task_type, load_floorplan(n), split)]
            assert choices, f"{task_type} impossible in {split}"
            targets = {c.object_target for c in choices}
            if split == "eval_unseen":
                assert targets <= UNSEEN_OBJECT_TYPES
            else:
                assert not targets & UNSEEN_OBJECT_TYPES


def test_generated_unseen_games_share_no_floorplan_or_target_type_with_train(train_games, unseen_games):
    train = [_load(p) for p in train_games.values()]
    unseen = [_load(p) for p in unseen_games.values()]
    assert {g["split"] for g in unseen} == {"eval_unseen"}
    assert not {g["scene"]["scene_num"] for g in train} & {g["scene"]["scene_num"] for g in unseen}
    train_targets = {g["pddl_params"]["object_target"] for g in train}
    unseen_targets = {g["pddl_params"]["object_target"] for g in unseen}
    assert not train_targets & unseen_targets
    assert all(g["solvable"] and g["walkthrough"] for g in unseen)


def test_unsolvable_problem_is_reported_not_raised(train_games):
    game = _load(train_games["pick_and_place_simple"])
    # Without placement rules nothing can be put anywhere: Fast Downward proves the goal unreachable.
    game["pddl_problem"] = re.sub(r"\(canContain [^)]*\)", "", game["pddl_problem"])
    report = check_solvable(game)
    assert report.solvable is False
    assert report.walkthrough == []
    assert "unreachable" in report.reason


def test_unsolvable_draws_are_regenerated(monkeypatch):
    real_check = generator.check_solvable
    calls = []

    def fail_first(game):
        calls.append(game["pddl_problem"])
        if len(calls) == 1:
            return SolveReport(False, [], "planted failure")
        return real_check(game)

    monkeypatch.setattr(generator, "check_solvable", fail_first)
    game = generate_game("look_at_obj_in_light", "train", seed=3)
    assert len(calls) == 2 and calls[0] != calls[1]
    assert game["solvable"] is True


def test_generation_error_lists_the_planners_reasons(monkeypatch):
    monkeypatch.setattr(generator, "check_solvable", lambda game: SolveReport(False, [], "planted failure"))
    with pytest.raises(GenerationError, match="planted failure"):
        generate_game("pick_and_place_simple", "train", seed=0)


def test_bad_arguments_are_rejected_before_work(tmp_path):
    with pytest.raises(ValueError, match="split"):
        generate_games(tmp_path, per_type=1, seed=0, split="test")
    with pytest.raises(ValueError, match="task type"):
        generate_games(tmp_path, per_type=1, seed=0, task_types=["make_coffee"])
    with pytest.raises(ValueError, match="per_type"):
        generate_games(tmp_path, per_type=-1, seed=0)
    assert not any(tmp_path.iterdir())


def test_cli_generate_list_and_play(tmp_path, capsys):
    assert cli_main(["generate", "--out", str(tmp_path), "--per-type", "1", "--seed", "4", "--task-types", "Cool"]) == 0
    out = capsys.readouterr().out
    assert "[1/1] Cool" in out and "Done: 1 solvable games" in out
    (game_file,) = tmp_path.rglob("game.tw-pddl")

    assert cli_main(["list", str(tmp_path)]) == 0
    assert "1 games (Cool: 1)" in capsys.readouterr().out

    assert cli_main(["play", str(game_file)]) == 0
    out = capsys.readouterr().out
    assert "Your task is to:" in out and "WON after" in out


def test_cli_reports_errors_without_a_traceback(tmp_path, capsys):
    assert cli_main(["play", str(tmp_path / "missing.tw-pddl")]) == 2
    assert "not found" in capsys.readouterr().err
