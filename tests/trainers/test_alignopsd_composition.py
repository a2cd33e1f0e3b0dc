"""AlignOPSD composed as the official trainer composes it (``mingju-c/Align-OPSD``,
``ThinkingCorrespondenceRayTrainer`` + ``compute_correspondence_credit``), checked at the trainer level.

``AlignOPSDTrainer.turn_advantages`` runs for real (outcome advantage, teacher generation, encoding, matching,
the corrected gaps, the span threshold, the spans, the budgets, the residual) on a hand-built step of three task
groups of three rollouts each, with the model-dependent numbers scripted: the encoder maps each thinking to a
fixed vector, the teacher writes a fixed thinking per turn, and the diagonal, plain and cross log-probs are
constants per turn. Every target turn has sources of different similarity, the groups have different distance
profiles (group 1 moves nothing; its distances are the smallest), and the expectation comes from
``alignopsd_reference``, written from the official formulas without the package. Spans are compared exactly,
advantages to 1e-9.

Faults this file catches (each applied to ``trainers/alignopsd.py`` by hand, then reverted; see the report of
issue 59): the live spans made one per turn, the omega temperature replaced by 1.0, the span threshold computed per
group.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

import taspo_trl.trainers.alignopsd as alignopsd_module
from taspo_trl import AlignOPSDConfig, AlignOPSDTrainer
from taspo_trl.privileged.alignopsd import NO_SKILLS
from taspo_trl.rollout.generation import Generation
from taspo_trl.rollout.records import Trajectory, Turn
from taspo_trl.trainers.step import LastStep, StepView
from tests.helpers.alignopsd_reference import (
    cosine,
    corrected_gap,
    invalid_residuals,
    jsd_bits,
    profile,
    quantile,
    segment,
    select,
    turn_scope_advantages,
    turn_weights,
)

# Three task groups of three rollouts: turns per rollout and wins. Group 1 all failed: its credit cannot move, but
# its distances enter the official batch threshold.
LENGTHS = [[4, 5, 4], [5, 4, 4], [4, 4, 5]]
WINS = [[True, False, False], [False, False, False], [True, True, False]]
INVALID = {(0, 1, 2)}  # (group, rollout, turn) of the one invalid action
LENGTHS_COUNT = [len(lengths) for lengths in LENGTHS]  # rollouts per group
SIGMAS = (0.12, 0.05, 0.2)  # the spread of each group's thinking vectors: three distance profiles
SETTINGS = dict(
    similarity_threshold=0.7, source_top_k=2, aggregation_temperature=0.1, alpha_max=0.8, credit_temperature=0.5,
    mixing_coefficient=0.5, profile_temperature=0.1, invalid_action_coef=0.1, reward_scale=10.0,
    grpo_normalization_scope="turn", action_filter=False,
)


def _scenario(seed: int = 13):
    """Thinking vectors near one direction (so the profiles are smooth and the distances fall inside the
    threshold's clip range), per-turn token counts, diagonal gaps, plain log-probs and cross offsets."""
    rng = random.Random(seed)
    student, teacher, counts, diagonal, plain, cross, keys = {}, {}, {}, {}, {}, {}, []
    for g, lengths in enumerate(LENGTHS):
        for r, n in enumerate(lengths):
            for t in range(n):
                key = (g, r, t)
                keys.append(key)
                s = [1.0] + [rng.gauss(0, SIGMAS[g]) for _ in range(4)]
                student[key] = [round(x, 6) for x in s]
                teacher[key] = [round(x + rng.gauss(0, 0.3 * SIGMAS[g]), 6) for x in s]
                counts[key] = rng.choice([2, 3, 4])
                diagonal[key] = round(rng.uniform(-1.0, 1.0), 2)
                plain[key] = round(-1.0 - 0.1 * t, 2)
    for source in keys:
        for target in keys:
            if source[0] == target[0] and source[1] != target[1]:
                cross[(source, target)] = round(rng.uniform(-2.0, 1.0), 2)
    return SimpleNamespace(keys=keys, student=student, teacher=teacher, counts=counts, diagonal=diagonal, plain=plain,
                           cross=cross)


def _texts(key) -> tuple[str, str]:
    g, r, t = key
    return f"student thinks {g} {r} {t}", f"teacher thinks {g} {r} {t}"


def _trajectories(sc, group_order=(0, 1, 2)) -> list[Trajectory]:
    out = []
    for g in group_order:
        for r, n in enumerate(LENGTHS[g]):
            trajectory = Trajectory(task_spec={}, task=f"task {g}", initial_observation="", group=g, won=WINS[g][r],
                                    reward=float(WINS[g][r]))
            for t in range(n):
                text = f"<think>{_texts((g, r, t))[0]}</think> <action>act {t}</action>"
                prompt = f"obs {g} {r} {t}"
                response = [10000 * g + 1000 * r + 100 * t + k for k in range(sc.counts[(g, r, t)])]
                trajectory.turns.append(Turn([ord(c) for c in prompt], response, [0.0] * len(response), text, f"act {t}",
                                             (g, r, t) not in INVALID, "ok", (0, len(response)), "", prompt_text=prompt))
            out.append(trajectory)
    return out


class _Encoder:
    def __init__(self, sc):
        self.vectors = {}
        for key in sc.keys:
            s, t = _texts(key)
            self.vectors[s], self.vectors[t] = sc.student[key], sc.teacher[key]

    def encode(self, texts):
        return torch.tensor([self.vectors[text] for text in texts], dtype=torch.float64)


def _key_of_prompt(ids) -> tuple[int, int, int]:
    found = re.search(r"obs (\d+) (\d+) (\d+)", "".join(chr(i) for i in ids))
    return tuple(int(x) for x in found.groups())


def _host(tmp_path, monkeypatch, sc, contexts=None, group_order=(0, 1, 2), **overrides):
    """An AlignOPSDTrainer without a model: its own credit code, with the model-dependent passes scripted."""
    config = AlignOPSDConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=3,
                             per_device_train_batch_size=9, **{**SETTINGS, **overrides})
    host = AlignOPSDTrainer.__new__(AlignOPSDTrainer)
    trajectories = _trajectories(sc, group_order)
    index = {(t.group, r, u): (j, u) for j, t in enumerate(trajectories)
             for r in [sum(1 for x in trajectories[:j] if x.group == t.group)] for u in range(t.num_turns)}
    by_response = {tuple(trajectories[j].turns[u].response_ids): key for key, (j, u) in index.items()}
    prompts_seen: list[int] = []

    def teacher(prompts):
        prompts_seen.append(len(prompts))
        out = []
        for ids in prompts:
            text = f"<think>{_texts(_key_of_prompt(ids))[1]}</think> <action>look</action>"
            out.append(Generation([ord(c) for c in text], [0.0] * len(text), True))
        return out

    def score(requests, *args, **kwargs):
        out = []
        for prompt, response in requests:
            source, target = _key_of_prompt(prompt), by_response[tuple(response)]
            out.append(torch.full((len(response),), sc.plain[target] + sc.cross[(source, target)], dtype=torch.float64))
        return out

    def shifts(step, target_contexts, action_only=True):
        gaps, plain = {}, {}
        for key, (j, u) in index.items():
            n = sc.counts[key]
            plain[(j, u)] = torch.full((n,), sc.plain[key], dtype=torch.float64)
            if target_contexts[j]:
                gaps[(j, u)] = torch.full((n,), sc.diagonal[key], dtype=torch.float64)
        return gaps, plain

    host.args = config
    host.accelerator = SimpleNamespace(num_processes=1, process_index=0, autocast=nullcontext)
    host.model = SimpleNamespace(training=True)
    host._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    host.encoder = _Encoder(sc)
    host.skill_bank = None
    host.chat = SimpleNamespace(first_prompt_ids=lambda text: [ord(c) for c in text])
    host._tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "".join(chr(i) for i in ids),
                                      pad_token_id=0)
    host.use_vllm = False
    host.scale_rewards = "group"
    host.last_step = LastStep(trajectories=trajectories)
    monkeypatch.setattr(host, "_privileged_shifts", shifts, raising=False)
    monkeypatch.setattr(alignopsd_module, "generator_for_trainer", lambda _trainer, batch_size=None: teacher)
    monkeypatch.setattr(alignopsd_module, "score_continuations", score)
    given = contexts or (lambda trajectories: [f"[Skills]\n- skill of {t.task}\n[End Skills]" for t in trajectories])
    monkeypatch.setattr(alignopsd_module, "skill_contexts", lambda bank, trajectories, k: given(trajectories))
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    step = StepView(trajectories, torch.zeros(len(trajectories)), SimpleNamespace(collect=lambda plain: plain), {},
                    rewards=rewards)
    return host, step, index, prompts_seen


