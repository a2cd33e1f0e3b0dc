"""TASPO credit math (paper Eqs. 1, 4-6, App. A.3) and every guarantee of App. B, as property tests."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from taspo_trl.credit.taspo import (
    FALLBACK_FEW_SCORABLE,
    FALLBACK_NO_PI,
    FALLBACK_ZERO_ADVANTAGE,
    center_scores,
    clip_token_shifts,
    clipped_action_score,
    mean_one_weights,
    support_scores,
    taspo_fallback_reason,
    taspo_token_fallback_reason,
    taspo_token_weights,
    taspo_weights,
)

PROPS = settings(max_examples=120, deadline=None)
TOL = 1e-9

finite = st.floats(min_value=-5.0, max_value=5.0, allow_nan=False, allow_infinity=False)
scores_st = st.lists(st.one_of(st.none(), finite), min_size=1, max_size=12)
nonzero_adv = st.floats(min_value=-10.0, max_value=10.0, allow_nan=False).filter(lambda a: abs(a) > 1e-6)
any_adv = st.one_of(st.just(0.0), nonzero_adv)
tau_st = st.floats(min_value=0.05, max_value=5.0)
eps_st = st.floats(min_value=0.0, max_value=0.99)
shift_st = st.floats(min_value=-20.0, max_value=20.0, allow_nan=False, allow_infinity=False)
c_st = st.floats(min_value=0.1, max_value=5.0)


def _scorable(scores):
    return [t for t, s in enumerate(scores) if s is not None]


# ---------------------------------------------------------------------------------------------------------------
# App. B.1 / Eq. 1 / B.3-B.4: bounds, positivity, mean one, sign and mean of A~, bounded deviation


@PROPS
@given(scores=scores_st, adv=any_adv, tau=tau_st, eps=eps_st, has_pi=st.booleans())
def test_bounds_positivity_mean_one(scores, adv, tau, eps, has_pi):
    w = taspo_weights(scores, adv, tau=tau, eps_w=eps, has_pi=has_pi)
    assert w.shape == (len(scores),) and w.dtype == torch.float64
    assert bool((w >= 1 - eps - TOL).all()) and bool((w <= 1 + eps + TOL).all())  # B.3 bounds
    assert bool((w > 0).all())  # B.3 positivity (eps < 1)
    assert abs(float(w.mean()) - 1.0) < TOL  # Eq. 1: mean over ALL T_i turns, unscorable ones included


@PROPS
@given(scores=scores_st, adv=nonzero_adv, tau=tau_st, eps=eps_st)
def test_reweighted_advantage_sign_mean_and_deviation(scores, adv, tau, eps):
    w = taspo_weights(scores, adv, tau=tau, eps_w=eps)
    a_tilde = adv * w
    assert bool((torch.sign(a_tilde) == math.copysign(1.0, adv)).all())  # B.4 sign preserved
    assert abs(float(a_tilde.mean()) - adv) < TOL * max(1.0, abs(adv))  # B.4 trajectory mean preserved
    assert bool(((a_tilde - adv).abs() <= eps * abs(adv) + TOL).all())  # B.4 |A~ - A| <= eps_w |A|


@PROPS
@given(scores=scores_st, adv=nonzero_adv, tau=tau_st, eps=eps_st)
def test_unscorable_turns_keep_unit_weight_and_scorable_mean_one(scores, adv, tau, eps):
    w = taspo_weights(scores, adv, tau=tau, eps_w=eps)
    idx = _scorable(scores)
    for t, s in enumerate(scores):
        if s is None:
            assert w[t].item() == 1.0
    if len(idx) >= 2:
        assert abs(float(w[idx].mean()) - 1.0) < TOL  # Eq. 6: mean one within I_i


@PROPS
@given(scores=scores_st, adv=nonzero_adv, tau=tau_st, eps=eps_st)
def test_weights_match_closed_form_b2(scores, adv, tau, eps):
    # B.2: w* = 1 + eta (q - q_bar) is the unique optimiser of B.1; check against the stationarity conditions:
    # (w - 1) - eta q is the same constant (-lambda) on every scorable turn, and sum(w - 1) = 0.
    idx = _scorable(scores)
    assume(len(idx) >= 2)
    w = taspo_weights(scores, adv, tau=tau, eps_w=eps)
    d = torch.tensor([scores[t] for t in idx], dtype=torch.float64)
    q = torch.tanh(math.copysign(1.0, adv) * (d - d.mean()) / tau)
    lam = (w[idx] - 1) - (eps / 2) * q
    assert float(lam.max() - lam.min()) < TOL
    assert abs(float((w[idx] - 1).sum())) < TOL


# ---------------------------------------------------------------------------------------------------------------
# App. B.2: shared-shift invariance, monotonicity in support


@PROPS
@given(scores=scores_st, adv=any_adv, tau=tau_st, eps=eps_st, b=st.floats(min_value=-50.0, max_value=50.0))
def test_shared_shift_invariance(scores, adv, tau, eps, b):
    shifted = [None if s is None else s + b for s in scores]
    w = taspo_weights(scores, adv, tau=tau, eps_w=eps)
    w_shifted = taspo_weights(shifted, adv, tau=tau, eps_w=eps)
    assert torch.allclose(w, w_shifted, atol=1e-8, rtol=0)


@PROPS
@given(
    scores=scores_st,
    adv=nonzero_adv,
    tau=tau_st,
    eps=eps_st,
    pick=st.integers(min_value=0, max_value=100),
    bump=st.floats(min_value=1e-3, max_value=5.0),
)
def test_monotone_in_support_for_both_signs(scores, adv, tau, eps, pick, bump):
    # "Stronger support increases positive credit or attenuates negative credit" (Sec. 1, 3.4):
    # raising d_t never lowers w_t when A > 0 and never raises it when A < 0, so A~_t = A w_t never decreases.
    idx = _scorable(scores)
    assume(len(idx) >= 2)
    t = idx[pick % len(idx)]
    raised = list(scores)
    raised[t] = scores[t] + bump
    w = taspo_weights(scores, adv, tau=tau, eps_w=eps)[t].item()
    w_raised = taspo_weights(raised, adv, tau=tau, eps_w=eps)[t].item()
    if adv > 0:
        assert w_raised >= w - 1e-12
    else:
        assert w_raised <= w + 1e-12
    assert adv * w_raised >= adv * w - 1e-9 * abs(adv)


@PROPS
@given(scores=scores_st, adv=nonzero_adv, tau=tau_st, eps=eps_st)
def test_negative_advantage_mirrors_positive(scores, adv, tau, eps):
    # Eq. 5 only uses sign(A): A < 0 on scores d equals A > 0 on scores -d, and |A| does not matter.
    neg = taspo_weights(scores, -abs(adv), tau=tau, eps_w=eps)
    mirrored = taspo_weights([None if s is None else -s for s in scores], abs(adv), tau=tau, eps_w=eps)
    unit = taspo_weights(scores, math.copysign(1.0, adv), tau=tau, eps_w=eps)
    assert torch.allclose(neg, mirrored, atol=1e-12, rtol=0)
    assert torch.allclose(taspo_weights(scores, adv, tau=tau, eps_w=eps), unit, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# App. B.2: clipped scores (B.5, B.6)


@PROPS
@given(shifts=st.lists(shift_st, min_size=1, max_size=20), c=c_st)
def test_action_score_bounded_by_c(shifts, c):
    d = clipped_action_score(shifts, c_delta=c)
    assert d is not None and abs(d) <= c + 1e-12  # B.5


@PROPS
@given(
    shifts=st.lists(shift_st, min_size=1, max_size=20),
    c=c_st,
    j=st.integers(min_value=0, max_value=100),
    new=shift_st,
    kappa=st.one_of(st.none(), st.floats(min_value=0.0, max_value=0.5)),
)
def test_single_token_influence_bound(shifts, c, j, new, kappa):
    j %= len(shifts)
    changed = list(shifts)
    changed[j] = new
    d = clipped_action_score(shifts, c_delta=c, kappa=kappa)
    d2 = clipped_action_score(changed, c_delta=c, kappa=kappa)
    L = len(shifts)
    assert abs(d2 - d) <= 2 * c / L + 1e-12  # B.6: one token moves d by at most 2c/L
    if kappa is None:
        # B.6 with the Lipschitz part; holds without the kappa filter (the filter jumps by up to kappa).
        assert abs(d2 - d) <= min(abs(new - shifts[j]), 2 * c) / L + 1e-12


def test_clipped_action_score_scorability_and_input_types():
    assert clipped_action_score([]) is None  # empty span
    assert clipped_action_score(torch.tensor([])) is None
    assert clipped_action_score([0.1, float("nan")]) is None  # NaN shift
    assert clipped_action_score([0.1, float("inf")]) is None  # clipping must not hide an infinite shift
    assert clipped_action_score(torch.tensor([float("-inf")])) is None
    # (0.5 + 2.0 [clipped from 3] - 0.5) / 3 = 2/3, same for list and tensor input
    assert clipped_action_score([0.5, 3.0, -0.5]) == pytest.approx(2 / 3, abs=1e-12)
    assert clipped_action_score(torch.tensor([0.5, 3.0, -0.5])) == pytest.approx(2 / 3, abs=1e-7)
    assert clipped_action_score([-9.0], c_delta=1.5) == pytest.approx(-1.5)
    with pytest.raises(ValueError):
        clipped_action_score([[0.1, 0.2]])
    with pytest.raises(ValueError):
        clipped_action_score([0.1], c_delta=0.0)


def test_kappa_filter_is_off_by_default_and_keeps_the_denominator():
    # Default (A.3): no filter -> (0.01 + 1.0) / 2 = 0.505.
    assert clipped_action_score([0.01, 1.0]) == pytest.approx(0.505, abs=1e-12)
    # kappa = 0.05 (Table C.3): 0.01 counts as 0 but the action length stays 2 -> (0 + 1.0) / 2 = 0.5.
    assert clipped_action_score([0.01, 1.0], kappa=0.05) == pytest.approx(0.5, abs=1e-12)
    # A shift exactly at kappa is kept (strict |Delta| < kappa); -0.04 is dropped: (0.05 + 0) / 2.
    assert clipped_action_score([0.05, -0.04], kappa=0.05) == pytest.approx(0.025, abs=1e-12)
    assert clip_token_shifts([0.01, -3.0], kappa=0.05).tolist() == [0.0, -2.0]
    with pytest.raises(ValueError):
        clipped_action_score([0.1], kappa=-0.1)


# ---------------------------------------------------------------------------------------------------------------
# Worked example, Eqs. 4-6 end to end, numbers computed by hand (c = 2, tau = 0.5, eps_w = 0.4, eta = 0.2)
#
# Turn 1 shifts [0.5, 3.0, -0.5]        -> clip [0.5, 2.0, -0.5]        d1 = 2.0/3            =  2/3
# Turn 2 shifts [-1.0, 0.2]             -> clip [-1.0, 0.2]             d2 = -0.8/2           = -2/5
# Turn 3 shifts [0.1, 0.1, 0.1, -2.5]   -> clip [0.1, 0.1, 0.1, -2.0]   d3 = -1.7/4           = -17/40
# mean d = (240 - 144 - 153)/360 / 3 = -57/1080 = -19/360 = -0.0527778
# d_hat = [259/360, -125/360, -134/360] = [0.7194444, -0.3472222, -0.3722222]          (sums to 0)
# d_hat / tau = [1.4388889, -0.6944444, -0.7444444]
# A > 0: q = tanh(.) = [0.893473833, -0.600829603, -0.631822885]
#        q_bar = (0.893473833 - 0.600829603 - 0.631822885)/3 = -0.339178655/3 = -0.113059552
#        w = 1 + 0.2 (q - q_bar) = [1 + 0.2*1.006533385, 1 + 0.2*(-0.487770051), 1 + 0.2*(-0.518763333)]
#          = [1.201306677, 0.902445990, 0.896247333]                                  (sums to 3)
# A < 0: q flips sign, q_bar = +0.113059552, w = 2 - w(A > 0) = [0.798693323, 1.097554010, 1.103752667]

HAND_SHIFTS = [[0.5, 3.0, -0.5], [-1.0, 0.2], [0.1, 0.1, 0.1, -2.5]]
HAND_D = [2 / 3, -0.4, -0.425]
HAND_D_HAT = [0.7194444444, -0.3472222222, -0.3722222222]
HAND_Q_POS = [0.893473833, -0.600829603, -0.631822885]
HAND_W_POS = [1.201306677, 0.902445990, 0.896247333]
HAND_W_NEG = [0.798693323, 1.097554010, 1.103752667]


def test_worked_example_equation_by_equation():
    d = [clipped_action_score(s, c_delta=2.0) for s in HAND_SHIFTS]
    assert d == pytest.approx(HAND_D, abs=1e-12)  # Eq. 4 / A.1
    d_hat = center_scores(torch.tensor(d, dtype=torch.float64))
    assert d_hat.tolist() == pytest.approx(HAND_D_HAT, abs=1e-9)  # Eq. 4, centering
    q = support_scores(d_hat, advantage=1.5, tau=0.5)
    assert q.tolist() == pytest.approx(HAND_Q_POS, abs=1e-8)  # Eq. 5
    w = mean_one_weights(q, eps_w=0.4)
    assert w.tolist() == pytest.approx(HAND_W_POS, abs=1e-8)  # Eq. 6


def test_worked_example_end_to_end_both_signs_with_an_unscorable_turn():
    d = [clipped_action_score(s) for s in HAND_SHIFTS]
    assert taspo_weights(d, 1.5, tau=0.5, eps_w=0.4).tolist() == pytest.approx(HAND_W_POS, abs=1e-8)
    assert taspo_weights(d, -0.7, tau=0.5, eps_w=0.4).tolist() == pytest.approx(HAND_W_NEG, abs=1e-8)
    # A fourth turn without a parsable action (empty span -> None) keeps w = 1 and leaves the others as they were:
    # trajectory mean = (3 + 1)/4 = 1.
    d4 = d + [clipped_action_score([])]
    w4 = taspo_weights(d4, 1.5)
    assert w4.tolist() == pytest.approx(HAND_W_POS + [1.0], abs=1e-8)
    # Eq. 1: A~ = A w; with A = 1.5 -> [1.801960016, 1.353668985, 1.344371000, 1.5], mean 1.5.
    a_tilde = 1.5 * w4
    assert a_tilde.tolist() == pytest.approx([1.801960016, 1.353668985, 1.344371000, 1.5], abs=1e-8)
    assert float(a_tilde.mean()) == pytest.approx(1.5, abs=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Fallbacks (A.3, Algorithm 1 lines 10 and 13)


@pytest.mark.parametrize(
    "scores, adv, has_pi, reason",
    [
        ([0.3, -0.2, 0.1], 0.0, True, FALLBACK_ZERO_ADVANTAGE),  # A = 0
        ([0.3, None, None], 1.0, True, FALLBACK_FEW_SCORABLE),  # one scorable turn
        ([None, None], -1.0, True, FALLBACK_FEW_SCORABLE),  # all None
        ([], 1.0, True, FALLBACK_FEW_SCORABLE),  # no turns
        ([0.3, float("nan"), None], 1.0, True, FALLBACK_FEW_SCORABLE),  # NaN score counts as unscorable
        ([0.3, -0.2], 1.0, False, FALLBACK_NO_PI),  # empty aligned PI
        ([0.3, -0.2], 0.0, False, FALLBACK_NO_PI),  # no_pi is reported first
        ([0.3, -0.2], -2.0, True, None),  # redistributes
    ],
)
def test_fallback_reasons_and_unit_weights(scores, adv, has_pi, reason):
    assert taspo_fallback_reason(scores, adv, has_pi=has_pi) == reason
    w = taspo_weights(scores, adv, has_pi=has_pi)
    assert w.shape == (len(scores),)
    if reason is not None:
        assert w.tolist() == [1.0] * len(scores)
    else:
        assert not torch.equal(w, torch.ones_like(w))


def test_fallback_from_token_shifts():
    # NaN shift and empty span make those turns unscorable; only one scorable turn remains -> all ones.
    d = [clipped_action_score([0.4, 0.2]), clipped_action_score([0.1, float("nan")]), clipped_action_score([])]
    assert d[1] is None and d[2] is None
    assert taspo_fallback_reason(d, 1.0) == FALLBACK_FEW_SCORABLE
    assert taspo_weights(d, 1.0).tolist() == [1.0, 1.0, 1.0]


def test_tensor_scores_with_nan_mark_unscorable_turns():
    d = [clipped_action_score(s) for s in HAND_SHIFTS]
    scores = torch.tensor(d + [float("nan")], dtype=torch.float32)
    w = taspo_weights(scores, torch.tensor(2.0))
    assert w.tolist() == pytest.approx(HAND_W_POS + [1.0], abs=1e-6)


def test_eps_zero_gives_unit_weights():
    assert taspo_weights([0.5, -1.0, 2.0], 1.0, eps_w=0.0).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tau": 0.0},
        {"tau": -1.0},
        {"tau": float("nan")},
        {"tau": float("inf")},
        {"eps_w": 1.0},
        {"eps_w": -0.1},
        {"eps_w": float("nan")},
    ],
)
def test_invalid_hyperparameters_raise(kwargs):
    with pytest.raises(ValueError):
        taspo_weights([0.1, 0.2], 1.0, **kwargs)
    with pytest.raises(ValueError):
        taspo_token_weights([[0.1, 0.2]], 1.0, **kwargs)


def test_invalid_hyperparameters_raise_even_on_fallback():
    # A misconfiguration should surface on the first call, not only once some trajectory redistributes.
    with pytest.raises(ValueError):
        taspo_weights([None], 0.0, tau=0.0)


def test_non_finite_advantage_raises():
    with pytest.raises(ValueError):
        taspo_weights([0.1, 0.2], float("nan"))
    with pytest.raises(ValueError):
        support_scores(torch.tensor([0.1, -0.1]), 0.0)


# ---------------------------------------------------------------------------------------------------------------
# Token-level allocation (Table 4 ablation; this package's reconstruction)

turn_shifts_st = st.lists(
    st.one_of(st.none(), st.lists(shift_st, min_size=0, max_size=6)), min_size=1, max_size=6
)


def _scored_token_weights(shifts_per_turn, weights):
    out = []
    for s, w in zip(shifts_per_turn, weights):
        if s is not None and len(s) > 0:
            out.append(w)
    return torch.cat(out) if out else torch.ones(0, dtype=torch.float64)


@PROPS
@given(turns=turn_shifts_st, adv=any_adv, tau=tau_st, eps=eps_st, c=c_st)
def test_token_weights_bounds_mean_one_and_shapes(turns, adv, tau, eps, c):
    ws = taspo_token_weights(turns, adv, c_delta=c, tau=tau, eps_w=eps)
    assert len(ws) == len(turns)
    for s, w in zip(turns, ws):
        assert w.dtype == torch.float64
        assert w.numel() == (0 if s is None else len(s))
    flat = _scored_token_weights(turns, ws)
    if flat.numel():
        assert bool((flat >= 1 - eps - TOL).all()) and bool((flat <= 1 + eps + TOL).all())
        assert bool((flat > 0).all())
        assert abs(float(flat.mean()) - 1.0) < TOL
        a_tilde = adv * flat
        if adv != 0:
            assert bool((torch.sign(a_tilde) == math.copysign(1.0, adv)).all())
        assert bool(((a_tilde - adv).abs() <= eps * abs(adv) + TOL).all())


@PROPS
@given(turns=turn_shifts_st, adv=nonzero_adv, tau=tau_st, eps=eps_st, pick=st.integers(0, 1000),
       bump=st.floats(min_value=1e-3, max_value=1.0))
def test_token_weights_monotone_in_own_shift(turns, adv, tau, eps, pick, bump):
    positions = [(t, k) for t, s in enumerate(turns) if s for k in range(len(s))]
    assume(len(positions) >= 2)
    t, k = positions[pick % len(positions)]
    raised = [None if s is None else list(s) for s in turns]
    raised[t][k] += bump
    w = taspo_token_weights(turns, adv, tau=tau, eps_w=eps)[t][k].item()
    w2 = taspo_token_weights(raised, adv, tau=tau, eps_w=eps)[t][k].item()
    assert (w2 >= w - 1e-12) if adv > 0 else (w2 <= w + 1e-12)


def test_token_weights_hand_example():
    # c = 2, tau = 0.5, eps_w = 0.4. Turn 1 [1.0, -3.0] -> clip [1.0, -2.0]; turn 2 [0.5]; turn 3 invalid (NaN).
    # mean over the 3 scored tokens = (1 - 2 + 0.5)/3 = -1/6
    # d_hat = [7/6, -11/6, 2/3]; /tau -> [7/3, -11/3, 4/3] = [2.3333333, -3.6666667, 1.3333333]
    # q = tanh = [0.981368081, -0.998694069, 0.870061662]; q_bar = 0.852735674/3 = 0.284245225
    # w = 1 + 0.2 (q - q_bar) = [1.139424571, 0.743412141, 1.117163287]; the NaN turn keeps ones.
    ws = taspo_token_weights([[1.0, -3.0], [0.5], [0.2, float("nan")]], 1.0)
    assert ws[0].tolist() == pytest.approx([1.139424571, 0.743412141], abs=1e-8)
    assert ws[1].tolist() == pytest.approx([1.117163287], abs=1e-8)
    assert ws[2].tolist() == [1.0, 1.0]


def test_token_fallbacks():
    assert taspo_token_fallback_reason([[0.3]], 1.0) == FALLBACK_FEW_SCORABLE  # one scored token
    assert taspo_token_fallback_reason([[0.3, 0.1]], 1.0) is None  # two tokens of one action suffice
    assert taspo_token_fallback_reason([[0.3, 0.1]], 0.0) == FALLBACK_ZERO_ADVANTAGE
    assert taspo_token_fallback_reason([[0.3, 0.1]], 1.0, has_pi=False) == FALLBACK_NO_PI
    assert taspo_token_fallback_reason([None, [], [0.2, float("nan")], [0.4]], 1.0) == FALLBACK_FEW_SCORABLE
    ws = taspo_token_weights([None, [], [0.2, float("nan")], [0.4]], 1.0)
    assert [w.tolist() for w in ws] == [[], [], [1.0, 1.0], [1.0]]
    ws = taspo_token_weights([[0.3, -0.1], [0.5]], 1.0, has_pi=False)
    assert [w.tolist() for w in ws] == [[1.0, 1.0], [1.0]]


def test_token_kappa_filter():
    # With kappa = 0.05 the 0.01 and 0.03 shifts count as 0: all scored tokens tie and the weights are exactly 1.
    ws = taspo_token_weights([[0.01], [0.03, 0.0]], 1.0, kappa=0.05)
    assert [w.tolist() for w in ws] == [[1.0], [1.0, 1.0]]
    # Without the filter they differ: d_hat = [-1/300, 1/60, -1/75] -> weights away from 1.
    assert not torch.equal(taspo_token_weights([[0.01], [0.03, 0.0]], 1.0)[0], torch.ones(1, dtype=torch.float64))


# --------------------------------------------------------------------------------------------------------------
# Tests written against the mutants that survived the credit modules' own tests (benchmarks/mutation.sh; the
# list and the equivalent mutants are in benchmarks/results/mutation.md). Each names what it pins down.


# Argument checks, defaults and dtypes the paper-property tests leave open


def test_taspo_argument_errors_name_the_bad_value():
    from taspo_trl.credit import taspo

    cases = [
        (lambda: taspo.taspo_weights([0.1, 0.2], float("nan")), r"^advantage must be finite, got nan$"),
        (lambda: taspo.clip_token_shifts([[0.1]]), r"^token_shifts must be 1-D \(one action span\), got shape \(1, 1\)$"),
        (lambda: taspo.clip_token_shifts([0.1], c_delta=0.0), r"^c_delta must be a finite number > 0, got 0.0$"),
        (lambda: taspo.clip_token_shifts([0.1], kappa=-1.0), r"^kappa must be None \(no filter\) or a finite number >= 0, got -1.0$"),
        (lambda: taspo.taspo_weights([0.1, 0.2], 1.0, tau=0.0), r"^tau must be a finite number > 0, got 0.0$"),
        (lambda: taspo.taspo_weights([0.1, 0.2], 1.0, eps_w=1.0), r"^eps_w must satisfy 0 <= eps_w < 1, got 1.0$"),
        (lambda: taspo.taspo_weights(torch.zeros(2, 2), 1.0), r"^action_scores must be 1-D, got shape \(2, 2\)$"),
        (lambda: taspo.mean_one_weights(torch.zeros(2), eps_w=1.0), r"^eps_w must satisfy 0 <= eps_w < 1, got 1.0$"),
        (lambda: taspo.support_scores(torch.zeros(2), 0.0), r"^Eq. 5 is undefined for A_i == 0; use taspo_weights, which falls back to unit weights$"),
        (lambda: taspo.support_scores(torch.zeros(2), 1.0, tau=0.0), r"^tau must be a finite number > 0, got 0.0$"),
        (lambda: taspo.support_scores(torch.zeros(2), 1.0, tau=-1.0), r"^tau must be a finite number > 0, got -1.0$"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    for eps_w in (1.0, 1.5):  # w = 1 + (eps_w / 2)(q - mean q) reaches 0 at eps_w = 1: refused
        with pytest.raises(ValueError, match="eps_w"):
            taspo.taspo_weights([0.1, 0.2], 1.0, eps_w=eps_w)
        with pytest.raises(ValueError, match="eps_w"):
            taspo.mean_one_weights(torch.zeros(2), eps_w=eps_w)
    # refused in the fallbacks too (one scorable turn or token, none at all), where Eq. 6 never runs
    for scores, shifts in (([0.1], [[0.1]]), ([None, None], [None, None])):
        with pytest.raises(ValueError, match="eps_w"):
            taspo.taspo_weights(scores, 1.0, eps_w=1.0)
        with pytest.raises(ValueError, match="eps_w"):
            taspo.taspo_token_weights(shifts, 1.0, eps_w=1.5)
    with pytest.raises(ValueError, match="kappa"):  # checked even when no turn has shifts
        taspo.taspo_token_weights([None, None], 1.0, kappa=-1.0)


def test_taspo_defaults_and_float64_outputs():
    """The paper's defaults (tau 0.5, eps_w 0.4) in the pure functions, and float64 whatever the input dtype."""
    from taspo_trl.credit import taspo

    q = torch.tensor([1.0, -1.0], dtype=torch.float32)
    assert taspo.mean_one_weights(q).tolist() == pytest.approx([1.2, 0.8])  # 1 + (0.4 / 2)(q - 0)
    assert taspo.support_scores(torch.tensor([0.5, -0.5]), 1.0).tolist() == pytest.approx([math.tanh(1.0), -math.tanh(1.0)])
    assert taspo.center_scores(q).dtype == torch.float64
    assert taspo.mean_one_weights(q).dtype == torch.float64
    assert taspo.support_scores(q, -1.0).dtype == torch.float64


def test_taspo_token_level_counts_and_clips_every_scored_turn():
    from taspo_trl.credit import taspo

    # an unscored turn first must not stop the count of the scored tokens after it
    assert taspo.taspo_token_fallback_reason([None, [0.1, 0.2]], 1.0) is None
    assert taspo.taspo_token_fallback_reason([None, [0.1]], 1.0) == "few_scorable"
    # c_delta reaches the token clip: shifts 0.5 and 3 clip to 0.5 and 1 (c = 1), not to 0.5 and 2 (the default)
    weights = taspo.taspo_token_weights([[0.5, 3.0]], 1.0, c_delta=1.0, tau=1.0, eps_w=0.4)
    q = math.tanh(0.25)  # centred clipped scores -0.25, +0.25
    assert torch.cat(weights).tolist() == pytest.approx([1 - 0.2 * q, 1 + 0.2 * q])
