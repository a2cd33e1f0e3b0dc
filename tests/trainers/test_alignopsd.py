"""AlignOPSD: the official stages wired into the trainer. Correspondence on a hand-built group with the real
offline encoder; the trainer's credit on the real ALFWorld engine (scripted plans, real log-probs of a tiny policy,
a scripted teacher)."""

from __future__ import annotations

import copy
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from trl.trainer.utils import pad

import taspo_trl.trainers.alignopsd as alignopsd_module
import taspo_trl.trainers.grpo as grpo_module
from taspo_trl import AgentGRPOTrainer, AlignOPSDConfig, AlignOPSDTrainer
from taspo_trl.credit.alignopsd import group_outcome_advantage
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.privileged.alignopsd import NO_SKILLS, cross_view_requests, group_correspondence, parse_response
from taspo_trl.privileged.rescoring import privileged_prompt_ids
from taspo_trl.rollout.chat import ChatFormat
from taspo_trl.rollout.generation import Generation
from taspo_trl.rollout.records import Trajectory, Turn
from taspo_trl.testing import PlannedGenerator, walkthrough_plans
from taspo_trl.trainers.step import StepView
from tests.helpers.cpu_config import cpu_trainer_kwargs

_MATCH = dict(threshold=0.7, top_k=2, action_filter=False, action_threshold=0.8, profile_temperature=0.1, profile_distance="jsd")


def _rollout(steps: list[tuple[str, str]], won: bool) -> Trajectory:
    trajectory = Trajectory(task_spec={}, task="heat some apple and put it in fridge", initial_observation="", group=0, won=won)
    for think, action in steps:
        text = (f"<think>{think}</think> " if think else "") + f"<action>{action}</action>"
        trajectory.turns.append(Turn([1], [2], [0.0], text, action, True, "ok", (0, 1), "..."))
    return trajectory


def _hand_built_group() -> list[Trajectory]:
    """A target, a sibling that paraphrases its steps (no thinking at its turn 1), and an unrelated sibling."""
    target = _rollout(
        [
            ("I need to find the apple, the countertop is a likely place.", "go to countertop 1"),
            ("The apple is here on the countertop, I will pick it up.", "take apple 1 from countertop 1"),
            ("Now I have to heat the apple, so I go to the microwave.", "go to microwave 1"),
        ],
        won=True,
    )
    paraphrase = _rollout(
        [
            ("The apple is probably on the countertop, let me go there.", "go to countertop 1"),
            ("", "take apple 1 from countertop 1"),
            ("To heat the apple I should walk to the microwave.", "go to microwave 1"),
        ],
        won=True,
    )
    unrelated = _rollout(
        [("Let me check what I am carrying.", "inventory"), ("I will look around the room.", "look")], won=False
    )
    return [target, paraphrase, unrelated]


def _teacher_echo(group: list[Trajectory]) -> dict[tuple[int, int], tuple[str, str]]:
    """A teacher that thinks, at every turn, what the student wrote there."""
    return {(i, t): parse_response(turn.response_text) for i, tr in enumerate(group) for t, turn in enumerate(tr.turns)}


def test_parse_response_reads_think_and_the_first_action_block():
    """The official parser: the first <think> block and the first <action>/<search>/<answer> block, stripped;
    text outside the tags is never taken for thinking."""
    assert parse_response("<THINK> go \n left </think><action> open door </action>") == ("go \n left", "open door")
    assert parse_response("no tags <action>open door</action> here") == ("", "open door")
    assert parse_response("<think>look it up</think><search>capital of peru</search>") == ("look it up", "capital of peru")
    assert parse_response("<think>done</think><answer>Lima</answer>") == ("done", "Lima")
    assert parse_response("nothing") == ("", "")


