"""Comparison methods (``taspo_trl.credit.baselines``, ``.distillation``, ``.registry``): hand-computed
worked examples, the degenerate cases that must give GRPO back, the papers' stated properties (hypothesis) and the
gradient direction of every loss term.

Parity with the official code (SDAR's repository ZJU-REAL/SDAR, whose ``sdar_utils``, ``rlsd_utils`` and
``gigpo/core_gigpo`` Align-OPSD's trainers import): each ``*_official_*`` test says where its expected numbers come
from, either a fixture of the official tests (Align-OPSD ``tests/test_sdar_auxiliary.py``) or a hand calculation of
the official function it names."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taspo_trl.credit.baselines import (
    anchor_state_groups,
    discounted_returns,
    gigpo_advantages,
    gigpo_episode_advantages,
    gigpo_step_advantages,
    opid_advantages,
    rlsd_advantages,
    rlsd_lambda,
    stepopsd_advantages,
)
from taspo_trl.credit.distillation import (
    gradient_equivalent_advantages,
    importance_weights,
    sampled_reverse_kl,
    sdar_gate,
    sdar_loss,
    skill_sd_loss,
    teacher_version,
)
from taspo_trl.credit.grpo import grpo_outcome_advantages
from taspo_trl.credit.registry import CREDIT_METHODS, get_credit, register_credit
import taspo_trl.trainers  # noqa: F401  (registers the trainers' own methods: GRPO, TASPO, AlignOPSD)

PROPS = settings(max_examples=60, deadline=None)
F64 = torch.float64
NAN = float("nan")

# Shared small batch: 2 rows x 3 tokens, the last token of row 0 is padding (its inputs are garbage on purpose).
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
ADV = torch.tensor([1.0, -2.0], dtype=F64)
STUDENT = [[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.0]]
TEACHER = [[-1.5, -2.0, NAN], [-0.5, -2.0, -0.25]]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def student_leaf() -> torch.Tensor:
    return torch.tensor(STUDENT, dtype=F64, requires_grad=True)


def teacher() -> torch.Tensor:
    return torch.tensor(TEACHER, dtype=F64)


# --------------------------------------------------------------------------------------------------------------
# RLSD


def test_rlsd_official_formula_hand_computed():
    # Hand calculation of the official compute_rlsd_token_advantage (rlsd_utils): w = clamp(exp(sign(A) Delta),
    # 1 - eps, 1 + eps), A_hat = A ((1 - lam) + lam w), times the response mask.
    delta = torch.tensor([[0.1, -1.0, NAN], [0.1, 0.0, -1.0]], dtype=F64)
    out = rlsd_advantages(ADV, delta, MASK, lam=0.5, clip_eps=0.2)
    # row 0, A = 1 (sign +1):
    #   t0: exp(0.1) = 1.1051709 in [0.8, 1.2]; factor 0.5 + 0.5*1.1051709 = 1.0525855; A_hat = 1.0525855
    #   t1: exp(-1) = 0.36788 -> clip 0.8; factor 0.5 + 0.4 = 0.9; A_hat = 0.9
    #   t2: padding -> 0 (its NaN gap is ignored)
    # row 1, A = -2 (sign -1, so the exponent is -Delta):
    #   t0: exp(-0.1) = 0.904837 in [0.8, 1.2]; factor 0.5 + 0.5*0.904837 = 0.9524187; A_hat = -1.9048374
    #   t1: exp(0) = 1; factor 1; A_hat = -2
    #   t2: exp(+1) = 2.71828 -> clip 1.2; factor 0.5 + 0.6 = 1.1; A_hat = -2.2
    expected = [[1.0525855, 0.9, 0.0], [-1.9048374, -2.0, -2.2]]
    assert out.tolist() == [pytest.approx(r, abs=1e-6) for r in expected]
    assert out.dtype == F64


def test_rlsd_zero_advantage_stays_zero_as_in_the_official_code():
    # Official: sign(0) = 0, so w = clamp(exp(0)) = 1 and A_hat = 0 * 1 = 0 on every token.
    out = rlsd_advantages(torch.tensor([0.0, 0.0]), torch.tensor([[3.0, -3.0, 0.0], [1.0, 1.0, 1.0]]), MASK, lam=0.5)
    assert torch.equal(out, torch.zeros(2, 3))


def test_rlsd_lambda_zero_is_grpo_exactly():
    adv = grpo_outcome_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    mask = torch.ones(4, 3)
    out = rlsd_advantages(adv, torch.randn(4, 3), mask, lam=0.0)
    assert torch.equal(out, adv.unsqueeze(-1).expand(4, 3))


def test_rlsd_lambda_official_schedule_counts_from_one():
    # Hand calculation of the official RLSDRayTrainer._get_rlsd_lambda(global_steps): 0 if global_steps >= D, else
    # lam0 (1 - global_steps / D), where verl's global_steps is 1 during the first update and TRL's step is 0.
    # D = 50 (the code's default): TRL step 0 -> official 1: 0.5 (1 - 1/50) = 0.49; 24 -> 25: 0.25;
    # 48 -> 49: 0.5/50 = 0.01; 49 -> 50: 0; 80 -> 81: 0
    assert [rlsd_lambda(s) for s in (0, 24, 48, 49, 80)] == pytest.approx([0.49, 0.25, 0.01, 0.0, 0.0], abs=1e-12)
    # D = 100 (SDAR's RLSD launchers, warmdown_steps=100): 0 -> 0.5 * 0.99 = 0.495; 98 -> 0.005; 99 -> 0
    assert [rlsd_lambda(s, 0.5, 100) for s in (0, 98, 99)] == pytest.approx([0.495, 0.005, 0.0], abs=1e-12)
    with pytest.raises(ValueError):
        rlsd_lambda(-1)
    with pytest.raises(ValueError):
        rlsd_advantages(ADV, torch.zeros(2, 3), MASK, lam=1.5)


@PROPS
@given(step=st.integers(0, 500), lam0=st.floats(0, 1), decay=st.integers(1, 300))
def test_rlsd_lambda_decays_linearly_from_the_first_update_and_ends_at_grpo(step, lam0, decay):
    lam = rlsd_lambda(step, lam0, decay)
    assert 0.0 <= lam <= lam0 * (1 - 1 / decay) + 1e-12  # already decayed once at the first update
    assert rlsd_lambda(step + 1, lam0, decay) <= lam  # never rises
    if step + 1 >= decay:  # the official step number reached the warm-down length: plain GRPO
        assert lam == 0.0
    else:  # one decay step is lam0 / decay
        assert lam - rlsd_lambda(step + 1, lam0, decay) == pytest.approx(lam0 / decay, abs=1e-12)


@PROPS
@given(
    a=st.floats(-5, 5, allow_nan=False),
    gaps=st.lists(st.floats(-30, 30, allow_nan=False), min_size=1, max_size=6),
    lam=st.floats(0, 1),
    eps=st.floats(0, 0.95),
)
def test_rlsd_keeps_sign_and_bounds(a, gaps, lam, eps):
    delta = torch.tensor([gaps], dtype=F64)
    out = rlsd_advantages(torch.tensor([a], dtype=F64), delta, torch.ones_like(delta), lam=lam, clip_eps=eps)
    lo, hi = (1 - lam) + lam * (1 - eps), (1 - lam) + lam * (1 + eps)
    for v in out[0].tolist():
        assert math.copysign(1, v) == math.copysign(1, a) or v == 0 == a
        assert lo * abs(a) - 1e-12 <= abs(v) <= hi * abs(a) + 1e-12


# --------------------------------------------------------------------------------------------------------------
# OPID


def test_opid_hand_computed():
    d_ep = torch.tensor([[0.5, -0.5, 9.0], [1.0, 0.0, -1.0]], dtype=F64)
    d_st = torch.tensor([[2.0, 0.0, 9.0], [0.0, 0.0, 3.0]], dtype=F64)
    out = opid_advantages(ADV, d_ep, d_st, MASK, w_episode=0.1, w_step=0.01)
    # row 0 (A = 1):  1 + 0.1*0.5 + 0.01*2 = 1.07;  1 - 0.05 + 0 = 0.95;  padding 0
    # row 1 (A = -2): -2 + 0.1 = -1.9;  -2;  -2 - 0.1 + 0.03 = -2.07
    expected = [[1.07, 0.95, 0.0], [-1.9, -2.0, -2.07]]
    assert out.tolist() == [pytest.approx(r, abs=1e-12) for r in expected]
    # No step skill: the episode term only. Paper weights 0.001: 1 + 0.001*0.5 = 1.0005
    assert opid_advantages(ADV, d_ep, None, MASK)[0, 0].item() == pytest.approx(1.0005, abs=1e-12)


def test_opid_zero_weights_is_grpo_exactly():
    adv = grpo_outcome_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), group_size=4)
    mask = torch.ones(4, 3)
    out = opid_advantages(adv, torch.randn(4, 3), torch.randn(4, 3), mask, w_episode=0.0, w_step=0.0)
    assert torch.equal(out, adv.unsqueeze(-1).expand(4, 3))


def test_opid_rejects_nonfinite_gap_on_optimised_token():
    bad = torch.tensor([[NAN, 0.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="finite"):
        opid_advantages(ADV, bad, None, MASK)


# --------------------------------------------------------------------------------------------------------------
# GiGPO


def test_discounted_returns_paper_gamma():
    # rewards [0, 0, 10], gamma 0.95: R_2 = 10, R_1 = 0.95*10 = 9.5, R_0 = 0.95*9.5 = 9.025
    assert discounted_returns([0, 0, 10]) == pytest.approx([9.025, 9.5, 10.0])


def test_anchor_groups_are_per_task_group_and_exact_text():
    labels = anchor_state_groups([["s0", "s1"], ["s0", "s0 "], ["s0"]], ["g", "g", "h"])
    # "s0" in task g -> label 0 (shared by traj 0 and 1); "s1" -> 1; "s0 " is different text -> 2;
    # "s0" in task h is a different group -> 3
    assert labels == [[0, 1], [0, 2], [3]]


GIGPO_OBS = [["s0", "s1"], ["s0", "s2", "s1"], ["s0"]]
GIGPO_REW = [[0.0, 1.0], [0.0, 0.0, 0.0], [1.0]]
GIGPO_GROUPS = [0, 0, 1]


def test_gigpo_official_hand_computed_mean_norm():
    # Hand calculation of verl-agent's compute_gigpo_outcome_advantage, mode "mean_norm" (remove_std=True).
    # A_S (step_norm_reward), gamma = 0.5: traj 0 returns [0.5, 1]; traj 1 [0, 0, 0]; traj 2 [1]
    #   anchor (0, s0): {0.5, 0} mean 0.25 -> A_S = +0.25 (traj 0), -0.25 (traj 1)
    #   anchor (0, s1): {1, 0} mean 0.5 -> +0.5 (traj 0 step 1), -0.5 (traj 1 step 2)
    #   anchor (0, s2) and (1, s0) are singletons -> 0
    steps = gigpo_step_advantages(GIGPO_OBS, GIGPO_REW, GIGPO_GROUPS, gamma=0.5)
    assert [s.tolist() for s in steps] == [[0.25, 0.5], [-0.25, 0.0, -0.5], [0.0]]
    # A_E (episode_norm_reward, compute_mean_std_cross_steps=True): episode scores [1, 0, 1] (sums of the step
    #   rewards); task group 0 has the rows [1, 1, 0, 0, 0] (2 + 3 steps), mean 0.4 -> A_E = 0.6, -0.4; task
    #   group 1 has one row: mean 0, std 1 -> A_E = 1
    episode = gigpo_episode_advantages([1.0, 0.0, 1.0], [2, 3, 1], GIGPO_GROUPS)
    assert episode.tolist() == pytest.approx([0.6, -0.4, 1.0], abs=1e-12)
    # A = A_E + 1 * A_S
    full = gigpo_advantages(GIGPO_OBS, GIGPO_REW, GIGPO_GROUPS, gamma=0.5)
    expected = [[0.85, 1.1], [-0.65, -0.4, -0.9], [1.0]]
    assert [s.tolist() for s in full] == [pytest.approx(e, abs=1e-12) for e in expected]


def test_gigpo_official_hand_computed_mean_std_norm():
    # mode "mean_std_norm": (x - mean) / (unbiased std + 1e-6), std 1 for one-member groups.
    # A_S: (0, s0): {0.5, 0}: std = sqrt(2 * 0.25^2 / 1) = 0.3535534 -> +-0.25/0.3535534 = +-0.7071068
    #      (0, s1): {1, 0}: std = sqrt(2 * 0.5^2) = 0.7071068 -> +-0.5/0.7071068 = +-0.7071068; singletons 0
    steps = gigpo_step_advantages(GIGPO_OBS, GIGPO_REW, GIGPO_GROUPS, gamma=0.5, norm="mean_std", eps=0.0)
    r = 0.7071068
    assert [s.tolist() for s in steps] == [
        pytest.approx([r, r], abs=1e-6),
        pytest.approx([-r, 0.0, -r], abs=1e-6),
        [0.0],
    ]
    # A_E: rows [1, 1, 0, 0, 0]: std = sqrt((2 * 0.6^2 + 3 * 0.4^2) / 4) = sqrt(0.3) = 0.5477226
    #   -> 0.6 / (0.5477226 + 1e-6) = 1.0954431, -0.4 / 0.5477236 = -0.7302954; the one-row group: 1 / (1 + 1e-6)
    episode = gigpo_episode_advantages([1.0, 0.0, 1.0], [2, 3, 1], GIGPO_GROUPS, norm="mean_std")
    assert episode.tolist() == pytest.approx([1.0954431, -0.7302954, 0.999999], abs=1e-6)


def test_gigpo_official_similarity_grouping_compares_with_each_clusters_first_member():
    # verl-agent build_step_group with enable_similarity: difflib ratio 2M / (|a| + |b|) against the cluster's
    # first member ("rep"), first cluster that passes wins. Threshold 0.8:
    #   "abcd" starts cluster 0; "abcd!" vs "abcd": M = 4, 8/9 = 0.889 -> cluster 0;
    #   "abc!" vs "abcd": M = 3, 6/8 = 0.75 -> a new cluster 1, although it is 8/9 similar to the member "abcd!";
    #   "abcd" in task group h starts its own cluster 2.
    labels = anchor_state_groups([["abcd", "abcd!"], ["abc!"], ["abcd"]], ["g", "g", "h"], similarity_threshold=0.8)
    assert labels == [[0, 0], [1], [2]]
    # The exact default keeps all three texts of task group g apart.
    assert anchor_state_groups([["abcd", "abcd!"], ["abc!"], ["abcd"]], ["g", "g", "h"]) == [[0, 1], [2], [3]]
    # Merged states are one anchor group: returns {1, 0} around mean 0.5 (gamma 1: each step's return is its reward)
    steps = gigpo_step_advantages([["abcd"], ["abcd!"]], [[1.0], [0.0]], [0, 0], gamma=1.0, similarity_threshold=0.8)
    assert [s.tolist() for s in steps] == [[0.5], [-0.5]]
    for bad in (0.0, 1.0, 1.5):  # verl-agent asserts 0 < similarity_thresh < 1
        with pytest.raises(ValueError, match="similarity_threshold"):
            anchor_state_groups([["a"]], [0], similarity_threshold=bad)


@PROPS
@given(
    observations=st.lists(st.lists(st.text(alphabet="ab ", max_size=6), min_size=1, max_size=4), min_size=1, max_size=5),
    groups=st.lists(st.integers(0, 1), min_size=5, max_size=5),
    threshold=st.floats(0.05, 0.95),
)
def test_gigpo_similarity_groups_merge_exact_groups_and_stay_within_task_groups(observations, groups, threshold):
    groups = groups[: len(observations)]
    exact = anchor_state_groups(observations, groups)
    similar = anchor_state_groups(observations, groups, similarity_threshold=threshold)
    merged: dict = {}
    for g, exact_labels, similar_labels in zip(groups, exact, similar, strict=True):
        for e, m in zip(exact_labels, similar_labels, strict=True):
            assert merged.setdefault(("exact", e), m) == m  # the same text always lands in the same cluster
            assert merged.setdefault(("task", m), g) == g  # a cluster never spans two task groups


def test_gigpo_no_shared_anchor_gives_zero_step_advantage():
    obs = [["a", "b"], ["a", "c"], ["a"], ["a", "b", "d"]]
    rew = [[0, 1], [0, 0], [0], [0, 0, 1]]
    distinct = [[f"{i}-{t}" for t in range(len(o))] for i, o in enumerate(obs)]
    for steps in gigpo_step_advantages(distinct, rew, [0] * 4, norm="mean_std"):
        assert torch.equal(steps, torch.zeros_like(steps))


@PROPS
@given(
    won=st.lists(st.booleans(), min_size=2, max_size=8),
    length=st.integers(1, 5),
    norm=st.sampled_from(["mean", "mean_std"]),
)
def test_gigpo_episode_term_on_equal_lengths_is_grpo_up_to_the_row_bessel_factor(won, length, norm):
    # With n trajectories of L steps each, verl-agent's row statistics have the trajectory mean, so "mean" is GRPO
    # without the std (TRL's scale "none"). The unbiased std over the n L rows is not the trajectories' one:
    # var_rows = L sum (x - mu)^2 / (n L - 1) = var_traj (n - 1) L / (n L - 1), so "mean_std" is GRPO times
    # sqrt((n L - 1) / ((n - 1) L)) (eps aside): larger than GRPO whenever L > 1.
    n = len(won)
    scores = [float(w) for w in won]
    episode = gigpo_episode_advantages(scores, [length] * n, [0] * n, norm=norm, eps=1e-12)
    grpo = grpo_outcome_advantages(torch.tensor(scores, dtype=F64), n, delta=1e-12, scale=norm == "mean_std")
    factor = math.sqrt((n * length - 1) / ((n - 1) * length)) if norm == "mean_std" else 1.0
    assert episode.tolist() == pytest.approx((grpo * factor).tolist(), abs=1e-6)


@PROPS
@given(
    trajectories=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([0.0, 1.0])), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=6,
    ),
    gamma=st.floats(0, 1),
)
def test_gigpo_mean_norm_centres_every_anchor_group_and_every_task_groups_rows(trajectories, gamma):
    groups = [g for g, _ in trajectories]
    obs = [[o for o, _ in steps] for _, steps in trajectories]
    rew = [[r for _, r in steps] for _, steps in trajectories]
    a_s = gigpo_step_advantages(obs, rew, groups, gamma=gamma)
    by_anchor: dict = {}
    for g, o, values in zip(groups, obs, a_s, strict=True):
        for text, value in zip(o, values.tolist(), strict=True):
            by_anchor.setdefault((g, text), []).append(value)
    assert all(abs(sum(values)) < 1e-9 for values in by_anchor.values())
    a_e = gigpo_episode_advantages([sum(r) for r in rew], [len(r) for r in rew], groups)
    for g in set(groups):
        rows = [float(a_e[i]) for i in range(len(groups)) if groups[i] == g for _ in rew[i]]
        if len(rows) > 1:  # a one-row group has mean 0 by definition and keeps its score
            assert abs(sum(rows)) < 1e-9


def test_gigpo_rejects_bad_inputs():
    with pytest.raises(ValueError, match="norm"):
        gigpo_step_advantages(GIGPO_OBS, GIGPO_REW, GIGPO_GROUPS, norm="std")
    with pytest.raises(ValueError, match="rewards"):
        gigpo_step_advantages([["a", "b"]], [[0.0]], [0])
    with pytest.raises(ValueError, match="norm"):
        gigpo_episode_advantages([1.0], [1], [0], norm="std")
    with pytest.raises(ValueError, match="step counts"):
        gigpo_episode_advantages([1.0, 0.0], [1], [0, 0])


# --------------------------------------------------------------------------------------------------------------
# StepOPSD (approximation)


def test_stepopsd_hand_computed_unclipped():
    # A = 2, two steps of 2 tokens; step gaps mean 0.2 and 0 -> e = [0.2, 0]; beta0 = [1/2, 1/2]
    # w_s = exp(e_s) / (0.5 e^0.2 + 0.5): w0 = 2 e^0.2 / (e^0.2 + 1) = 1.0996680, w1 = 2 / (e^0.2 + 1) = 0.9003320
    # both inside [0.5, 1.5]; sum n w = 2 (w0 + w1) = 4 = N
    delta = torch.tensor([[0.2, 0.2], [0.0, 0.0]], dtype=F64)
    out = stepopsd_advantages(2.0, delta, torch.ones(2, 2))
    e = math.exp(0.2)
    w0, w1 = 2 * e / (e + 1), 2 / (e + 1)
    assert out.tolist() == [pytest.approx([2 * w0] * 2, abs=1e-12), pytest.approx([2 * w1] * 2, abs=1e-12)]


def test_stepopsd_hand_computed_clipped_failure():
    # A = -1: step 0 (2 tokens, gap +1, teacher endorses) -> e0 = -1; step 1 (3 tokens, gap -1) -> e1 = +1
    # beta0 = [2/5, 3/5]; raw w = exp(e) / (0.4 e^-1 + 0.6 e) = [0.2069, 1.5287]
    # bounds [0.5, 1.5]: step 0 clips at 0.5; 2*0.5 + 3*w1 = 5 -> w1 = 4/3 (inside the bound)
    # A_t = -0.5 on step 0 (less blame for the endorsed step), -4/3 on step 1; padding 0
    delta = torch.tensor([[1.0, 1.0, NAN], [-1.0, -1.0, -1.0]], dtype=F64)
    out = stepopsd_advantages(-1.0, delta, MASK)
    assert out.tolist() == [pytest.approx([-0.5, -0.5, 0.0]), pytest.approx([-4 / 3] * 3)]


def test_stepopsd_degenerate_cases_are_grpo():
    mask = torch.ones(3, 2)
    same = torch.full((3, 2), 0.7)
    assert torch.equal(stepopsd_advantages(1.5, same, mask), torch.full((3, 2), 1.5, dtype=F64))
    assert torch.equal(stepopsd_advantages(0.0, torch.randn(3, 2), mask), torch.zeros(3, 2, dtype=F64))
    assert torch.equal(stepopsd_advantages(1.5, torch.randn(3, 2), mask, eps=0.0), torch.full((3, 2), 1.5, dtype=F64))


@PROPS
@given(
    a=st.floats(-5, 5, allow_nan=False).filter(lambda x: abs(x) > 1e-3),
    rows=st.lists(
        st.lists(st.tuples(st.floats(-8, 8, allow_nan=False), st.booleans()), min_size=3, max_size=3),
        min_size=1,
        max_size=5,
    ),
    temp=st.floats(0.1, 5),
    eps=st.floats(0, 0.9),
)
def test_stepopsd_keeps_sign_bounds_and_token_weighted_mean(a, rows, temp, eps):
    delta = torch.tensor([[g for g, _ in r] for r in rows], dtype=F64)
    mask = torch.tensor([[m for _, m in r] for r in rows])
    out = stepopsd_advantages(a, delta, mask, temperature=temp, eps=eps)
    live = out[mask]
    assert bool((out[~mask] == 0).all())
    if live.numel():
        assert bool((torch.sign(live) == math.copysign(1, a)).all())
        w = live / a
        assert bool((w >= 1 - eps - 1e-9).all()) and bool((w <= 1 + eps + 1e-9).all())
        assert float(live.mean()) == pytest.approx(a, rel=1e-9, abs=1e-9)


# --------------------------------------------------------------------------------------------------------------
# losses: sampled-token reverse KL (OPSD / OPD)


def test_sampled_reverse_kl_hand_computed_value_and_gradient():
    s = student_leaf()
    loss = sampled_reverse_kl(s, teacher(), MASK)
    # k1 = s - t: row 0: -1 + 1.5 = 0.5, -2 + 2 = 0, padding 0; row 1: 0, -1 + 2 = 1, -1 + 0.25 = -0.75
    k1 = [[0.5, 0.0, 0.0], [0.0, 1.0, -0.75]]
    assert loss.tolist() == k1
    loss.sum().backward()
    # gradient = sg(k1): positive where the teacher likes the token less (descent lowers log pi), negative where more
    assert s.grad.tolist() == k1


def test_sampled_reverse_kl_gradient_matches_trl_sdpo():
    # TRL sdpo sampled_token: per_token = (student - teacher).detach() * student (written out here, not imported)
    s1, s2 = student_leaf(), student_leaf()
    t = torch.tensor([[-1.5, -2.0, 0.0], [-0.5, -2.0, -0.25]], dtype=F64)
    (sampled_reverse_kl(s1, t, MASK).sum()).backward()
    (((s2 - t).detach() * s2) * MASK).sum().backward()
    assert torch.allclose(s1.grad, s2.grad)


def test_reverse_kl_estimator_is_unbiased_for_exact_kl_gradient():
    # Enumerate a 3-token vocabulary: sum_y p(y) * loss(y) must have the gradient of KL(p || q) w.r.t. the logits.
    logits = torch.tensor([0.3, -0.2, 1.0], dtype=F64, requires_grad=True)
    log_q = torch.log_softmax(torch.tensor([1.0, 0.0, -1.0], dtype=F64), dim=0)
    log_p = torch.log_softmax(logits, dim=0)
    per_y = sampled_reverse_kl(log_p.unsqueeze(0), log_q.unsqueeze(0), torch.ones(1, 3))[0]
    (grad_est,) = torch.autograd.grad((log_p.exp().detach() * per_y).sum(), logits, retain_graph=True)
    exact = (log_p.exp() * (log_p - log_q)).sum()
    (grad_exact,) = torch.autograd.grad(exact, logits)
    assert torch.allclose(grad_est, grad_exact, atol=1e-12)


def test_divergences_vanish_when_teacher_equals_student():
    s = student_leaf()
    same = torch.tensor(STUDENT, dtype=F64)
    total = sampled_reverse_kl(s, same, MASK).sum() + skill_sd_loss(s, same, same - 0.3, MASK).sum()
    assert total.item() == 0.0
    total.backward()
    assert torch.equal(s.grad, torch.zeros_like(s))
    # SDAR's term is no divergence: at Delta = 0 its value is 0 but the half-open gate still pulls the sampled
    # token up, gradient -coef * sigma(0) = -0.01 / 2 on every masked token (official compute_sdar_loss).
    s = student_leaf()
    loss = sdar_loss(s, same, MASK, coef=0.01)
    assert loss.abs().sum().item() == 0.0
    loss.sum().backward()
    assert s.grad.tolist() == [[-0.005, -0.005, 0.0], [-0.005, -0.005, -0.005]]


# --------------------------------------------------------------------------------------------------------------
# SDAR


def test_sdar_gate_halves_at_zero_gap():
    gate = sdar_gate(torch.tensor([0.0, 1.0, -1.0]), beta=5.0)
    assert gate[0].item() == 0.5
    assert gate.tolist() == pytest.approx([0.5, sigmoid(5.0), sigmoid(-5.0)])


def test_sdar_official_fixture_formula_gradient_and_teacher_detachment():
    # Align-OPSD tests/test_sdar_auxiliary.py::test_formula_gradient_and_teacher_detachment, on our per-token form
    # (the official token-mean is the masked sum over the 2 kept tokens / 2). Its inputs, numbers by hand:
    #   Delta = t - s = [1, -1, (2: masked)]; gate sigma(5 Delta) = [sigma(5), sigma(-5)] = [0.9933071, 0.0066929]
    #   loss = (0.9933071 * 1 + 0.0066929 * -1) / 2 = 0.4933071 (coef 1)
    #   (0.01 * loss).backward() -> student.grad = -0.01 * gate * mask / 2 = [-0.0049665, -0.0000335, 0]
    #   teacher.grad is None (the teacher is detached)
    student = torch.tensor([[-2.0, -1.0, -3.0]], requires_grad=True)
    teacher_lp = torch.tensor([[-1.0, -2.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    token_mean = sdar_loss(student, teacher_lp, mask, coef=1.0, beta=5.0).sum() / 2
    assert token_mean.item() == pytest.approx((sigmoid(5.0) - sigmoid(-5.0)) / 2, abs=1e-7)
    assert token_mean.item() == pytest.approx(0.4933071, abs=1e-7)
    (token_mean * 0.01).backward()
    assert student.grad.tolist() == [pytest.approx([-0.0049665357, -0.0000334643, 0.0], abs=1e-9)]
    assert teacher_lp.grad is None


def test_sdar_official_hand_computed_value_and_advantage():
    s = student_leaf()
    loss = sdar_loss(s, teacher(), MASK, coef=0.01, beta=5.0)
    # Hand calculation of the official compute_sdar_loss per token, coef * gate * (t - s):
    # Delta = t - s: row 0: -0.5, 0, (padding); row 1: 0, -1, +0.75
    # gate sigma(5 Delta): sigma(-2.5) = 0.0758582, 1/2, 1/2, sigma(-5) = 0.0066929, sigma(3.75) = 0.9770226
    expected = [
        [0.01 * sigmoid(-2.5) * -0.5, 0.0, 0.0],
        [0.0, 0.01 * sigmoid(-5.0) * -1.0, 0.01 * sigmoid(3.75) * 0.75],
    ]
    assert loss.tolist() == [pytest.approx(r, abs=1e-15) for r in expected]
    assert loss[1, 2].item() == pytest.approx(7.3276695e-3, abs=1e-9)
    loss.sum().backward()
    # d loss / d log pi = -coef * gate: every kept token is RAISED, the endorsed one (Delta = +0.75, gate open)
    # with 0.0097702, the rejected one (Delta = -1) with 0.0000669 only; padding 0.
    gate = [[sigmoid(-2.5), 0.5, 0.0], [0.5, sigmoid(-5.0), sigmoid(3.75)]]
    assert s.grad.tolist() == [pytest.approx([-0.01 * g for g in r], abs=1e-15) for r in gate]
    # The trainer's advantage form is the negated gradient, +coef * gate: the sigma(beta Delta), never < 0.
    adv = gradient_equivalent_advantages(sdar_loss, torch.tensor(STUDENT, dtype=F64), teacher(), MASK, coef=0.01)
    assert adv.tolist() == [pytest.approx([0.01 * g for g in r], abs=1e-15) for r in gate]


def test_sdar_beta_zero_is_sdars_grpo_opsd_constant_half_weight():
    # SDAR's GRPO+OPSD launchers run this term with gate_beta=0.0: sigma(0) = 1/2 whatever the teacher says, so
    # the advantage is coef / 2 on every kept token.
    student = torch.tensor(STUDENT, dtype=F64)
    adv = gradient_equivalent_advantages(sdar_loss, student, teacher(), MASK, coef=0.01, beta=0.0)
    assert adv.tolist() == [[0.005, 0.005, 0.0], [0.005, 0.005, 0.005]]


@PROPS
@given(
    rows=st.lists(
        st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0), st.booleans()), min_size=3, max_size=3),
        min_size=1,
        max_size=4,
    ),
    coef=st.floats(0, 1),
    beta=st.floats(0, 20),
)
def test_sdar_advantage_is_coef_times_the_gate_never_negative_and_rises_with_the_gap(rows, coef, beta):
    student = torch.tensor([[a for a, _, _ in r] for r in rows], dtype=F64)
    teacher_lp = torch.tensor([[b for _, b, _ in r] for r in rows], dtype=F64)
    mask = torch.tensor([[m for _, _, m in r] for r in rows])
    adv = gradient_equivalent_advantages(sdar_loss, student, teacher_lp, mask, coef=coef, beta=beta)
    gap = teacher_lp - student
    want = torch.where(mask, coef * torch.sigmoid(beta * gap), torch.zeros_like(gap))
    assert torch.allclose(adv, want, rtol=0, atol=1e-12)
    assert bool((adv >= 0).all()) and bool((adv <= coef).all())
    # A larger teacher-student gap never gets a smaller advantage (the gate is monotone).
    order = gap[mask].argsort()
    assert bool((adv[mask][order].diff() >= -1e-12).all())


# --------------------------------------------------------------------------------------------------------------
# Skill-SD


def test_skill_sd_hand_computed_value_and_gradient():
    s = student_leaf()
    old = torch.tensor([[-1.5, -2.0, 5.0], [-2.0, 0.0, -1.0]], dtype=F64)
    loss = skill_sd_loss(s, teacher(), old, MASK, coef=0.1, is_clip=2.0)
    # rho = min(exp(s - old), 2): row 0: e^0.5 = 1.6487213, e^0 = 1, (padding); row 1: e^1.5 = 4.48 -> 2,
    # e^-1 = 0.3678794, e^0 = 1
    # loss = 0.1 * rho * k1 with k1 = [[0.5, 0, 0], [0, 1, -0.75]]:
    #   0.1*1.6487213*0.5 = 0.0824361; 0; 0; 0.1*2*0 = 0; 0.1*0.3678794*1 = 0.0367879; 0.1*1*(-0.75) = -0.075
    expected = [[0.0824361, 0.0, 0.0], [0.0, 0.0367879, -0.075]]
    assert loss.tolist() == [pytest.approx(r, abs=1e-7) for r in expected]
    loss.sum().backward()
    # gradient = 0.1 * rho * k1 (rho detached), the same numbers
    assert s.grad.tolist() == [pytest.approx(r, abs=1e-7) for r in expected]


def test_importance_weights_clip_and_detach():
    s = torch.tensor([0.0, 0.0, 0.0], requires_grad=True)
    old = torch.tensor([-10.0, 0.5, 0.0])
    w = importance_weights(s, old, clip=2.0)
    # exp(10) -> 2; exp(-0.5) = 0.6065307 (no lower clip); exp(0) = 1
    assert w.tolist() == pytest.approx([2.0, 0.6065307, 1.0])
    assert not w.requires_grad
    assert importance_weights(s, old, clip=None)[0].item() == pytest.approx(math.exp(10.0))


def test_losses_are_zero_outside_mask_even_with_nan_teacher():
    s = student_leaf()
    total = sampled_reverse_kl(s, teacher(), MASK) + sdar_loss(s, teacher(), MASK)
    assert total[0, 2].item() == 0.0
    total.sum().backward()
    assert bool(torch.isfinite(s.grad).all()) and s.grad[0, 2].item() == 0.0


# --------------------------------------------------------------------------------------------------------------
# registry


def test_registry_holds_the_comparison_methods_and_each_is_reachable_from_a_config(tmp_path):
    # A registered name that no BaselineConfig selects would be a method users cannot run.
    from taspo_trl.trainers import BaselineConfig, method_classes, method_names

    comparison = ("skill_grpo", "opsd", "grpo_opsd", "sdar", "skill_sd", "opd", "rlsd", "opid", "gigpo", "stepopsd")
    assert set(comparison) <= set(CREDIT_METHODS)
    assert set(method_names()) == {"grpo", "taspo", "alignopsd", *CREDIT_METHODS}  # what `method:` takes
    assert all(method_classes(name)[0] is BaselineConfig for name in comparison)
    for name, method in CREDIT_METHODS.items():
        if method.trainer is not None:  # a trainer of its own: BaselineConfig refuses it, naming that trainer
            with pytest.raises(ValueError, match=f"use {method.config.__name__} and {method.trainer.__name__}"):
                BaselineConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", baseline=name)
            assert method_classes(name) == (method.config, method.trainer)
            continue
        teacher = {"teacher_model_name_or_path": "x"} if method.teacher == "external" else {}
        config = BaselineConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", baseline=name, **teacher)
        assert config.credit_method is method
    # What the trainer prepares before calling each built-in (the papers' setups, README "Comparison methods").
    assert {n for n in comparison if CREDIT_METHODS[n].teacher is None} == {"skill_grpo", "gigpo"}
    assert {n for n in comparison if CREDIT_METHODS[n].teacher == "external"} == {"opd"}
    assert {n for n in comparison if not CREDIT_METHODS[n].outcome} == {"opsd", "opd"}
    assert {n for n in comparison if CREDIT_METHODS[n].step_skills} == {"opid"}
    assert get_credit(" RLSD ") is CREDIT_METHODS["rlsd"]


@PROPS
@given(name=st.text(min_size=0, max_size=12))
def test_registry_unknown_name_lists_known(name):
    if name.strip().lower() in CREDIT_METHODS:
        return
    with pytest.raises(ValueError, match="known: alignopsd, gigpo, grpo, grpo_opsd, opd, opid, opsd, rlsd, sdar, skill_grpo, skill_sd, stepopsd, taspo"):
        get_credit(name)


def test_register_credit_keeps_a_taken_name():
    def mine(batch, args, step):
        return []

    try:
        assert register_credit("Mine_Test", teacher="self")(mine) is mine  # as a decorator, stored lower-case
        assert register_credit("mine_test", mine, teacher="self") is mine  # the same function again: a no-op
        assert get_credit("MINE_TEST").fn is mine and get_credit("mine_test").title == "mine_test"
        with pytest.raises(ValueError, match="'rlsd' is already registered"):
            register_credit("rlsd", mine)
        with pytest.raises(ValueError, match="teacher must be one of"):
            register_credit("mine_other", mine, teacher="ema")
    finally:
        CREDIT_METHODS.pop("mine_test", None)
    assert "mine_other" not in CREDIT_METHODS


# --------------------------------------------------------------------------------------------------------------
# the periodically synchronised self-teacher (Skill-SD)


def test_teacher_version_by_hand():
    # Every 3 steps: the copy taken at 0 serves steps 0-2, the one taken at 3 serves 3-5, and so on.
    assert [teacher_version(s, 3) for s in range(8)] == [0, 0, 0, 3, 3, 3, 6, 6]
    assert [teacher_version(s, 1) for s in range(4)] == [0, 1, 2, 3]  # every step: the rollout snapshot
    assert [teacher_version(s, 0) for s in range(4)] == [0, 0, 0, 0]  # never refreshed: the initial policy
    with pytest.raises(ValueError, match="sync_steps"):
        teacher_version(4, -1)
    with pytest.raises(ValueError, match="step"):
        teacher_version(-1, 2)


@PROPS
@given(st.integers(0, 10_000), st.integers(1, 500))
def test_teacher_version_is_the_last_refresh_at_or_before_the_step(step, period):
    version = teacher_version(step, period)
    assert version % period == 0 and version <= step < version + period
    assert teacher_version(version, period) == version  # a refresh step holds its own policy


def test_gigpo_groups_tensor_group_ids_by_value():
    """Group ids given as a tensor group by their values, as a list does (a tensor's elements hash by identity).
    Scores [1, 0, 1, 0] in groups [0, 0, 1, 1], one step each, norm "mean": each group's mean is 0.5, so
    A_E = [0.5, -0.5, 0.5, -0.5]; two steps in one task group with the same text share an anchor label."""
    ids = torch.tensor([0, 0, 1, 1])
    episode = gigpo_episode_advantages([1.0, 0.0, 1.0, 0.0], [1, 1, 1, 1], ids)
    assert episode.tolist() == [0.5, -0.5, 0.5, -0.5]
    assert anchor_state_groups([["room"], ["room"]], torch.tensor([3, 3])) == [[0], [0]]


# --------------------------------------------------------------------------------------------------------------
# Tests written against the mutants of ``taspo_trl.credit.baselines`` that survived the tests above
# (benchmarks/mutation.sh; the score and the equivalent survivors are in benchmarks/results/mutation.md).
#
# They pin down what a caller relies on: the documented defaults (each test says where its default comes from), the
# closed ends of the documented ranges, the floating dtype of the output, which tokens a statistic is taken over, that
# every option reaches the function that uses it, and the full text of each error message. Every expected value is
# worked out by hand in the test's docstring or comments.


SQRT2 = math.sqrt(2.0)
SQRT3 = math.sqrt(3.0)


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern that matches ``message`` and nothing longer or shorter."""
    return f"^{re.escape(message)}$"


# --------------------------------------------------------------------------------------------------------------
# shared argument checks (every token-level method): the messages name the argument and both shapes


@pytest.mark.parametrize(
    "advantages,mask,message",
    [
        (torch.zeros(3), torch.ones(3), "mask must be [rows, T], got shape (3,)"),
        (torch.zeros(2, 2), torch.ones(2, 3), "advantages (2, 2) do not match mask (2, 3)"),
    ],
)
def test_token_methods_refuse_a_bad_mask_or_advantage_shape_by_name(
    advantages: torch.Tensor, mask: torch.Tensor, message: str
) -> None:
    """A mask that is not [rows, T], or a [rows, T] A of another shape, is refused with both shapes in the message."""
    with pytest.raises(ValueError, match=exactly(message)):
        rlsd_advantages(advantages, torch.zeros(mask.shape), mask, lam=0.5)
    with pytest.raises(ValueError, match=exactly(message)):
        opid_advantages(advantages, torch.zeros(mask.shape), None, mask)


def test_integer_advantages_are_promoted_to_float32_before_the_gap_is_added() -> None:
    """Integer A (e.g. raw 0/1 rewards) becomes float32, so a fractional gap is not truncated to an int.

    OPID with w_e = 1, A = [2, -1] per row, Delta_episode = 0.5 on every token:
    A' = 2 + 1 * 0.5 = 2.5 and -1 + 0.5 = -0.5 (exact in float32)."""
    mask = torch.ones(2, 2)
    out = opid_advantages(torch.tensor([2, -1]), torch.full((2, 2), 0.5), None, mask, w_episode=1.0)
    assert out.dtype == torch.float32
    assert out.tolist() == [[2.5, 2.5], [-0.5, -0.5]]


# --------------------------------------------------------------------------------------------------------------
# RLSD


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"step": -1}, "step must be >= 0, got -1"),
        ({"step": 0, "lam0": 1.5}, "lam0 must be in [0, 1], got 1.5"),
        ({"step": 0, "decay_steps": 0}, "decay_steps must be > 0, got 0"),
    ],
)
def test_rlsd_lambda_refuses_out_of_range_arguments_by_name(kwargs: dict, message: str) -> None:
    """step < 0, lam0 outside [0, 1] and decay_steps <= 0 (0 would divide by zero) are refused by name."""
    with pytest.raises(ValueError, match=exactly(message)):
        rlsd_lambda(**kwargs)


