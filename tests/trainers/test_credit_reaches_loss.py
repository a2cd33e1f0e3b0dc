"""The credit reaches the loss: for GRPO, TASPO (action and token level) and every registered comparison method,
the per-token advantages TRL's ``compute_loss`` receives in one real optimizer step equal an expectation built
here independently.

One scripted batch on a real ALFWorld game (two wins, two failures) with a tiny random-weight policy whose real
log-probs are recorded. The siblings think differently where their decisions differ: each response's reasoning
names the action it takes. The expectation is built from
- log-probs and privileged shifts from plain forward passes of a fresh copy of the initial weights (the rollout
  snapshot of step 0), prompts rendered with the tokenizer's chat template;
- the paper's formulas by hand (GRPO's A_i, TASPO's Eqs. 4-6, Eq. 7's token weights) or, for the comparison
  methods, the registered pure credit function called on gaps built here;
- placement on each turn's response tokens by hand.
A spy on ``compute_loss`` records what TRL's loss gets (after the trainer's micro-batch repacking); each received
row is matched to its turn by its token ids.
"""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, TASPOConfig, TASPOTrainer
from taspo_trl.credit.registry import CREDIT_METHODS, OutcomeBatch, TeacherGaps, get_credit
from taspo_trl.envs.alfworld import task_spec_rows
from taspo_trl.testing import make_tiny_model_dir
from taspo_trl.trainers import BaselineConfig, BaselineTrainer
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.one_step import (
    ATOL,
    MAX_TURNS,
    chat_prompt_ids,
    received_rows,
    response_logprobs,
    train_one_step,
)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory, embedded_model_path):
    """OPD's external teacher: another tiny random-weight model with the policy's tokenizer."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("teacher"), tokenizer_source=embedded_model_path, seed=1)


@pytest.fixture(scope="module")
def other_model(other_model_dir):
    return AutoModelForCausalLM.from_pretrained(other_model_dir, dtype=torch.float32).eval()


# --------------------------------------------------------------------------------------------------------------
# one optimizer step (tests.helpers.one_step), and what TRL's loss received


def _expected_turn_rows(trajectories, advantages_per_turn) -> list[tuple[tuple, torch.Tensor, torch.Tensor]]:
    """The turn layout by hand: one row per turn, its prompt the turn's prompt and its completion the response;
    every response token carries its turn's advantage (a number, or one per token) and Eq. 7's 1 / (T_i |R_it|)."""
    out = []
    for trajectory, per_turn in zip(trajectories, advantages_per_turn, strict=True):
        assert len(per_turn) == trajectory.num_turns
        for turn, advantage in zip(trajectory.turns, per_turn, strict=True):
            n = len(turn.response_ids)
            values = torch.tensor(advantage if isinstance(advantage, list) else [advantage] * n, dtype=torch.float64)
            assert values.numel() == n
            balance = torch.full((n,), 1.0 / (trajectory.num_turns * n), dtype=torch.float64)
            out.append(((tuple(turn.prompt_ids), tuple(turn.response_ids)), values.clone(), balance))
    return out


def _expected_sequence_rows(trajectories, advantages_per_turn) -> list[tuple[tuple, torch.Tensor, torch.Tensor]]:
    """The sequence layout by hand: one row per trajectory, prompt = the first prompt, completion = every later
    token of the conversation; turn t's response sits where its history (its ``prompt_ids``) ends, observation
    tokens between responses carry advantage 0 and loss weight 0."""
    out = []
    for trajectory, per_turn in zip(trajectories, advantages_per_turn, strict=True):
        first = trajectory.turns[0].prompt_ids
        last = trajectory.turns[-1]
        completion = last.prompt_ids[len(first) :] + last.response_ids
        values = torch.zeros(len(completion), dtype=torch.float64)
        balance = torch.zeros(len(completion), dtype=torch.float64)
        for turn, advantage in zip(trajectory.turns, per_turn, strict=True):
            assert turn.prompt_ids[: len(first)] == first
            start, n = len(turn.prompt_ids) - len(first), len(turn.response_ids)
            assert completion[start : start + n] == turn.response_ids
            values[start : start + n] = torch.as_tensor(advantage, dtype=torch.float64)
            balance[start : start + n] = 1.0 / (trajectory.num_turns * n)
        out.append(((tuple(first), tuple(completion)), values, balance))
    return out


def _assert_loss_received(seen, expected) -> None:
    """Every row TRL's loss got is an expected row with the expected advantages and Eq. 7 weights; every expected
    row with a non-zero advantage was received (rows whose advantages are all 0 may be left out, exactly)."""
    received = received_rows(seen)
    unmatched = list(expected)
    for key, advantages, balance in received:
        candidates = [k for k, (want_key, _, _) in enumerate(unmatched) if want_key == key]
        assert candidates, f"the loss got a row that is no turn of the batch ({len(key[1])} completion tokens)"
        # identical rows (two siblings' equal first turns) tell apart by their trajectory's Eq. 7 weight
        same_weight = [k for k in candidates if torch.allclose(balance, unmatched[k][2], atol=1e-7, rtol=1e-5)]
        wanted = [unmatched[k][2][0].item() for k in candidates]
        assert same_weight, f"Eq. 7 weights {balance[0].item():.6g} on a row, want one of {wanted}"
        errors = [(unmatched[k][1] - advantages).abs().max().item() for k in same_weight]
        best = same_weight[min(range(len(same_weight)), key=errors.__getitem__)]
        assert min(errors) <= ATOL, (
            f"advantages off by {min(errors):.3g}: got {advantages.tolist()[:4]}..., want {unmatched[best][1].tolist()[:4]}..."
        )
        unmatched.pop(best)
    assert all(torch.all(values == 0) for _, values, _ in unmatched), "a row with credit never reached the loss"


# --------------------------------------------------------------------------------------------------------------
# independent forwards and formulas


def _privileged_prompt(tokenizer, context: str, trajectory, t: int, layout: str) -> list[int]:
    """Turn t's prompt with the context in front of the first user message (TASPO Sec. 3.2, Eq. 3): in the turn
    layout that is the turn's own message; in the sequence layout the first one, the history after it unchanged."""
    first, turn = trajectory.turns[0], trajectory.turns[t]
    if layout == "turn":
        assert chat_prompt_ids(tokenizer, turn.prompt_text) == turn.prompt_ids  # the rendering the policy saw
        return chat_prompt_ids(tokenizer, f"{context}\n\n{turn.prompt_text}")
    assert chat_prompt_ids(tokenizer, first.prompt_text) == first.prompt_ids
    assert turn.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    return chat_prompt_ids(tokenizer, f"{context}\n\n{first.prompt_text}") + turn.prompt_ids[len(first.prompt_ids) :]


