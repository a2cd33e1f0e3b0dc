"""BaselineTrainer: every comparison method's per-token advantages on one real ALFWorld batch.

One rollout batch (two scripted wins, two failures, real log-probs of a tiny policy) is shared; each test switches
the method on the same trainer and checks its advantages against numbers derived here independently: the teacher
gap from a direct forward pass of the model (not the trainer's batched scorer) and the papers' formulas by hand.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from cpu_config import cpu_trainer_kwargs
from datasets import Dataset
from trl.trainer.utils import pad

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.privileged.rescoring import privileged_prompt_ids
from taspo_trl.rollout.scripted import PlannedGenerator, walkthrough_plans
from taspo_trl.trainers import BaselineConfig, BaselineTrainer

MAX_TURNS = 6
A_WIN = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # GRPO on rewards [1, 1, 0, 0]: (1 - 0.5) / (unbiased std + delta)


def _config(tmp_path: Path, **overrides) -> BaselineConfig:
    return BaselineConfig(**cpu_trainer_kwargs(tmp_path / "out", max_turns=MAX_TURNS, **overrides))


def _rollout(trainer: BaselineTrainer, game: Path, dataset: Dataset) -> dict:
    """One scripted batch; returns what ``turn_advantages`` saw, captured by a spy."""
    walkthrough = json.loads(Path(game).read_text())["walkthrough"]
    generator = PlannedGenerator(trainer.model, trainer.processing_class, walkthrough_plans(walkthrough, MAX_TURNS))
    original = trainer.turn_advantages
    seen: dict = {}

    def spy(trajectories, advantages, rows, batch):
        seen.update(trajectories=trajectories, advantages=advantages, rows=rows, batch=batch)
        return original(trajectories, advantages, rows, batch)

    trainer.turn_advantages = spy
    patched = grpo_module.generator_for_trainer
    grpo_module.generator_for_trainer = lambda _trainer, batch_size=None: generator
    try:
        trainer._generate_and_score_completions([dict(dataset[0]) for _ in range(4)])
    finally:
        grpo_module.generator_for_trainer = patched
        trainer.turn_advantages = original
    return seen


@pytest.fixture(scope="module")
def game(tmp_path_factory):
    games = generate_games(
        tmp_path_factory.mktemp("games"), per_type=1, seed=0, split="train", task_types=["pick_and_place_simple"]
    )
    return games[0]


@pytest.fixture(scope="module")
def shared(tmp_path_factory, tiny_model_dir, game):
    """A trainer whose teacher context is the shipped ALFWorld skills, and one scripted batch."""
    dataset = Dataset.from_list(task_spec_rows([game]))
    trainer = BaselineTrainer(
        model=tiny_model_dir, args=_config(tmp_path_factory.mktemp("b"), baseline="sdar"), train_dataset=dataset
    )
    seen = _rollout(trainer, game, dataset)
    # The teacher pass depends only on the contexts and the teacher, not on the method that shapes its gaps, so
    # methods sharing both reuse it (each forward of the 49k-token LM head costs seconds on this CPU).
    scored: dict = {}
    teacher_scores = trainer._teacher_scores

    def reuse(trajectories, contexts):
        key = (tuple(contexts), trainer.args.baseline == "opd", id(trainer.teacher_model))
        if key not in scored:
            scored[key] = teacher_scores(trajectories, contexts)
        return scored[key]

    trainer._teacher_scores = reuse
    yield trainer, seen
    trainer.close()


def _advantages_with(trainer: BaselineTrainer, seen: dict, **settings) -> list[list[list[float]]]:
    """Per trajectory, per turn, per token advantages of the method ``settings`` select."""
    saved = {name: getattr(trainer.args, name) for name in settings}
    for name, value in settings.items():
        setattr(trainer.args, name, value)
    try:
        out = trainer.turn_advantages(seen["trajectories"], seen["advantages"], seen["rows"], seen["batch"])
    finally:
        for name, value in saved.items():
            setattr(trainer.args, name, value)
    return [[turn if isinstance(turn, list) else [turn] for turn in trajectory] for trajectory in out]


def _direct_gaps(trainer: BaselineTrainer, seen: dict) -> list[list[torch.Tensor]]:
    """Delta = log pi(y | skills + h) - log pi_old(y | h) from one plain forward pass per turn."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    gaps = []
    for trajectory, context in zip(seen["trajectories"], trainer.last_privileged_info, strict=True):
        per_turn = []
        for t, turn in enumerate(trajectory.turns):
            prompt = privileged_prompt_ids(trajectory, t, context, trainer.chat)
            ids = torch.tensor([prompt + turn.response_ids])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            teacher = torch.log_softmax(logits, -1).gather(1, torch.tensor(turn.response_ids)[:, None])[:, 0]
            per_turn.append(teacher - torch.tensor(turn.logprobs))
        gaps.append(per_turn)
    return gaps


