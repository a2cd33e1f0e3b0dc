"""Comparison methods (``taspo_trl.credit.baselines``, ``.distillation``, ``.registry``): hand-computed
worked examples, the degenerate cases that must give GRPO back, the papers' stated properties (hypothesis) and the
gradient direction of every loss term."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taspo_trl.credit.baselines import (
    anchor_state_groups,
    discounted_returns,
    gigpo_advantages,
    gigpo_step_advantages,
    opid_advantages,
    rlsd_advantages,
    rlsd_lambda,
    stepopsd_advantages,
)
from taspo_trl.credit.distillation import (
    importance_weights,
    sampled_reverse_kl,
    sdar_gate,
    sdar_loss,
    skill_sd_loss,
    teacher_version,
)
from taspo_trl.credit.grpo import grpo_outcome_advantages
from taspo_trl.credit.registry import CREDIT_METHODS, get_credit, register_credit

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


def test_rlsd_hand_computed():
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


def test_rlsd_lambda_zero_is_grpo_exactly():
    adv = grpo_outcome_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    mask = torch.ones(4, 3)
    out = rlsd_advantages(adv, torch.randn(4, 3), mask, lam=0.0)
    assert torch.equal(out, adv.unsqueeze(-1).expand(4, 3))


def test_rlsd_lambda_schedule():
    # lam0 * max(0, 1 - step/50): 0.5, 0.5*0.5 = 0.25, 0, 0
    assert [rlsd_lambda(s) for s in (0, 25, 50, 80)] == [0.5, 0.25, 0.0, 0.0]
    with pytest.raises(ValueError):
        rlsd_lambda(-1)
    with pytest.raises(ValueError):
        rlsd_advantages(ADV, torch.zeros(2, 3), MASK, lam=1.5)


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


def test_gigpo_hand_computed_mean_norm():
    # gamma = 0.5: traj 0 returns [0.5, 1]; traj 1 [0, 0, 0]; traj 2 [1]
    # anchor (0, s0): {0.5, 0} mean 0.25 -> A_S = +0.25 (traj 0), -0.25 (traj 1)
    # anchor (0, s1): {1, 0} mean 0.5 -> +0.5 (traj 0 step 1), -0.5 (traj 1 step 2)
    # anchor (0, s2) and (1, s0) are singletons -> 0
    steps = gigpo_step_advantages(GIGPO_OBS, GIGPO_REW, GIGPO_GROUPS, gamma=0.5)
    assert [s.tolist() for s in steps] == [[0.25, 0.5], [-0.25, 0.0, -0.5], [0.0]]
    # A = A_E + 1 * A_S with A_E = [1, -1, 0]
    full = gigpo_advantages([1.0, -1.0, 0.0], GIGPO_OBS, GIGPO_REW, GIGPO_GROUPS, gamma=0.5)
    assert [s.tolist() for s in full] == [[1.25, 1.5], [-1.25, -1.0, -1.5], [0.0]]


def test_gigpo_hand_computed_mean_std_norm():
    # (0, s0): {0.5, 0}: unbiased std = sqrt(2 * 0.25^2 / 1) = 0.3535534 -> +-0.25/0.3535534 = +-0.7071068
    # (0, s1): {1, 0}: std = sqrt(2 * 0.5^2) = 0.7071068 -> +-0.5/0.7071068 = +-0.7071068; singletons 0
    steps = gigpo_step_advantages(GIGPO_OBS, GIGPO_REW, GIGPO_GROUPS, gamma=0.5, norm="mean_std", eps=0.0)
    r = 0.7071068
    assert [s.tolist() for s in steps] == [
        pytest.approx([r, r], abs=1e-6),
        pytest.approx([-r, 0.0, -r], abs=1e-6),
        [0.0],
    ]


def test_gigpo_omega_zero_is_grpo_and_no_shared_anchor_gives_zero():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    a_e = grpo_outcome_advantages(rewards, group_size=4)
    obs = [["a", "b"], ["a", "c"], ["a"], ["a", "b", "d"]]
    rew = [[0, 1], [0, 0], [0], [0, 0, 1]]
    out = gigpo_advantages(a_e, obs, rew, [0] * 4, omega=0.0)
    for i, steps in enumerate(out):
        assert torch.equal(steps, torch.full((len(obs[i]),), float(a_e[i]), dtype=F64))
    distinct = [[f"{i}-{t}" for t in range(len(o))] for i, o in enumerate(obs)]
    for steps in gigpo_step_advantages(distinct, rew, [0] * 4, norm="mean_std"):
        assert torch.equal(steps, torch.zeros_like(steps))


def test_gigpo_rejects_bad_inputs():
    with pytest.raises(ValueError, match="norm"):
        gigpo_step_advantages(GIGPO_OBS, GIGPO_REW, GIGPO_GROUPS, norm="std")
    with pytest.raises(ValueError, match="rewards"):
        gigpo_step_advantages([["a", "b"]], [[0.0]], [0])


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


def test_losses_vanish_when_teacher_equals_student():
    s = student_leaf()
    same = torch.tensor(STUDENT, dtype=F64)
    total = (
        sampled_reverse_kl(s, same, MASK).sum()
        + sdar_loss(s, same, MASK).sum()
        + skill_sd_loss(s, same, same - 0.3, MASK).sum()
    )
    assert total.item() == 0.0
    total.backward()
    assert torch.equal(s.grad, torch.zeros_like(s))


# --------------------------------------------------------------------------------------------------------------
# SDAR


def test_sdar_gate_halves_at_zero_gap():
    gate = sdar_gate(torch.tensor([0.0, 1.0, -1.0]), beta=5.0)
    assert gate[0].item() == 0.5
    assert gate.tolist() == pytest.approx([0.5, sigmoid(5.0), sigmoid(-5.0)])


def test_sdar_hand_computed_value_and_gradient():
    s = student_leaf()
    loss = sdar_loss(s, teacher(), MASK, coef=0.01, beta=5.0)
    # Delta = t - s: row 0: -0.5, 0; row 1: 0, -1, +0.75
    # gate sigma(5 Delta): sigma(-2.5) = 0.0758582, 1/2, 1/2, sigma(-5) = 0.0066929, sigma(3.75) = 0.9770226
    # loss = 0.01 * gate * k1, k1 = -Delta: 0.01*0.0758582*0.5 = 3.79291e-4; 0; 0; 0.01*0.0066929*1 = 6.6929e-5;
    # 0.01*0.9770226*(-0.75) = -7.3276695e-3
    expected = [
        [0.01 * sigmoid(-2.5) * 0.5, 0.0, 0.0],
        [0.0, 0.01 * sigmoid(-5.0) * 1.0, 0.01 * sigmoid(3.75) * -0.75],
    ]
    assert loss.tolist() == [pytest.approx(r, abs=1e-15) for r in expected]
    assert loss[1, 2].item() == pytest.approx(-7.3276695e-3, abs=1e-9)
    loss.sum().backward()
    # d loss / d log pi = -coef * gate * Delta: the endorsed token (Delta = +0.75, gate open) has a negative
    # gradient, so descent RAISES its log-prob towards the teacher; the rejected token (Delta = -1) is lowered
    # only with the nearly closed gate's weight 0.0066929.
    assert s.grad.tolist() == [pytest.approx(r, abs=1e-15) for r in expected]
    assert s.grad[1, 2] < 0 < s.grad[1, 1]
    assert s.grad[1, 1] < 0.01 * 1.0 * 0.01  # attenuated far below the ungated coefficient 0.01 * |Delta|


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
    from taspo_trl.trainers.baselines import BASELINES, BaselineConfig

    assert set(BASELINES) <= set(CREDIT_METHODS)
    for name, method in CREDIT_METHODS.items():
        teacher = {"teacher_model_name_or_path": "x"} if method.teacher == "external" else {}
        config = BaselineConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", baseline=name, **teacher)
        assert config.credit_method is method
    # What the trainer prepares before calling each built-in (the papers' setups, README "Comparison methods").
    assert {n for n in BASELINES if CREDIT_METHODS[n].teacher is None} == {"skill_grpo", "gigpo"}
    assert {n for n in BASELINES if CREDIT_METHODS[n].teacher == "external"} == {"opd"}
    assert {n for n in BASELINES if not CREDIT_METHODS[n].outcome} == {"opsd", "opd"}
    assert {n for n in BASELINES if CREDIT_METHODS[n].step_skills} == {"opid"}
    assert get_credit(" RLSD ") is CREDIT_METHODS["rlsd"]


@PROPS
@given(name=st.text(min_size=0, max_size=12))
def test_registry_unknown_name_lists_known(name):
    if name.strip().lower() in CREDIT_METHODS:
        return
    with pytest.raises(ValueError, match="known: gigpo, grpo_opsd, opd, opid, opsd, rlsd, sdar, skill_grpo"):
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
