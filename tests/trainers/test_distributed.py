"""Two processes (accelerate, gloo on CPU) compute the same TASPO weights and PI as one process, with the
task group split across the processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taspo_trl.envs.alfworld import generate_games

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "taspo_weights.py"


def _run(command: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def test_two_processes_give_the_same_weights_as_one(tmp_path, tiny_model_dir):
    game = generate_games(tmp_path / "games", per_type=1, seed=0, split="train", task_types=["pick_and_place_simple"])[0]
    single, double = tmp_path / "one" / "w.json", tmp_path / "two" / "w.json"
    single.parent.mkdir()
    double.parent.mkdir()
    _run([sys.executable, str(SCRIPT), tiny_model_dir, str(game), str(single)], tmp_path)
    _run(
        [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            str(SCRIPT), tiny_model_dir, str(game), str(double),
        ],
        tmp_path,
    )
    one, two = json.loads(single.read_text()), json.loads(double.read_text())
    assert (one["processes"], two["processes"]) == (1, 2)
    assert one["pi"] == two["pi"] and any(one["pi"])
    assert len(one["weights"]) == len(two["weights"]) == 4
    for a, b in zip(one["weights"], two["weights"]):
        assert a == pytest.approx(b, abs=1e-6)
    assert any(w != 1.0 for traj in one["weights"] for w in traj)


def test_an_outcome_method_gives_the_same_credit_on_two_processes_as_on_one(tmp_path, tiny_model_dir):
    """GiGPO's anchor-state groups span the group's four siblings, two on each process: the hook sees the whole
    batch (``StepView.everything``) and each process keeps its own two trajectories' credit."""
    game = generate_games(tmp_path / "games", per_type=1, seed=0, split="train", task_types=["pick_and_place_simple"])[0]
    single, double = tmp_path / "one" / "a.json", tmp_path / "two" / "a.json"
    single.parent.mkdir()
    double.parent.mkdir()
    _run([sys.executable, str(SCRIPT), tiny_model_dir, str(game), str(single), "gigpo"], tmp_path)
    _run(
        [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            str(SCRIPT), tiny_model_dir, str(game), str(double), "gigpo",
        ],
        tmp_path,
    )
    one, two = json.loads(single.read_text()), json.loads(double.read_text())
    assert (one["processes"], two["processes"]) == (1, 2)
    assert len(one["turn_advantages"]) == len(two["turn_advantages"]) == 4
    for a, b in zip(one["turn_advantages"], two["turn_advantages"]):
        assert a == pytest.approx(b, abs=1e-6)
    # the step-level term moves turns of one trajectory apart: not a flat copy of the outcome advantage
    assert any(len(set(turns)) > 1 for turns in one["turn_advantages"])


@pytest.mark.slow  # about a minute; the test above and test_packing.py run two processes by default
def test_two_process_quickstart_recipe_trains_and_evaluates(tmp_path, tiny_model_dir):
    """The shipped 2-process CPU accelerate config runs a quickstart recipe; taspo-eval then scores the result."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    _run(
        [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(root / "recipes" / "accelerate" / "cpu_2proc.yaml"),
            "-m", "taspo_trl.cli", "--config", str(root / "recipes" / "quickstart" / "alfworld_taspo_cpu.yaml"),
            "--model_name_or_path", tiny_model_dir, "--games_dir", str(tmp_path / "games"), "--max_tasks", "4",
            "--max_steps", "1", "--max_turns", "2", "--max_completion_length", "8", "--output_dir", str(out),
        ],
        tmp_path,
    )
    assert (out / "model.safetensors").is_file()
    _run(
        [
            sys.executable, "-m", "taspo_trl.evaluation", "--model_name_or_path", str(out), "--games_root",
            str(tmp_path / "eval_games"), "--games_per_type", "1", "--splits", "eval_seen", "--max_turns", "2",
            "--max_completion_length", "8", "--results_dir", str(tmp_path / "eval"),
        ],
        tmp_path,
    )
    result = json.loads((tmp_path / "eval" / "alfworld_eval_seen.json").read_text())
    assert result["num_tasks"] == 6 and result["model"] == str(out)
