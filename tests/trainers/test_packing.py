"""Repacked micro-batches (zero-advantage rows skipped, rows grouped by length, padding trimmed) give the
gradient of TRL's own micro-batches, in both layouts and across two processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, encode_task_prompt
from taspo_trl.rollout.records import Trajectory
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.step_gradients import step_gradients
from tests.helpers.toy_envs import locker_factory

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "step_gradients.py"
GRADIENT_TOLERANCE = 1e-6


def _assert_same_gradients(reference: dict[str, torch.Tensor], packed: dict[str, torch.Tensor]) -> None:
    assert reference.keys() == packed.keys() and reference
    assert max(g.abs().max().item() for g in reference.values()) > 1e-4  # the step has a real gradient
    for name, gradient in reference.items():
        assert torch.allclose(packed[name], gradient, rtol=0.0, atol=GRADIENT_TOLERANCE), name


def _failed_group_rows(trajectories: list[Trajectory], layout: str, group_size: int = 4) -> int:
    """Training rows of the groups whose siblings all got the same reward (GRPO advantages all 0)."""
    rows = 0
    for start in range(0, len(trajectories), group_size):
        group = trajectories[start : start + group_size]
        if len({t.reward for t in group}) == 1:
            rows += sum(t.num_turns for t in group) if layout == "turn" else len(group)
    return rows


@pytest.mark.parametrize("layout", ["turn", "sequence"])
def test_skipping_zero_advantage_rows_keeps_the_gradient(tmp_path, tiny_model_dir, layout):
    trl = step_gradients(tiny_model_dir, layout, tmp_path / "trl", trl_batches=True)
    packed = step_gradients(tiny_model_dir, layout, tmp_path / "packed", trl_batches=False)
    _assert_same_gradients(trl["gradients"], packed["gradients"])

    # As many forward/backward calls as TRL's; fewer rows, none of the micro-batches wider than TRL's.
    assert len(packed["shapes"]) == len(trl["shapes"]) == 4
    assert sum(rows for rows, _, _ in packed["shapes"]) < sum(rows for rows, _, _ in trl["shapes"])
    assert max(p + c for _, p, c in packed["shapes"]) <= max(p + c for _, p, c in trl["shapes"])

    trajectories = packed["trajectories"]
    failed = _failed_group_rows(trajectories, layout)
    real = sum(t.num_turns for t in trajectories) if layout == "turn" else len(trajectories)
    assert 0 < failed < real
    assert packed["logs"]["rows/skipped"] == failed
    assert packed["logs"]["rows/skipped_fraction"] == pytest.approx(failed / real)


def test_two_processes_skip_rows_with_the_same_gradient(tmp_path, tiny_model_dir):
    """Process 1 holds only failed groups, so all its micro-batches are placeholders while process 0 trains."""
    out = tmp_path / "gradients.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
        "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT), tiny_model_dir, "turn", str(out),
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = torch.load(out)
    assert runs["trl"]["processes"] == runs["packed"]["processes"] == 2
    _assert_same_gradients(runs["trl"]["gradients"], runs["packed"]["gradients"])
    assert len(runs["packed"]["shapes"]) == len(runs["trl"]["shapes"]) == 4
    assert runs["packed"]["logs"]["rows/skipped_fraction"] > 0.5  # 3 of the 4 groups failed


@pytest.mark.parametrize(
    "overrides",
    [dict(beta=0.01), dict(entropy_coef=0.01), dict(top_entropy_quantile=0.2), dict(loss_type="bnpo", turn_balanced_loss=False)],
)
def test_zero_advantage_rows_are_trained_when_they_have_a_gradient(tmp_path, tiny_model_dir, overrides):
    """A KL term, an entropy bonus, a micro-batch entropy quantile or a per-micro-batch normaliser make a
    zero-advantage row matter, so it is not skipped."""
    config = AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path / "out", **overrides))
    rows = Dataset.from_list([{"prompt": encode_task_prompt({"target": 1})}])
    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=config, train_dataset=rows, env_factory=locker_factory)
    try:
        assert not trainer._zero_advantage_rows_skippable
    finally:
        trainer.close()


def test_repack_fills_a_short_process_with_placeholder_rows():
    """A process with fewer kept rows than the busiest one keeps its rows intact and fills the rest with rows
    that attend one token and have no loss-mask token."""
    from taspo_trl.trainers.packing import repack

    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]])
    completion_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]])
    batch = {
        "prompt_ids": torch.arange(12).view(4, 3) * prompt_mask, "prompt_mask": prompt_mask,
        "completion_ids": torch.arange(12, 24).view(4, 3) * completion_mask, "completion_mask": completion_mask,
        "tool_mask": completion_mask.float(), "advantages": torch.tensor([[1.0] * 3, [0.0] * 3, [0.0] * 3, [-2.0] * 3]),
        "num_items_in_batch": torch.tensor(4.0),
    }
    halves = [{k: v[:2] if v.ndim else v for k, v in batch.items()}, {k: v[2:] if v.ndim else v for k, v in batch.items()}]
    packed = repack(halves, torch.tensor([True, False, False, True]), sizes=[2, 2])
    assert [b["prompt_ids"].size(0) for b in packed] == [2, 2]
    first, second = packed
    # row 3 (3 attended tokens) before row 0 (4), trimmed to 2 prompt and 2 completion columns
    assert first["prompt_ids"].tolist() == [[10, 11], [1, 2]] and first["completion_ids"].tolist() == [[21, 0], [12, 13]]
    assert first["advantages"][:, 0].tolist() == [-2.0, 1.0]
    # no kept row left: two placeholder rows, one attended prompt token each, nothing in the loss
    assert second["prompt_mask"].tolist() == [[1], [1]] and second["completion_mask"].sum() == 0
    assert torch.equal(second["num_items_in_batch"], batch["num_items_in_batch"])
    widened = repack(halves, torch.tensor([True, False, False, False]), sizes=[2, 1])[0]
    assert widened["prompt_mask"].tolist() == [[1, 1], [0, 1]] and widened["completion_mask"][1].sum() == 0


def test_repack_keeps_a_one_column_per_row_tensor_with_its_row():
    """TRL's sequence-level importance-sampling ratio is one column per row ([B, 1]); repacking moves each value
    with its row and keeps it one column wide, also next to placeholder rows widened to the real rows' width."""
    from taspo_trl.trainers.packing import repack

    prompt_mask = torch.tensor([[1, 1], [0, 1], [1, 1], [0, 1]])
    completion_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]])
    batch = {
        "prompt_ids": torch.ones(4, 2, dtype=torch.long), "prompt_mask": prompt_mask,
        "completion_ids": torch.ones(4, 3, dtype=torch.long), "completion_mask": completion_mask,
        "advantages": torch.ones(4, 3), "importance_sampling_ratio": torch.tensor([[0.5], [1.5], [2.0], [3.0]]),
        "num_items_in_batch": torch.tensor(4.0),
    }
    halves = [{k: v[:2] if v.ndim else v for k, v in batch.items()}, {k: v[2:] if v.ndim else v for k, v in batch.items()}]
    first, second = repack(halves, torch.tensor([True, False, True, True]), sizes=[2, 2])
    # rows by length: 3 (2 tokens) and 2 (4 tokens), then 0 (5 tokens) beside a placeholder widened to 3 columns
    assert first["importance_sampling_ratio"].tolist() == [[3.0], [2.0]]
    assert second["completion_ids"].size(1) == 3 and second["importance_sampling_ratio"].shape == (2, 1)
    assert second["importance_sampling_ratio"][0].item() == 0.5 and second["completion_mask"][1].sum() == 0