def _expected(sc, threshold_groups="batch", omega_temperature=None, one_turn_spans=False, reward_scale=10.0):
    """The official composition, from ``alignopsd_reference``: H = cos(teacher thinking at the source, student
    thinking at the target) (``cosine_matrix_by_task``); each target's corrected gap (``select_sparse_sources``,
    ``combine_cross_teacher_scores``); profiles and distances (``build_dense_correspondence_profiles``,
    ``compute_adjacent_profile_distance``); the threshold over the valid distances of ``threshold_groups``
    (official: the whole batch, ``adaptive_segmentation_threshold``); spans (``segment_trajectories``); weights
    (``compute_correspondence_credit_from_tensors``); outcome and residual (``compute_unique_trajectory_grpo_
    advantage`` turn scope, ``compute_invalid_action_advantage_residual``) on rewards of 10 per win."""
    tau, temperature = SETTINGS["similarity_threshold"], omega_temperature or SETTINGS["aggregation_temperature"]
    keys = sc.keys
    h = {(s, t): cosine(sc.teacher[s], sc.student[t]) for s in keys for t in keys if s[0] == t[0] and s[1] != t[1]}
    trajectories = sorted({k[:2] for k in keys})
    turns = {tr: sum(1 for k in keys if k[:2] == tr) for tr in trajectories}
    advantage, residual = {}, {}
    for g in range(len(LENGTHS)):
        members = [tr for tr in trajectories if tr[0] == g]
        rewards = [reward_scale * WINS[g][tr[1]] for tr in members]
        advantage.update(zip(members, turn_scope_advantages(rewards, [turns[tr] for tr in members])))
        rows = [tr + (t,) for tr in members for t in range(turns[tr])]
        bad = [row in INVALID for row in rows]
        values = invalid_residuals([reward_scale * WINS[g][row[1]] for row in rows], bad, SETTINGS["invalid_action_coef"])
        residual.update(zip(rows, values if any(bad) else [0.0] * len(rows)))
    distance, valid = {}, {}
    for tr in trajectories:
        previous = None
        for t in range(turns[tr]):
            p, ok = profile(h, keys, tr + (t,), SETTINGS["profile_temperature"], tau)
            valid[tr + (t,)] = previous is not None and ok and previous[1]
            distance[tr + (t,)] = jsd_bits(previous[0], p) if valid[tr + (t,)] else 0.0
            previous = (p, ok)
    moving = {g for g in range(len(LENGTHS)) if any(advantage[tr] != 0 for tr in trajectories if tr[0] == g)}

    def threshold(groups) -> float:
        values = [distance[k] for k in keys if valid[k] and k[0] in groups]
        return min(max(quantile(values, 0.8), 0.01), 0.10) if values else float("inf")

    out = dict(spans={}, advantages={}, threshold=threshold(range(len(LENGTHS))), moving=moving,
               moving_threshold=threshold(moving), distance=distance, valid=valid, h=h)
    for tr in trajectories:
        n = turns[tr]
        if advantage[tr] == 0:
            out["spans"][tr], out["advantages"][tr] = [(0, n)], [residual[tr + (t,)] for t in range(n)]
            continue
        limit = {"batch": threshold(range(len(LENGTHS))), "moving": threshold(moving), "group": threshold({tr[0]})}
        gaps = []
        for t in range(n):
            k = tr + (t,)
            sources = select(h, keys, k, tau, SETTINGS["source_top_k"])
            gaps.append(corrected_gap(sc.plain[k] + sc.diagonal[k], sc.plain[k], [h[(s, k)] for s in sources],
                                      [sc.plain[k] + sc.cross[(s, k)] for s in sources], tau, temperature, SETTINGS["alpha_max"]))
        spans = segment([distance[tr + (t,)] for t in range(n)], [valid[tr + (t,)] for t in range(n)], limit[threshold_groups])
        sign = 1.0 if advantage[tr] > 0 else -1.0
        weights = turn_weights([sign * g for g in gaps], [sc.counts[tr + (t,)] for t in range(n)],
                               [(t, t + 1) for t in range(n)] if one_turn_spans else spans, SETTINGS["credit_temperature"])
        out["spans"][tr] = spans
        out["advantages"][tr] = [advantage[tr] * w + residual[tr + (t,)] for t, w in enumerate(weights)]
    return out


