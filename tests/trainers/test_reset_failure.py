"""A trajectory whose environment failed at reset (no turn at all) in a group whose siblings win: it has
privileged context and a nonzero advantage, the case that reaches the rescoring passes. TASPO and AlignOPSD must
give it nothing to weight and carry on with the rest of the group, in both row layouts."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl import AlignOPSDConfig, AlignOPSDTrainer, TASPOConfig, TASPOTrainer, encode_task_prompt
from taspo_trl.testing import PlannedGenerator
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.toy_envs import locker_factory

SPEC = {"target": 3, "max_turns": 2}
# Two wins (locker 3 at once, then after one empty locker), one failure out of turns, one environment that never
# started: the agent loop gives it no turn, so its plan is empty.
PLANS = [["open locker 3"], ["open locker 1", "open locker 3"], ["open locker 1", "open locker 2"], []]


@pytest.mark.parametrize("layout", ["turn", "sequence"])
@pytest.mark.parametrize("method", ["taspo", "alignopsd"])
def test_a_trajectory_whose_environment_failed_at_reset(tmp_path, tiny_model_dir, encoder, monkeypatch, method, layout):
    dataset = Dataset.from_list([{"prompt": encode_task_prompt(SPEC)}])
    settings = cpu_trainer_kwargs(tmp_path / "out", layout=layout)
    if method == "taspo":  # the nearest other success is PI for any target, one without turns too
        trainer = TASPOTrainer(
            model=tiny_model_dir, args=TASPOConfig(pi_source="nearest_success", **settings), train_dataset=dataset,
            env_factory=locker_factory,
        )
    else:
        trainer = AlignOPSDTrainer(
            model=tiny_model_dir, args=AlignOPSDConfig(**settings), train_dataset=dataset, env_factory=locker_factory,
            encoder=encoder,
        )
    generator = PlannedGenerator(trainer.model, trainer.processing_class, PLANS)
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    inputs = [{"prompt": encode_task_prompt(SPEC)} for _ in range(3)] + [{"prompt": encode_task_prompt(SPEC), "fail_reset": True}]
    try:
        batch = trainer._generate_and_score_completions(inputs)
    finally:
        trainer.close()
    trajectories = trainer.last_step.trajectories
    assert [t.reward for t in trajectories] == [1.0, 1.0, 0.0, 0.0]  # so A_3 = -0.5 / (std + delta) < 0
    failed = trajectories[3]
    assert failed.num_turns == 0 and "simulated failure at reset" in failed.error
    context = trainer.last_step.privileged_info[3] if method == "taspo" else trainer.last_step.skill_texts[3]
    assert context  # with A_3 != 0: the trajectory was eligible for rescoring
    assert trainer.last_step.weights[3] == []
    # Every other trajectory keeps one weight per turn with mean one (TASPO: over turns, Eq. 1; AlignOPSD: over
    # tokens), and the batch carries finite advantages.
    for trajectory, weights in zip(trajectories[:3], trainer.last_step.weights[:3]):
        assert len(weights) == trajectory.num_turns
        counts = [len(turn.response_ids) if method == "alignopsd" else 1 for turn in trajectory.turns]
        assert sum(w * n for w, n in zip(weights, counts)) / sum(counts) == pytest.approx(1.0, abs=1e-9)
    assert torch.isfinite(batch["advantages"]).all()
    policy_tokens = ((batch["completion_mask"] > 0) & (batch["tool_mask"] > 0)).sum().item()
    assert policy_tokens == sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
