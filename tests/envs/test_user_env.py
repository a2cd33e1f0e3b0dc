"""A user's environment, registered with its task rows in its own module, runs through ``taspo-train`` and
``taspo-eval`` by name (``--env_module``), in process as the console scripts run them."""

from __future__ import annotations

import json

import pytest

from taspo_trl import envs
from taspo_trl.cli import train_main
from taspo_trl.envs import build_task_rows, register_env
from taspo_trl.evaluation import eval_main

CPU = ["--report_to", "none", "--use_cpu", "true", "--bf16", "false", "--save_strategy", "no"]


def test_registered_environment_trains_one_step_and_evaluates_by_name(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    train_main([
        "--env_module", "tests.helpers.user_env", "--environment", "lockers", "--model_name_or_path", tiny_model_dir,
        "--output_dir", str(run), "--max_tasks", "2", "--max_turns", "2", "--max_steps", "1",
        "--per_device_train_batch_size", "2", "--num_generations", "2", "--max_completion_length", "8", *CPU,
    ])
    assert "env=lockers tasks=2 " in capsys.readouterr().out  # the dataset is the registered builder's rows
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 1

    eval_main([
        "--env_module", "tests.helpers.user_env", "--environment", "lockers", "--splits", "test",
        "--model_name_or_path", str(run), "--max_tasks", "3", "--max_turns", "1", "--max_completion_length", "8",
        "--results_dir", str(tmp_path / "eval"),
    ])
    result = json.loads((tmp_path / "eval" / "lockers_test.json").read_text())
    assert result["env"] == "lockers" and result["num_tasks"] == 3
    assert set(result["groups"]) == {"lockers-test"}  # the split reached the builder as task_split
    assert (tmp_path / "eval" / "results.md").read_text().startswith("Success rate (%):\n\n| Method | lockers-test | All |")


def test_unknown_environment_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"'alfworld'.*'search'.*'webshop'.*--env_module"):
        build_task_rows("no_such_env", {}, None)


def test_environment_registered_without_rows_names_the_fix(monkeypatch):
    monkeypatch.setattr(envs, "_REGISTRY", dict(envs._REGISTRY))  # undone after the test
    monkeypatch.setattr(envs, "_ROWS", dict(envs._ROWS))
    register_env("rowless", lambda: None)
    with pytest.raises(ValueError, match="rows="):
        build_task_rows("rowless", {}, None)


def test_env_module_that_cannot_be_imported_stops_before_training(tiny_model_dir):
    with pytest.raises(SystemExit, match="--env_module no_such_module_here.*PYTHONPATH"):
        train_main(["--env_module", "no_such_module_here", "--environment", "lockers",
                    "--model_name_or_path", tiny_model_dir, "--output_dir", "unused", *CPU])


def test_rule_analyzer_on_an_environment_it_has_no_rules_for_is_refused_before_training(tmp_path, tiny_model_dir):
    from taspo_trl.cli import build_trainer

    argv = ["--env_module", "tests.helpers.user_env", "--environment", "lockers",
            "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "run"), "--max_tasks", "2",
            "--max_turns", "2", "--max_steps", "1", "--per_device_train_batch_size", "2", "--num_generations", "2",
            "--max_completion_length", "8", *CPU]
    # TASPO's aligned PI is written by the analyzer: the ALFWorld rules would read the lockers' actions as nothing
    with pytest.raises(ValueError, match=r"analyzer='rule'.*not for environment 'lockers'.*analyzer='openai'.*"
                                         r"analyzer_rules"):
        build_trainer([*argv, "--method", "taspo"])
    named = build_trainer([*argv, "--method", "taspo", "--analyzer_rules", "alfworld"])
    assert named.analyzer.environment == "alfworld"
    assert build_trainer([*argv, "--method", "gigpo"]).analyzer is None  # its credit needs no analyzer


def test_a_built_in_environment_names_its_rule_set(tmp_path, tiny_model_dir):
    from taspo_trl.cli import build_trainer

    trainer = build_trainer(["--environment", "search", "--method", "taspo", "--model_name_or_path", tiny_model_dir,
                             "--output_dir", str(tmp_path / "run"), "--max_tasks", "2", "--max_turns", "2",
                             "--per_device_train_batch_size", "2", "--num_generations", "2",
                             "--max_completion_length", "8", *CPU])
    assert trainer.environment_name == "search" and trainer.analyzer.environment == "search"
