"""AlignOPSD's credit reaches the loss: for the method (ablation E) and each official ablation A-D, the per-token
advantages TRL's ``compute_loss`` receives in one real optimizer step equal an expectation built here
independently.

The batch is ``test_credit_reaches_loss``'s (``tests.helpers.one_step``): one real ALFWorld game, a tiny
random-weight policy, two wins and two failures, each response's thinking naming the action it takes. The second win
looks around once more, so its turn t + 1 makes the decision the first win makes at turn t: a decision-aligned
source is NOT at the target's step index. The scripted teacher thinks, at each turn, about the decision the skills
call for there (the walkthrough's next step), which is not always what the student did, so H[source, target] is not
symmetric and swapping the teacher and student roles changes the match.

The expectation is built from
- log-probs from plain forward passes of the initial weights (the rollout snapshot of step 0): the plain prompt,
  the turn under its own p_x (diagonal) and the target's response under each source's p_x and context (cross);
  prompts rendered with the tokenizer's chat template;
- the cosines of the encoder's embeddings of the teacher's and the student's thinking, computed here;
- the pure stage functions of ``taspo_trl.credit.alignopsd`` (selection, profiles, spans, budgets);
- the turn-scope GRPO advantage and the invalid-action residual by hand;
- placement on each turn's response tokens by hand.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset

import taspo_trl.trainers.alignopsd as alignopsd_module
from taspo_trl import AlignOPSDConfig, AlignOPSDTrainer
from taspo_trl.credit.alignopsd import (
    adjacent_profile_distances,
    correction_strength,
    correspondence_confidence,
    corrected_token_gap,
    cross_teacher_logprobs,
    dense_profiles,
    flat_token_weights,
    flat_turn_weights,
    hierarchical_turn_weights,
    segment_trajectory,
    segmentation_threshold,
    select_sources,
    source_weights,
    structural_eligibility,
)
from taspo_trl.envs.alfworld import task_spec_rows
from taspo_trl.rollout.generation import Generation
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.one_step import (
    ATOL as LOGPROB_ATOL,
    THOUGHTS,
    chat_prompt_ids,
    received_rows,
    response_logprobs,
    train_one_step,
)

# The test's own forwards and the trainer's agree to ~1e-5 in log-prob on one CPU (LOGPROB_ATOL's note), but
# AlignOPSD amplifies such differences: the aggregation temperature 0.1 multiplies those in the similarities by 10,
# the rectification's 1 / (1 - tau) by 4. On a 2-core AMD EPYC with AVX2 only, three ablations were off by up to
# 2.0e-4 (within 1e-4 on an AVX512 box), so the advantages get 5e-4. The hyperparameter check at the end still
# asks for five times that (2.9e-3 measured, against 2.5e-3).
ATOL = 5 * LOGPROB_ATOL

# Off the defaults where two fields could be confused: alpha_max != mixing_coefficient, tau below the cosines of
# two "go to" thoughts about different places, a credit temperature that moves the weights well past ATOL.
SETTINGS = dict(
    similarity_threshold=0.75, alpha_max=0.6, mixing_coefficient=0.3, source_top_k=2, credit_temperature=0.5,
    aggregation_temperature=0.1, invalid_action_coef=0.5,
)

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def _thought(action: str | None) -> str:
    if action is None:
        return ""
    verb = next(v for v in THOUGHTS if action.startswith(v))
    return THOUGHTS[verb].format(rest=action[len(verb) :].strip())


def _teacher_plans(walkthrough: list[str]) -> list[list[str | None]]:
    """What the teacher, reading the skills, decides at each turn of each student trajectory: the winners' own
    steps; for the failure that carries the cd away, the walk to the right place and the put (a thought the
    student never had there); for the wanderer, the first walkthrough step at every turn."""
    go_drawer, open_drawer, take_cd, go_bin, put_cd = walkthrough
    return [
        [go_drawer, open_drawer, take_cd, go_bin, put_cd],
        [go_drawer, "look", open_drawer, take_cd, go_bin, put_cd],
        [go_drawer, open_drawer, take_cd, go_bin, put_cd, put_cd],
        [go_drawer] * 6,
    ]


class _Teacher:
    """The teacher's generator: for the k-th privileged prompt (one per turn, trajectories in order) a response
    thinking about the teacher plan's decision there."""

    def __init__(self, trainer, plans):
        self.trainer, self.plans, self.calls = trainer, plans, 0

    def __call__(self, prompts):
        self.calls += 1
        keys = [(i, t) for i, tr in enumerate(self.trainer.last_step.trajectories) for t in range(tr.num_turns)]
        assert len(prompts) == len(keys)
        out = []
        for i, t in keys:
            action = self.plans[i][t]
            text = f"<think>{_thought(action)}</think> <action>{action}</action>"
            ids = self.trainer.processing_class(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(list(ids), [0.0] * len(ids), True))
        return out


