"""ALFWorldEnv on the real TextWorld/ALFWorld engine: walkthroughs win, malformed commands get the game's
normal answer, truncation, a hand-made problem, the factory and dataset rows, and clear errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from taspo_trl.envs.alfworld.engine import _require_engine
from taspo_trl.envs.alfworld.env import ALFWorldEnv, alfworld_env_factory, task_spec_rows
from taspo_trl.envs.alfworld.generator import game_logic, generate_games
from taspo_trl.envs.alfworld.tasks import TASK_TYPES
from taspo_trl.envs.base import AgentEnv, task_spec_from_row
from tests.helpers.alfworld_games import tiny_kitchen_problem, write_game

NOTHING_HAPPENS = "Nothing happens."


@pytest.fixture(scope="session")
def games(tmp_path_factory) -> dict[str, Path]:
    """One game per family, generated once for the whole session."""
    paths = generate_games(tmp_path_factory.mktemp("alfworld_env"), per_type=1, seed=11, split="eval_seen")
    return {json.loads(p.read_text())["task_type"]: p for p in paths}


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_walkthrough_wins_for_every_family(games, task_type):
    env = ALFWorldEnv(games[task_type])
    assert env.task_type == task_type
    observation = env.reset()
    assert observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert f"Your task is to: {env.task}" in observation
    assert {"look", "inventory"} <= set(env.admissible_commands)
    results = [env.step(command) for command in env.walkthrough]
    env.close()
    *before, last = results
    assert all(r.reward == 0.0 and not r.done and not r.info["won"] for r in before)
    assert last.reward == 1.0 and last.done and last.info["won"] and not last.info["truncated"]


def test_names_are_demangled_as_alfworld_prints_them(games):
    env = ALFWorldEnv(games["pick_clean_then_place_in_recep"])
    observation = env.reset()
    commands = env.admissible_commands
    env.close()
    assert "go to sinkbasin 1" in commands
    assert all(re.fullmatch(r"[a-z0-9 ]+", c) for c in commands)
    assert "_bar_" not in observation and "sinkbasinbasin" not in observation
    assert re.search(r"you see (a [a-z]+ \d+, )+and a [a-z]+ \d+\.", observation)


@pytest.mark.parametrize("command", ["", "   ", "xyzzy", "go to the moon " * 300, "prends la pomme ñ 🍎", "look look"])
def test_malformed_commands_get_the_games_normal_answer(games, command):
    env = ALFWorldEnv(games["pick_and_place_simple"])
    env.reset()
    admissible = env.admissible_commands
    result = env.step(command)
    env.close()
    expected = NOTHING_HAPPENS
    assert result.observation == expected
    assert result.reward == 0.0 and not result.done and not result.info["won"]
    assert result.info["admissible_commands"] == admissible


def test_episode_truncates_after_max_turns(games):
    env = ALFWorldEnv(games["pick_two_obj_and_place"], max_turns=3)
    env.reset()
    results = [env.step("look") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["truncated"] and not results[-1].info["won"] and results[-1].reward == 0.0
    after = env.step("look")  # stepping a finished episode is harmless
    assert after.done and after.reward == 0.0
    assert env.turns == 3
    env.reset()  # a reset starts a new episode
    assert env.turns == 0 and not env.step("look").done
    env.close()


def test_win_on_the_last_allowed_turn_is_not_truncation(games):
    walkthrough = ALFWorldEnv(games["look_at_obj_in_light"]).walkthrough
    env = ALFWorldEnv(games["look_at_obj_in_light"], max_turns=len(walkthrough))
    env.reset()
    last = [env.step(c) for c in walkthrough][-1]
    env.close()
    assert last.info["won"] and not last.info["truncated"] and last.reward == 1.0


def test_hand_made_problem_plays_on_the_installed_domain_and_grammar(tmp_path):
    domain, grammar = game_logic()
    game_file = write_game(
        tmp_path / "tiny" / "game.tw-pddl",
        pddl_domain=domain,
        grammar=grammar.replace("UNKNOWN GOAL", "put some apple in fridge"),
        pddl_problem=tiny_kitchen_problem(),
    )
    env = ALFWorldEnv(game_file)
    observation = env.reset()
    assert "you see a countertop 1, and a fridge 1." in observation
    assert env.task == "put some apple in fridge."
    assert env.task_type is None and env.walkthrough is None
    steps = [
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a apple 1."),
        ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."),
        ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
        ("move apple 1 to fridge 1", NOTHING_HAPPENS),  # closed: not admissible
        ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see nothing."),
        ("move apple 1 to fridge 1", "You move the apple 1 to the fridge 1."),
    ]
    for command, expected in steps:
        result = env.step(command)
        assert result.observation == expected
    env.close()
    assert result.done and result.info["won"] and result.reward == 1.0


def test_official_layout_infers_task_type_and_fills_the_task_from_traj_data(games, tmp_path):
    game = json.loads(games["pick_heat_then_place_in_recep"].read_text())
    domain, grammar = game_logic()
    trial = tmp_path / "json_2.1.1" / "train" / "pick_heat_then_place_in_recep-Apple-None-Fridge-5" / "trial_T1"
    game_file = write_game(
        trial / "game.tw-pddl",
        pddl_domain=domain,
        grammar=grammar,
        pddl_problem=game["pddl_problem"],
        solvable=True,
        walkthrough=game["walkthrough"],
    )
    env = ALFWorldEnv(game_file)
    assert env.task_type == "pick_heat_then_place_in_recep"  # from the directory name
    assert env.task == "UNKNOWN GOAL."  # a raw grammar without traj_data shows ALFWorld's placeholder
    (trial / "traj_data.json").write_text(json.dumps({k: game[k] for k in ("task_type", "pddl_params")}))
    env = ALFWorldEnv(game_file)
    target, parent = game["pddl_params"]["object_target"].lower(), game["pddl_params"]["parent_target"].lower()
    assert target in env.task and parent in env.task
    assert f"Your task is to: {env.task}" in env.reset()
    env.close()


def test_env_follows_the_agent_env_protocol(games):
    env = alfworld_env_factory({"game_file": str(games["pick_cool_then_place_in_recep"]), "max_turns": 7})
    assert isinstance(env, AgentEnv)
    assert env.max_turns == 7 and env.action_tag == "action"
    assert alfworld_env_factory({"game_file": games["pick_cool_then_place_in_recep"]}).max_turns == 50
    with pytest.raises(ValueError, match="game_file"):
        alfworld_env_factory({"max_turns": 3})


def test_task_spec_rows_name_each_game(games):
    files = [games[t] for t in TASK_TYPES]
    rows = task_spec_rows(files)
    assert [r["task_type"] for r in rows] == TASK_TYPES
    for row, game_file in zip(rows, files):
        assert set(row) == {"prompt", "game_file", "task_type"}
        spec = task_spec_from_row({"prompt": row["prompt"]})  # the prompt alone carries the task (TRL rollout_func)
        assert spec["env"] == "alfworld" and spec["game_file"] == row["game_file"] == str(game_file)
        assert spec["task_type"] == row["task_type"]
        assert json.loads(game_file.read_text())["task_desc"] in spec["task"]


def test_missing_game_file_names_the_path_and_how_to_generate(tmp_path):
    missing = tmp_path / "nowhere" / "game.tw-pddl"
    with pytest.raises(FileNotFoundError, match="taspo-alfworld generate") as error:
        ALFWorldEnv(missing)
    assert str(missing) in str(error.value)
    with pytest.raises(FileNotFoundError):
        task_spec_rows([missing])


def test_corrupt_game_files_name_the_file_and_the_problem(tmp_path, games):
    not_json = tmp_path / "broken.tw-pddl"
    not_json.write_text("{ this is not json")
    with pytest.raises(ValueError, match="not valid JSON") as error:
        ALFWorldEnv(not_json)
    assert str(not_json) in str(error.value)

    game = json.loads(games["pick_and_place_simple"].read_text())
    del game["pddl_problem"]
    missing_key = write_game(tmp_path / "nokey.tw-pddl", **game)
    with pytest.raises(ValueError, match="pddl_problem") as error:
        ALFWorldEnv(missing_key)
    assert str(missing_key) in str(error.value)

    game["pddl_problem"], game["solvable"] = "(define)", False
    marked = write_game(tmp_path / "marked.tw-pddl", **game)
    with pytest.raises(ValueError, match="marked unsolvable"):
        ALFWorldEnv(marked)


def test_unsolvable_game_file_fails_with_a_clear_error(tmp_path, games):
    game = json.loads(games["pick_and_place_simple"].read_text())
    game["pddl_problem"] = re.sub(r"\(canContain [^)]*\)", "", game["pddl_problem"])
    game_file = write_game(tmp_path / "unsolvable.tw-pddl", **game)
    env = ALFWorldEnv(game_file)
    with pytest.raises(ValueError, match="unsolvable"):
        env.reset()


def test_missing_optional_dependency_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld", None)
    with pytest.raises(ImportError, match=re.escape('pip install "taspo-trl[alfworld]"')):
        _require_engine()


def test_package_imports_without_the_optional_dependencies(tmp_path):
    blocked = "import sys\nfor name in ('alfworld', 'textworld', 'fast_downward'):\n    sys.modules[name] = None\n"
    script = blocked + (
        "import taspo_trl.envs.alfworld as alfworld\n"
        "try:\n"
        "    alfworld.generate_games('out', 1, 0)\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    repo_root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(repo_root)},
    )
    assert result.returncode == 0, result.stderr
    assert 'pip install "taspo-trl[alfworld]"' in result.stdout


def _play_walkthrough(game_file: Path) -> list[str]:
    env = ALFWorldEnv(game_file)
    printed = [env.reset(), *env.admissible_commands]
    for command in env.walkthrough:
        printed += [env.step(command).observation, *env.admissible_commands]
    env.close()
    return printed


def test_remembered_template_parses_print_the_same_game_with_fewer_parses(games, monkeypatch):
    from taspo_trl.envs.alfworld import engine

    _require_engine()
    calls = []
    for module in engine._parsing_modules():
        shipped = module._parse_and_convert.__wrapped__

        def counted(*args, _parse=shipped, **kwargs):
            calls.append(args[0])
            return _parse(*args, **kwargs)

        monkeypatch.setattr(module, "_parse_and_convert", counted)
    game_file = games["pick_heat_then_place_in_recep"]
    with monkeypatch.context() as shipped_only:
        shipped_only.setattr(engine, "_remember_template_parses", lambda: None)
        as_shipped = _play_walkthrough(game_file)
    shipped_calls = len(calls)
    calls.clear()
    engine._remember_template_parses()  # wraps the counting parses
    first = _play_walkthrough(game_file)
    first_calls = len(calls)
    again = _play_walkthrough(game_file)

    assert first == as_shipped and again == as_shipped
    assert first_calls == len(set(calls)) < shipped_calls  # each distinct text parsed once
    assert len(calls) == first_calls  # the second episode parsed nothing


def test_a_remembered_parse_hands_out_copies():
    from taspo_trl.envs.alfworld.engine import _remembering

    made = []

    def parse(text, rule_name=None):
        made.append(text)
        return [{"symbol": text, "rule": rule_name}]

    remembered = _remembering(parse)
    first = remembered("#intro#", rule_name="symbols")
    first[0]["context"] = "mutated by the caller"
    second = remembered("#intro#", rule_name="symbols")
    assert second == [{"symbol": "#intro#", "rule": "symbols"}]
    assert remembered("#intro#", rule_name="other") == [{"symbol": "#intro#", "rule": "other"}]
    assert made == ["#intro#", "#intro#"]


def _fast_downward_copies_loaded() -> int:
    """How many copies of ``libdownward.so`` this process has mapped (TextWorld loads each from a temp folder)."""
    return len({line.split()[-2] if line.endswith("(deleted)") else line.split()[-1]
                for line in Path("/proc/self/maps").read_text().splitlines() if "libdownward.so" in line})


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's memory map of the process")
def test_closed_engines_hand_their_fast_downward_copy_to_the_next_game(games):
    files = [games[task_type] for task_type in TASK_TYPES]
    envs = [ALFWorldEnv(game_file) for game_file in files]  # open together: each needs a copy of its own
    printed = {game_file: [env.reset(), *env.admissible_commands] for game_file, env in zip(files, envs)}
    for turn in range(max(len(env.walkthrough) for env in envs)):  # round robin: the copies' states interleave
        for game_file, env in zip(files, envs):
            if turn < len(env.walkthrough):
                printed[game_file] += [env.step(env.walkthrough[turn]).observation, *env.admissible_commands]
    assert all(env.step("look").info["won"] for env in envs)
    for env in envs:
        env.close()
    copies = _fast_downward_copies_loaded()
    assert copies >= len(files)

    for _ in range(2):  # each game again, one at a time, on copies that played other games before
        for game_file in files:
            assert _play_walkthrough(game_file) == printed[game_file]
    assert _fast_downward_copies_loaded() == copies
