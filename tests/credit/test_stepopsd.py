"""The bounded Gibbs allocation of ``taspo_trl.credit.stepopsd`` (StepOPSD's per-step budget): property
tests of the bounds, the exact token-mean identity, sign preservation and monotonicity, plus a hand-computed
worked example."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from taspo_trl.credit.stepopsd import (
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


# --------------------------------------------------------------------------------------------------------------
# Tests written against the mutants of ``taspo_trl.credit.stepopsd`` (then ``gibbs_allocation``) that survived the
# tests above and ``tests/credit/test_baselines.py`` (benchmarks/mutation.sh; the score and the equivalent survivors
# are in benchmarks/results/mutation.md).
#
# They pin down what a caller relies on: token counts and masks given as integer tensors (as a tokenizer's attention
# mask comes), turns and spans without optimised tokens staying out of the credit measure, the exact token mass for
# very long turns, and the full text of each error message (which argument is wrong, and its value or shape). Every
# expected value is worked out by hand in the test's docstring or comments, or cited from the worked example above.


NAN = float("nan")
INF = float("inf")
E = math.e


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern that matches ``message`` and nothing longer or shorter."""
    return f"^{re.escape(message)}$"


# --------------------------------------------------------------------------------------------------------------
# turn_evidence


@pytest.mark.parametrize("mask", [torch.tensor([1, 0, 1]), [1, 0, 1]], ids=["long tensor", "int list"])
def test_turn_evidence_reads_a_0_1_integer_mask_as_a_token_selection(mask: torch.Tensor | list[int]) -> None:
    """A 0/1 integer mask (an attention mask) selects tokens 0 and 2: e = sign(A) * (1 + 3) / 2 = +-2.

    Read as integer indices instead, it would average g[[1, 0, 1]] = (2 + 1 + 2) / 3."""
    assert turn_evidence([1.0, 2.0, 3.0], 0.5, mask=mask) == 2.0
    assert turn_evidence([1.0, 2.0, 3.0], -0.5, mask=mask) == -2.0


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: turn_evidence([[1.0, 2.0], [3.0, 4.0]], 1.0), "rectified must be 1-D, got shape (2, 2)"),
        (lambda: turn_evidence([1.0, 2.0, 3.0], 1.0, mask=[True, False]), "mask must have shape (3,), got (2,)"),
        (lambda: turn_evidence([1.0], NAN), "advantage must be finite, got nan"),
        (lambda: turn_evidence([1.0], torch.tensor(-INF)), "advantage must be finite, got -inf"),
    ],
    ids=["2-D rectified", "short mask", "nan advantage", "-inf advantage"],
)
def test_turn_evidence_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """Each refused input is named in the message, with its shape or value."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


# --------------------------------------------------------------------------------------------------------------
# span_evidence


def test_span_evidence_keeps_a_turn_with_a_single_token() -> None:
    """n_t = 1 is an optimised turn: E = (2 + 4) / 2 = 3 over turns 0 and 1; turn 2 (n = 0) is left out."""
    assert span_evidence([2.0, 4.0, 6.0], [(0, 3)], token_counts=[1, 3, 0]).tolist() == [3.0]


def test_span_evidence_of_a_span_without_tokens_is_zero_whatever_its_turns_hold() -> None:
    """A span whose turns all have n_t = 0 has E_s = 0 (docstring), even if those turns hold nan / inf
    placeholders; the other span is the mean of its one turn, 1.0."""
    out = span_evidence([NAN, INF, 1.0], [(0, 2), (2, 3)], token_counts=[0, 0, 2])
    assert out.tolist() == [0.0, 1.0]


def test_span_evidence_takes_token_counts_as_a_tensor() -> None:
    """Counts as an integer tensor (as a mask's row sums come): turn 0 (n = 0) is left out, E = 4."""
    assert span_evidence([2.0, 4.0], [(0, 2)], token_counts=torch.tensor([0, 3])).tolist() == [4.0]


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: span_evidence([[1.0, 2.0]], [(0, 2)]), "evidence must be 1-D, got shape (1, 2)"),
        (lambda: span_evidence([1.0, 2.0], [(0, 2)], token_counts=[1]), "1 token counts for 2 turns"),
    ],
    ids=["2-D evidence", "too few counts"],
)
def test_span_evidence_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """The message names the evidence and its shape, or both lengths."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


# --------------------------------------------------------------------------------------------------------------
# neutral_measure


def test_neutral_measure_takes_a_count_tensor_and_is_all_zeros_without_tokens() -> None:
    """beta0 = n / N: [1, 3] -> [1/4, 3/4]; N = 0 -> all zeros (docstring), not 0 / 0 = nan."""
    assert neutral_measure(torch.tensor([1, 3])).tolist() == [0.25, 0.75]
    assert neutral_measure([0, 0]).tolist() == [0.0, 0.0]


def test_neutral_measure_refuses_a_negative_count_and_shows_the_counts() -> None:
    """A negative token count is refused, with the counts in the message."""
    with pytest.raises(ValueError, match=exactly("token counts must be >= 0, got [1, -1]")):
        neutral_measure([1, -1])


# --------------------------------------------------------------------------------------------------------------
# hierarchical_weights (temperature 1)


def test_hierarchical_weights_give_one_to_a_turn_without_tokens_in_its_own_span() -> None:
    """n = [0, 1, 1], spans {0}, {1, 2}, e = [1, 2, 0]: turn 0 (n = 0) gets 1.0 (docstring).

    beta0 = [0, 1/2, 1/2]; span {1, 2} holds all the mass, beta = 1; alpha ~ [e^2 / 2, 1 / 2] ->
    [e^2 / (e^2 + 1), 1 / (e^2 + 1)]; w = alpha / beta0 = [2 e^2 / (e^2 + 1), 2 / (e^2 + 1)] = [1.7615942, 0.2384058].
    """
    w = hierarchical_weights([1.0, 2.0, 0.0], [0, 1, 1], [(0, 1), (1, 3)])
    assert w.tolist() == pytest.approx([1.0, 2 * E**2 / (E**2 + 1), 2 / (E**2 + 1)], rel=1e-12)
    assert w[0].item() == 1.0


def test_hierarchical_weights_span_evidence_leaves_out_turns_without_tokens() -> None:
    """n = [1, 0, 1], spans {0, 1}, {2}, e = [1, 5, 0]: turn 1 (n = 0) neither counts in E_0 nor moves off 1.0.

    E = [1, 0] (E_0 = e_0 alone, not (1 + 5) / 2 = 3); beta0 = [1/2, 0, 1/2], beta0_s = [1/2, 1/2];
    beta ~ [e / 2, 1 / 2] -> [e / (e + 1), 1 / (e + 1)]; each span has one live turn (alpha = 1), so
    w = beta_s / beta0_t = [2 e / (e + 1), 1, 2 / (e + 1)] = [1.4621172, 1, 0.5378828]; check 1.4621172 + 0.5378828 = 2.
    """
    w = hierarchical_weights([1.0, 5.0, 0.0], [1, 0, 1], [(0, 2), (2, 3)])
    assert w.tolist() == pytest.approx([2 * E / (E + 1), 1.0, 2 / (E + 1)], rel=1e-12)
    assert w[1].item() == 1.0


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: hierarchical_weights([[1.0, 2.0]], [1, 1], [(0, 2)]), "evidence must be 1-D, got shape (1, 2)"),
        (lambda: hierarchical_weights([1.0, 2.0], [1], [(0, 2)]), "1 token counts for 2 turns"),
        (lambda: hierarchical_weights([INF, 0.0], [1, 1], [(0, 2)]), "evidence must be finite"),
        (
            lambda: hierarchical_weights([1.0, 0.0], [1, 1], [(0, 2)], temperature=0.0),
            "temperature must be a number > 0, got 0.0",
        ),
        (
            lambda: hierarchical_weights([1.0, 0.0], [1, 1], [(0, 2)], temperature=NAN),
            "temperature must be a number > 0, got nan",
        ),
        (
            lambda: hierarchical_weights([1.0, 0.0], [1, 1], [(0, 1)]),
            "spans must be a contiguous partition of [0, 2), got [(0, 1)]",
        ),
        (
            lambda: hierarchical_weights([1.0, 0.0, 2.0], [1, 1, 1], [(0, 1), (2, 3)]),
            "spans must be a contiguous partition of [0, 3), got [(0, 1), (2, 3)]",
        ),
    ],
    ids=["2-D evidence", "too few counts", "inf evidence", "zero temperature", "nan temperature", "short spans", "gap"],
)
def test_hierarchical_weights_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """The message names the argument (evidence, counts, temperature, spans) and its shape or value; a temperature
    of inf is allowed here, so the message does not say "finite"."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