def test_hand_built_group_teacher_to_student_correspondence(encoder):
    group = _hand_built_group()
    c = group_correspondence(group, [0, 1, 2], _teacher_echo(group), encoder, **_MATCH)
    chosen = {c.keys[row]: [c.keys[s] for s in c.selected[row]] for row in c.rows_of(0)}
    # Turns 0 and 2 find the paraphrase's same step; turn 1's counterpart has no thinking (ineligible), and the
    # unrelated rollout never clears tau.
    assert chosen[(0, 0)] == [(1, 0)] and chosen[(0, 2)] == [(1, 2)]
    assert all(key[0] != 2 for sources in chosen.values() for key in sources)
    # A turn without thinking can neither give nor receive: no eligible source, an all-zero invalid profile.
    row = c.keys.index((1, 1))
    assert not bool(c.eligible[row].any()) and not bool(c.eligible[:, row].any())
    assert not bool(c.profile_valid[row]) and float(c.profiles[row].sum()) == 0.0
    # The similarity runs from the teacher's thinking at the source to the student's at the target: a teacher that
    # thinks nothing at the paraphrase's turns leaves them no outgoing edge, while they still receive.
    silent = {k: ("", v[1]) if k[0] == 1 else v for k, v in _teacher_echo(group).items()}
    c2 = group_correspondence(group, [0, 1, 2], silent, encoder, **_MATCH)
    assert all(c2.keys[s][0] != 1 for row in c2.rows_of(0) for s in c2.selected[row])
    assert any(c2.keys[s][0] == 0 for row in c2.rows_of(1) for s in c2.selected[row])


class _PositionNoisyEncoder:
    """Fixed unit vectors per text, nudged by 1e-6 x (position in the batch) towards the first axis: the way a
    batched encoder's rounding can depend on where a text sits in the batch, made large and one-directional."""

    VECTORS = {"find the apple": (1.0, 0.0), "the apple is likely on the countertop": (0.9, 0.4359)}

    def encode(self, texts):
        return torch.tensor([[x + 1e-6 * k, y] for k, t in enumerate(texts) for x, y in [self.VECTORS[t]]])


def test_two_sources_with_the_same_thinking_tie_exactly_and_the_earlier_wins():
    """Siblings 1 and 2 thought the same at turn 0 (cosine 0.9 with the target's thinking). Their similarities to
    the target must be equal to the last bit, whatever batch positions the encoder saw them at, so that top_k = 1
    keeps the earlier one, as select_sources's tie-break says; the later one used to win by rounding."""
    group = [
        _rollout([("find the apple", "go to countertop 1")], won=True),
        _rollout([("the apple is likely on the countertop", "go to countertop 1")], won=True),
        _rollout([("the apple is likely on the countertop", "go to countertop 1")], won=False),
    ]
    c = group_correspondence(group, [0, 1, 2], _teacher_echo(group), _PositionNoisyEncoder(), **{**_MATCH, "top_k": 1})
    assert float(c.similarity[1, 0]) == float(c.similarity[2, 0])
    assert abs(float(c.similarity[1, 0]) - 0.9 / math.hypot(0.9, 0.4359)) < 1e-5
    assert [c.keys[s] for s in c.selected[0]] == [(1, 0)]


def test_action_filter_drops_a_source_whose_action_disagrees(encoder):
    group = _hand_built_group()
    teacher = _teacher_echo(group)
    teacher[(1, 0)] = (teacher[(1, 0)][0], "inventory")  # the teacher would act differently at that source
    c = group_correspondence(group, [0, 1, 2], teacher, encoder, **{**_MATCH, "action_filter": True})
    assert [c.keys[s] for s in c.selected[c.keys.index((0, 0))]] == []
    assert [c.keys[s] for s in c.selected[c.keys.index((0, 2))]] == [(1, 2)]


def test_cross_views_are_the_target_response_under_the_source_teacher_prompt(encoder, embedded_tokenizer):
    group = _hand_built_group()
    c = group_correspondence(group, [0, 1, 2], _teacher_echo(group), encoder, **_MATCH)
    chat = ChatFormat(embedded_tokenizer)
    contexts = ["[Skills] a", "[Skills] b", "[Skills] c"]
    requests, owners = cross_view_requests(c, 0, group, contexts, chat)
    # Turn 1's own counterpart (1, 1) is ineligible, so it takes that sibling's next-best turn, (1, 0).
    assert [(t, c.keys[s]) for t, s in owners] == [(0, (1, 0)), (1, (1, 0)), (2, (1, 2))]
    for (prompt, response), (t, s) in zip(requests, owners):
        assert prompt == privileged_prompt_ids(group[1], c.keys[s][1], "[Skills] b", chat)
        assert response is group[0].turns[t].response_ids


