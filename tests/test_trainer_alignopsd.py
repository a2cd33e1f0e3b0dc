"""AlignOPSD: decision correspondence on a hand-built group with the real offline encoder, and the trainer's
credit on the real ALFWorld engine (scripted plans, real log-probs of a tiny policy)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from cpu_config import cpu_trainer_kwargs
from datasets import Dataset
from trl.trainer.utils import pad

import taspo_trl.trainers.alignopsd as alignopsd_module
import taspo_trl.trainers.grpo as grpo_module
from taspo_trl import AlignOPSDConfig, AlignOPSDTrainer
from taspo_trl.credit.alignopsd import (
    adaptive_threshold,
    correspondence_shifts,
    segment_spans,
)
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.privileged.alignment import active_contexts, aligned_view_requests, batch_correspondences
from taspo_trl.privileged.decisions import (
    embed_group,
    target_correspondence,
    think_text,
)
from taspo_trl.privileged.rescoring import privileged_prompt_ids
from taspo_trl.rollout.chat import ChatFormat
from taspo_trl.rollout.records import Trajectory, Turn
from taspo_trl.testing import PlannedGenerator, walkthrough_plans
from taspo_trl.trainers.step import StepView


def _rollout(steps: list[tuple[str, str]], won: bool) -> Trajectory:
    trajectory = Trajectory(task_spec={}, task="heat some apple and put it in fridge", initial_observation="", group=0, won=won)
    for think, action in steps:
        text = f"<think>{think}</think> <action>{action}</action>"
        trajectory.turns.append(Turn([1], [2], [0.0], text, action, True, "ok", (0, 1), "..."))
    return trajectory


def _hand_built_group() -> list[Trajectory]:
    """A target, a sibling that paraphrases its every step, and an unrelated failing sibling."""
    target = _rollout(
        [
            ("I need to find the apple, the countertop is a likely place.", "go to countertop 1"),
            ("The apple is here on the countertop, I will pick it up.", "take apple 1 from countertop 1"),
            ("Now I have to heat the apple, so I go to the microwave.", "go to microwave 1"),
            ("Heat the apple with the microwave.", "heat apple 1 with microwave 1"),
        ],
        won=True,
    )
    paraphrase = _rollout(
        [
            ("The apple is probably on the countertop, let me go there.", "go to countertop 1"),
            ("I see the apple on the countertop and take it.", "take apple 1 from countertop 1"),
            ("To heat the apple I should walk to the microwave.", "go to microwave 1"),
            ("Use the microwave to heat the apple.", "heat apple 1 with microwave 1"),
        ],
        won=True,
    )
    unrelated = _rollout(
        [
            ("Let me check what I am carrying.", "inventory"),
            ("I will look around the room.", "look"),
            ("Maybe the drawer has something useful.", "go to drawer 1"),
        ],
        won=False,
    )
    return [target, paraphrase, unrelated]


def test_hand_built_group_correspondence_and_spans(encoder):
    group = _hand_built_group()
    states = embed_group(group, [0, 1, 2], encoder)
    per_turn, columns = target_correspondence(group, 0, states, threshold=0.7, top_k=2, action_threshold=0.8)
    chosen = [[columns[s] for s in match.sources] for match in per_turn]
    # Turn 1's closest state is the paraphrase's turn 0 ("go to countertop"), one source per sibling keeps only
    # that one, and the action filter then rejects it (taking the apple is not going to the countertop).
    assert chosen == [[(1, 0)], [], [(1, 2)], [(1, 3)]]
    assert all((2, t) not in sum(chosen, []) for t in range(3))  # the unrelated rollout never corresponds
    assert per_turn[1].quality == 0.0 and all(0 < per_turn[t].quality <= 1 for t in (0, 2, 3))
    shifts = correspondence_shifts([match.distribution for match in per_turn])
    # The reference context stays put over "find the apple" -> "take it", then jumps to "heat it".
    assert int(torch.argmax(shifts)) == 1
    spans = segment_spans(shifts, adaptive_threshold([shifts]), min_len=1, max_len=8)
    assert spans == [(0, 2), (2, 4)]


class _CountingEncoder:
    def __init__(self, encoder):
        self.encoder, self.calls = encoder, 0

    def encode(self, texts):
        self.calls += 1
        return self.encoder.encode(texts)


def test_batch_stages_on_the_hand_built_group(encoder, embedded_tokenizer):
    group = _hand_built_group()
    # A zero advantage can't move under any weights: that trajectory is neither matched nor rescored.
    active = active_contexts(["[Skills] a", "[Skills] b", "[Skills] c"], torch.tensor([0.5, 0.0, -1.0]))
    assert active == ["[Skills] a", "", "[Skills] c"]
    counting = _CountingEncoder(encoder)
    found = batch_correspondences(
        group, 0, active, counting, {}, exact_action_match=False, threshold=0.7, top_k=2, action_threshold=0.8
    )
    assert sorted(found) == [0, 2]
    assert counting.calls == 2  # the group's thinking and actions, encoded once for both targets
    per_turn, columns = found[0]
    assert [[columns[s] for s in match.sources] for match in per_turn] == [[(1, 0)], [], [(1, 2)], [(1, 3)]]
    # One aligned view per kept source: the target's response under the source's history and the source's p_x.
    chat = ChatFormat(embedded_tokenizer)
    contexts = ["[Skills] a", "[Skills] b", "[Skills] c"]
    requests, owners = aligned_view_requests({0: found[0]}, group, group, contexts, chat)
    assert [(i, t, columns[s]) for i, t, s in owners] == [(0, 0, (1, 0)), (0, 2, (1, 2)), (0, 3, (1, 3))]
    for (prompt, response), (_, t, s) in zip(requests, owners):
        assert prompt == privileged_prompt_ids(group[1], columns[s][1], "[Skills] b", chat)
        assert response is group[0].turns[t].response_ids


def test_think_text():
    assert think_text("<THINK> go \n left </think><action>x</action>") == "go left"
    assert think_text("no tags <action>open door</action> here") == "no tags here"


@pytest.fixture(scope="module")
def pick_game(tmp_path_factory):
    return generate_games(tmp_path_factory.mktemp("games"), 1, 0, "train", task_types=["pick_and_place_simple"])[0]


def test_teacher_side_thinking_replaces_the_targets_decision_states(encoder):
    group = _hand_built_group()
    states = embed_group(group, [0, 1, 2], encoder)
    # The teacher's thinking for each target turn says what the paraphrase sibling said at the same step, so every
    # turn now finds that step (cosine 1), and turn 1 finds "take apple" instead of "go to countertop".
    teacher = encoder.encode([think_text(turn.response_text) for turn in group[1].turns])
    per_turn, columns = target_correspondence(
        group, 0, states, target_thinking=teacher, threshold=0.7, top_k=2, action_threshold=0.8
    )
    assert [[columns[s] for s in match.sources] for match in per_turn] == [[(1, 0)], [(1, 1)], [(1, 2)], [(1, 3)]]
    with pytest.raises(ValueError, match="target_thinking has 2 rows for 4 target turns"):
        target_correspondence(group, 0, states, target_thinking=teacher[:2], threshold=0.7, top_k=2, action_threshold=0.8)


@pytest.mark.parametrize(("allocation", "teacher_thinking"), [("adaptive", False), ("token", False), ("adaptive", True)])
def test_alignopsd_step_on_alfworld(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder, allocation, teacher_thinking):
    config = AlignOPSDConfig(
        **cpu_trainer_kwargs(
            tmp_path / "out", max_turns=6, similarity_threshold=0.5, allocation=allocation, teacher_thinking=teacher_thinking
        )
    )
    trainer = AlignOPSDTrainer(
        model=tiny_model_dir, args=config, train_dataset=Dataset.from_list(task_spec_rows([pick_game])), encoder=encoder
    )
    walkthrough = json.loads(Path(pick_game).read_text())["walkthrough"]
    generator = PlannedGenerator(trainer.model, trainer.processing_class, walkthrough_plans(walkthrough, 6))
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    try:
        trainer.train()
    finally:
        trainer.close()
    logged = trainer.state.log_history[0]
    assert ("alignopsd/teacher_thinking_seconds" in logged) == teacher_thinking
    if teacher_thinking:  # the tiny random policy thinks nothing the siblings said: no source clears 0.5
        assert logged["alignopsd/match_rate"] == 0 and logged["alignopsd/aligned_views"] == 0
        return
    assert logged["alignopsd/match_rate"] > 0 and logged["alignopsd/aligned_views"] > 0
    assert torch.isfinite(torch.tensor(logged["loss"]))
    assert all(text.startswith("[Skills]") for text in trainer.last_step.skill_texts)
    trajectories = trainer.last_step.trajectories
    redistributed = 0
    for trajectory, weights in zip(trajectories, trainer.last_step.weights):
        counts = [len(turn.response_ids) for turn in trajectory.turns]
        per_token = [
            w for n, turn_w in zip(counts, weights) for w in (turn_w if isinstance(turn_w, list) else [turn_w] * n)
        ]
        w = torch.tensor(per_token, dtype=torch.float64)
        assert torch.all(w >= 0.5 - 1e-9) and torch.all(w <= 1.5 + 1e-9)  # weight_bound = 0.5
        assert w.mean().item() == pytest.approx(1.0, abs=1e-9)  # token-weighted mean advantage preserved
        redistributed += not torch.all(w == 1.0)
    assert redistributed >= 2


def test_all_fail_step_runs_no_rescoring_pass(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder):
    """No sibling won, so no advantage can move: no privileged, aligned or plain pass may run, even when the
    sampler ran under bf16 autocast and only a forward pass could give the plain log-probs."""
    config = AlignOPSDConfig(**cpu_trainer_kwargs(tmp_path / "out", max_turns=6, similarity_threshold=0.5))
    trainer = AlignOPSDTrainer(
        model=tiny_model_dir, args=config, train_dataset=Dataset.from_list(task_spec_rows([pick_game])), encoder=encoder
    )
    walkthrough = json.loads(Path(pick_game).read_text())["walkthrough"]
    generator = PlannedGenerator(trainer.model, trainer.processing_class, walkthrough_plans(walkthrough, 6, wins=0))
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    monkeypatch.setattr(trainer.args, "bf16", True)
    passes = []
    snapshot = trainer._snapshot_logprobs
    monkeypatch.setattr(trainer, "_snapshot_logprobs", lambda *args, **kwargs: passes.append(1) or snapshot(*args, **kwargs))
    try:
        batch = trainer._generate_and_score_completions([dict(trainer.train_dataset[0]) for _ in range(4)])
    finally:
        trainer.close()
    assert batch["advantages"].abs().sum() == 0
    assert passes == []


def _one_step_inputs(trainer, game, monkeypatch) -> tuple:
    """What ``turn_weights`` gets in one scripted step (trajectories, advantages, rows, batch); the credit itself is
    left out of that step."""
    walkthrough = json.loads(Path(game).read_text())["walkthrough"]
    generator = PlannedGenerator(trainer.model, trainer.processing_class, walkthrough_plans(walkthrough, 6))
    seen: list = []

    def capture(step):
        seen.append((step.trajectories, step.advantages, step.rows, step.batch))
        return [[1.0] * t.num_turns for t in step.trajectories]

    with monkeypatch.context() as patch:
        patch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
        patch.setattr(trainer, "turn_weights", capture)
        trainer._generate_and_score_completions([dict(trainer.train_dataset[0]) for _ in range(4)])
    return seen[0]


def test_rectified_gap_has_one_plain_reference(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder):
    """g0 and every aligned g_j subtract the same plain log-probs. Sampling log-probs that differ from the snapshot's
    by a constant (another engine's, e.g. vLLM's) must therefore not move the rectified gap g~: it is taken against
    TRL's recomputed log-probs when TRL computed them, and against a pass of the trainer's own otherwise."""
    config = AlignOPSDConfig(**cpu_trainer_kwargs(tmp_path / "out", max_turns=6, similarity_threshold=0.5))
    trainer = AlignOPSDTrainer(
        model=tiny_model_dir, args=config, train_dataset=Dataset.from_list(task_spec_rows([pick_game])), encoder=encoder
    )
    try:
        trajectories, advantages, rows, batch = _one_step_inputs(trainer, pick_game, monkeypatch)
    finally:
        trainer.close()
    rectified: list = []
    real_evidences = alignopsd_module.turn_evidences

    def recorded(gaps, advantage):
        rectified.append([g.clone() for g in gaps])
        return real_evidences(gaps, advantage)

    monkeypatch.setattr(alignopsd_module, "turn_evidences", recorded)

    def rectified_gaps(trajectories, rows, batch) -> list:
        rectified.clear()
        trainer.turn_weights(StepView(trajectories, advantages, rows, batch))
        return list(rectified)

    # The transformers backend sampled, so its log-probs are the snapshot's: what TRL would recompute.
    snapshot = batch["sampling_per_token_logps"]
    reference = rectified_gaps(trajectories, rows, {**batch, "old_per_token_logps": snapshot.clone()})
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    assert reference and metrics["alignopsd/aligned_views"][-1] > 0  # aligned views enter g~ (lambda > 0)

    offset = 0.75
    shifted_trajectories = copy.deepcopy(trajectories)
    for trajectory in shifted_trajectories:
        for turn in trajectory.turns:
            turn.logprobs = [value + offset for value in turn.logprobs]
    shifted_rows = copy.deepcopy(rows)
    shifted_rows.logprobs = [
        [value + offset * policy for value, policy in zip(values, mask)] for values, mask in zip(rows.logprobs, rows.env_mask)
    ]
    shifted = {**batch, "sampling_per_token_logps": pad([torch.tensor(v) for v in shifted_rows.logprobs], 0.0, "right")}
    recomputed = rectified_gaps(shifted_trajectories, shifted_rows, {**shifted, "old_per_token_logps": snapshot.clone()})
    assert len(recomputed) == len(reference)
    for got, want in zip(recomputed, reference):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    # vLLM sampled, or the sampler ran under bf16 autocast, and TRL recomputed nothing: the trainer scores the
    # plain pass itself (this trainer's forward is float32, so the gaps are the reference ones).
    for setting, value in (("use_vllm", True), ("bf16", True)):
        owner = trainer if setting == "use_vllm" else trainer.args
        monkeypatch.setattr(owner, setting, value)
        rescored = rectified_gaps(shifted_trajectories, shifted_rows, shifted)
        assert len(rescored) == len(reference)
        for got, want in zip(rescored, reference):
            assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got, want))
        monkeypatch.setattr(owner, setting, not value)


def test_config_errors(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="allocation"):
        AlignOPSDConfig(allocation="sentence", **base)
    with pytest.raises(ValueError, match="span_max_turns"):
        AlignOPSDConfig(span_min_turns=3, span_max_turns=4, **base)