# --------------------------------------------------------------------------------------------------------------
# bounded_normalize


def test_bounded_normalize_keeps_the_token_mass_exact_for_very_long_turns() -> None:
    """n = [2^24 + 1, 1], w = [1, 4], eps = 0.5 (bounds [0.5, 1.5]); 2^24 + 1 has no float32 form.

    Near s = 1 turn 1 sits at 4 s > 1.5, so it is clipped to 1.5 and turn 0 takes the rest of N = 2^24 + 2:
    (2^24 + 1) s + 1.5 = 2^24 + 2 -> s = (2^24 + 0.5) / (2^24 + 1) = 0.99999997 (inside the bounds; 4 s > 1.5 holds).
    """
    n0 = 2**24 + 1
    w = bounded_normalize([1.0, 4.0], [n0, 1], eps=0.5)
    assert w.tolist() == pytest.approx([(2**24 + 0.5) / n0, 1.5], rel=1e-12)
    assert n0 * w[0].item() + w[1].item() == pytest.approx(2**24 + 2, abs=1e-6)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: bounded_normalize([[1.0, 2.0]], [1, 1]), "weights must be 1-D, got shape (1, 2)"),
        (lambda: bounded_normalize([1.0, 2.0], [1]), "1 token counts for 2 weights"),
        (lambda: bounded_normalize([0.0, 2.0], [1, 1]), "weights of turns with tokens must be finite and > 0"),
        (lambda: bounded_normalize([NAN, 2.0], [1, 1]), "weights of turns with tokens must be finite and > 0"),
        (lambda: bounded_normalize([1.0, 2.0], [1, 1], eps=1.0), "eps must satisfy 0 <= eps < 1, got 1.0"),
        (lambda: bounded_normalize([1.0, 2.0], [1, 1], eps=-0.1), "eps must satisfy 0 <= eps < 1, got -0.1"),
    ],
    ids=["2-D weights", "too few counts", "zero weight", "nan weight", "eps 1", "negative eps"],
)
def test_bounded_normalize_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """The message names the weights, the counts or eps, with the shape, lengths or value."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


# --------------------------------------------------------------------------------------------------------------
# gibbs_weights


def test_gibbs_weights_take_token_counts_as_a_tensor() -> None:
    """The worked example above (n = [2, 2, 4], spans {0, 1}, {2}, e = [ln 3, 0, 0],
    temp 1, eps 0.5 -> w = [1.5, 0.7554237, 0.8722882]) with n as an integer tensor."""
    w = gibbs_weights([math.log(3.0), 0.0, 0.0], torch.tensor([2, 2, 4]), [(0, 2), (2, 3)])
    assert w.tolist() == pytest.approx([1.5, 0.7554237, 0.8722882], abs=1e-7)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: gibbs_weights([[1.0, 2.0]], [1, 1], [(0, 2)]), "evidence must be 1-D, got shape (1, 2)"),
        (lambda: gibbs_weights([NAN, 1.0], [1, 1], [(0, 2)]), "evidence must be finite"),
        (lambda: gibbs_weights([0.5, 1.0], [1, 1], [(0, 2)], eps=1.5), "eps must satisfy 0 <= eps < 1, got 1.5"),
        (
            lambda: gibbs_weights([0.5, 1.0], [1, 1], [(0, 2)], temperature=-1.0),
            "temperature must be a number > 0, got -1.0",
        ),
        # all evidence 0: the early return to all ones still checks every argument
        (
            lambda: gibbs_weights([0.0, 0.0], [1, 1], [(0, 2)], temperature=0.0),
            "temperature must be a number > 0, got 0.0",
        ),
        (
            lambda: gibbs_weights([0.0, 0.0], [1, 1], [(0, 2)], temperature=-INF),
            "temperature must be a number > 0, got -inf",
        ),
        (lambda: gibbs_weights([0.0, 0.0], [1], [(0, 2)]), "1 token counts for 2 turns"),
        (lambda: gibbs_weights([0.0, 0.0], [1, -1], [(0, 2)]), "token counts must be >= 0, got [1, -1]"),
        (
            lambda: gibbs_weights([0.0, 0.0, 0.0], [1, 1, 1], [(0, 1), (2, 3)]),
            "spans must be a contiguous partition of [0, 3), got [(0, 1), (2, 3)]",
        ),
        (
            lambda: gibbs_weights([0.0, 0.0, 0.0], [1, 1, 1], [(0, 2)]),
            "spans must be a contiguous partition of [0, 3), got [(0, 2)]",
        ),
    ],
    ids=[
        "2-D evidence",
        "nan evidence",
        "eps above 1",
        "negative temperature",
        "zero evidence, zero temperature",
        "zero evidence, -inf temperature",
        "zero evidence, too few counts",
        "zero evidence, negative count",
        "zero evidence, gap in spans",
        "zero evidence, short spans",
    ],
)
def test_gibbs_weights_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """Every refused argument is named with its value or shape, whether or not some evidence is nonzero."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


def test_span_evidence_leaves_out_a_tokenless_turn_even_when_its_placeholder_is_not_finite() -> None:
    """Turns 0 and 2 have tokens (evidence 0.2 and 0.4), turn 1 none and a NaN placeholder: E = (0.2 + 0.4) / 2."""
    e = span_evidence([0.2, float("nan"), 0.4], [(0, 3)], token_counts=[3, 0, 1])
    assert e.tolist() == pytest.approx([0.3], abs=1e-12)
