"""The bounded Gibbs allocation of ``taspo_trl.credit.gibbs_allocation`` (StepOPSD's per-step budget): property
tests of the bounds, the exact token-mean identity, sign preservation and monotonicity, plus a hand-computed
worked example."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from taspo_trl.credit.gibbs_allocation import (
    gibbs_weights,
    bounded_normalize,
    hierarchical_weights,
    neutral_measure,
    span_evidence,
    turn_evidence,
)

PROPS = settings(max_examples=100, deadline=None)
TOL = 1e-9
F64 = torch.float64

evid_st = st.floats(min_value=-4.0, max_value=4.0, allow_nan=False)
temp_st = st.floats(min_value=0.05, max_value=10.0)
eps_st = st.floats(min_value=0.0, max_value=0.95)
nonzero_adv = st.floats(min_value=-10.0, max_value=10.0, allow_nan=False).filter(lambda a: abs(a) > 1e-6)


@st.composite
def trajectory(draw, max_turns=8):
    """Evidence, token counts (some turns empty) and a contiguous partition into spans."""
    T = draw(st.integers(min_value=1, max_value=max_turns))
    e = draw(st.lists(evid_st, min_size=T, max_size=T))
    n = draw(st.lists(st.integers(min_value=0, max_value=6), min_size=T, max_size=T))
    assume(sum(n) > 0)
    cuts = sorted(set(draw(st.lists(st.integers(1, T - 1), max_size=T)))) if T > 1 else []
    bounds = [0, *cuts, T]
    return torch.tensor(e, dtype=F64), n, list(zip(bounds[:-1], bounds[1:]))


def tok_mean(w, n):
    n = torch.tensor(n, dtype=F64)
    return float((n * w).sum()), float(n.sum())


def test_turn_evidence_conventions():
    assert turn_evidence([0.2, 0.4], 3.0) == pytest.approx(0.3)
    assert turn_evidence([0.2, 0.4], -0.5) == pytest.approx(-0.3)
    assert turn_evidence([0.2, 0.4], 0.0) == 0.0
    assert turn_evidence([], 1.0) == 0.0  # no optimised token
    assert turn_evidence([float("nan"), float("inf")], 1.0) == 0.0  # no finite value
    assert turn_evidence([0.2, float("nan"), 0.4], 1.0) == pytest.approx(0.3)  # non-finite values left out
    assert turn_evidence([0.2, 9.0, 0.4], 1.0, mask=[True, False, True]) == pytest.approx(0.3)
    # Span evidence leaves out turns without tokens when counts are given.
    assert span_evidence([0.0, 0.6], [(0, 2)], token_counts=[0, 3]).tolist() == pytest.approx([0.6])
    assert span_evidence([0.0, 0.6], [(0, 2)]).tolist() == pytest.approx([0.3])


@PROPS
@given(
    w=st.lists(st.floats(min_value=-60.0, max_value=60.0).map(math.exp), min_size=1, max_size=10).flatmap(
        lambda w: st.tuples(st.just(w), st.lists(st.integers(0, 50), min_size=len(w), max_size=len(w)))
    ),
    eps=eps_st,
)
def test_bounded_normalize_bounds_exact_mean_order_and_common_scale(w, eps):
    raw, n = w
    assume(sum(n) > 0)
    raw_t = torch.tensor(raw, dtype=F64)
    out = bounded_normalize(raw_t, n, eps)
    live = [t for t in range(len(n)) if n[t] > 0]
    assert all(out[t].item() == 1.0 for t in range(len(n)) if n[t] == 0)
    assert bool((out > 0).all())
    assert bool((out >= 1 - eps - 1e-12).all()) and bool((out <= 1 + eps + 1e-12).all())
    s, N = tok_mean(out, n)
    assert abs(s - N) <= TOL * N  # token-weighted mean exactly 1
    for a, b in itertools.combinations(live, 2):  # order preserved (weakly)
        if raw[a] > raw[b]:
            assert out[a] >= out[b] - 1e-12
    # out = clip(s * raw): every strictly-inside weight has the same ratio to its raw weight.
    inside = [t for t in live if 1 - eps + 1e-9 < out[t].item() < 1 + eps - 1e-9]
    ratios = [out[t].item() / raw[t] for t in inside]
    if ratios:
        assert max(ratios) - min(ratios) <= 1e-9 * max(ratios)


def test_bounded_normalize_exact_across_many_orders_of_magnitude():
    # Raw weights spanning 1e8 (a sharp temperature): two clip at 1.5, three tiny ones share N - 3 = 2 -> 2/3
    # each. A running slope accumulated over the sweep would lose ~1e-8 here; the piece is re-solved exactly.
    raw = torch.tensor([1.8045, 3.1955, 2.0653e-08, 2.0653e-08, 2.0653e-08], dtype=F64)
    w = bounded_normalize(raw, [1] * 5, eps=0.5)
    assert w.tolist() == pytest.approx([1.5, 1.5, 2 / 3, 2 / 3, 2 / 3], abs=1e-15)
    assert abs(float(w.sum()) - 5.0) <= 1e-14
    # Weights 1e-21 .. 3: turns 2 and 6 clip at 1.5, turn 3 (5e-28) stays at 0.5, turn 0 (n = 2) takes the rest:
    # 2 w0 = 5 - 1.5 - 1.5 - 0.5 -> w0 = 0.75 (turns 1, 4, 5 have no tokens).
    raw = torch.tensor([2.375e-21, 1.0, 10 / 3, 5.346e-28, 1.0, 1.0, 5 / 3], dtype=F64)
    w = bounded_normalize(raw, [2, 0, 1, 1, 0, 0, 1], eps=0.5)
    assert w.tolist() == pytest.approx([0.75, 1.0, 1.5, 0.5, 1.0, 1.0, 1.5], abs=1e-15)
    # Already inside the bounds with mean one: unchanged; eps = 0: all ones.
    assert bounded_normalize([0.8, 1.2], [1, 1], eps=0.5).tolist() == pytest.approx([0.8, 1.2], abs=1e-15)
    assert bounded_normalize([0.2, 5.0], [3, 1], eps=0.0).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError):
        bounded_normalize([0.0, 1.0], [1, 1])


@PROPS
@given(traj=trajectory(), temp=temp_st, eps=eps_st, adv=nonzero_adv)
def test_weights_positive_bounded_mean_preserving_sign_preserving(traj, temp, eps, adv):
    e, n, spans = traj
    w = gibbs_weights(e, n, spans, temperature=temp, eps=eps)
    assert w.dtype == F64 and w.shape == e.shape
    assert bool((w > 0).all())
    assert bool((w >= 1 - eps - 1e-12).all()) and bool((w <= 1 + eps + 1e-12).all())
    a_tilde = adv * w
    nt = torch.tensor(n, dtype=F64)
    assert abs(float((nt * a_tilde).sum()) - adv * float(nt.sum())) <= TOL * abs(adv) * float(nt.sum())
    assert bool((torch.sign(a_tilde) == math.copysign(1.0, adv)).all())


@PROPS
@given(traj=trajectory())
def test_raw_hierarchical_weights_already_preserve_the_token_mean(traj):
    e, n, spans = traj
    s, N = tok_mean(hierarchical_weights(e, n, spans), n)
    assert abs(s - N) <= 1e-9 * N


@PROPS
@given(traj=trajectory(), temp=temp_st, eps=eps_st)
def test_zero_evidence_gives_exactly_grpo(traj, temp, eps):
    _, n, spans = traj
    zero = torch.zeros(len(n), dtype=F64)
    w = gibbs_weights(zero, n, spans, temperature=temp, eps=eps)
    assert w.tolist() == [1.0] * len(n)  # exact, not approximate


@PROPS
@given(traj=trajectory(), eps=eps_st)
def test_infinite_temperature_gives_uniform_weights(traj, eps):
    e, n, spans = traj
    assert gibbs_weights(e, n, spans, temperature=math.inf, eps=eps).tolist() == [1.0] * len(n)
    w = gibbs_weights(e, n, spans, temperature=1e9, eps=eps)
    assert float((w - 1).abs().max()) < 1e-7


@PROPS
@given(traj=trajectory(), temp=temp_st, eps=eps_st, adv=nonzero_adv)
def test_within_span_higher_evidence_never_gets_less_credit(traj, temp, eps, adv):
    # Credit = w_t, evidence = e_t (which already carries sign(A)). Within a span a larger e_t never gets a
    # smaller weight (clipping may tie them). For A~ = A w that means: with A > 0 the higher-evidence turn gets
    # at least as much credit, with A < 0 at least as much blame (A~ at most as large) -- the reverse ordering.
    # In terms of the teacher's support m_t = mean g~ = sign(A) e_t, better-supported turns always end with
    # the larger A~ (more positive credit, or attenuated negative credit), as in TASPO.
    e, n, spans = traj
    w = gibbs_weights(e, n, spans, temperature=temp, eps=eps)
    a_tilde = adv * w
    for s, end in spans:
        for t, u in itertools.permutations([x for x in range(s, end) if n[x] > 0], 2):
            if e[t] > e[u]:
                assert w[t] >= w[u] - 1e-12
                if adv > 0:
                    assert a_tilde[t] >= a_tilde[u] - 1e-12 * abs(adv)
                else:
                    assert a_tilde[t] <= a_tilde[u] + 1e-12 * abs(adv)
                support_t, support_u = math.copysign(1, adv) * e[t], math.copysign(1, adv) * e[u]
                hi_sup, lo_sup = (t, u) if support_t > support_u else (u, t)
                assert a_tilde[hi_sup] >= a_tilde[lo_sup] - 1e-12 * abs(adv)


def test_turns_without_tokens_keep_weight_one():
    w = gibbs_weights([0.0, 2.0, -1.0, 0.5], [0, 3, 2, 0], [(0, 2), (2, 4)], eps=0.4)
    assert w[0].item() == 1.0 and w[3].item() == 1.0
    assert 3 * w[1].item() + 2 * w[2].item() == pytest.approx(5.0, abs=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": 0.0}, {"temperature": -1.0}, {"temperature": float("nan")}, {"eps": 1.0}, {"eps": -0.1}],
)
def test_invalid_hyperparameters_raise_even_with_zero_evidence(kwargs):
    for e in ([0.3, -0.1], [0.0, 0.0]):
        with pytest.raises(ValueError):
            gibbs_weights(e, [1, 1], [(0, 2)], **kwargs)


def test_invalid_spans_raise():
    for spans in ([(0, 1)], [(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 0), (0, 3)]):
        with pytest.raises(ValueError):
            gibbs_weights([0.1, 0.2, 0.3], [1, 1, 1], spans)


# ---------------------------------------------------------------------------------------------------------------
# Worked example: allocation and bounded normalisation, numbers by hand (temp = 1, eps = 0.5)
#
# n = [2, 2, 4], N = 8 -> beta0 = [1/4, 1/4, 1/2]; spans {0, 1} and {2}; e = [ln 3, 0, 0].
# Span evidence: E_1 = (ln 3 + 0)/2 = ln sqrt(3), E_2 = 0. beta0_s = [1/2, 1/2].
# Outer: beta ~ [1/2 sqrt(3), 1/2] -> beta_1 = sqrt3/(sqrt3 + 1) = (3 - sqrt3)/2 = 0.6339746,
#                                     beta_2 = 1/(sqrt3 + 1)     = (sqrt3 - 1)/2 = 0.3660254.
# Inner (span 1): alpha ~ [1/4 * 3, 1/4 * 1] -> [3/4, 1/4]; span 2: alpha = [1].
# w = beta_s alpha_t / beta0_t = [0.6339746 * 3, 0.6339746, 0.3660254 * 2] = [1.9019238, 0.6339746, 0.7320508]
#   check: 2 * 1.9019238 + 2 * 0.6339746 + 4 * 0.7320508 = 3.8038476 + 1.2679492 + 2.9282032 = 8 = N.
# Bounds [0.5, 1.5]: turn 0 exceeds 1.5 and stays clipped; the others share N - 2 * 1.5 = 5:
#   s = 5 / (2 * 0.6339746 + 4 * 0.7320508) = 5 / (3 sqrt3 - 1) = 5 / 4.1961524 = 1.1915678
#   w = [1.5, 0.6339746 * 1.1915678, 0.7320508 * 1.1915678] = [1.5, 0.7554237, 0.8722882]  (inside the bounds)
#   check: 2 * 1.5 + 2 * 0.7554237 + 4 * 0.8722882 = 3 + 1.5108474 + 3.4891528 = 8.0000002 ~ 8.
# A = 2: A~ = [3.0, 1.5108474, 1.7445764]; token mean (6 + 3.0216948 + 6.9783056) / 8 = 2.

HAND_N = [2, 2, 4]
HAND_SPANS = [(0, 2), (2, 3)]
HAND_E = [math.log(3.0), 0.0, 0.0]
HAND_RAW = [1.9019238, 0.6339746, 0.7320508]
HAND_W = [1.5, 0.7554237, 0.8722882]
HAND_A_TILDE = [3.0, 1.5108474, 1.7445764]


def test_worked_example_allocation_step_by_step():
    e = torch.tensor(HAND_E, dtype=F64)
    assert neutral_measure(HAND_N).tolist() == [0.25, 0.25, 0.5]
    assert span_evidence(e, HAND_SPANS).tolist() == pytest.approx([math.log(math.sqrt(3.0)), 0.0], abs=1e-15)
    raw = hierarchical_weights(e, HAND_N, HAND_SPANS, temperature=1.0)
    assert raw.tolist() == pytest.approx(HAND_RAW, abs=1e-7)
    w = bounded_normalize(raw, HAND_N, eps=0.5)
    assert w.tolist() == pytest.approx(HAND_W, abs=1e-7)
    assert w[0].item() == 1.5
    assert w.tolist() == pytest.approx(gibbs_weights(e, HAND_N, HAND_SPANS, 1.0, 0.5).tolist(), abs=0)
    a_tilde = 2.0 * w
    assert a_tilde.tolist() == pytest.approx(HAND_A_TILDE, abs=1e-6)
    assert float((torch.tensor(HAND_N, dtype=F64) * a_tilde).sum()) / 8 == pytest.approx(2.0, abs=1e-12)