def test_rlsd_lambda_accepts_lam0_one() -> None:
    """lam0 = 1 is the closed upper end of [0, 1]: lam = 1 * max(0, 1 - (0 + 1) / 4) = 0.75 at the first update."""
    assert rlsd_lambda(0, lam0=1.0, decay_steps=4) == 0.75


@pytest.mark.parametrize(
    "lam,clip_eps,message",
    [
        (1.5, 0.2, "lam must be in [0, 1], got 1.5"),
        (0.5, 1.0, "clip_eps must be in [0, 1), got 1.0"),
    ],
)
def test_rlsd_refuses_lam_outside_closed_unit_interval_and_clip_eps_one(
    lam: float, clip_eps: float, message: str
) -> None:
    """lam must lie in [0, 1]; clip_eps in [0, 1) (eps = 1 would let the factor reach 0 and erase A)."""
    mask = torch.ones(1, 2)
    with pytest.raises(ValueError, match=exactly(message)):
        rlsd_advantages(torch.ones(1), torch.zeros(1, 2), mask, lam=lam, clip_eps=clip_eps)


def test_rlsd_lam_one_uses_only_the_clipped_teacher_ratio() -> None:
    """lam = 1 (the first update's lam with lam0 = 1) is allowed: A_hat = A clip(exp(sign(A) Delta), 0.8, 1.2).

    Default clip_eps 0.2 (the docstring's paper value). A = 1 (sign +1), Delta = [0.1, -1]:
    t0: exp(0.1) = 1.1051709 inside [0.8, 1.2] -> 1.1051709; t1: exp(-1) = 0.3679 -> clipped to 0.8."""
    out = rlsd_advantages(torch.ones(1, dtype=F64), torch.tensor([[0.1, -1.0]], dtype=F64), torch.ones(1, 2), lam=1.0)
    assert out.tolist() == [pytest.approx([1.1051709180756477, 0.8], abs=1e-12)]