def _got(host, step, index):
    advantages = host.turn_advantages(step)
    trajectories = step.trajectories
    keyed = {}
    for key, (j, u) in index.items():
        keyed.setdefault(key[:2], {})[key[2]] = advantages[j][u]
    spans = {}
    for key, (j, _) in index.items():
        spans[key[:2]] = host.last_step.spans[j]
    return {tr: [v[t] for t in sorted(v)] for tr, v in keyed.items()}, spans, trajectories


def _max_difference(a: dict, b: dict) -> float:
    return max(abs(x - y) for tr in a for x, y in zip(a[tr], b[tr], strict=True))


@pytest.fixture(scope="module")
def scenario():
    return _scenario()


def test_scenario_exercises_what_the_faults_change(scenario):
    """The step is built so that each of the three faults moves the expectation far beyond 1e-9: group 1's small
    distances lower the batch threshold below group 0's and group 2's own; the two sources of a target differ in
    similarity; the moving trajectories have spans of two or more turns. (The official expectation against each
    fault's, from the reference alone.)"""
    want = _expected(scenario)
    assert want["moving"] == {0, 2}
    assert want["threshold"] < want["moving_threshold"]
    assert any(len(s) > 1 for tr, s in want["spans"].items() if tr[0] in want["moving"])
    assert _max_difference(want["advantages"], _expected(scenario, threshold_groups="group")["advantages"]) > 0.1
    assert _max_difference(want["advantages"], _expected(scenario, threshold_groups="moving")["advantages"]) > 0.1
    assert _max_difference(want["advantages"], _expected(scenario, omega_temperature=1.0)["advantages"]) > 0.05
    assert _max_difference(want["advantages"], _expected(scenario, one_turn_spans=True)["advantages"]) > 0.1
    assert _expected(scenario, threshold_groups="group")["spans"] != want["spans"]
    assert _expected(scenario, threshold_groups="moving")["spans"] != want["spans"]


