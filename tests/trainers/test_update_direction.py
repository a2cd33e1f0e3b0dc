"""An optimizer step moves the policy the way its credit says: after one real step of GRPO and of TASPO on a
scripted ALFWorld batch (two wins, two failures), the advantage-weighted log-likelihood of the rows TRL's loss
received is higher under the updated weights than under the initial ones, and the won responses gained against the
failed ones.

The tests beside this one check the advantages that reach the loss; this one checks what the loss and the optimizer
do with them. A sign lost between them (a loss that descends where it should ascend, weights applied inverted)
leaves every advantage right and trains the agent backwards. The log-likelihoods come from plain forwards of the
initial weights (``snapshot``) and of the trained model, on the exact token rows the loss received.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, TASPOConfig, TASPOTrainer
from taspo_trl.envs.alfworld import task_spec_rows
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.one_step import MAX_TURNS, response_logprobs, train_one_step


def _likelihoods(model, seen: list[dict[str, torch.Tensor]], tokenizer, won_only: set[str], failed_only: set[str]
                 ) -> tuple[float, float, float]:
    """Sum over the received rows' completion tokens of advantage x loss weight x log pi (the objective the step's
    loss descends the negative of, at importance ratio 1); and the mean token log pi of the responses whose action
    only the won siblings took, and of those whose action only the failed ones took (told from the scripted plans,
    not from the advantages)."""
    objective, sides = 0.0, {"won": [0.0, 0], "failed": [0.0, 0]}
    for row in seen:
        for r in range(row["completion_ids"].size(0)):
            completion = row["completion_mask"][r].bool()
            if not completion.any():
                continue
            prompt = row["prompt_ids"][r][row["prompt_mask"][r].bool()]
            logprobs = response_logprobs(model, prompt.tolist(), row["completion_ids"][r][completion].tolist())
            advantages = row["advantages"][r][completion].double()
            objective += float((advantages * row["tool_mask"][r][completion].double() * logprobs).sum())
            text = tokenizer.decode(row["completion_ids"][r][completion])
            action = text.split("<action>")[-1].split("</action>")[0] if "<action>" in text else None
            side = "won" if action in won_only else "failed" if action in failed_only else None
            if side:
                sides[side][0] += float(logprobs.sum())
                sides[side][1] += len(logprobs)
    return objective, sides["won"][0] / sides["won"][1], sides["failed"][0] / sides["failed"][1]


@pytest.mark.parametrize("method", ["grpo", "taspo"])
def test_one_step_raises_the_credited_responses(method, tmp_path, tiny_model_dir, pick_and_place_game, snapshot,
                                                monkeypatch):
    trainer_cls, config_cls = {"grpo": (AgentGRPOTrainer, AgentGRPOConfig), "taspo": (TASPOTrainer, TASPOConfig)}[method]
    # A small step (Adam's first step moves each weight by about the learning rate), so first order decides.
    config = config_cls(**cpu_trainer_kwargs(tmp_path / "out", max_turns=MAX_TURNS, learning_rate=1e-5))
    trainer = trainer_cls(model=tiny_model_dir, args=config,
                          train_dataset=Dataset.from_list(task_spec_rows([pick_and_place_game])))
    seen = train_one_step(trainer, pick_and_place_game, monkeypatch)
    trajectories = trainer.last_step.trajectories
    assert [t.won for t in trajectories] == [True, True, False, False]
    actions = {won: {turn.action for t in trajectories if t.won == won for turn in t.turns} for won in (True, False)}
    won_only, failed_only = actions[True] - actions[False], actions[False] - actions[True]
    assert won_only and failed_only
    trainer.model.eval()
    tokenizer = trainer.processing_class
    before, won_before, failed_before = _likelihoods(snapshot, seen, tokenizer, won_only, failed_only)
    after, won_after, failed_after = _likelihoods(trainer.model, seen, tokenizer, won_only, failed_only)
    assert after > before
    assert won_after - failed_after > won_before - failed_before