def test_rlsd_output_keeps_the_advantages_float32_dtype_with_a_float64_gap() -> None:
    """The module's convention: outputs are in the floating dtype of ``advantages``, whatever the gap's dtype.

    A = 1 (float32), Delta = 0, lam = 0.5: factor 0.5 + 0.5 * exp(0) = 1, so A_hat = 1 on both tokens."""
    out = rlsd_advantages(torch.ones(1), torch.zeros(1, 2, dtype=F64), torch.ones(1, 2), lam=0.5)
    assert out.dtype == torch.float32
    assert out.tolist() == [[1.0, 1.0]]


@pytest.mark.parametrize(
    "delta,message",
    [
        (torch.zeros(2, 2), "delta (2, 2) does not match mask (2, 3)"),
        (torch.tensor([[0.0, NAN, 0.0], [0.0, 0.0, 0.0]]), "delta must be finite on masked (optimised) tokens"),
    ],
)
def test_rlsd_and_stepopsd_name_a_bad_delta(delta: torch.Tensor, message: str) -> None:
    """A gap of the wrong shape, or NaN on an optimised token, is refused naming ``delta`` (and both shapes)."""
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match=exactly(message)):
        rlsd_advantages(torch.ones(2), delta, mask, lam=0.5)
    with pytest.raises(ValueError, match=exactly(message)):
        stepopsd_advantages(1.0, delta, mask)