def test_teacher_gaps_have_one_plain_reference(shared):
    """The teacher gap's student term and the distillation losses' student log-probs are the trainer's one plain
    reference (TRL's recomputed log-probs when it computed them), so sampling log-probs off by a constant (another
    engine's, e.g. vLLM's) move no method's advantages."""
    trainer, seen = shared
    snapshot = seen["batch"]["sampling_per_token_logps"]  # the transformers backend: the snapshot's own log-probs
    offset = 0.75
    shifted_trajectories = copy.deepcopy(seen["trajectories"])
    for trajectory in shifted_trajectories:
        for turn in trajectory.turns:
            turn.logprobs = [value + offset for value in turn.logprobs]
    rows = seen["rows"]
    shifted_rows = copy.deepcopy(rows)
    shifted_rows.logprobs = [
        [value + offset * policy for value, policy in zip(values, mask)] for values, mask in zip(rows.logprobs, rows.env_mask)
    ]
    reference = {**seen, "batch": {**seen["batch"], "old_per_token_logps": snapshot.clone()}}
    shifted = {
        **seen,
        "trajectories": shifted_trajectories,
        "rows": shifted_rows,
        "batch": {
            **seen["batch"],
            "sampling_per_token_logps": pad([torch.tensor(v) for v in shifted_rows.logprobs], 0.0, "right"),
            "old_per_token_logps": snapshot.clone(),
        },
    }
    for method in ("opsd", "grpo_opsd", "sdar", "skill_sd", "rlsd", "opid", "stepopsd"):
        want = _advantages_with(trainer, reference, baseline=method, pi_source="generic_skill")
        assert _advantages_with(trainer, shifted, baseline=method, pi_source="generic_skill") == want, method


def test_batch_has_two_wins_and_skill_contexts(shared):
    trainer, seen = shared
    assert [t.won for t in seen["trajectories"]] == [True, True, False, False]
    assert seen["advantages"].tolist() == pytest.approx([A_WIN, A_WIN, -A_WIN, -A_WIN], abs=1e-5)
    _advantages_with(trainer, seen, baseline="opsd")
    assert all(context.startswith("[Skills]") or "- " in context for context in trainer.last_privileged_info)


def test_distillation_methods_add_their_gradient_equivalent_term(shared):
    trainer, seen = shared
    gaps = _direct_gaps(trainer, seen)
    advantages = seen["advantages"].tolist()
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = {
        "opsd": lambda a, d: 1.0 * d,  # reverse KL only, no reward: A_t = lambda Delta_t
        "grpo_opsd": lambda a, d: a + 0.1 * d,
        "sdar": lambda a, d: a + 0.01 * sigmoid(5 * d) * d,
        "skill_sd": lambda a, d: a + 0.1 * d,  # importance weight 1 at the snapshot
        "rlsd": lambda a, d: a * (0.5 + 0.5 * min(max(math.exp(math.copysign(1, a) * d), 0.8), 1.2)),
    }
    coefs = {"opsd": 1.0, "grpo_opsd": 0.1, "sdar": 0.01, "skill_sd": 0.1, "rlsd": 0.0}
    for method, formula in expected.items():
        got = _advantages_with(trainer, seen, baseline=method, distill_coef=coefs[method], teacher_policy="current")
        for i, trajectory in enumerate(got):
            for t, turn in enumerate(trajectory):
                want = [formula(advantages[i], float(d)) for d in gaps[i][t]]
                assert turn == pytest.approx(want, abs=2e-4), (method, i, t)


def test_rlsd_never_flips_the_sign_and_stays_in_its_band(shared):
    trainer, seen = shared
    got = _advantages_with(trainer, seen, baseline="rlsd")
    for a, trajectory in zip(seen["advantages"].tolist(), got, strict=True):
        for value in (v for turn in trajectory for v in turn):
            assert math.copysign(1, value) == math.copysign(1, a)
            assert 0.9 * abs(a) - 1e-6 <= abs(value) <= 1.1 * abs(a) + 1e-6  # lambda 0.5, eps 0.2


def test_opd_with_the_policy_as_its_own_teacher_gives_zero_advantages(shared):
    trainer, seen = shared
    trainer.teacher_model = trainer.model
    try:
        got = _advantages_with(trainer, seen, baseline="opd", distill_coef=1.0)
    finally:
        trainer.teacher_model = None
    assert max(abs(v) for trajectory in got for turn in trajectory for v in turn) < 1e-4