def test_batch_threshold_spans_and_advantages_match_the_official_composition(tmp_path, monkeypatch, scenario):
    """Points 1, 2 and 7 of issue 59: the span threshold pools every group's valid distances (group 1 included,
    though nothing of it moves), the spans are exactly the official ones, and every turn's advantage A_i w_it + r_it
    matches, with rewards of 10 per win (the residual is the official's at c = 0.1)."""
    host, step, index, prompts = _host(tmp_path, monkeypatch, scenario)
    got, spans, _ = _got(host, step, index)
    want = _expected(scenario)
    assert spans == want["spans"]
    assert _max_difference(got, want["advantages"]) < 1e-9
    # Every group got its teacher (36 turns), and the logged threshold is the batch's.
    assert prompts == [sum(sum(lengths) for lengths in LENGTHS)]
    assert host._metrics["train"]["alignopsd/segmentation_threshold"] == [pytest.approx(want["threshold"], abs=1e-12)]


def test_moving_scope_pools_only_the_groups_that_move(tmp_path, monkeypatch, scenario):
    """``span_threshold_scope: moving``: group 1 gets no teacher and its distances stay out of the quantile, so the
    threshold and the spans are those of groups 0 and 2 pooled."""
    host, step, index, prompts = _host(tmp_path, monkeypatch, scenario, span_threshold_scope="moving")
    got, spans, _ = _got(host, step, index)
    want = _expected(scenario, threshold_groups="moving")
    assert spans == want["spans"] and spans != _expected(scenario)["spans"]
    assert _max_difference(got, want["advantages"]) < 1e-9
    assert prompts == [sum(sum(lengths) for g, lengths in enumerate(LENGTHS) if g != 1)]