# --------------------------------------------------------------------------------------------------------------
# OPID


def test_opid_default_weights_are_the_papers_0_001() -> None:
    """Default w_episode = w_step = 0.001 (the docstring's ALFWorld weights).

    A = 1, Delta_episode = 2, Delta_step = 3 on both tokens: A' = 1 + 0.001 * 2 + 0.001 * 3 = 1.005."""
    episode, step = torch.full((1, 2), 2.0, dtype=F64), torch.full((1, 2), 3.0, dtype=F64)
    out = opid_advantages(torch.ones(1, dtype=F64), episode, step, torch.ones(1, 2))
    assert out.tolist() == [pytest.approx([1.005, 1.005], abs=1e-12)]


def test_opid_output_keeps_the_advantages_float32_dtype_with_float64_gaps() -> None:
    """Both gap terms are cast to the advantages' dtype, so float64 gaps leave a float32 output.

    A = 1, w_e = w_s = 0.5, Delta_episode = 1, Delta_step = 2: A' = 1 + 0.5 + 1 = 2.5 (exact in float32)."""
    out = opid_advantages(
        torch.ones(1),
        torch.ones(1, 2, dtype=F64),
        torch.full((1, 2), 2.0, dtype=F64),
        torch.ones(1, 2),
        w_episode=0.5,
        w_step=0.5,
    )
    assert out.dtype == torch.float32
    assert out.tolist() == [[2.5, 2.5]]