def test_stepopsd_keeps_each_trajectorys_sign_and_token_mean(shared):
    trainer, seen = shared
    got = _advantages_with(trainer, seen, baseline="stepopsd", pi_source="generic_skill")
    for a, trajectory in zip(seen["advantages"].tolist(), got, strict=True):
        values = [v for turn in trajectory for v in turn]
        assert all(math.copysign(1, v) == math.copysign(1, a) for v in values)
        assert sum(values) / len(values) == pytest.approx(a, rel=1e-4)
        assert len(set(round(v, 6) for v in values)) > 1  # credit actually moved between steps


def test_gigpo_first_step_anchor_group_by_hand(shared):
    trainer, seen = shared
    trajectories = seen["trajectories"]
    n = trajectories[0].num_turns  # the walkthrough; sibling 1 takes one detour step more
    assert trajectories[1].num_turns == n + 1
    got = _advantages_with(trainer, seen, baseline="gigpo")
    # Turn 0 of all four siblings acts on the same intro text, their anchor group. Discounted returns at turn 0:
    # 0.95^(n-1) and 0.95^n for the winners, 0 for the failures; A_S = return - group mean ("mean" norm).
    mean = (0.95 ** (n - 1) + 0.95**n) / 4
    assert got[0][0][0] == pytest.approx(A_WIN + 0.95 ** (n - 1) - mean, abs=1e-5)
    assert got[1][0][0] == pytest.approx(A_WIN + 0.95**n - mean, abs=1e-5)
    assert got[2][0][0] == pytest.approx(-A_WIN - mean, abs=1e-5)
    assert got[3][0][0] == pytest.approx(-A_WIN - mean, abs=1e-5)
    no_step_term = _advantages_with(trainer, seen, baseline="gigpo", gigpo_omega=0.0)
    for a, trajectory in zip(seen["advantages"].tolist(), no_step_term, strict=True):
        assert all(v == pytest.approx(a, abs=1e-6) for turn in trajectory for v in turn)


def test_opid_shapes_additively_with_tiny_weights(shared):
    trainer, seen = shared
    got = _advantages_with(trainer, seen, baseline="opid", pi_source="generic_skill")
    gaps = _direct_gaps(trainer, seen)
    for i, (a, trajectory) in enumerate(zip(seen["advantages"].tolist(), got, strict=True)):
        for t, turn in enumerate(trajectory):
            assert turn == pytest.approx([a + 0.001 * float(d) for d in gaps[i][t]], abs=2e-5)


def test_skill_grpo_shows_skills_to_the_policy_and_keeps_grpo_credit(tmp_path, tiny_model_dir, game):
    dataset = Dataset.from_list(task_spec_rows([game]))
    trainer = BaselineTrainer(model=tiny_model_dir, args=_config(tmp_path, baseline="skill_grpo"), train_dataset=dataset)
    try:
        seen = _rollout(trainer, game, dataset)
        got = trainer.turn_advantages(seen["trajectories"], seen["advantages"], seen["rows"], seen["batch"])
    finally:
        trainer.close()
    assert all("[Skills]" in turn.prompt_text for t in seen["trajectories"] for turn in t.turns)
    for a, trajectory in zip(seen["advantages"].tolist(), got, strict=True):
        assert trajectory == [pytest.approx(a)] * len(trajectory)


def test_bad_settings_fail_before_training(tmp_path):
    with pytest.raises(ValueError, match="baseline must be one of"):
        _config(tmp_path, baseline="ppo")
    with pytest.raises(ValueError, match="teacher_model_name_or_path"):
        _config(tmp_path, baseline="opd")
    with pytest.raises(ValueError, match="teacher_policy"):
        _config(tmp_path, baseline="opsd", teacher_policy="ema")


def test_a_non_finite_log_prob_leaves_its_turn_unscored(shared):
    trainer, seen = shared
    trajectories, rows = seen["trajectories"], seen["rows"]
    plain = copy.deepcopy(rows.collect(rows.logprobs))
    plain[(0, 1)][0] = float("nan")
    contexts = trainer.last_privileged_info or trainer._privileged_info(trajectories)
    gaps = trainer._teacher_gaps(trajectories, contexts, plain)
    assert (0, 1) not in gaps and (0, 0) in gaps
    mode = "train" if trainer.model.training else "eval"
    assert trainer._metrics[mode]["baseline/non_finite_gap_turns"][-1] == 1.0