def _gap(model, teacher, tokenizer, context: str, trajectory, t: int, layout: str = "turn") -> torch.Tensor:
    """log pi_T(y | context + h) - log pi_old(y | h) on every response token of turn t; an empty context: the
    teacher under the plain prompt."""
    turn = trajectory.turns[t]
    prompt = _privileged_prompt(tokenizer, context, trajectory, t, layout) if context else turn.prompt_ids
    return (response_logprobs(teacher, prompt, turn.response_ids)
            - response_logprobs(model, turn.prompt_ids, turn.response_ids))


def _grpo_advantages(trajectories) -> list[float]:
    """Sec. 3.1 by hand: A_i = (R_i - mean) / (unbiased std + 1e-4) over the one group."""
    rewards = [t.reward for t in trajectories]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + 1e-4) for r in rewards]


def _taspo_redistribution(scores: torch.Tensor, advantage: float, tau: float, eps_w: float) -> torch.Tensor:
    """Eqs. 4-6 by hand on the scorable units: centre, tanh(sign(A) d_hat / tau), centre again, scale by eps_w / 2."""
    centred = scores - scores.mean()
    q = torch.tanh(math.copysign(1.0, advantage) * centred / tau)
    return 1.0 + eps_w / 2.0 * (q - q.mean())