@pytest.mark.parametrize("bad", ["delta_episode", "delta_step"])
@pytest.mark.parametrize(
    "kind,message",
    [
        ("shape", "{name} (2, 2) does not match mask (2, 3)"),
        ("nan", "{name} must be finite on masked (optimised) tokens"),
    ],
)
def test_opid_names_which_gap_is_bad(bad: str, kind: str, message: str) -> None:
    """A wrong-shaped or non-finite gap is refused naming the argument it came in (episode or step gap)."""
    mask = torch.ones(2, 3)
    gaps = {"delta_episode": torch.zeros(2, 3), "delta_step": torch.zeros(2, 3)}
    gaps[bad] = torch.zeros(2, 2) if kind == "shape" else torch.tensor([[0.0, 0.0, 0.0], [NAN, 0.0, 0.0]])
    with pytest.raises(ValueError, match=exactly(message.format(name=bad))):
        opid_advantages(torch.ones(2), gaps["delta_episode"], gaps["delta_step"], mask)


# --------------------------------------------------------------------------------------------------------------
# GiGPO


def test_discounted_returns_refuses_gamma_above_one_by_name() -> None:
    """gamma must lie in [0, 1]; 1.5 is refused with the accepted range in the message."""
    with pytest.raises(ValueError, match=exactly("gamma must be in [0, 1], got 1.5")):
        discounted_returns([1.0], gamma=1.5)