@pytest.fixture(scope="module")
def pick_game(tmp_path_factory):
    return generate_games(tmp_path_factory.mktemp("games"), 1, 0, "train", task_types=["pick_and_place_simple"])[0]


class _Teacher:
    """The teacher's generator: one fixed thinking for every privileged prompt (close to the plans' student
    thinking, so sources are found); records the prompts and the budget it was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.prompts, self.max_new_tokens = tokenizer, [], None

    def __call__(self, prompts):
        self.prompts.append(len(prompts))
        ids = self.tokenizer("<think>Step 1: I will do the next step.</think> <action>look</action>", add_special_tokens=False)["input_ids"]
        return [Generation(list(ids), [0.0] * len(ids), True) for _ in prompts]


def _trainer(tmp_path, tiny_model_dir, pick_game, encoder, **overrides):
    config = AlignOPSDConfig(
        **cpu_trainer_kwargs(tmp_path / "out", max_turns=6, similarity_threshold=0.5, **overrides)
    )
    return AlignOPSDTrainer(
        model=tiny_model_dir, args=config, train_dataset=Dataset.from_list(task_spec_rows([pick_game])), encoder=encoder
    )


def _script(trainer, game, monkeypatch, wins=2) -> _Teacher:
    walkthrough = json.loads(Path(game).read_text())["walkthrough"]
    generator = PlannedGenerator(trainer.model, trainer.processing_class, walkthrough_plans(walkthrough, 6, wins=wins))
    teacher = _Teacher(trainer.processing_class)
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    monkeypatch.setattr(alignopsd_module, "generator_for_trainer", lambda _trainer, batch_size=None: teacher)
    return teacher


@pytest.mark.parametrize("ablation", ["E", "B"])
def test_alignopsd_step_on_alfworld(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder, ablation):
    trainer = _trainer(tmp_path, tiny_model_dir, pick_game, encoder, ablation=ablation, teacher_max_new_tokens=64)
    teacher = _script(trainer, pick_game, monkeypatch)
    try:
        trainer.train()
    finally:
        trainer.close()
    logged = trainer.state.log_history[0]
    assert logged["alignopsd/match_rate"] > 0 and logged["alignopsd/cross_views"] > 0
    assert logged["alignopsd/teacher_generation_seconds"] > 0 and 0 < logged["alignopsd/alpha_mean"] <= 0.8
    assert teacher.max_new_tokens == 64 and teacher.prompts == [sum(t.num_turns for t in trainer.last_step.trajectories)]
    assert torch.isfinite(torch.tensor(logged["loss"]))
    assert all(text.startswith("[Skills]") for text in trainer.last_step.skill_texts)
    redistributed = 0
    for trajectory, weights in zip(trainer.last_step.trajectories, trainer.last_step.weights):
        counts = [len(turn.response_ids) for turn in trajectory.turns]
        per_token = [w for n, tw in zip(counts, weights) for w in (tw if isinstance(tw, list) else [tw] * n)]
        w = torch.tensor(per_token, dtype=torch.float64)
        # Official box [0, 4] mixed at 0.5: [0.5, 2.5]; the token ablation has no mixing: [0, 4].
        low, high = (0.5, 2.5) if ablation == "E" else (0.0, 4.0)
        assert torch.all(w >= low - 1e-9) and torch.all(w <= high + 1e-9)
        assert w.mean().item() == pytest.approx(1.0, abs=1e-9)  # the token budget: sum_t n_t w_t = N
        redistributed += not torch.all(w == 1.0)
    assert redistributed >= 2
    # The step line's weight range is the range of these weights (per token in ablation B).
    flat = [x for weights in trainer.last_step.weights for tw in weights for x in (tw if isinstance(tw, list) else [tw])]
    assert (logged["credit/weight_min"], logged["credit/weight_max"]) == pytest.approx((min(flat), max(flat)))
    assert logged["credit/weight_min"] < 1.0 < logged["credit/weight_max"]


def _one_step(trainer, game, monkeypatch) -> StepView:
    """What the credit hook gets in one scripted step; the credit itself is left out of that step."""
    _script(trainer, game, monkeypatch)
    seen: list = []

    def capture(step):
        seen.append(step)
        return [[0.0] * t.num_turns for t in step.trajectories]

    with monkeypatch.context() as patch:
        patch.setattr(trainer, "turn_advantages", capture)
        trainer._generate_and_score_completions([dict(trainer.train_dataset[0]) for _ in range(4)])
    return seen[0]


def test_ablation_a_with_uniform_gaps_is_grpo_bit_for_bit(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder):
    """Trajectory scope, reward scale 1, no residual, no rectification (ablation A) and every turn's gap equal:
    the weights are exactly 1 and every turn gets exactly GRPO's A_i."""
    trainer = _trainer(tmp_path, tiny_model_dir, pick_game, encoder, grpo_normalization_scope="trajectory",
                       invalid_action_coef=0.0, reward_scale=1.0, ablation="A")
    try:
        step = _one_step(trainer, pick_game, monkeypatch)
        shifts = trainer._privileged_shifts
        monkeypatch.setattr(trainer, "_privileged_shifts", lambda *a, **k: (
            lambda out: ({key: torch.full_like(g, 0.25) for key, g in out[0].items()}, out[1]))(shifts(*a, **k)))
        got = trainer.turn_advantages(step)
        want = AgentGRPOTrainer.turn_advantages(trainer, step)
    finally:
        trainer.close()
    assert got == want and any(a != 0 for turns in want for a in turns)