def _action_shifts(model, tokenizer, trajectory, pi: str, layout: str) -> list[torch.Tensor | None]:
    """Eq. 3 shifts on each turn's action span (None where the turn has no action)."""
    out = []
    for t, turn in enumerate(trajectory.turns):
        start, end = turn.action_span
        if end <= start:
            out.append(None)
            continue
        # the span is the action block of the response, by its text
        assert turn.action in tokenizer.decode(turn.response_ids[start:end])
        out.append(_gap(model, model, tokenizer, pi, trajectory, t, layout)[start:end])
    return out


def _taspo_action_weights(shifts, advantage: float, has_pi: bool, c_delta: float, tau: float, eps_w: float) -> list[float]:
    """One weight per turn: d_it = mean clip(shift, -c, c) (Eq. 4) redistributed over the scorable turns; 1 for the
    others and in A.3's fallbacks (no PI, A = 0, fewer than two scorable turns)."""
    weights = [1.0] * len(shifts)
    scorable = [t for t, s in enumerate(shifts) if s is not None]
    if not has_pi or advantage == 0 or len(scorable) < 2:
        return weights
    scores = torch.stack([shifts[t].clamp(-c_delta, c_delta).mean() for t in scorable])
    for t, w in zip(scorable, _taspo_redistribution(scores, advantage, tau, eps_w).tolist()):
        weights[t] = w
    return weights


def _taspo_token_weights(trajectory, shifts, advantage: float, has_pi: bool, c_delta: float, tau: float, eps_w: float):
    """Token-level allocation: every action token's clipped shift is its own score, redistributed over all the
    trajectory's action tokens; the other response tokens (and turns without action) keep 1."""
    weights = [[1.0] * len(turn.response_ids) for turn in trajectory.turns]
    scorable = [t for t, s in enumerate(shifts) if s is not None]
    if not has_pi or advantage == 0 or sum(shifts[t].numel() for t in scorable) < 2:
        return weights
    flat = _taspo_redistribution(torch.cat([shifts[t].clamp(-c_delta, c_delta) for t in scorable]), advantage, tau, eps_w)
    position = 0
    for t in scorable:
        start, end = trajectory.turns[t].action_span
        weights[t][start:end] = flat[position : position + end - start].tolist()
        position += end - start
    return weights


def _trainer(cls, config_cls, tmp_path, model_dir, game, **overrides):
    values = cpu_trainer_kwargs(tmp_path / "out", max_turns=MAX_TURNS, **overrides)
    return cls(model=model_dir, args=config_cls(**values), train_dataset=Dataset.from_list(task_spec_rows([game])))


# --------------------------------------------------------------------------------------------------------------
# GRPO and TASPO


def test_grpo_reaches_the_loss(tmp_path, tiny_model_dir, pick_and_place_game, monkeypatch):
    trainer = _trainer(AgentGRPOTrainer, AgentGRPOConfig, tmp_path, tiny_model_dir, pick_and_place_game)
    seen = train_one_step(trainer, pick_and_place_game, monkeypatch)
    trajectories = trainer.last_step.trajectories
    assert [t.won for t in trajectories] == [True, True, False, False]
    advantages = _grpo_advantages(trajectories)
    _assert_loss_received(seen, _expected_turn_rows(trajectories, [[a] * t.num_turns for a, t in zip(advantages, trajectories)]))


TASPO_SETTINGS = dict(tau=0.25, eps_w=0.6, c_delta=2.0)  # tau != eps_w, so a swap of the two shows


def _taspo_expectation(trainer, snapshot, unit: str, layout: str, **settings) -> tuple[list[float], list[list], list[list]]:
    """(A_i, per-turn shifts, per-turn advantages) of the trainer's last step, by hand."""
    trajectories, pi = trainer.last_step.trajectories, trainer.last_step.privileged_info
    tokenizer = trainer.processing_class
    advantages = _grpo_advantages(trajectories)
    shifts = [_action_shifts(snapshot, tokenizer, t, text, layout) if text and a != 0 else [None] * t.num_turns
              for t, text, a in zip(trajectories, pi, advantages)]
    credit = []
    for trajectory, text, a, s in zip(trajectories, pi, advantages, shifts, strict=True):
        if unit == "action":
            credit.append([a * w for w in _taspo_action_weights(s, a, bool(text), **settings)])
        else:
            credit.append([[a * w for w in turn] for turn in _taspo_token_weights(trajectory, s, a, bool(text), **settings)])
    return advantages, shifts, credit