def test_gigpo_length_mismatches_are_refused_with_both_counts() -> None:
    """Two trajectories with one group id, or two observation lists with one reward list, are refused."""
    with pytest.raises(ValueError, match=exactly("2 trajectories but 1 group ids")):
        anchor_state_groups([["a"], ["b"]], [0])
    with pytest.raises(ValueError, match=exactly("2 observation lists but 1 reward lists")):
        gigpo_step_advantages([["a"], ["b"]], [[0.0]], [0, 0])


def test_similarity_grouping_merges_at_exactly_the_threshold() -> None:
    """The docstring's rule is ratio >= threshold: "ab" and "ac" share 1 of 4 characters, ratio 2 * 1 / 4 = 0.5,
    so at threshold 0.5 they are one anchor state; in another task group they are not."""
    assert anchor_state_groups([["ab"], ["ac"]], [0, 0], similarity_threshold=0.5) == [[0], [0]]
    assert anchor_state_groups([["ab"], ["ac"]], [0, 1], similarity_threshold=0.5) == [[0], [1]]


# Two trajectories of one task group that visit the same two states; only trajectory 0 is rewarded at the end.
# Returns (gamma 0.95): trajectory 0 R = [0 + 0.95 * 1, 1] = [0.95, 1], trajectory 1 R = [0, 0].
# Anchor groups: s0 = {0.95, 0} (mean 0.475, unbiased std 0.95 / sqrt 2), s1 = {1, 0} (mean 0.5, std 1 / sqrt 2).
# Episode rows: scores [1, 1, 0, 0] (one per step), mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 1 / sqrt 3.
GIGPO_PAIR_OBS = [["s0", "s1"], ["s0", "s1"]]
GIGPO_PAIR_REW = [[0.0, 1.0], [0.0, 0.0]]