def test_no_skill_still_builds_the_teacher(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder):
    """Retrieval gives no skill: the official trainer still builds the teacher prompt (an empty skill text), so
    the teacher runs on every turn under the empty skill block and the credit still moves."""
    trainer = _trainer(tmp_path, tiny_model_dir, pick_game, encoder)
    try:
        step = _one_step(trainer, pick_game, monkeypatch)
        teacher = _Teacher(trainer.processing_class)
        monkeypatch.setattr(alignopsd_module, "generator_for_trainer", lambda _trainer, batch_size=None: teacher)
        monkeypatch.setattr(alignopsd_module, "skill_contexts", lambda bank, trajectories, k: [""] * len(trajectories))
        seen = []
        real = alignopsd_module.teacher_prompts
        monkeypatch.setattr(alignopsd_module, "teacher_prompts", lambda t, w, c, chat: seen.append(list(c)) or real(t, w, c, chat))
        trainer.turn_advantages(step)
    finally:
        trainer.close()
    assert teacher.prompts == [sum(t.num_turns for t in step.trajectories)]
    assert seen == [[NO_SKILLS] * len(step.trajectories)]
    assert any(w != 1.0 for weights in trainer.last_step.weights for w in weights)


def test_turn_scope_advantage_and_invalid_residual_in_the_trainer(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder):
    """The trainer's outcome advantage is the official turn-scope one over the group's rewards and turn counts,
    and the residual is added per turn: an all-fail step has A = 0 and only the invalid turns move."""
    trainer = _trainer(tmp_path, tiny_model_dir, pick_game, encoder)
    try:
        step = _one_step(trainer, pick_game, monkeypatch)
        assert step.groups == {0: list(range(len(step.trajectories)))}  # one task group
        outcome = trainer._outcome_advantages(step)
        # The episode reward as the official environments pay it: 10 per win.
        want = group_outcome_advantage(10 * step.rewards.double(), [t.num_turns for t in step.trajectories], "turn", 1e-6)
        assert outcome == pytest.approx(want.tolist(), abs=1e-12)
        residuals = trainer._invalid_residuals(step)
    finally:
        trainer.close()
    # Hand: normalise the turn rows' rewards (10 per win) with and without the 0.1 penalty on invalid rows.
    rewards = torch.tensor([10 * float(r) for r, t in zip(step.rewards, step.trajectories) for _ in t.turns], dtype=torch.float64)
    invalid = torch.tensor([not turn.action_valid for t in step.trajectories for turn in t.turns], dtype=torch.float64)
    assert invalid.sum() > 0
    penalised = rewards - 0.1 * invalid
    want = (penalised - penalised.mean()) / (penalised.std() + 1e-6) - (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    assert [v for row in residuals for v in row] == pytest.approx(want.tolist(), abs=1e-12)


def test_all_fail_step_runs_no_teacher_and_no_scoring_pass(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder):
    """No sibling won, so no outcome advantage can move: no teacher generation and no privileged, cross or plain
    pass runs, even when the sampler ran under bf16 autocast. Only the invalid-action residual is left: with
    equal rewards, the invalid turns fall below the group's mean and the valid ones rise above it."""
    trainer = _trainer(tmp_path, tiny_model_dir, pick_game, encoder)
    teacher = _script(trainer, pick_game, monkeypatch, wins=0)
    monkeypatch.setattr(trainer.args, "bf16", True)
    passes = []
    snapshot = trainer._snapshot_logprobs
    monkeypatch.setattr(trainer, "_snapshot_logprobs", lambda *args, **kwargs: passes.append(1) or snapshot(*args, **kwargs))
    try:
        batch = trainer._generate_and_score_completions([dict(trainer.train_dataset[0]) for _ in range(4)])
    finally:
        trainer.close()
    assert passes == [] and teacher.prompts == []
    per_turn = [a for turns in trainer.last_step.trajectories for a in turns.turns]
    assert any(not turn.action_valid for turn in per_turn) and any(turn.action_valid for turn in per_turn)
    assert bool((batch["advantages"] < 0).any()) and bool((batch["advantages"] > 0).any())


def test_corrected_gap_has_one_plain_reference(tmp_path, tiny_model_dir, pick_game, monkeypatch, encoder):
    """The diagonal and every cross score subtract the same recomputed old log-probs: sampling log-probs that differ
    from the snapshot's by a constant (another engine's) must not move the corrected gaps."""
    trainer = _trainer(tmp_path, tiny_model_dir, pick_game, encoder)
    try:
        step = _one_step(trainer, pick_game, monkeypatch)
        recorded: list = []
        real = trainer._corrected_gaps

        def record(*args, **kwargs):
            out = real(*args, **kwargs)
            recorded.append(out)
            return out

        monkeypatch.setattr(trainer, "_corrected_gaps", record)
        snapshot = step.batch["sampling_per_token_logps"]
        trainer.turn_advantages(StepView(step.trajectories, step.advantages, step.rows, {**step.batch, "old_per_token_logps": snapshot.clone()}, step.rewards))
        reference, views, _ = recorded[-1]
        assert views > 0
        shifted_rows = copy.deepcopy(step.rows)
        shifted_rows.logprobs = [[v + 0.75 * m for v, m in zip(values, mask)] for values, mask in zip(step.rows.logprobs, step.rows.env_mask)]
        shifted = {**step.batch, "sampling_per_token_logps": pad([torch.tensor(v) for v in shifted_rows.logprobs], 0.0, "right")}
        trainer.turn_advantages(StepView(step.trajectories, step.advantages, shifted_rows, {**shifted, "old_per_token_logps": snapshot.clone()}, step.rewards))
        recomputed, _, _ = recorded[-1]
    finally:
        trainer.close()
    assert reference.keys() == recomputed.keys()
    for i in reference:
        for a, b in zip(reference[i], recomputed[i]):
            assert (a is None and b is None) or torch.equal(a, b)


def test_config_errors(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="ablation"):
        AlignOPSDConfig(ablation="F", **base)
    with pytest.raises(ValueError, match="aggregation_mode"):
        AlignOPSDConfig(aggregation_mode="mean", **base)
    with pytest.raises(ValueError, match="span_max_turns"):
        AlignOPSDConfig(span_min_turns=3, span_max_turns=4, **base)
    with pytest.raises(ValueError, match="invalid_action_coef instead"):
        AlignOPSDConfig(invalid_action_penalty=0.1, **base)
    with pytest.raises(ValueError, match="alpha_max"):
        AlignOPSDConfig(alpha_max=1.5, **base)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [  # the official configuration check refuses the same three: coef -1, coef NaN, gate_beta 0
        ("sdar_aux_coef", -1.0, "sdar_aux_coef must be a finite number >= 0, got -1.0"),
        ("sdar_aux_coef", float("nan"), "sdar_aux_coef must be a finite number >= 0, got nan"),
        ("sdar_aux_gate_beta", 0.0, "sdar_aux_gate_beta must be a finite number > 0, got 0.0"),
    ],
)
def test_sdar_auxiliary_settings_are_checked(tmp_path, field, value, message):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", sdar_aux=True)
    with pytest.raises(ValueError, match=re.escape(message)):
        AlignOPSDConfig(**{field: value}, **base)