def test_a_task_without_skills_still_gets_its_teacher(tmp_path, monkeypatch, scenario):
    """Point 3: retrieval gives no skill for group 2's task. The official ``build_teacher_batch`` still builds the
    teacher prompt (an empty skill text under its header); here the teacher sees the empty skill block, and the
    credit is the same as with skills (the scripted scores do not read the skill text)."""

    def contexts(trajectories):
        return ["" if t.group == 2 else f"[Skills]\n- skill of {t.task}\n[End Skills]" for t in trajectories]

    host, step, index, prompts = _host(tmp_path, monkeypatch, scenario, contexts=contexts)
    seen = []
    real = alignopsd_module.teacher_prompts
    monkeypatch.setattr(alignopsd_module, "teacher_prompts",
                        lambda trajectories, wanted, ctx, chat: seen.append(list(ctx)) or real(trajectories, wanted, ctx, chat))
    got, spans, trajectories = _got(host, step, index)
    want = _expected(scenario)
    assert spans == want["spans"] and _max_difference(got, want["advantages"]) < 1e-9
    assert [c for c, t in zip(seen[0], trajectories) if t.group == 2] == [NO_SKILLS] * 3
    weights = [w for j, t in enumerate(trajectories) if t.group == 2 for w in host.last_step.weights[j]]
    assert any(abs(w - 1.0) > 1e-3 for w in weights)
    assert [host.last_step.skill_texts[j] for j, t in enumerate(trajectories) if t.group == 2] == ["", "", ""]


def test_random_spans_are_seeded_by_the_trajectory_index_in_task_rollout_order(tmp_path, monkeypatch, scenario):
    """Point 4: ablation D seeds ``random.Random(0 + index)`` with the trajectory's index in (task, rollout) order
    over the whole batch (official ``segment_trajectories`` over ``_trajectory_groups``). The batch is handed over
    with the groups in the order 2, 0, 1, so that index is not the batch position."""
    host, step, index, _ = _host(tmp_path, monkeypatch, scenario, group_order=(2, 0, 1), ablation="D")
    seeds = []
    real = alignopsd_module.segment_trajectory
    monkeypatch.setattr(alignopsd_module, "segment_trajectory",
                        lambda *args, **kwargs: seeds.append(kwargs["seed"]) or real(*args, **kwargs))
    host.turn_advantages(step)
    # Batch order: group 2's rollouts, then group 0's; their (task, rollout) indices are 6, 7, 8, then 0, 1, 2.
    assert seeds == [6, 7, 8, 0, 1, 2]
    checked = 0
    for (g, r, t), (j, _) in index.items():
        if t or g == 1:
            continue  # one check per trajectory; nothing moves in group 1: one span
        rank = sum(LENGTHS_COUNT[:g]) + r  # the (task, rollout) index: groups 0, 1, 2, then the rollout
        n = step.trajectories[j].num_turns  # the repair never runs: every trajectory is shorter than 8 turns
        assert host.last_step.spans[j] == segment([0.0] * n, [False] * n, 0.1, random_seed=rank), (g, r)
        checked += 1
    assert checked == 6


def test_official_profile_recipes_carry_the_reward_scale_and_the_batch_threshold():
    """The official-profile recipes: 10 per win on ALFWorld and WebShop, the exact match (1) on Search, the win as
    the outcome, the batch threshold; the CPU quickstarts keep the scale and the batch threshold, WebShop's the
    graded score."""
    import yaml

    from taspo_trl.recipes import RECIPES_DIR as ROOT

    for env, scale in (("alfworld", 10.0), ("webshop", 10.0), ("search", 1.0)):
        for model in ("qwen2.5-3b", "qwen2.5-7b"):
            data = yaml.safe_load((ROOT / "paper" / env / f"alignopsd_{model}.yaml").read_text())
            assert (data["reward_scale"], data["outcome_reward"], data["span_threshold_scope"]) == (scale, "win", "batch")
        quick = yaml.safe_load((ROOT / "quickstart" / f"{env}_alignopsd_cpu.yaml").read_text())
        outcome = "env" if env == "webshop" else "win"
        assert (quick["reward_scale"], quick["outcome_reward"], quick["span_threshold_scope"]) == (scale, outcome, "batch")