def test_gigpo_defaults_are_verl_agents_mean_norm_with_gamma_0_95() -> None:
    """Defaults omega = 1, gamma = 0.95, norm = "mean" (verl-agent's GiGPO launchers and config, per docstrings).

    A_E = score - 0.5 = +-0.5; A_S = R - mean_G: s0 +-0.475, s1 +-0.5. A = A_E + A_S:
    trajectory 0 [0.975, 1.0], trajectory 1 [-0.975, -1.0]."""
    out = gigpo_advantages(GIGPO_PAIR_OBS, GIGPO_PAIR_REW, [0, 0])
    assert out[0].tolist() == pytest.approx([0.975, 1.0], abs=1e-12)
    assert out[1].tolist() == pytest.approx([-0.975, -1.0], abs=1e-12)


@pytest.mark.parametrize("kwargs,eps", [({}, 1e-6), ({"eps": 0.5}, 0.5)])
def test_gigpo_mean_std_norm_and_eps_reach_both_terms(kwargs: dict, eps: float) -> None:
    """norm="mean_std" divides both A_E and A_S by std + eps, with eps defaulting to verl-agent's 1e-6.

    A_E = +-0.5 / (1/sqrt 3 + eps); A_S at s0 = +-0.475 / (0.95/sqrt 2 + eps), at s1 = +-0.5 / (1/sqrt 2 + eps)
    (with eps -> 0 these are +-sqrt 3 / 2 and +-1 / sqrt 2), and A = A_E + A_S (omega 1)."""
    a_e = 0.5 / (1 / SQRT3 + eps)
    a_s = [0.475 / (0.95 / SQRT2 + eps), 0.5 / (1 / SQRT2 + eps)]
    out = gigpo_advantages(GIGPO_PAIR_OBS, GIGPO_PAIR_REW, [0, 0], norm="mean_std", **kwargs)
    assert out[0].tolist() == pytest.approx([a_e + a_s[0], a_e + a_s[1]], abs=1e-12)
    assert out[1].tolist() == pytest.approx([-a_e - a_s[0], -a_e - a_s[1]], abs=1e-12)


def test_gigpo_step_advantages_mean_std_default_eps_is_1e_minus_6() -> None:
    """gigpo_step_advantages' own eps default (verl-agent's epsilon 1e-6) under norm="mean_std":
    A_S at s0 = +-0.475 / (0.95/sqrt 2 + 1e-6), at s1 = +-0.5 / (1/sqrt 2 + 1e-6)."""
    a_s = [0.475 / (0.95 / SQRT2 + 1e-6), 0.5 / (1 / SQRT2 + 1e-6)]
    out = gigpo_step_advantages(GIGPO_PAIR_OBS, GIGPO_PAIR_REW, [0, 0], norm="mean_std")
    assert [t.tolist() for t in out] == [pytest.approx(a_s, abs=1e-12), pytest.approx([-a_s[0], -a_s[1]], abs=1e-12)]


def test_gigpo_similarity_threshold_reaches_the_step_term() -> None:
    """With similarity_threshold = 0.5, "ab" and "ac" (ratio 0.5) are one anchor state, so the step term is live.

    One step each, rewards 1 and 0: A_E = +-0.5 (rows [1, 0], mean 0.5), A_S = +-0.5 (anchor group {1, 0}),
    A = +-1. Exact matching would keep the states apart (A_S = 0, A = +-0.5)."""
    out = gigpo_advantages([["ab"], ["ac"]], [[1.0], [0.0]], [0, 0], similarity_threshold=0.5)
    assert [t.tolist() for t in out] == [[1.0], [-1.0]]


# --------------------------------------------------------------------------------------------------------------
# StepOPSD


def test_stepopsd_refuses_a_non_finite_advantage_by_name() -> None:
    """A NaN trajectory advantage is refused with its value in the message."""
    with pytest.raises(ValueError, match=exactly("advantage must be finite, got nan")):
        stepopsd_advantages(NAN, torch.zeros(1, 2), torch.ones(1, 2))


def test_stepopsd_of_no_steps_is_an_empty_float64_tensor() -> None:
    """A trajectory with no step rows gives [0, T] float64 advantages (the documented dtype), even for a float32 gap."""
    out = stepopsd_advantages(1.0, torch.zeros(0, 3), torch.zeros(0, 3))
    assert out.dtype == F64
    assert out.shape == (0, 3)


def test_stepopsd_refuses_a_one_dimensional_step_layout() -> None:
    """delta and mask must be [S, T] (one row per step): a single 1-D row is refused with a ValueError, raised by
    the allocation (``credit/stepopsd.py``) because the step rows it would be split into are 0-D."""
    with pytest.raises(ValueError, match="must be 1-D"):
        stepopsd_advantages(1.0, torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))