def _run(tmp_path, tiny_model_dir, game, encoder, monkeypatch, **overrides):
    values = cpu_trainer_kwargs(tmp_path / "out", max_turns=6, **{**SETTINGS, **overrides})
    trainer = AlignOPSDTrainer(
        model=tiny_model_dir, args=AlignOPSDConfig(**values), train_dataset=Dataset.from_list(task_spec_rows([game])),
        encoder=encoder,
    )
    walkthrough = json.loads(Path(game).read_text())["walkthrough"]
    teacher = _Teacher(trainer, _teacher_plans(walkthrough))
    monkeypatch.setattr(alignopsd_module, "generator_for_trainer", lambda _trainer, batch_size=None: teacher)
    seen = train_one_step(trainer, game, monkeypatch)
    assert teacher.calls == 1
    return trainer, seen, _teacher_plans(walkthrough)


# --------------------------------------------------------------------------------------------------------------
# the expectation, independently


def _cosines(encoder, sources: list[str], targets: list[str]) -> torch.Tensor:
    """cos(source text, target text) of the encoder's embeddings, 0 where either text is empty."""
    texts = sorted({x for x in sources + targets if x})
    embedded = dict(zip(texts, torch.nn.functional.normalize(encoder.encode(texts).double(), dim=-1)))
    out = torch.zeros(len(sources), len(targets), dtype=torch.float64)
    for a, s in enumerate(sources):
        for b, t in enumerate(targets):
            if s and t:
                out[a, b] = float(torch.dot(embedded[s], embedded[t]).clamp(-1, 1))
    return out


# The episode reward as the official environments pay it (AlignOPSDConfig.reward_scale): 10 per win.
REWARD_SCALE = 10.0


def _turn_scope_advantages(trajectories) -> list[float]:
    """A_i = (R_i - mu) / (sigma + 1e-6), mu and the unbiased sigma over the turn rows (each reward once per turn),
    R_i = 10 per win."""
    rows = [REWARD_SCALE * t.reward for t in trajectories for _ in t.turns]
    mu = sum(rows) / len(rows)
    sigma = math.sqrt(sum((r - mu) ** 2 for r in rows) / (len(rows) - 1))
    return [(REWARD_SCALE * t.reward - mu) / (sigma + 1e-6) for t in trajectories]


def _residuals(trajectories, coefficient: float) -> list[list[float]]:
    """normalise(R - c * invalid) - normalise(R) over the group's turn rows (mean, unbiased std, 1e-6), R = 10 per win."""
    rewards = torch.tensor([REWARD_SCALE * t.reward for t in trajectories for _ in t.turns], dtype=torch.float64)
    invalid = torch.tensor([not turn.action_valid for t in trajectories for turn in t.turns], dtype=torch.float64)
    assert invalid.any()
    penalised = rewards - coefficient * invalid
    normalised = lambda x: (x - x.mean()) / (x.std() + 1e-6)  # noqa: E731
    flat = (normalised(penalised) - normalised(rewards)).tolist()
    out, k = [], 0
    for t in trajectories:
        out.append(flat[k : k + t.num_turns])
        k += t.num_turns
    return out