@pytest.mark.parametrize("unit,layout", [("action", "turn"), ("action", "sequence"), ("token", "turn")])
def test_taspo_reaches_the_loss(tmp_path, tiny_model_dir, pick_and_place_game, snapshot, monkeypatch, unit, layout):
    """TASPO's A_i w_it (action level: one weight per turn; token level: one per action token) on every response
    token, as TRL's loss receives them; a failed trajectory's credit is ordered by sign(A) d; and the test would
    see tau and eps_w swapped."""
    trainer = _trainer(
        TASPOTrainer, TASPOConfig, tmp_path, tiny_model_dir, pick_and_place_game, layout=layout, allocation_unit=unit,
        **TASPO_SETTINGS,
    )
    seen = train_one_step(trainer, pick_and_place_game, monkeypatch)
    trajectories, pi = trainer.last_step.trajectories, trainer.last_step.privileged_info
    assert [t.won for t in trajectories] == [True, True, False, False]
    # The failure that found the cd gets PI from its successful siblings; the wanderer shares no step with them.
    assert [bool(text) for text in pi] == [True, True, True, False]
    advantages, shifts, credit = _taspo_expectation(trainer, snapshot, unit, layout, **TASPO_SETTINGS)
    expected_rows = _expected_turn_rows if layout == "turn" else _expected_sequence_rows
    _assert_loss_received(seen, expected_rows(trajectories, credit))

    # The failed trajectory with PI (A < 0): a better-supported action (larger d) gets the LESS negative credit,
    # i.e. A~ ranks as d ranks, where the weight w alone ranks against d. |A| in place of A would reverse that.
    failed = 2
    assert advantages[failed] < 0
    scorable = [t for t, s in enumerate(shifts[failed]) if s is not None]
    assert len(scorable) >= 3
    if unit == "action":
        scores = [shifts[failed][t].clamp(-2, 2).mean().item() for t in scorable]
        values = [credit[failed][t] for t in scorable]
    else:
        scores = torch.cat([shifts[failed][t].clamp(-2, 2) for t in scorable]).tolist()
        values = [credit[failed][t][k] for t in scorable for k in range(*trajectories[failed].turns[t].action_span)]
    pairs = [(a, b) for a in range(len(scores)) for b in range(len(scores)) if scores[a] < scores[b] - 1e-9]
    assert pairs and all(values[a] < values[b] for a, b in pairs)

    # The expectation is sensitive to which of tau and eps_w is which: the swapped pair differs well beyond ATOL.
    swapped = dict(TASPO_SETTINGS, tau=TASPO_SETTINGS["eps_w"], eps_w=TASPO_SETTINGS["tau"])
    _, _, credit_swapped = _taspo_expectation(trainer, snapshot, unit, layout, **swapped)
    flat = lambda c: torch.tensor([v for traj in c for turn in traj for v in (turn if isinstance(turn, list) else [turn])])  # noqa: E731
    assert (flat(credit) - flat(credit_swapped)).abs().max() > 50 * ATOL


# --------------------------------------------------------------------------------------------------------------
# the comparison methods: every registered credit method, through the registry's own function

BASELINE_SETTINGS = {
    # raised so that each method's own term is far above the tolerance (defaults 0.01 / 0.1 / 0.001)
    "grpo_opsd": dict(distill_coef=1.0),
    "sdar": dict(distill_coef=1.0),
    "skill_sd": dict(distill_coef=1.0),
    "opid": dict(opid_episode_weight=1.0, opid_step_weight=1.0),
}


def _outcome_expectation(method, trainer) -> list[list]:
    """A teacher-free method on the batch as its ``OutcomeBatch``, built here from the trajectories."""
    trajectories = trainer.last_step.trajectories
    batch = OutcomeBatch(
        advantages=torch.tensor(_grpo_advantages(trajectories), dtype=torch.float32),
        observations=[[t.initial_observation] + [turn.observation for turn in t.turns[:-1]] for t in trajectories],
        rewards=[[turn.reward for turn in t.turns] for t in trajectories],
        groups=[0] * len(trajectories),
    )
    return [list(values) for values in method.fn(batch, trainer.args, 0)]


