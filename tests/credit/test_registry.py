"""A user's own credit method: registered by name in ``credit.registry``, named in a YAML recipe, and run for one
optimizer step through ``taspo-train``'s in-process entry, with a tiny random-weight policy on a real ALFWorld
game. Its advantages must be the ones TRL's loss receives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from taspo_trl.cli import train_main
from taspo_trl.credit.registry import CREDIT_METHODS, OutcomeBatch, register_credit
from taspo_trl.envs.alfworld import generate_games
from taspo_trl.trainers import BaselineTrainer

NAME = "later_turns_test"
MAX_TURNS = 2


def later_turns(batch: OutcomeBatch, args, step: int) -> list[list[float]]:
    """Turn t of every trajectory gets 0.25 (t + 1), whatever the outcome: a value no built-in method gives."""
    later_turns.calls.append(batch)
    return [[0.25 * (t + 1) for t in range(len(rewards))] for rewards in batch.rewards]


later_turns.calls = []


@pytest.fixture
def registered():
    later_turns.calls.clear()
    register_credit(NAME, later_turns, title="Later turns")
    try:
        yield
    finally:
        CREDIT_METHODS.pop(NAME)


def test_a_registered_credit_method_runs_from_a_recipe(registered, tmp_path, tiny_model_dir, monkeypatch):
    games = tmp_path / "games"
    generate_games(games, per_type=1, seed=0, split="train", task_types=["pick_and_place_simple"])
    recipe = {
        "method": NAME,
        "model_name_or_path": tiny_model_dir,
        "environment": "alfworld",
        "games_dir": str(games),
        "max_tasks": 1,
        "max_turns": MAX_TURNS,
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "max_completion_length": 8,
        "max_steps": 1,
        "learning_rate": 1.0e-4,
        "beta": 0.0,
        "loss_type": "dapo",
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "report_to": "none",
        "save_strategy": "no",
        "output_dir": str(tmp_path / "out"),
        "seed": 0,
    }
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(recipe))

    # The loss's inputs, seen by a spy that passes them on to TRL's loss unchanged.
    seen: list[dict] = []
    compute_loss = BaselineTrainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        seen.append({key: inputs[key].detach().clone() for key in ("advantages", "completion_mask")})
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(BaselineTrainer, "compute_loss", spy)
    train_main(["--config", str(path)])

    [batch] = later_turns.calls  # one optimizer step, one generation batch
    assert batch.groups == [0, 0] and batch.advantages.shape == (2,)  # one task, its two siblings
    assert all(len(rewards) == MAX_TURNS for rewards in batch.rewards)  # a random policy never wins early
    # Turn layout: one loss row per turn, each token of turn t carrying 0.25 (t + 1).
    row_values = []
    for inputs in seen:
        for advantages, mask in zip(inputs["advantages"], inputs["completion_mask"], strict=True):
            values = advantages[mask.bool()]
            if values.numel():
                assert torch.all(values == values[0])
                row_values.append(values[0].item())
    assert sorted(row_values) == [0.25, 0.25, 0.5, 0.5]
    state = json.loads(Path(tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 1


def test_an_unknown_method_names_the_registered_ones(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"method": "not_registered_anywhere"}))
    with pytest.raises(SystemExit, match="unknown method 'not_registered_anywhere'.*'gigpo'"):
        train_main(["--config", str(path)])
