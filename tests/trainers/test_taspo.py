"""TASPOTrainer on the real ALFWorld engine with the rule-based analyzer and a tiny random-weight policy.

The rollouts follow fixed action plans (some win, some fail) so groups have verified successes, but every
recorded log-probability is the policy's real one, so the privileged rescoring is genuine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl.trainer.utils import pad

import taspo_trl.trainers.grpo as grpo_module
import taspo_trl.trainers.scoring as scoring_module
from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, TASPOConfig, TASPOTrainer
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.privileged.rescoring import privileged_token_shifts, privileged_user_text
from taspo_trl.rollout.layouts import build_rows
from taspo_trl.testing import PlannedGenerator, walkthrough_plans
from taspo_trl.trainers.step import StepView
from tests.helpers.cpu_config import cpu_trainer_kwargs

MAX_TURNS = 6


@pytest.fixture(scope="module")
def pick_game(tmp_path_factory):
    games = generate_games(tmp_path_factory.mktemp("games"), per_type=1, seed=0, split="train", task_types=["pick_and_place_simple"])
    return games[0]


def _trainer(cls, config_cls, tmp_path, model_dir, game, layout="turn", peft_config=None, **overrides):
    values = cpu_trainer_kwargs(tmp_path / cls.__name__, layout=layout, max_turns=MAX_TURNS, **overrides)
    dataset = Dataset.from_list(task_spec_rows([game]))
    return cls(model=model_dir, args=config_cls(**values), train_dataset=dataset, peft_config=peft_config), dataset


def _run_step(trainer, dataset, plans, monkeypatch):
    generator = PlannedGenerator(trainer.model, trainer.processing_class, plans)
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    return trainer._generate_and_score_completions([dict(dataset[0]) for _ in range(4)])


def _sampled(rows) -> torch.Tensor:
    """The rows' sampling log-probs as one right-padded [rows, T] tensor."""
    return pad([torch.tensor(values) for values in rows.logprobs], padding_value=0.0, padding_side="right")


def _walkthrough(game) -> list[str]:
    return json.loads(Path(game).read_text())["walkthrough"]


@pytest.mark.parametrize("layout", ["turn", "sequence"])
def test_taspo_redistributes_credit_within_bounds(tmp_path, tiny_model_dir, pick_game, monkeypatch, layout):
    trainer, dataset = _trainer(TASPOTrainer, TASPOConfig, tmp_path, tiny_model_dir, pick_game, layout)
    try:
        batch = _run_step(trainer, dataset, walkthrough_plans(_walkthrough(pick_game), MAX_TURNS, wins=2), monkeypatch)
    finally:
        trainer.close()
    trajectories = trainer.last_step.trajectories
    assert [t.won for t in trajectories] == [True, True, False, False]
    pi = trainer.last_step.privileged_info
    # Successes and the failing sibling that reached the drawer get aligned PI; the one that never saw the CD
    # has nothing applicable to its own path (alignment keeps only target-supported statements).
    assert [text.startswith("[Privileged Guidance]") for text in pi] == [True, True, True, False]
    redistributed = 0
    for trajectory, weights in zip(trajectories, trainer.last_step.weights):
        w = torch.tensor(weights, dtype=torch.float64)
        assert len(w) == trajectory.num_turns
        assert torch.all(w >= 0.6 - 1e-12) and torch.all(w <= 1.4 + 1e-12)  # eps_w = 0.4
        assert w.mean().item() == pytest.approx(1.0, abs=1e-12)
        redistributed += not torch.all(w == 1.0)
    assert redistributed >= 2
    rewards = torch.tensor([t.reward for t in trajectories])
    expected_a = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    # Every policy token carries A_i w_it with w_it in [0.6, 1.4]: the sign of its trajectory's A_i, never 0 here
    # (all four A_i are +-0.866), and at most eps_w away from A_i in relative size.
    rows = build_rows(trajectories, layout)
    checked = 0
    for r, traj in enumerate(rows.row_trajectory):
        policy = batch["tool_mask"][r][: len(rows.completion_ids[r])] > 0
        values = batch["advantages"][r][: len(rows.completion_ids[r])][policy]
        a = expected_a[traj].item()
        assert torch.all(torch.sign(values) == math.copysign(1.0, a)), (r, traj)
        assert torch.all((values.abs() >= 0.6 * abs(a) - 1e-5) & (values.abs() <= 1.4 * abs(a) + 1e-5)), (r, traj)
        checked += int(policy.sum())
    assert checked == sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
    for i, weights in enumerate(trainer.last_step.weights):
        # Eq. 1: the turn average of A_i w_it is A_i
        assert sum(expected_a[i].item() * w for w in weights) / len(weights) == pytest.approx(expected_a[i].item(), rel=1e-5)