def _teacher_expectation(method, trainer, snapshot, teacher) -> list[list]:
    """A teacher method: per trajectory its [turns, T] gaps from plain forwards of the teacher (the initial weights
    at step 0 for a self-teacher, under the trajectory's privileged context and, with step skills, each step's
    own skill; OPD's model under the plain prompt), the method's function on them, and each scored turn's values
    on its response tokens; a turn without a gap keeps A_i (0 for distillation-only methods)."""
    trajectories = trainer.last_step.trajectories
    tokenizer = trainer.processing_class
    contexts = trainer.last_step.privileged_info
    step_skills = trainer.last_step.step_skills if method.step_skills else [{} for _ in trajectories]
    external = method.teacher == "external"
    credit = []
    for i, (trajectory, a) in enumerate(zip(trajectories, _grpo_advantages(trajectories), strict=True)):
        n = trajectory.num_turns
        unscored = a if method.outcome else 0.0
        episode = {t: _gap(snapshot, teacher, tokenizer, contexts[i], trajectory, t) for t in range(n) if external or contexts[i]}
        step = {t: _gap(snapshot, teacher, tokenizer, text, trajectory, t) for t, text in step_skills[i].items()}
        if not episode and not step:
            credit.append([unscored] * n)
            continue
        width = max(len(turn.response_ids) for turn in trajectory.turns)
        delta, step_delta, mask, student = (torch.zeros(n, width, dtype=torch.float64) for _ in range(4))
        for t, turn in enumerate(trajectory.turns):
            length = len(turn.response_ids)
            student[t, :length] = response_logprobs(snapshot, turn.prompt_ids, turn.response_ids)
            for gaps, values in ((episode, delta), (step, step_delta)):
                if t in gaps:
                    values[t, :length] = gaps[t]
                    mask[t, :length] = 1.0
        gaps = TeacherGaps(
            advantage=torch.full((n,), a, dtype=torch.float64), delta=delta, mask=mask, student=student, step_delta=step_delta
        )
        shaped = method.fn(gaps, trainer.args, 0).double()
        credit.append([
            shaped[t, : len(turn.response_ids)].tolist() if mask[t].any() else unscored
            for t, turn in enumerate(trajectory.turns)
        ])
    return credit


@pytest.mark.parametrize("name", sorted(n for n, m in CREDIT_METHODS.items() if m.trainer is None))  # the trainers' own: above
def test_comparison_method_reaches_the_loss(
    name, tmp_path, tiny_model_dir, other_model_dir, other_model, pick_and_place_game, snapshot, monkeypatch
):
    method = get_credit(name)
    settings = dict(BASELINE_SETTINGS.get(name, {}))
    if method.teacher == "external":
        settings["teacher_model_name_or_path"] = other_model_dir
    trainer = _trainer(BaselineTrainer, BaselineConfig, tmp_path, tiny_model_dir, pick_and_place_game, baseline=name,
                       **settings)
    seen = train_one_step(trainer, pick_and_place_game, monkeypatch)
    trajectories = trainer.last_step.trajectories
    assert [t.won for t in trajectories] == [True, True, False, False]
    if method.teacher is None:
        credit = _outcome_expectation(method, trainer)
    else:
        assert any(trainer.last_step.privileged_info) or method.teacher == "external"
        teacher = snapshot if method.teacher == "self" else other_model
        credit = _teacher_expectation(method, trainer, snapshot, teacher)
    _assert_loss_received(seen, _expected_turn_rows(trajectories, credit))
    if method.prompt_skills:
        assert all("[Skills]" in turn.prompt_text for t in trajectories for turn in t.turns)
    else:  # the method's own term is measurable here: GRPO's credit would fail the check above
        grpo = [[a] * t.num_turns for a, t in zip(_grpo_advantages(trajectories), trajectories)]
        moved = [
            abs(v - g)
            for traj, base in zip(credit, grpo)
            for turn, g in zip(traj, (b for b in base))
            for v in (turn if isinstance(turn, list) else [turn])
        ]
        assert max(moved) > 50 * ATOL