def test_sdar_auxiliary_is_off_by_default_with_the_launcher_values(tmp_path):
    config = AlignOPSDConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    # algorithm.sdar_aux of the official beyond_timestamps_trainer.yaml: enabled false, coef 0.01, gate_beta 5.0
    assert (config.sdar_aux, config.sdar_aux_coef, config.sdar_aux_gate_beta) == (False, 0.01, 5.0)


def _sdar_host(coef: float, beta: float) -> SimpleNamespace:
    """What ``_add_sdar_auxiliary`` reads of a trainer: its two settings, the metrics store and the mode."""
    return SimpleNamespace(args=SimpleNamespace(sdar_aux_coef=coef, sdar_aux_gate_beta=beta),
                           _metrics=defaultdict(lambda: defaultdict(list)), metrics_mode="train")


def test_sdar_auxiliary_term_by_hand():
    """c = 0.1, beta = 1. Turn 0 (advantage 0.4 on every token) has gaps [ln 3, 0, -ln 3]: sigma = [3/4, 1/2, 1/4],
    so it gains [0.075, 0.05, 0.025]. Turn 1 carries per-token advantages [0.3, -0.2] and gaps [ln 9, -ln 9]:
    sigma = [9/10, 1/10], so [0.39, -0.19]: the term only ever adds. Turn 2 has no diagonal score, turn 3 a NaN gap,
    turn 4 a gap shorter than its response: all three keep 0.4. Logged mean (0.075 + 0.05 + 0.025 + 0.09 + 0.01) / 5."""
    host = _sdar_host(0.1, 1.0)
    advantages = [[0.4, [0.3, -0.2], 0.4, 0.4, 0.4]]
    gaps = {
        (0, 0): torch.tensor([math.log(3), 0.0, -math.log(3)]),
        (0, 1): torch.tensor([math.log(9), -math.log(9)]),
        (0, 3): torch.tensor([float("nan"), 0.0]),
        (0, 4): torch.tensor([0.5]),
    }
    plain = {(0, 0): torch.tensor([-1.0, -2.0, -0.5]), (0, 1): torch.tensor([-3.0, -0.1]), (0, 2): torch.tensor([-1.0]),
             (0, 3): torch.tensor([-1.0, -1.0]), (0, 4): torch.tensor([-1.0, -1.0])}
    AlignOPSDTrainer._add_sdar_auxiliary(host, advantages, gaps, plain)
    assert advantages[0][0] == pytest.approx([0.475, 0.45, 0.425], abs=1e-9)
    assert advantages[0][1] == pytest.approx([0.39, -0.19], abs=1e-9)
    assert advantages[0][2:] == [0.4, 0.4, 0.4]
    assert host._metrics["train"]["alignopsd/sdar_aux_mean"] == pytest.approx([0.05], abs=1e-9)


def test_sdar_auxiliary_term_on_the_official_fixture():
    """The inputs of the official SDAR auxiliary test (student log-probs [-2, -1], teacher [-1, -2]) with the
    launcher's c = 0.01, beta = 5: gate [sigma(5), sigma(-5)] = [0.9933071, 0.0066929], so the gradient-equivalent
    advantage on a zero outcome advantage is 0.01 x gate."""
    host = _sdar_host(0.01, 5.0)
    student, teacher = torch.tensor([-2.0, -1.0]), torch.tensor([-1.0, -2.0])
    advantages = [[0.0]]
    AlignOPSDTrainer._add_sdar_auxiliary(host, advantages, {(0, 0): teacher - student}, {(0, 0): student})
    assert advantages[0][0] == pytest.approx([0.009933071, 0.000066929], abs=1e-9)