def _three_processes(host, whole, index, scenario, monkeypatch) -> list[StepView]:
    """The ``StepView`` of each of three processes holding three trajectories each (``first`` at 0, 3 and 6, the
    whole batch in ``step.everything``), with the host set up as one of three processes: the other processes'
    teacher responses arrive through the gather, and the privileged pass scores this process's trajectories."""
    everything = whole.everything
    contexts = alignopsd_module.teacher_contexts(alignopsd_module.skill_contexts(None, everything, 0))
    shares = [StepView(everything[first : first + 3], torch.zeros(3), SimpleNamespace(collect=lambda plain: plain),
                       {}, rewards=whole.rewards, first=first, everything=everything) for first in (0, 3, 6)]
    every_group = {t.group for t in everything}
    shared = [pair for share in shares for pair in host._teacher_responses(share, contexts, every_group).items()]

    def shifts(step, target_contexts, action_only=True):  # keyed by this process's trajectory index, as the pass is
        gaps, plain = {}, {}
        for key, (j, u) in index.items():
            i = j - step.first
            if 0 <= i < len(step.trajectories):
                plain[(i, u)] = torch.full((scenario.counts[key],), scenario.plain[key], dtype=torch.float64)
                if target_contexts[i]:
                    gaps[(i, u)] = torch.full((scenario.counts[key],), scenario.diagonal[key], dtype=torch.float64)
        return gaps, plain

    monkeypatch.setattr(host, "_privileged_shifts", shifts, raising=False)
    monkeypatch.setattr(alignopsd_module, "gather_object", lambda mine: shared)
    host.accelerator = SimpleNamespace(num_processes=3, process_index=0, autocast=nullcontext, gather=lambda t: t,
                                       device=torch.device("cpu"))
    return shares


def test_each_process_share_gets_the_official_advantages_of_its_trajectories(tmp_path, monkeypatch, scenario):
    """Three processes, one task group each: the hook on every process's share gives exactly its own trajectories
    the official spans and advantages, with the batch threshold that pools all three groups."""
    host, whole, index, _ = _host(tmp_path, monkeypatch, scenario)
    want = _expected(scenario)
    for share in _three_processes(host, whole, index, scenario, monkeypatch):
        advantages = host.turn_advantages(share)
        assert len(advantages) == 3
        for key, (j, u) in index.items():
            if share.first <= j < share.first + 3:
                assert advantages[j - share.first][u] == pytest.approx(want["advantages"][key[:2]][key[2]], abs=1e-9)
                assert host.last_step.spans[j - share.first] == want["spans"][key[:2]]
    assert host._metrics["train"]["alignopsd/segmentation_threshold"] == [pytest.approx(want["threshold"], abs=1e-12)] * 3


def test_random_spans_on_three_processes_are_seeded_by_the_index_over_the_whole_batch(tmp_path, monkeypatch, scenario):
    """Ablation D's seeds on a process's share are the trajectories' (task, rollout) indices over the whole batch,
    as on one process: groups handed over in the order 2, 0, 1, one per process."""
    host, whole, index, _ = _host(tmp_path, monkeypatch, scenario, group_order=(2, 0, 1), ablation="D")
    seeds = []
    real = alignopsd_module.segment_trajectory
    monkeypatch.setattr(alignopsd_module, "segment_trajectory",
                        lambda *args, **kwargs: seeds.append(kwargs["seed"]) or real(*args, **kwargs))
    for share in _three_processes(host, whole, index, scenario, monkeypatch):
        host.turn_advantages(share)
    assert seeds == [6, 7, 8, 0, 1, 2]  # group 1 moves nothing: no spans drawn