def test_stepopsd_step_evidence_is_the_mean_over_masked_tokens_only() -> None:
    """Padding (here NaN, zeroed) does not dilute a step's mean gap.

    A = 2; step 0 has 2 masked tokens with gap ln 2 and one padding token, step 1 three tokens with gap 0.
    e = [ln 2, 0], n = [2, 3], N = 5, temperature 1, eps 0.5 (defaults). w_s = N exp(e_s) / sum_u n_u exp(e_u):
    denominator 2 * 2 + 3 * 1 = 7, so w = [10/7, 5/7] = [1.4286, 0.7143], inside [0.5, 1.5], no clipping.
    A_t = 2 w: step 0 [20/7, 20/7, 0], step 1 [10/7] * 3 (token-weighted mean (40 + 30) / 7 / 5 = 2 = A)."""
    ln2 = math.log(2.0)
    delta = torch.tensor([[ln2, ln2, NAN], [0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = stepopsd_advantages(2.0, delta, mask)
    assert out.tolist() == [pytest.approx([20 / 7, 20 / 7, 0.0], abs=1e-12), pytest.approx([10 / 7] * 3, abs=1e-12)]


@pytest.mark.parametrize(
    "temperature,expected",
    [
        # e = [1, -1], n = [1, 1]: w_s = 2 exp(e_s / 2) / (exp(1/2) + exp(-1/2)) = 2 sigmoid(+-1) = 1.4621, 0.5379
        # (inside [0.5, 1.5]); at the default temperature 1 they would be 2 sigmoid(+-2) = 1.76, 0.24, clipped.
        (2.0, [2 / (1 + math.exp(-1.0)), 2 / (1 + math.exp(1.0))]),
        (math.inf, [1.0, 1.0]),  # the docstring: inf is the uniform budget, i.e. GRPO
    ],
)
def test_stepopsd_temperature_sets_the_budget(temperature: float, expected: list[float]) -> None:
    """The temperature reaches the Gibbs budget b_s ~ n_s exp(e_s / temp). A = 1, one token per step, gaps +-1."""
    out = stepopsd_advantages(1.0, torch.tensor([[1.0], [-1.0]], dtype=F64), torch.ones(2, 1), temperature=temperature)
    assert out[:, 0].tolist() == pytest.approx(expected, abs=1e-12)


# --------------------------------------------------------------------------------------------------------------
# Behaviour of ``taspo_trl.credit.distillation`` that its unit tests above left open (found with
# ``benchmarks/mutation.sh``; the equivalent survivors are in
# ``benchmarks/results/mutation.md``): the defaults the papers' launchers fix, the shape and
# ``clip`` errors a user sees, the [-20, 20] clamp of the importance log-ratio, the dtype of the losses when the
# teacher's log-probs come in another precision, and a loss term that does not depend on the student.
#
# Every expected number is worked out by hand in the test's docstring or comment.


LN4 = math.log(4.0)

# --------------------------------------------------------------------------------------------------------------
# input checks shared by the losses


@pytest.mark.parametrize("loss_fn", [sampled_reverse_kl, sdar_loss])
def test_losses_reject_mismatched_shapes_and_name_each_shape(loss_fn: Callable[..., torch.Tensor]) -> None:
    """A teacher row shorter than the student's is refused, and the message lists the three shapes in order."""
    message = "student_logp, teacher_logp and mask must share one [rows, T] shape, got (2, 3), (2, 2), (2, 3)"
    with pytest.raises(ValueError, match=re.escape(message)):
        loss_fn(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))


@pytest.mark.parametrize("shape", [(1, 2, 3), (3,)])
def test_losses_reject_equal_shapes_that_are_not_rows_by_tokens(shape: tuple[int, ...]) -> None:
    """Equal shapes are not enough: the inputs must be 2-D [rows, T] (a 3-D or 1-D batch is refused)."""
    got = ", ".join([str(shape)] * 3)
    message = f"student_logp, teacher_logp and mask must share one [rows, T] shape, got {got}"
    with pytest.raises(ValueError, match=re.escape(message)):
        sampled_reverse_kl(torch.zeros(shape), torch.zeros(shape), torch.ones(shape))


def test_losses_keep_the_students_dtype_when_the_teacher_is_in_another_precision() -> None:
    """A bf16 student with float32 teacher log-probs gets a bf16 loss (the teacher is cast to the student's dtype).

    sampled_reverse_kl: k1 = s - t = [-1 + 1.5, -2 + 2] = [0.5, 0] (exact in bf16).
    sdar_loss (coef 1, beta 0, gate 1/2): 1/2 * (t - s) = [-0.25, 0].
    """
    student = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    teacher = torch.tensor([[-1.5, -2.0]], dtype=torch.float32)
    mask = torch.ones(1, 2)
    kl = sampled_reverse_kl(student, teacher, mask)
    sdar = sdar_loss(student, teacher, mask, coef=1.0, beta=0.0)
    assert kl.dtype == torch.bfloat16 and kl.tolist() == [[0.5, 0.0]]
    assert sdar.dtype == torch.bfloat16 and sdar.tolist() == [[-0.25, 0.0]]


# --------------------------------------------------------------------------------------------------------------
# SDAR defaults (the launchers' algorithm.sdar.gate_beta = 5 and sdar_coef = 0.01, see sdar_loss's docstring)


def test_sdar_gate_default_sharpness_is_five() -> None:
    """sdar_gate's default beta is SDAR's launcher value 5.

    Delta = 0.2: sigma(5 * 0.2) = sigma(1) = 1 / (1 + e^-1) = 1 / 1.3678794 = 0.7310586;
    Delta = -0.4: sigma(-2) = 1 / (1 + e^2) = 1 / 8.3890561 = 0.1192029.
    """
    gate = sdar_gate(torch.tensor([0.2, -0.4], dtype=F64))
    assert gate.tolist() == pytest.approx([0.7310585786, 0.1192029220], abs=1e-10)


def test_sdar_loss_defaults_are_coef_one_hundredth_and_beta_five() -> None:
    """sdar_loss with defaults is the launchers' 0.01 * sigma(5 Delta) * Delta.

    s = -1.2, t = -1.0: Delta = 0.2, gate sigma(1) = 0.73105857863,
    loss = 0.01 * 0.73105857863 * 0.2 = 0.00146211715726.
    """
    loss = sdar_loss(torch.tensor([[-1.2]], dtype=F64), torch.tensor([[-1.0]], dtype=F64), torch.ones(1, 1))
    assert loss.item() == pytest.approx(0.00146211715726, abs=1e-13)


# --------------------------------------------------------------------------------------------------------------
# importance weights


def test_importance_weights_default_clip_is_two() -> None:
    """The default clip is 2.0 (TRL sdpo/sdft's clipped IS; skill_sd_loss's docstring): pi/pi_old = e^ln4 = 4 -> 2,
    while e^0 = 1 stays."""
    w = importance_weights(torch.tensor([0.0, 0.0], dtype=F64), torch.tensor([-LN4, 0.0], dtype=F64))
    assert w.tolist() == pytest.approx([2.0, 1.0], abs=1e-12)


def test_importance_log_ratio_is_clamped_to_twenty_either_way() -> None:
    """Unclipped, a log-ratio of -30 gives e^-20 = 2.0611536e-9 and one of +30 gives e^20 = 4.8516520e8 (the
    clamp to [-20, 20] before exp), not e^-30 or e^30."""
    w = importance_weights(torch.tensor([0.0, 0.0], dtype=F64), torch.tensor([30.0, -30.0], dtype=F64), clip=None)
    assert w.tolist() == pytest.approx([2.0611536224e-9, 4.8516519541e8], rel=1e-10)


def test_importance_weights_do_not_overflow_in_float32() -> None:
    """A float32 log-ratio of 100 would overflow exp (e^100 > 3.4e38, the float32 maximum); clamped it is e^20."""
    w = importance_weights(torch.tensor([100.0]), torch.tensor([0.0]), clip=None)
    assert w.item() == pytest.approx(4.8516519541e8, rel=1e-6)


def test_importance_weights_accept_a_clip_below_one() -> None:
    """Any clip > 0 is valid: with clip 0.5 the ratios e^0 = 1 and e^-1 = 0.3678794 become 0.5 and 0.3678794."""
    w = importance_weights(torch.tensor([0.0, -1.0], dtype=F64), torch.tensor([0.0, 0.0], dtype=F64), clip=0.5)
    assert w.tolist() == pytest.approx([0.5, 0.3678794412], abs=1e-10)


@pytest.mark.parametrize("clip", [0.0, -1.0])
def test_importance_weights_reject_a_clip_that_is_not_positive(clip: float) -> None:
    """A clip of 0 (every weight 0) or below is refused with a message naming the value."""
    with pytest.raises(ValueError, match=re.escape(f"clip must be > 0 or None, got {clip!r}")):
        importance_weights(torch.zeros(2), torch.zeros(2), clip=clip)


def test_importance_weights_have_the_students_dtype() -> None:
    """float64 rollout log-probs are cast to a float32 student's dtype, so the weights are float32:
    e^(0 - (-1)) = 2.7182818 -> clip 2."""
    w = importance_weights(torch.tensor([0.0, 0.0]), torch.tensor([-1.0, 0.0], dtype=F64))
    assert w.dtype == torch.float32
    assert w.tolist() == [2.0, 1.0]


# --------------------------------------------------------------------------------------------------------------
# Skill-SD

# One row, two tokens: s = -1, t = [-1.5, -1.25] -> k1 = s - t = [0.5, 0.25]; pi/pi_old = [e^ln4, e^0] = [4, 1].
SKILL_STUDENT = [[-1.0, -1.0]]
SKILL_TEACHER = [[-1.5, -1.25]]
SKILL_OLD = [[-1.0 - LN4, -1.0]]


def skill_sd(**kwargs: float | None) -> list[float]:
    """skill_sd_loss on the row above (float64, both tokens kept)."""
    loss = skill_sd_loss(
        torch.tensor(SKILL_STUDENT, dtype=F64),
        torch.tensor(SKILL_TEACHER, dtype=F64),
        torch.tensor(SKILL_OLD, dtype=F64),
        torch.ones(1, 2),
        **kwargs,
    )
    return loss[0].tolist()


def test_skill_sd_defaults_are_coef_one_tenth_and_clip_two() -> None:
    """Defaults: coef 0.1 (SDAR's reimplementation) and is_clip 2.0 (TRL's clipped IS), per skill_sd_loss's docstring.

    rho = [min(4, 2), 1] = [2, 1]; loss = 0.1 * rho * k1 = [0.1 * 2 * 0.5, 0.1 * 1 * 0.25] = [0.1, 0.025].
    """
    assert skill_sd() == pytest.approx([0.1, 0.025], abs=1e-12)


@pytest.mark.parametrize("is_clip,first", [(3.0, 0.1 * 3 * 0.5), (None, 0.1 * 4 * 0.5)])
def test_skill_sd_weights_with_the_clip_it_is_given(is_clip: float | None, first: float) -> None:
    """is_clip reaches the importance weights: clip 3 gives rho = 3, loss 0.1 * 3 * 0.5 = 0.15; no clip gives
    rho = 4, loss 0.1 * 4 * 0.5 = 0.2. The unclipped second token stays 0.1 * 1 * 0.25 = 0.025."""
    assert skill_sd(is_clip=is_clip) == pytest.approx([first, 0.025], abs=1e-12)


def test_skill_sd_rejects_old_logp_of_another_shape() -> None:
    """Rollout log-probs that do not line up with the mask are refused, naming both shapes."""
    with pytest.raises(ValueError, match=re.escape("old_logp (2, 2) does not match mask (2, 3)")):
        skill_sd_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))


# --------------------------------------------------------------------------------------------------------------
# gradient-equivalent advantages


def test_advantages_of_a_term_that_ignores_the_student_are_zero() -> None:
    """A loss term with no path to the student's log-probs (here one that only trains the teacher) moves the
    policy by nothing, so its advantages are 0 everywhere (not an autograd error about an unused input)."""
    teacher = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)

    def teacher_only(student: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return teacher_logp * mask

    adv = gradient_equivalent_advantages(teacher_only, torch.tensor([[-0.5, -0.5, -0.5]]), teacher, torch.ones(1, 3))
    assert adv.tolist() == [[0.0, 0.0, 0.0]]
