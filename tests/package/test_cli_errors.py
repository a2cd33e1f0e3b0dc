"""Bad input to ``taspo-train`` and ``taspo-eval`` fails before any work, in one line that names the fix.

Run as a user runs them: ``python -m`` in a subprocess (exit status, stderr, no traceback) for the headline
cases, and through the commands' own ``main(argv)`` for the rest, which is the same code without the start-up
cost of a fresh interpreter.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taspo_trl.cli import train_main
from taspo_trl.evaluation import EvalArguments, build_generator, eval_main
from taspo_trl.trainers.grpo import AgentGRPOConfig
from taspo_trl.trainers.sft import AgentSFTConfig

ROOT = Path(__file__).resolve().parents[2]
MISSING_MODEL = "/no/such/folder/model"


def _run(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _one_line_exit(excinfo: pytest.ExceptionInfo, program: str) -> str:
    """The message of a one-line setup error, checked for its shape."""
    message = str(excinfo.value.code)
    assert message.startswith(f"{program}: error: ") and "\n" not in message, message
    return message


# --- taspo-train -----------------------------------------------------------------------------------------------


def test_train_missing_model_is_one_line_without_traceback(tmp_path):
    done = _run("taspo_trl.cli", "--config", "alfworld_grpo_cpu", "--model_name_or_path", MISSING_MODEL,
                "--output_dir", str(tmp_path / "out"), "--games_dir", str(tmp_path / "games"), cwd=tmp_path)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr
    assert lines[-1].startswith("taspo-train: error: ") and MISSING_MODEL in lines[-1]
    assert len(lines) == 1, lines  # nothing before it, not even transformers' warning about TRL's defaults
    assert not (tmp_path / "games").exists()  # checked before any game was generated


CONFIG_ARGS = {
    AgentGRPOConfig: {"num_generations": 2, "per_device_train_batch_size": 2},
    AgentSFTConfig: {"environment": "alfworld"},
}


@pytest.mark.parametrize("config_class", list(CONFIG_ARGS), ids=lambda c: c.__name__)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_config_keeps_gradient_checkpointing_without_the_deprecation_warning(tmp_path, config_class, checkpointing,
                                                                               recwarn):
    config = config_class(output_dir=str(tmp_path), gradient_checkpointing=checkpointing, use_cpu=True,
                          report_to="none", **CONFIG_ARGS[config_class])
    assert config.gradient_checkpointing is checkpointing and config.activation_checkpointing is checkpointing
    assert not [w for w in recwarn if "gradient_checkpointing" in str(w.message)]


def test_train_debug_shows_the_original_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        train_main(["--config", "alfworld_grpo_cpu", "--model_name_or_path", MISSING_MODEL,
                    "--output_dir", str(tmp_path / "out"), "--debug"])


def test_train_unknown_recipe_names_the_close_ones(tmp_path):
    with pytest.raises(SystemExit) as excinfo:
        train_main(["--config", "alfworld_taspo_cp"])
    message = str(excinfo.value.code)
    assert "no shipped recipe named 'alfworld_taspo_cp'" in message and "alfworld_taspo_cpu" in message
    with pytest.raises(SystemExit, match="taspo-recipes list"):
        train_main(["--config", "nothing_like_any_recipe"])


@pytest.mark.parametrize(("text", "kind"), [("- method: grpo\n- environment: alfworld\n", "list"), ("just words\n", "str")])
def test_train_recipe_must_be_a_mapping(tmp_path, text, kind):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with pytest.raises(SystemExit, match=f"a recipe is a YAML mapping.*not a {kind}"):
        train_main(["--config", str(recipe)])


def _search_argv(tmp_path: Path, model_dir: str, *extra: str) -> list[str]:
    """A CPU search recipe whose retriever spec is unusable: building its rows is the first step after the
    model and output_dir checks, so the retriever error shows that those checks passed."""
    return ["--config", "search_grpo_cpu", "--model_name_or_path", model_dir, "--output_dir", str(tmp_path / "out"),
            "--retriever", "ftp://127.0.0.1/index", *extra]


def test_train_bad_retriever_fails_before_training(tmp_path, tiny_model_dir):
    with pytest.raises(SystemExit) as excinfo:
        train_main(_search_argv(tmp_path, tiny_model_dir))
    message = _one_line_exit(excinfo, "taspo-train")
    assert "ftp://127.0.0.1/index" in message and "http" in message
    assert not (tmp_path / "out").exists()


def test_train_refuses_an_output_dir_with_checkpoints_unless_told(tmp_path, tiny_model_dir):
    (tmp_path / "out" / "checkpoint-1").mkdir(parents=True)
    with pytest.raises(SystemExit) as excinfo:
        train_main(_search_argv(tmp_path, tiny_model_dir))
    message = _one_line_exit(excinfo, "taspo-train")
    assert "checkpoint-1" in message and "--overwrite_output_dir" in message and "--resume_from_checkpoint" in message
    for allow in (["--overwrite_output_dir", "true"], ["--resume_from_checkpoint", "true"]):
        with pytest.raises(SystemExit) as excinfo:
            train_main(_search_argv(tmp_path, tiny_model_dir, *allow))
        assert "ftp://" in _one_line_exit(excinfo, "taspo-train")  # past the output_dir check
    assert (tmp_path / "out" / "checkpoint-1").is_dir()


@pytest.mark.parametrize(("flags", "field"), [
    (["--num_generations", "0"], "num_generations"),
    (["--num_generations", "3"], "num_generations"),  # 1 x 8 = 8 rollouts per batch: not whole groups of 3
    (["--max_turns", "0"], "max_turns"),
])
def test_train_bad_counts_are_one_line(tmp_path, tiny_model_dir, flags, field):
    with pytest.raises(SystemExit) as excinfo:
        train_main(["--config", "alfworld_grpo_cpu", "--model_name_or_path", tiny_model_dir,
                    "--output_dir", str(tmp_path / "out"), *flags])
    assert field in _one_line_exit(excinfo, "taspo-train")


# --- AgentGRPOConfig ---------------------------------------------------------------------------------------------


def _config(**overrides) -> AgentGRPOConfig:
    settings = {"output_dir": "unused", "use_cpu": True, "bf16": False, "report_to": "none",
                "per_device_train_batch_size": 4, "num_generations": 2, **overrides}
    return AgentGRPOConfig(**settings)


@pytest.mark.parametrize(("field", "value"), [
    ("num_generations", 0), ("num_generations", 1), ("num_generations", -2),
    ("max_turns", 0), ("history_window", -1), ("max_prompt_tokens", 0), ("env_workers", -1),
    ("rollout_batch_size", 0), ("rescore_batch_size", 0), ("skill_top_k", 0), ("prompt_skill_top_k", 0),
    ("advantage_epsilon", 0.0), ("env_step_timeout", 0.0),
])
def test_config_refuses_bad_counts_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        _config(**{field: value})


def test_config_names_the_batch_fix_when_groups_do_not_divide_the_batch():
    with pytest.raises(ValueError, match="per_device_train_batch_size: 3"):
        _config(per_device_train_batch_size=4, num_generations=3)


def test_config_keeps_valid_edge_values():
    config = _config(max_turns=1, history_window=0, env_workers=0, num_generations=4, rollout_batch_size=1)
    assert (config.max_turns, config.history_window, config.num_generations) == (1, 0, 4)


# --- taspo-eval --------------------------------------------------------------------------------------------------


def test_eval_missing_model_is_one_line_and_builds_no_games(tmp_path):
    done = _run("taspo_trl.evaluation", "--model_name_or_path", MISSING_MODEL,
                "--games_root", str(tmp_path / "games"), "--results_dir", str(tmp_path / "eval"), cwd=tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("taspo-eval: error: ") and MISSING_MODEL in last
    assert not (tmp_path / "games").exists() and not (tmp_path / "eval").exists()


def test_eval_debug_shows_the_original_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        eval_main(["--model_name_or_path", MISSING_MODEL, "--games_root", str(tmp_path), "--debug"])


@pytest.mark.parametrize(("flags", "field"), [
    (["--top_p", "0"], "top_p"),
    (["--repetition_penalty", "0"], "repetition_penalty"),
    (["--min_p", "1.5"], "min_p"),
    (["--env_step_timeout", "0"], "env_step_timeout"),
    (["--generation_kwargs", "{not json"], "generation_kwargs"),
    (["--generation_kwargs", '{"no_such_setting": 1}'], "no_such_setting"),
])
def test_eval_bad_generation_settings_are_one_line(tmp_path, tiny_model_dir, flags, field):
    # environment search: its rows need no generated games, so the failure is quick whatever its stage
    with pytest.raises(SystemExit) as excinfo:
        eval_main(["--model_name_or_path", tiny_model_dir, "--environment", "search", "--max_tasks", "1",
                   "--results_dir", str(tmp_path / "eval"), *flags])
    assert field in _one_line_exit(excinfo, "taspo-eval")
    assert not (tmp_path / "eval").exists()


def test_eval_unknown_recipe_names_the_close_ones():
    with pytest.raises(SystemExit, match="alfworld_taspo_cpu"):
        eval_main(["--config", "alfworld_taspo_cp"])


def test_eval_bad_games_folder_is_one_line(tmp_path, tiny_model_dir):
    broken = tmp_path / "games" / "eval_seen" / "a"
    broken.mkdir(parents=True)
    (broken / "game.tw-pddl").write_text('{"pddl_domain": "(define')  # cut off mid-file
    with pytest.raises(SystemExit) as excinfo:
        eval_main(["--model_name_or_path", tiny_model_dir, "--games_root", str(tmp_path / "games"),
                   "--splits", "eval_seen"])
    message = _one_line_exit(excinfo, "taspo-eval")
    assert "not valid JSON" in message and f"Delete {tmp_path / 'games' / 'eval_seen'}" in message


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU fallback")
def test_eval_use_vllm_without_a_gpu_falls_back_to_transformers(tiny_model_dir, caplog):
    from taspo_trl.models import load_model_and_tokenizer
    from taspo_trl.rollout.generation import TransformersGenerator

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    with caplog.at_level(logging.WARNING, logger="taspo_trl"):
        generator = build_generator(model, tokenizer, EvalArguments(use_vllm=True))
    assert isinstance(generator, TransformersGenerator)
    assert "no CUDA GPU" in caplog.text


def test_eval_use_vllm_with_a_gpu_but_no_vllm_names_the_extra(tiny_model_dir, monkeypatch):
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    from taspo_trl.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the guard's branch for a GPU machine
    with pytest.raises(ImportError, match=r"taspo-trl\[vllm\]"):
        build_generator(model, tokenizer, EvalArguments(use_vllm=True))


def test_a_script_without_a_main_guard_is_told_so_when_its_worker_dies(tmp_path):
    """A spawned worker imports the main script; without ``if __name__ == "__main__":`` it re-runs the pool's
    construction and dies during start-up. The error says so (exit code, the guard), instead of a start-up timeout."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from taspo_trl.envs import get_env_factory\n"
        "from taspo_trl.rollout.env_pool import EnvPool\n"
        "EnvPool(get_env_factory('alfworld'), num_workers=1).shutdown()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    assert "exited during start-up" in done.stderr and 'if __name__ == "__main__":' in done.stderr, done.stderr[-2000:]
    assert "did not start within" not in done.stderr