def _expectation(trainer, snapshot, encoder, teacher_plans, ablation: str, **settings):
    """(A_i, per-turn corrected gaps, per-turn A_i w_it, per-turn advantages with the residual, the spans)."""
    s = {**SETTINGS, **settings}
    trajectories, contexts = trainer.last_step.trajectories, trainer.last_step.skill_texts
    tokenizer = trainer.processing_class
    assert all(contexts)
    advantages = _turn_scope_advantages(trajectories)
    keys = [(i, t) for i, tr in enumerate(trajectories) for t in range(tr.num_turns)]
    student_think = []
    for i, t in keys:
        found = _THINK.search(trajectories[i].turns[t].response_text)
        student_think.append(found.group(1).strip() if found else "")
    teacher_think = [_thought(teacher_plans[i][t]) for i, t in keys]
    rollouts = [i for i, _ in keys]
    h = _cosines(encoder, teacher_think, student_think)  # H[source: teacher, target: student]
    b = structural_eligibility(rollouts, [bool(x) for x in teacher_think], [bool(x) for x in student_think])
    tau = s["similarity_threshold"]
    selected = select_sources(h, b, rollouts, tau, s["source_top_k"])
    profiles, valid = dense_profiles(h, b, tau, 0.1)
    rows_of = {i: [n for n, key in enumerate(keys) if key[0] == i] for i in range(len(trajectories))}
    distances, boundary_valid = adjacent_profile_distances(profiles, valid, b, list(rows_of.values()), "jsd")
    threshold = segmentation_threshold(distances, boundary_valid, 0.8, 0.01, 0.10)
    alpha_max = 0.0 if ablation == "A" else s["alpha_max"]

    def privileged(j: int, u: int) -> list[int]:
        turn = trajectories[j].turns[u]
        assert chat_prompt_ids(tokenizer, turn.prompt_text) == turn.prompt_ids
        return chat_prompt_ids(tokenizer, f"{contexts[j]}\n\n{turn.prompt_text}")

    gaps, weighted, spans = [], [], []
    for i, trajectory in enumerate(trajectories):
        a = advantages[i]
        turn_gaps = []
        for row in rows_of[i]:
            turn = trajectory.turns[keys[row][1]]
            student = response_logprobs(snapshot, turn.prompt_ids, turn.response_ids)
            diagonal = response_logprobs(snapshot, privileged(i, keys[row][1]), turn.response_ids)
            sources = selected[row] if alpha_max > 0 else ()
            if not sources:
                turn_gaps.append(corrected_token_gap(diagonal, student))
                continue
            sims = h[list(sources), row]
            omega = source_weights(sims, s["aggregation_temperature"])
            alpha = correction_strength(correspondence_confidence(sims, omega, tau), alpha_max)
            views = torch.stack([response_logprobs(snapshot, privileged(*keys[src]), turn.response_ids)
                                 for src in sources])
            turn_gaps.append(corrected_token_gap(diagonal, student, cross_teacher_logprobs(views, omega), alpha))
        gaps.append(turn_gaps)
        n = trajectory.num_turns
        sign = 1.0 if a > 0 else -1.0
        scores = [sign * float(g.mean()) for g in turn_gaps]
        counts = [g.numel() for g in turn_gaps]
        if ablation == "B":
            token_w = flat_token_weights(torch.cat([sign * g for g in turn_gaps]), s["credit_temperature"])
            per_turn = [part.tolist() for part in torch.split(token_w, counts)]
            weighted.append([[a * w for w in part] for part in per_turn])
            spans.append([(t, t + 1) for t in range(n)])
            continue
        if ablation == "C":
            cut = [(0, n)]
            w = flat_turn_weights(scores, counts, s["credit_temperature"], s["mixing_coefficient"])
        else:
            cut = segment_trajectory(
                distances[rows_of[i]], boundary_valid[rows_of[i]], threshold, 2, 8, fallback_min=0.01,
                mode="random" if ablation == "D" else "adaptive", seed=i,
            )
            w = hierarchical_turn_weights(scores, counts, cut, s["credit_temperature"], s["mixing_coefficient"])
        weighted.append([a * x for x in w.tolist()])
        spans.append(cut)
    residuals = _residuals(trajectories, s["invalid_action_coef"])
    total = [
        [[v + r for v in x] if isinstance(x, list) else x + r for x, r in zip(per_turn, res)]
        for per_turn, res in zip(weighted, residuals)
    ]
    return dict(advantages=advantages, gaps=gaps, weighted=weighted, total=total, spans=spans, selected=selected, keys=keys)


