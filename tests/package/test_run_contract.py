"""A run does exactly what was asked (issue 39): no silent zero-step runs, no steps past ``max_steps`` on resume,
a damaged model file caught with its path, and errors in the words the user typed.

Each case runs as a user runs it: ``python -m taspo_trl.cli`` (``taspo-train``) or ``python -m
taspo_trl.evaluation`` (``taspo-eval``) in a subprocess, with a tiny random-weight model, checking the exit
status, that the error is one line and that no traceback is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    variables = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, env={**variables, **(env or {})},
                          capture_output=True, text=True, timeout=300)


def _one_line_error(done: subprocess.CompletedProcess, program: str) -> str:
    """The single error line of a failed setup, checked for its shape."""
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith(f"{program}: error: ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def _train_argv(tiny_model_dir: str, games_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    """The CPU GRPO quickstart on a tiny model, with the shortest episodes: ~1 s per step."""
    return ["--config", "alfworld_grpo_cpu", "--model_name_or_path", tiny_model_dir, "--games_dir", str(games_dir),
            "--output_dir", str(output_dir), "--max_turns", "2", "--max_completion_length", "8", "--bf16", "false",
            *extra]


# --- zero steps ---------------------------------------------------------------------------------------------------


def test_dataset_smaller_than_one_generation_batch_fails_before_training(tmp_path, tiny_model_dir, family_games_dir):
    # The command: 2 x 8 = 16 rollouts per step are 8 tasks of 2 siblings, and there are 6 tasks.
    done = _run("taspo_trl.cli", *_train_argv(tiny_model_dir, family_games_dir, tmp_path / "out", "--max_steps", "8",
                "--per_device_train_batch_size", "2", "--num_generations", "2"), cwd=tmp_path)
    line = _one_line_error(done, "taspo-train")
    assert "6 tasks, but one step needs 8" in line
    for named in ("per_device_train_batch_size 2", "gradient_accumulation_steps 8", "num_generations 2"):
        assert named in line
    assert "lower gradient_accumulation_steps or per_device_train_batch_size" in line
    assert "done; model saved" not in done.stdout and not (tmp_path / "out").exists()


def test_python_trainer_refuses_a_dataset_smaller_than_one_generation_batch(tmp_path, tiny_model_dir):
    from datasets import Dataset

    from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer
    from taspo_trl.envs.base import encode_task_prompt

    config = AgentGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_steps=3,
                             per_device_train_batch_size=4, num_generations=2, gradient_accumulation_steps=1)
    dataset = Dataset.from_list([{"prompt": encode_task_prompt({"task": "one"})}])
    with pytest.raises(ValueError, match="1 tasks, but one step needs 2"):
        AgentGRPOTrainer(model=tiny_model_dir, args=config, train_dataset=dataset)


# --- resume past the budget ---------------------------------------------------------------------------------------


FINISHED_RUN = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--num_generations", "2",
                "--gradient_accumulation_steps", "1", "--save_strategy", "steps", "--save_steps", "1"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir, family_games_dir) -> tuple[Path, list[str]]:
    """A run that trained its 2 steps and saved checkpoint-1 and checkpoint-2; its output_dir and command."""
    out = tmp_path_factory.mktemp("finished") / "out"
    argv = _train_argv(tiny_model_dir, family_games_dir, out, *FINISHED_RUN)
    first = _run("taspo_trl.cli", *argv, cwd=out.parent)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    return out, argv


def test_a_finished_run_relaunched_with_resume_trains_no_more(tmp_path, finished_run):
    out, argv = finished_run
    final = (out / "model.safetensors").read_bytes()
    for _ in range(2):  # a scheduler that re-queues the finished job, twice
        again = _run("taspo_trl.cli", *argv, "--resume_from_checkpoint", "true", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert "already finished" in again.stdout and "checkpoint-2" in again.stdout and "max_steps 2" in again.stdout
        assert "[step 3/2]" not in again.stdout
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
        assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
        assert (out / "model.safetensors").read_bytes() == final  # the trained model is not replaced


def test_python_trainer_resumed_at_its_budget_returns_the_finished_model(finished_run, tiny_model_dir,
                                                                         family_games_dir):
    from datasets import Dataset
    from safetensors.torch import load_file

    from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer
    from taspo_trl.envs.alfworld import task_spec_rows

    out, _ = finished_run
    config = AgentGRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", max_steps=2,
                             per_device_train_batch_size=2, num_generations=2, max_turns=2, max_completion_length=8)
    dataset = Dataset.from_list(task_spec_rows(sorted(family_games_dir.rglob("*.tw-pddl"))))
    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=config, train_dataset=dataset)
    try:
        output = trainer.train(resume_from_checkpoint=True)
    finally:
        trainer.close()
    assert output.global_step == 2 and trainer.state.global_step == 2
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    trained = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    weights = trainer.model.state_dict()
    assert all(weights[name].equal(tensor) for name, tensor in trained.items())  # the checkpoint's, not the start's


# --- a damaged model file -----------------------------------------------------------------------------------------


def test_a_truncated_model_file_is_one_line_naming_the_path(tmp_path, tiny_model_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    done = _run("taspo_trl.cli", "--config", "alfworld_grpo_cpu", "--model_name_or_path", str(model),
                "--output_dir", str(tmp_path / "out"), "--games_dir", str(tmp_path / "games"), cwd=tmp_path)
    line = _one_line_error(done, "taspo-train")
    assert str(weights) in line and "save_pretrained" in line
    assert not (tmp_path / "games").exists()  # found before any game was generated


def test_a_truncated_cached_embedded_model_is_rebuilt_with_a_warning(tmp_path, monkeypatch, capsys, embedded_model_path):
    """The converted embedded model is derived data: a damaged copy is converted again. The conversion is
    replaced by a copy of the real cache's files (the same bytes, without the 30 s GGUF de-quantization)."""
    from safetensors.torch import load_file

    from taspo_trl import models

    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_find_gguf_file", lambda: Path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    monkeypatch.setattr(models, "_export_gguf", lambda gguf, out: shutil.copytree(embedded_model_path, out,
                                                                                    dirs_exist_ok=True))
    first = Path(models.resolve_embedded(models.EMBEDDED_MODEL))
    weights = first / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as handle:  # cut off, as a full disk or a killed copy leaves it
        handle.truncate(size // 2)
    capsys.readouterr()
    again = Path(models.resolve_embedded(models.EMBEDDED_MODEL))
    warning = capsys.readouterr().err
    assert "model.safetensors" in warning and "rebuilding" in warning
    assert again.stat().st_size and weights.stat().st_size == size
    assert "model.embed_tokens.weight" in load_file(str(weights))


# --- errors in the user's words ------------------------------------------------------------------------------------


def test_negative_max_completion_length_is_named_as_typed(tmp_path, tiny_model_dir):
    train = _run("taspo_trl.cli", "--config", "alfworld_grpo_cpu", "--model_name_or_path", tiny_model_dir,
                 "--output_dir", str(tmp_path / "out"), "--games_dir", str(tmp_path / "games"),
                 "--max_completion_length", "-5", cwd=tmp_path)
    line = _one_line_error(train, "taspo-train")
    assert "max_completion_length" in line and "-5" in line and "max_new_tokens" not in line
    evaluation = _run("taspo_trl.evaluation", "--model_name_or_path", tiny_model_dir, "--environment", "search",
                      "--max_tasks", "1", "--results_dir", str(tmp_path / "eval"), "--max_completion_length", "-5",
                      cwd=tmp_path)
    line = _one_line_error(evaluation, "taspo-eval")
    assert "max_completion_length" in line and "-5" in line and "max_new_tokens" not in line
    assert not (tmp_path / "eval").exists()


def test_an_unknown_recipe_key_suggests_the_closest_field(tmp_path, tiny_model_dir):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("method: grpo\nenvironment: alfworld\nuse_cpu: true\nreport_to: none\nnum_generation: 4\n"
                      "per_device_train_batch_size: 4\n")
    done = _run("taspo_trl.cli", "--config", str(recipe), "--model_name_or_path", tiny_model_dir,
                "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    line = _one_line_error(done, "taspo-train")
    assert "num_generation" in line and str(recipe) in line and "did you mean num_generations?" in line


@pytest.mark.parametrize(("module", "program", "typo", "field"), [
    ("taspo_trl.cli", "taspo-train", "--gradient_acumulation_steps", "gradient_accumulation_steps"),
    ("taspo_trl.evaluation", "taspo-eval", "--max_turnz", "max_turns"),
    # An abbreviation is a typo too: argparse would have taken it as --max_steps and trained a real step.
    ("taspo_trl.cli", "taspo-train", "--max_step", "max_steps"),
])
def test_an_unknown_flag_suggests_the_closest_field(tmp_path, module, program, typo, field):
    done = _run(module, "--config", "alfworld_grpo_cpu", typo, "4", cwd=tmp_path)
    line = _one_line_error(done, program)
    assert typo in line and f"did you mean --{field}?" in line


@pytest.mark.parametrize(("module", "program", "where"), [
    ("taspo_trl.cli", "taspo-train", "recipe"),
    ("taspo_trl.cli", "taspo-train", "flag"),
    ("taspo_trl.evaluation", "taspo-eval", "flag"),
])
def test_the_old_datasets_key_names_search_datasets(tmp_path, module, program, where):
    """`datasets` meant Search-QA's question sets, unlike TRL's; it is now `search_datasets`, and the old key is
    refused in one line naming the new one (never read as an alias)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("method: grpo\nenvironment: search\nuse_cpu: true\nreport_to: none\n"
                      + ("datasets: [nq]\n" if where == "recipe" else ""))
    extra = ["--datasets", "nq"] if where == "flag" else []
    done = _run(module, "--config", str(recipe), *extra, "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    line = _one_line_error(done, program)
    assert "datasets is now called" in line and "search_datasets" in line, line
    assert not (tmp_path / "out").exists()