def test_privileged_shifts_match_an_independent_forward(tmp_path, tiny_model_dir, pick_game, monkeypatch):
    trainer, dataset = _trainer(TASPOTrainer, TASPOConfig, tmp_path, tiny_model_dir, pick_game)
    try:
        _run_step(trainer, dataset, walkthrough_plans(_walkthrough(pick_game), MAX_TURNS, wins=2), monkeypatch)
    finally:
        trainer.close()
    trajectories, pi = trainer.last_step.trajectories, trainer.last_step.privileged_info
    rows = build_rows(trajectories, "turn")
    shifts = privileged_token_shifts(
        rows, trajectories, pi, trainer.chat, trainer._snapshot_logprobs, _sampled(rows), trainer._tokenizer.pad_token_id
    )
    assert shifts
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for (i, t), delta in list(shifts.items())[:4]:
        turn = trajectories[i].turns[t]
        prompt = trainer.chat.first_prompt_ids(privileged_user_text(pi[i], turn.prompt_text))
        ids = torch.tensor([prompt + turn.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
        privileged = torch.log_softmax(logits, -1).gather(1, torch.tensor(turn.response_ids)[:, None]).squeeze(1)
        start, end = turn.action_span
        expected = privileged[start:end].double() - torch.tensor(turn.logprobs[start:end], dtype=torch.float64)
        assert end > start and torch.allclose(delta, expected, atol=1e-4)


def test_rescoring_with_lora_dropout_is_deterministic(tmp_path, tiny_model_dir, pick_game, monkeypatch):
    """Scoring passes run with dropout off. With a LoRA adapter whose dropout is live (train mode, p = 0.5, random
    non-zero init so the adapter path matters), two identical privileged passes give identical shifts; the
    trainer's shifts equal dropout-free forwards even when TRL's recomputed log-probs carry dropout noise; and
    every module's mode is back afterwards."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, init_lora_weights=False, target_modules=["q_proj", "v_proj"])
    trainer, dataset = _trainer(TASPOTrainer, TASPOConfig, tmp_path, tiny_model_dir, pick_game, peft_config=lora)
    model = trainer.model
    model.eval()  # rollouts sample in eval mode (TransformersGenerator does the same)
    seen: list = []

    def capture(step):  # the step's credit inputs; its own credit is not needed
        seen.append((step.trajectories, step.advantages, step.rows, step))
        return [[1.0] * t.num_turns for t in step.trajectories]

    monkeypatch.setattr(trainer, "turn_weights", capture)
    try:
        batch = _run_step(trainer, dataset, walkthrough_plans(_walkthrough(pick_game), MAX_TURNS, wins=2), monkeypatch)
    finally:
        trainer.close()
    monkeypatch.undo()
    trajectories, advantages, rows, step = seen[0]
    model.train()  # as during a training step
    modes = {name: module.training for name, module in model.named_modules()}
    assert any("lora_dropout" in name for name in modes)

    pi = [text if a != 0 else "" for text, a in zip(trainer._privileged_info(step), advantages.tolist())]
    assert any(pi)

    def shifts():
        return privileged_token_shifts(
            rows, trajectories, pi, trainer.chat, trainer._snapshot_logprobs, _sampled(rows), trainer._tokenizer.pad_token_id
        )

    first, second = shifts(), shifts()
    assert first and first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert {name: module.training for name, module in model.named_modules()} == modes

    # TRL recomputes old log-probs in train mode: with dropout live they are noisy, and must not be the reference.
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        noisy, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention, batch["completion_ids"].size(1))
    recorded: list = []
    real = scoring_module.privileged_token_shifts

    def record(*args, **kwargs):
        recorded.append(real(*args, **kwargs))
        return recorded[-1]

    monkeypatch.setattr(scoring_module, "privileged_token_shifts", record)
    trainer.turn_weights(StepView(trajectories, advantages, rows, {**batch, "old_per_token_logps": noisy}))
    assert {name: module.training for name, module in model.named_modules()} == modes
    model.eval()
    assert recorded[0]
    for (i, t), delta in list(recorded[0].items())[:3]:
        turn = trajectories[i].turns[t]
        privileged = trainer.chat.first_prompt_ids(privileged_user_text(pi[i], turn.prompt_text))
        start, end = turn.action_span
        with torch.no_grad():
            expected = _logprobs(model, privileged, turn.response_ids) - _logprobs(model, turn.prompt_ids, turn.response_ids)
        assert torch.allclose(delta, expected[start:end].double(), atol=1e-4)


def test_bf16_sampling_rescores_the_plain_side_of_the_rescored_rows_only(tmp_path, tiny_model_dir, pick_game, monkeypatch):
    """Under bf16 sampling the plain log-probs come from a forward pass. It scores the rows that the privileged
    pass rescores and no other (here the sibling without PI is left out), and the shifts are privileged minus
    plain forwards: the sampler's log-probs, moved by +1 nat below, play no part."""
    trainer, dataset = _trainer(TASPOTrainer, TASPOConfig, tmp_path, tiny_model_dir, pick_game)
    steps: list = []
    weights = trainer.turn_weights
    monkeypatch.setattr(trainer, "turn_weights", lambda step: steps.append(step) or weights(step))
    try:
        _run_step(trainer, dataset, walkthrough_plans(_walkthrough(pick_game), MAX_TURNS, wins=2), monkeypatch)
    finally:
        trainer.close()
    monkeypatch.undo()
    step = steps[0]
    monkeypatch.setattr(trainer.args, "bf16", True)
    plain_rows: list[int] = []
    score = scoring_module.score_continuations
    monkeypatch.setattr(scoring_module, "score_continuations", lambda pairs, *a, **k: plain_rows.append(len(pairs)) or score(pairs, *a, **k))
    recorded: list = []
    shifts = scoring_module.privileged_token_shifts
    monkeypatch.setattr(scoring_module, "privileged_token_shifts", lambda *a, **k: recorded.append(shifts(*a, **k)) or recorded[-1])
    moved = {**step.batch, "sampling_per_token_logps": step.batch["sampling_per_token_logps"] + 1.0}
    trainer.turn_weights(StepView(step.trajectories, step.advantages, step.rows, moved))

    trajectories, pi = step.trajectories, trainer.last_step.privileged_info
    assert [bool(text) for text in pi] == [True, True, True, False]
    # turn layout: one row per turn, so the rescored rows are the turns of the three trajectories with PI
    assert plain_rows == [sum(t.num_turns for t in trajectories[:3])]
    assert plain_rows[0] < len(step.rows)
    assert recorded[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the passes score in bf16, as sampling ran
        for (i, t), delta in recorded[0].items():
            turn = trajectories[i].turns[t]
            privileged = trainer.chat.first_prompt_ids(privileged_user_text(pi[i], turn.prompt_text))
            expected = _logprobs(trainer.model, privileged, turn.response_ids) - _logprobs(trainer.model, turn.prompt_ids, turn.response_ids)
            start, end = turn.action_span
            # bf16 rounds a padded batch differently from one row (about 1e-3 here); the moved sampler would be 1 off
            assert torch.allclose(delta, expected[start:end].double(), atol=1e-2)


def _logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log pi(response | prompt) token by token, from one plain forward."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


class _BrokenAnalyzer:
    """An analyzer whose answers never parse: TASPO must fall back to GRPO for every trajectory."""

    workers = 1

    def complete(self, messages):
        return "I cannot help with that."


@pytest.mark.parametrize("case", ["all_fail", "no_pi"])
def test_fallback_is_grpo_bit_for_bit(tmp_path, tiny_model_dir, pick_game, monkeypatch, case):
    plans = walkthrough_plans(_walkthrough(pick_game), MAX_TURNS, wins=0 if case == "all_fail" else 2)
    grpo, dataset = _trainer(AgentGRPOTrainer, AgentGRPOConfig, tmp_path, tiny_model_dir, pick_game)
    taspo, _ = _trainer(TASPOTrainer, TASPOConfig, tmp_path, tiny_model_dir, pick_game)
    if case == "no_pi":
        taspo.analyzer = _BrokenAnalyzer()
    # As if sampled under bf16 autocast, where only a forward pass could give the plain log-probs: with nothing
    # to rescore, no pass may run at all (an all-fail step costs its rollout).
    monkeypatch.setattr(taspo.args, "bf16", True)
    passes = []
    snapshot = taspo._snapshot_logprobs
    monkeypatch.setattr(taspo, "_snapshot_logprobs", lambda *args, **kwargs: passes.append(1) or snapshot(*args, **kwargs))
    try:
        batch_grpo = _run_step(grpo, dataset, [list(p) for p in plans], monkeypatch)
        batch_taspo = _run_step(taspo, dataset, [list(p) for p in plans], monkeypatch)
        assert passes == []
        assert all(text == "" for text in taspo.last_step.privileged_info)
        for key in ("completion_ids", "advantages", "tool_mask", "num_items_in_batch"):
            assert torch.equal(batch_grpo[key], batch_taspo[key]), key
        if case == "no_pi":
            assert batch_grpo["advantages"].abs().sum() > 0  # a real outcome signal, left untouched
        loss_grpo = grpo.compute_loss(grpo.model, batch_grpo)
        loss_taspo = taspo.compute_loss(taspo.model, batch_taspo)
        assert torch.equal(loss_grpo, loss_taspo)
    finally:
        grpo.close()
        taspo.close()


@pytest.mark.parametrize("unit,use_peft", [("token", False), ("action", True)])
def test_taspo_trains_a_step(tmp_path, tiny_model_dir, pick_game, monkeypatch, unit, use_peft):
    from peft import LoraConfig

    trainer, dataset = _trainer(
        TASPOTrainer, TASPOConfig, tmp_path, tiny_model_dir, pick_game, allocation_unit=unit,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if use_peft else None,
    )
    generator = PlannedGenerator(trainer.model, trainer.processing_class, walkthrough_plans(_walkthrough(pick_game), MAX_TURNS, wins=2))
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    try:
        trainer.train()
    finally:
        trainer.close()
    logged = trainer.state.log_history[0]
    assert logged["pi/coverage"] > 0 and torch.isfinite(torch.tensor(logged["loss"]))
    assert logged["taspo/fallback/redistributed"] > 0
    if unit == "token":  # action tokens carry their own weights
        assert any(isinstance(turn, list) for traj in trainer.last_step.weights for turn in traj)


def test_config_errors(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="analyzer_base_url"):
        TASPOConfig(analyzer="openai", **base)
    with pytest.raises(ValueError, match="pi_source"):
        TASPOConfig(pi_source="best_guess", **base)
    with pytest.raises(ValueError, match="eps_w"):
        TASPOConfig(eps_w=1.0, **base)