def _assert_advantages_received(seen, trajectories, total) -> None:
    """Every row TRL's loss got is one turn of the batch (by its prompt and response ids) and carries that turn's
    expected advantage on each response token; every turn with credit was received."""
    expected = []
    for trajectory, per_turn in zip(trajectories, total, strict=True):
        for turn, value in zip(trajectory.turns, per_turn, strict=True):
            n = len(turn.response_ids)
            values = torch.tensor(value if isinstance(value, list) else [value] * n, dtype=torch.float64)
            assert values.numel() == n
            expected.append(((tuple(turn.prompt_ids), tuple(turn.response_ids)), values))
    for key, advantages, _ in received_rows(seen):
        candidates = [k for k, (want, _) in enumerate(expected) if want == key]
        assert candidates, "the loss got a row that is no turn of the batch"
        errors = [(expected[k][1] - advantages).abs().max().item() for k in candidates]
        best = min(range(len(candidates)), key=errors.__getitem__)
        want = expected[candidates[best]][1]
        assert errors[best] <= ATOL, (
            f"advantages off by {errors[best]:.3g}: got {advantages.tolist()[:4]}..., want {want.tolist()[:4]}..."
        )
        expected.pop(candidates[best])
    assert all(torch.all(values == 0) for _, values in expected), "a turn with credit never reached the loss"


def _flat(credit) -> torch.Tensor:
    return torch.tensor([v for traj in credit for turn in traj for v in (turn if isinstance(turn, list) else [turn])])


# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ablation", ["E", "A", "B", "C", "D"])
def test_alignopsd_reaches_the_loss(tmp_path, tiny_model_dir, pick_and_place_game, snapshot, encoder, monkeypatch,
                                    ablation):
    """A_i w_it + r_it of every turn (per token in ablation B), as TRL's loss receives them; the failure's
    reweighted credit ranks as its corrected gaps rank within a span (sign(A) < 0); alpha_max and
    mixing_coefficient swapped, or another tau, would be seen."""
    trainer, seen, teacher_plans = _run(tmp_path, tiny_model_dir, pick_and_place_game, encoder, monkeypatch,
                                        ablation=ablation)
    trajectories = trainer.last_step.trajectories
    assert [t.won for t in trajectories] == [True, True, False, False]
    want = _expectation(trainer, snapshot, encoder, teacher_plans, ablation)
    _assert_advantages_received(seen, trajectories, want["total"])
    assert trainer.last_step.spans == want["spans"]

    # Decision alignment, not step index: the second win's source for the first win's "open" (turn 1) is its
    # turn 2, and no source of that target sits at the same index in that sibling.
    keys, selected = want["keys"], want["selected"]
    assert (1, 2) in [keys[s] for s in selected[keys.index((0, 1))]]
    assert (1, 1) not in [keys[s] for s in selected[keys.index((0, 1))]]

    # The failed trajectory that took the cd (A < 0): within a span, a turn (token in B) with a larger corrected
    # gap gets the LESS negative reweighted advantage A_i w_it; with |A| in place of A the order would reverse.
    failed = 2
    assert want["advantages"][failed] < 0
    gaps, credit = want["gaps"][failed], want["weighted"][failed]
    if ablation == "B":
        units = [[(float(g), c) for g, c in zip(torch.cat(gaps).tolist(), [v for turn in credit for v in turn])]]
    else:
        units = [[(float(gaps[t].mean()), credit[t]) for t in range(a, b)] for a, b in want["spans"][failed]]
    pairs = [(x, y) for unit in units for x in unit for y in unit if x[0] < y[0] - 1e-9]
    assert pairs and all(x[1] < y[1] for x, y in pairs)

    # The expectation sees the hyperparameters: swapping alpha_max and mixing_coefficient (A: no rectification,
    # B: no mixing, so there tau and the credit temperature) moves it past five times the tolerance (the weights of
    # a random-weight policy stay within about 1 % of 1).
    if ablation in ("A", "B"):
        other = dict(similarity_threshold=0.9) if ablation == "B" else dict(credit_temperature=0.25)
    else:
        other = dict(alpha_max=SETTINGS["mixing_coefficient"], mixing_coefficient=SETTINGS["alpha_max"])
    changed = _expectation(trainer, snapshot, encoder, teacher_plans, ablation, **other)
    assert (_flat(want["total"]) - _flat(changed["total"])).abs().max() > 5 * ATOL


def test_sdar_auxiliary_term_reaches_the_loss(tmp_path, tiny_model_dir, pick_and_place_game, snapshot, encoder,
                                              monkeypatch):
    """With the launcher's SDAR auxiliary loss on (off-default coef 0.05 and beta 2, so a swap would be seen), every
    response token of every turn gets A_i w_it + r_it + coef * sigma(beta (log pi_T - log pi_theta)) with pi_T the
    turn under its own p_x: the gradient of the official compute_sdar_loss term at the rollout snapshot, whose
    derivative in log pi_theta is -coef * gate (the official test of that function checks the same)."""
    coef, beta = 0.05, 2.0
    trainer, seen, teacher_plans = _run(tmp_path, tiny_model_dir, pick_and_place_game, encoder, monkeypatch,
                                        ablation="E", sdar_aux=True, sdar_aux_coef=coef, sdar_aux_gate_beta=beta)
    trajectories, contexts = trainer.last_step.trajectories, trainer.last_step.skill_texts
    want = _expectation(trainer, snapshot, encoder, teacher_plans, "E")
    total = []
    for i, (trajectory, per_turn) in enumerate(zip(trajectories, want["total"], strict=True)):
        turns = []
        for turn, value in zip(trajectory.turns, per_turn, strict=True):
            student = response_logprobs(snapshot, turn.prompt_ids, turn.response_ids)
            teacher = response_logprobs(
                snapshot, chat_prompt_ids(trainer.processing_class, f"{contexts[i]}\n\n{turn.prompt_text}"),
                turn.response_ids,
            )
            gate = [coef / (1.0 + math.exp(-beta * (float(t) - float(s)))) for t, s in zip(teacher, student)]
            base = value if isinstance(value, list) else [value] * len(gate)
            turns.append([b + g for b, g in zip(base, gate)])
        total.append(turns)
    _assert_advantages_received(seen, trajectories, total)
    # Every token got between 0 and coef more than without the term, never less: the term cannot flip a sign.
    added = _flat(total) - torch.tensor([v for traj, per in zip(total, want["total"]) for turn, value in zip(traj, per)
                                         for v in ([value] * len(turn) if not isinstance(value, list) else value)])
    assert bool(((added > 0) & (added < coef)).all())
    logged = trainer.state.log_history[0]
    assert logged["alignopsd/sdar_aux_mean"] == pytest.approx(float(added.mean()), abs=ATOL)
