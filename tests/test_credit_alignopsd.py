"""AlignOPSD credit math (this package's reconstruction; see ``taspo_trl.credit.alignopsd``): property tests for
correspondence, rectification, spans, evidence and the bounded hierarchical allocation, plus hand-computed
worked examples."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from taspo_trl.credit.alignopsd import (
    TurnCorrespondence,
    adaptive_threshold,
    align_trajectory,
    align_turn,
    alignopsd_token_weights,
    alignopsd_weights,
    allocation_spans,
    bounded_normalize,
    correspondence_distribution,
    correspondence_shift,
    correspondence_shifts,
    hierarchical_weights,
    match_quality,
    neutral_measure,
    random_spans,
    rectified_gap,
    rectified_turn_gaps,
    reweighted_advantages,
    segment_spans,
    source_weights,
    span_evidence,
    token_gap,
    turn_evidence,
    turn_evidences,
    turn_spans,
)

PROPS = settings(max_examples=100, deadline=None)
TOL = 1e-9
F64 = torch.float64

unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
cos_st = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False)
evid_st = st.floats(min_value=-4.0, max_value=4.0, allow_nan=False)
temp_st = st.floats(min_value=0.05, max_value=10.0)
eps_st = st.floats(min_value=0.0, max_value=0.95)
nonzero_adv = st.floats(min_value=-10.0, max_value=10.0, allow_nan=False).filter(lambda a: abs(a) > 1e-6)


@st.composite
def length_limits(draw):
    lo = draw(st.integers(min_value=1, max_value=3))
    hi = draw(st.one_of(st.none(), st.integers(min_value=2 * lo - 1, max_value=2 * lo + 3)))
    return lo, hi


@st.composite
def trajectory(draw, max_turns=8):
    """Evidence, token counts (some turns empty), spans within limits."""
    T = draw(st.integers(min_value=1, max_value=max_turns))
    e = draw(st.lists(evid_st, min_size=T, max_size=T))
    n = draw(st.lists(st.integers(min_value=0, max_value=6), min_size=T, max_size=T))
    assume(sum(n) > 0)
    lo, hi = draw(length_limits())
    spans = random_spans(T, random.Random(draw(st.integers(0, 10_000))), lo, hi)
    return torch.tensor(e, dtype=F64), n, spans


def assert_partition(spans, T, lo=1, hi=None):
    assert spans[0][0] == 0 and spans[-1][1] == T
    for (s, e), (s2, _) in zip(spans, spans[1:]):
        assert e == s2
    for s, e in spans:
        assert e > s
        if T >= lo:
            assert e - s >= lo
        if hi is not None:
            assert e - s <= max(hi, lo if T < lo else hi)


def tok_mean(w, n):
    n = torch.tensor(n, dtype=F64)
    return float((n * w).sum()), float(n.sum())


# ---------------------------------------------------------------------------------------------------------------
# Spans: contiguous partitions within the limits


@PROPS
@given(
    d=st.lists(st.one_of(unit, st.just(float("nan"))), min_size=0, max_size=15),
    thr=unit,
    limits=length_limits(),
)
def test_segment_spans_partition_within_limits(d, thr, limits):
    lo, hi = limits
    spans = segment_spans(d, thr, min_len=lo, max_len=hi)
    assert_partition(spans, len(d) + 1, lo, hi)


@PROPS
@given(d=st.lists(unit, min_size=0, max_size=15), thr=unit)
def test_segment_spans_unconstrained_cut_exactly_at_candidates(d, thr):
    spans = segment_spans(d, thr)
    starts = [s for s, _ in spans[1:]]
    assert starts == [t for t in range(1, len(d) + 1) if d[t - 1] > thr]  # strict: D_t > threshold


def _brute_force_score(d, thr, lo, hi, T):
    best = None
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, T), r) for r in range(T)):
        bounds = (0, *cuts, T)
        lengths = [b - a for a, b in zip(bounds, bounds[1:])]
        if any(n < lo or (hi is not None and n > hi) for n in lengths):
            continue
        cand = [c for c in cuts if d[c - 1] > thr]
        score = (-(len(cuts) - len(cand)), len(cand), sum(d[c - 1] for c in cuts))
        best = score if best is None or score > best else best
    return best


@settings(max_examples=60, deadline=None)
@given(d=st.lists(unit, min_size=1, max_size=8), thr=unit, limits=length_limits())
def test_segment_spans_is_optimal_under_limits(d, thr, limits):
    # The DP's lexicographic objective (fewest forced boundaries, most candidates kept, largest total D) checked
    # against enumerating every partition.
    lo, hi = limits
    T = len(d) + 1
    assume(T >= lo)
    spans = segment_spans(d, thr, min_len=lo, max_len=hi)
    cuts = [s for s, _ in spans[1:]]
    cand = [c for c in cuts if d[c - 1] > thr]
    got = (-(len(cuts) - len(cand)), len(cand), sum(d[c - 1] for c in cuts))
    best = _brute_force_score(d, thr, lo, hi, T)
    assert got[:2] == best[:2] and got[2] == pytest.approx(best[2], abs=1e-12)


def test_segment_spans_edge_cases():
    assert segment_spans([], 0.5) == [(0, 1)]
    assert segment_spans([], 0.5, num_turns=0) == []
    assert segment_spans([0.9], 0.5, min_len=3, max_len=5) == [(0, 2)]  # T < min_len: one span
    assert segment_spans([0.5, 0.6], 0.5) == [(0, 2), (2, 3)]  # D equal to the threshold is no boundary
    # Candidates at 1 and 2 with min_len 2: only one survives; the higher total D (cut at 2) wins the tie.
    assert segment_spans([0.7, 0.9, 0.0, 0.0], 0.5, min_len=2) == [(0, 2), (2, 5)]
    # No candidate but max_len 2 on 5 turns: two forced boundaries, placed at the largest D.
    assert segment_spans([0.1, 0.3, 0.2, 0.4], 0.5, max_len=2) == [(0, 2), (2, 4), (4, 5)]
    with pytest.raises(ValueError):
        segment_spans([0.1], 0.5, min_len=3, max_len=4)  # max < 2 min - 1
    with pytest.raises(ValueError):
        segment_spans([0.1], 0.5, num_turns=5)


@PROPS
@given(T=st.integers(min_value=0, max_value=30), limits=length_limits(), seed=st.integers(0, 10_000))
def test_random_spans_partition_within_limits_and_reproducible(T, limits, seed):
    lo, hi = limits
    spans = random_spans(T, random.Random(seed), lo, hi)
    if T == 0:
        assert spans == []
    else:
        assert_partition(spans, T, lo, hi)
    assert spans == random_spans(T, random.Random(seed), lo, hi)


def test_turn_spans_and_allocation_modes():
    assert turn_spans(3) == [(0, 1), (1, 2), (2, 3)]
    assert allocation_spans("turn", 2) == [(0, 1), (1, 2)]
    assert allocation_spans("adaptive", 3, shifts=[0.1, 0.9], threshold=0.5) == [(0, 2), (2, 3)]
    assert allocation_spans("random", 4, rng=random.Random(1)) == random_spans(4, random.Random(1))
    for bad in (dict(mode="token"), dict(mode="nope"), dict(mode="adaptive"), dict(mode="random")):
        with pytest.raises(ValueError):
            allocation_spans(num_turns=3, **bad)


@PROPS
@given(
    p=st.lists(unit, min_size=1, max_size=6).flatmap(
        lambda p: st.tuples(st.just(p), st.lists(unit, min_size=len(p), max_size=len(p)))
    )
)
def test_correspondence_shift_range_symmetry_and_empty_convention(p):
    a, b = (torch.tensor(x, dtype=F64) for x in p)
    d = correspondence_shift(a, b)
    assert 0.0 <= d <= 1.0 and d == pytest.approx(correspondence_shift(b, a), abs=1e-12)
    zero = torch.zeros_like(a)
    if float(a.sum()) > 0:
        assert correspondence_shift(a, a) == pytest.approx(0.0, abs=1e-12)
        assert correspondence_shift(a, 3.0 * a) == pytest.approx(0.0, abs=1e-12)  # scale-free
        assert correspondence_shift(zero, a) == 1.0 and correspondence_shift(a, zero) == 1.0
    assert correspondence_shift(zero, zero) == 0.0


def test_adaptive_threshold_pools_the_batch():
    # values 0.1, 0.3 | 0.2 | (none): mean 0.2, population std sqrt((0.01 + 0.01 + 0)/3) = 0.0816497
    assert adaptive_threshold([[0.1, 0.3], [0.2], []]) == pytest.approx(0.2 + math.sqrt(0.02 / 3), abs=1e-12)
    assert adaptive_threshold([[0.1, 0.3], [0.2]], num_std=0.0) == pytest.approx(0.2, abs=1e-12)
    assert adaptive_threshold([[], []]) == math.inf
    assert correspondence_shifts(torch.zeros(1, 3)).numel() == 0


# ---------------------------------------------------------------------------------------------------------------
# Bounded normalisation and the allocation guarantees


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
    w = alignopsd_weights(e, n, spans, temperature=temp, eps=eps)
    assert w.dtype == F64 and w.shape == e.shape
    assert bool((w > 0).all())
    assert bool((w >= 1 - eps - 1e-12).all()) and bool((w <= 1 + eps + 1e-12).all())
    a_tilde = reweighted_advantages(adv, w)
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
    w = alignopsd_weights(zero, n, spans, temperature=temp, eps=eps)
    assert w.tolist() == [1.0] * len(n)  # exact, not approximate


@PROPS
@given(
    g0=st.lists(st.lists(evid_st, min_size=0, max_size=4), min_size=1, max_size=5),
    adv=st.one_of(st.just(0.0), nonzero_adv),
    temp=temp_st,
)
def test_no_match_anywhere_is_identity_and_zero_evidence_is_grpo(g0, adv, temp):
    # No source kept for any turn -> rectification is the identity, exactly.
    locals_ = [torch.tensor(g, dtype=F64) for g in g0]
    for g in locals_:
        c = align_turn([0.1, 0.2], ["a", "b"])  # nothing passes the 0.7 threshold
        assert c.is_identity and c.quality == 0.0
        assert torch.equal(rectified_gap(g, None, c.weights, c.quality), g)
    # With an all-zero local gap (or A = 0) the evidence is zero and every weight is exactly 1 (GRPO).
    n = [len(g) for g in g0]
    assume(sum(n) > 0)
    zero_gaps = [torch.zeros(len(g), dtype=F64) for g in g0]
    e = turn_evidences(zero_gaps, adv)
    assert e.tolist() == [0.0] * len(n)
    assert alignopsd_weights(e, n, turn_spans(len(n)), temperature=temp).tolist() == [1.0] * len(n)
    e0 = turn_evidences(locals_, 0.0)
    assert alignopsd_weights(e0, n, turn_spans(len(n))).tolist() == [1.0] * len(n)


@PROPS
@given(traj=trajectory(), eps=eps_st)
def test_infinite_temperature_gives_uniform_weights(traj, eps):
    e, n, spans = traj
    assert alignopsd_weights(e, n, spans, temperature=math.inf, eps=eps).tolist() == [1.0] * len(n)
    w = alignopsd_weights(e, n, spans, temperature=1e9, eps=eps)
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
    w = alignopsd_weights(e, n, spans, temperature=temp, eps=eps)
    a_tilde = reweighted_advantages(adv, w)
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


@PROPS
@given(
    gaps=st.lists(st.one_of(st.none(), st.lists(evid_st, min_size=0, max_size=5)), min_size=1, max_size=5),
    adv=st.one_of(st.just(0.0), nonzero_adv),
    temp=temp_st,
    eps=eps_st,
)
def test_token_level_allocation(gaps, adv, temp, eps):
    ws = alignopsd_token_weights(gaps, adv, temperature=temp, eps=eps)
    assert [w.numel() for w in ws] == [0 if g is None else len(g) for g in gaps]
    flat = torch.cat(ws)
    if flat.numel() == 0:
        return
    assert bool((flat >= 1 - eps - 1e-12).all()) and bool((flat <= 1 + eps + 1e-12).all())
    assert abs(float(flat.sum()) - flat.numel()) <= TOL * flat.numel()
    g = torch.cat([torch.tensor(x, dtype=F64) for x in gaps if x])
    # The closed form equals the generic allocator with every token a one-token span.
    e = math.copysign(1.0, adv) * g if adv != 0 else torch.zeros_like(g)
    generic = alignopsd_weights(e, [1] * e.numel(), turn_spans(e.numel()), temperature=temp, eps=eps)
    assert torch.allclose(flat, generic, atol=1e-12, rtol=0)
    if adv == 0 or bool((g == 0).all()):
        assert flat.tolist() == [1.0] * flat.numel()
    else:  # monotone in the token's own evidence sign(A) g~_k
        e = math.copysign(1.0, adv) * g
        order = torch.argsort(e)
        assert bool((flat[order][1:] >= flat[order][:-1] - 1e-12).all())


def test_token_level_non_finite_gap_is_zero_evidence():
    # tokens: e = [ln 3, 0 (NaN), 0]; raw w = exp(e) / mean exp(e) = [3, 1, 1] / (5/3) = [1.8, 0.6, 0.6];
    # eps = 0.5: 1.8 clips to 1.5, the other two share the rest: 0.75 each (scale 1.25; sum = 3).
    ws = alignopsd_token_weights([[math.log(3.0), float("nan")], [0.0]], 1.0, temperature=1.0, eps=0.5)
    assert ws[0].tolist() == pytest.approx([1.5, 0.75], abs=1e-12)
    assert ws[1].tolist() == pytest.approx([0.75], abs=1e-12)


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
    assert w.tolist() == pytest.approx(alignopsd_weights(e, HAND_N, HAND_SPANS, 1.0, 0.5).tolist(), abs=0)
    a_tilde = reweighted_advantages(2.0, w)
    assert a_tilde.tolist() == pytest.approx(HAND_A_TILDE, abs=1e-6)
    assert float((torch.tensor(HAND_N, dtype=F64) * a_tilde).sum()) / 8 == pytest.approx(2.0, abs=1e-12)


def test_worked_example_from_gaps_for_a_failed_trajectory():
    # A < 0: e_t = -mean g~. Gaps [-ln3, -ln3], [0.2, -0.2], [0, 0, 0, 0] -> e = [ln 3, 0, 0]: the same weights as
    # above. The first turn, which the teacher disfavours most, takes the most blame: A~ = -1 * w.
    gaps = [[-math.log(3.0)] * 2, [0.2, -0.2], [0.0] * 4]
    e = turn_evidences(gaps, -1.0)
    assert e.tolist() == pytest.approx(HAND_E, abs=1e-15)
    w = alignopsd_weights(e, HAND_N, HAND_SPANS)
    assert (-1.0 * w).tolist() == pytest.approx([-x for x in HAND_W], abs=1e-7)


def test_turn_evidence_conventions():
    assert turn_evidence([0.2, 0.4], 3.0) == pytest.approx(0.3)
    assert turn_evidence([0.2, 0.4], -0.5) == pytest.approx(-0.3)
    assert turn_evidence([0.2, 0.4], 0.0) == 0.0
    assert turn_evidence([], 1.0) == 0.0  # no optimised token
    assert turn_evidence([float("nan"), float("inf")], 1.0) == 0.0  # no finite value
    assert turn_evidence([0.2, float("nan"), 0.4], 1.0) == pytest.approx(0.3)  # non-finite values left out
    assert turn_evidence([0.2, 9.0, 0.4], 1.0, mask=[True, False, True]) == pytest.approx(0.3)
    assert turn_evidences([None, [1.0]], 1.0).tolist() == [0.0, 1.0]
    # Span evidence leaves out turns without tokens when counts are given.
    assert span_evidence([0.0, 0.6], [(0, 2)], token_counts=[0, 3]).tolist() == pytest.approx([0.6])
    assert span_evidence([0.0, 0.6], [(0, 2)]).tolist() == pytest.approx([0.3])


def test_turns_without_tokens_keep_weight_one():
    w = alignopsd_weights([0.0, 2.0, -1.0, 0.5], [0, 3, 2, 0], [(0, 2), (2, 4)], eps=0.4)
    assert w[0].item() == 1.0 and w[3].item() == 1.0
    assert 3 * w[1].item() + 2 * w[2].item() == pytest.approx(5.0, abs=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": 0.0}, {"temperature": -1.0}, {"temperature": float("nan")}, {"eps": 1.0}, {"eps": -0.1}],
)
def test_invalid_hyperparameters_raise_even_with_zero_evidence(kwargs):
    for e in ([0.3, -0.1], [0.0, 0.0]):
        with pytest.raises(ValueError):
            alignopsd_weights(e, [1, 1], [(0, 2)], **kwargs)


def test_invalid_spans_raise():
    for spans in ([(0, 1)], [(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 0), (0, 3)]):
        with pytest.raises(ValueError):
            alignopsd_weights([0.1, 0.2, 0.3], [1, 1, 1], spans)


# ---------------------------------------------------------------------------------------------------------------
# Correspondence


@st.composite
def candidates(draw):
    S = draw(st.integers(min_value=0, max_value=10))
    sims = draw(st.lists(cos_st, min_size=S, max_size=S))
    rollouts = draw(st.lists(st.integers(0, 3), min_size=S, max_size=S))
    valid = draw(st.lists(st.booleans(), min_size=S, max_size=S))
    action = draw(st.lists(cos_st, min_size=S, max_size=S))
    parsed = draw(st.lists(st.booleans(), min_size=S, max_size=S))
    same_op = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=S, max_size=S)))
    return sims, rollouts, valid, action, parsed, same_op


def _reference_selection(sims, rollouts, valid, consistent, thr, k, before):
    """Selection restated from the spec with plain Python (tie rule: higher similarity, then lower column)."""
    pool = [j for j in range(len(sims)) if valid[j] and sims[j] >= thr and (consistent[j] or not before)]
    best = {}
    for j in pool:
        r = rollouts[j]
        if r not in best or (sims[j], -j) > (sims[best[r]], -best[r]):
            best[r] = j
    top = sorted(best.values(), key=lambda j: (-sims[j], j))[:k]
    return top if before else [j for j in top if consistent[j]]


@PROPS
@given(
    cand=candidates(),
    thr=st.floats(min_value=-0.5, max_value=0.95),
    k=st.integers(min_value=1, max_value=4),
    weighting=st.sampled_from(["proportional", "softmax"]),
    mode=st.sampled_from(["after_top_k", "before_selection"]),
)
def test_correspondence_filters(cand, thr, k, weighting, mode):
    sims, rollouts, valid, action, parsed, same_op = cand
    c = align_turn(
        sims,
        rollouts,
        valid,
        action_similarity=action,
        actions_parsed=parsed,
        same_operation=same_op,
        threshold=thr,
        top_k=k,
        weighting=weighting,
        action_filter=mode,
    )
    consistent = [parsed[j] and action[j] >= 0.8 and (same_op is None or same_op[j]) for j in range(len(sims))]
    assert list(c.sources) == _reference_selection(sims, rollouts, valid, consistent, thr, k, mode != "after_top_k")
    kept = list(c.sources)
    assert len(kept) <= k and len({rollouts[j] for j in kept}) == len(kept)  # top-k, one per sibling
    assert all(valid[j] and sims[j] >= thr and consistent[j] for j in kept)  # threshold, action filter
    assert 0.0 <= c.quality <= 1.0
    if kept:
        assert abs(float(c.weights.sum()) - 1.0) < 1e-12 and bool((c.weights >= 0).all())
        assert c.column[kept].tolist() == c.weights.tolist() and float(c.column.sum()) == pytest.approx(1.0)
        assert c.quality <= len(kept) / k + 1e-12  # coverage factor
    else:
        assert c.is_identity and c.quality == 0.0 and c.weights.numel() == 0 and not bool(c.column.any())
    # c_t covers ALL structurally valid sources (before threshold / top-k): zero exactly on invalid ones.
    dist = c.distribution
    assert all(dist[j].item() == 0.0 for j in range(len(sims)) if not valid[j])
    if any(valid):
        assert float(dist.sum()) == pytest.approx(1.0, abs=1e-12) and bool((dist[valid] > 0).all())
    else:
        assert not bool(dist.any())


def test_correspondence_rules_one_by_one():
    sims, roll = [0.95, 0.9, 0.8, 0.75, 0.69], ["b", "b", "c", "d", "e"]
    # threshold 0.7 drops 0.69; one per sibling drops col 1; top-2 keeps cols 0 and 2.
    assert align_turn(sims, roll).sources == (0, 2)
    assert align_turn(sims, roll, top_k=5).sources == (0, 2, 3)
    assert align_turn(sims, roll, threshold=0.5, top_k=5).sources == (0, 2, 3, 4)
    # A similarity equal to the threshold is kept.
    assert align_turn([0.7], ["b"]).sources == (0,)
    # Structural mask and the target's own rollout.
    assert align_turn(sims, roll, [False, True, True, True, True]).sources == (1, 2)
    assert align_turn(sims, roll, target_rollout="b").sources == (2, 3)
    # Action filter after top-k: col 0's action disagrees -> only col 2 left, coverage 1/2.
    act = [0.5, 0.9, 0.85, 0.9, 0.9]
    c = align_turn(sims, roll, action_similarity=act)
    assert c.sources == (2,) and c.weights.tolist() == [1.0] and c.quality == pytest.approx(0.8 * 0.5)
    # ... or as part of eligibility: col 1 (same sibling "b") replaces col 0.
    assert align_turn(sims, roll, action_similarity=act, action_filter="before_selection").sources == (1, 2)
    # Parse failure and WebShop exact checks.
    assert align_turn(sims, roll, actions_parsed=[True, True, False, True, True]).sources == (0,)
    assert align_turn(sims, roll, same_operation=[False, True, True, True, True]).sources == (2,)
    assert align_turn(sims, roll, same_click_target=[True, True, False, True, True]).sources == (0,)
    # Nothing at all.
    empty = align_turn([], [])
    assert empty.is_identity and empty.quality == 0.0 and empty.distribution.numel() == 0
    # Ties: equal similarity -> lower column first, also within one sibling.
    assert align_turn([0.8, 0.8, 0.8], ["b", "b", "c"]).sources == (0, 2)


def test_source_weights_and_quality():
    assert source_weights([0.9, 0.9]).tolist() == [0.5, 0.5]
    assert source_weights([0.8, 0.6]).tolist() == pytest.approx([4 / 7, 3 / 7], abs=1e-15)
    # softmax at temperature 0.1: weights e^9, e^8 -> [1/(1 + e^-1), e^-1/(1 + e^-1)] = [0.7310586, 0.2689414]
    assert source_weights([0.9, 0.8], "softmax", 0.1).tolist() == pytest.approx([0.7310586, 0.2689414], abs=1e-7)
    assert source_weights([-0.2, 0.0]).tolist() == [0.5, 0.5]  # no positive score: uniform
    assert source_weights([]).numel() == 0
    assert match_quality([], [], 2) == 0.0
    assert match_quality([0.8], [1.0], 2) == pytest.approx(0.4)
    assert match_quality([-0.5], [1.0], 1) == 0.0  # clipped into [0, 1]
    with pytest.raises(ValueError):
        match_quality([0.8, 0.9, 0.7], [0.3, 0.3, 0.4], 2)


def test_correspondence_distribution_modes():
    c = correspondence_distribution([0.2, 0.9, 0.5], [True, False, True], profile="proportional")
    assert c.tolist() == pytest.approx([0.2 / 0.7, 0.0, 0.5 / 0.7], abs=1e-15)
    # softmax at 0.1 over {0.2, 0.5}: [1, e^3] / (1 + e^3) = [0.0474259, 0.9525741]
    c = correspondence_distribution([0.2, 0.9, 0.5], [True, False, True])
    assert c.tolist() == pytest.approx([0.0474259, 0.0, 0.9525741], abs=1e-7)
    assert correspondence_distribution([0.3, float("nan")]).tolist() == [1.0, 0.0]  # non-finite = invalid


# ---------------------------------------------------------------------------------------------------------------
# Rectified gap


@PROPS
@given(
    L=st.integers(min_value=0, max_value=6),
    k=st.integers(min_value=1, max_value=3),
    lam=unit,
    data=st.data(),
)
def test_rectified_gap_is_a_convex_mix(L, k, lam, data):
    g0 = torch.tensor(data.draw(st.lists(evid_st, min_size=L, max_size=L)), dtype=F64)
    gj = torch.tensor(
        data.draw(st.lists(st.lists(evid_st, min_size=L, max_size=L), min_size=k, max_size=k)), dtype=F64
    ).reshape(k, L)
    w = source_weights(data.draw(st.lists(st.floats(0.7, 1.0), min_size=k, max_size=k)))
    g = rectified_gap(g0, gj, w, lam)
    stacked = torch.cat([g0[None], gj])
    assert bool((g >= stacked.min(0).values - 1e-12).all()) and bool((g <= stacked.max(0).values + 1e-12).all())
    assert torch.equal(rectified_gap(g0, gj, w, 0.0), g0)
    assert torch.allclose(rectified_gap(g0, gj, w, 1.0), (w[:, None] * gj).sum(0), atol=1e-12, rtol=0)


def test_rectified_gap_identity_ignores_non_finite_unused_views():
    g0 = torch.tensor([0.1, -0.2], dtype=F64)
    bad = torch.tensor([[float("inf"), float("nan")]], dtype=F64)
    assert torch.equal(rectified_gap(g0, bad, torch.ones(1, dtype=F64), 0.0), g0)
    assert torch.equal(rectified_gap(g0, [], torch.zeros(0), 0.0), g0)
    assert torch.equal(rectified_gap(g0), g0)
    with pytest.raises(ValueError):
        rectified_gap(g0, bad, torch.ones(1, dtype=F64), 1.5)
    assert token_gap([-1.0, -2.0], [-1.5, -1.0]).tolist() == [0.5, -1.0]


def _match(sources: tuple[int, ...], weights: list[float], quality: float) -> TurnCorrespondence:
    w = torch.tensor(weights, dtype=F64)
    unused = torch.zeros(3, dtype=F64)  # c_t and the column play no part in rectification
    return TurnCorrespondence(sources, w, torch.ones(len(sources), dtype=F64), quality, unused, unused)


def test_rectified_turn_gaps_by_hand():
    # Turn 0 kept nothing (identity), turn 1 kept columns 0 and 2 with W = (1/4, 3/4) and lambda = 1/2, turn 2 was
    # not scored. Turn 1: 1/2 [1, 2] + 1/2 (1/4 [3, 3] + 3/4 [-1, 1]) = [0.5, 1] + 1/2 [0, 1.5] = [0.5, 1.75].
    matches = [_match((), [], 0.0), _match((0, 2), [0.25, 0.75], 0.5), _match((1,), [1.0], 0.9)]
    g0 = [torch.tensor([0.3], dtype=F64), torch.tensor([1.0, 2.0], dtype=F64), None]
    aligned = {(1, 0): torch.tensor([3.0, 3.0], dtype=F64), (1, 2): torch.tensor([-1.0, 1.0], dtype=F64)}
    got = rectified_turn_gaps(matches, g0, aligned)
    assert got[0].tolist() == [0.3] and got[1].tolist() == [0.5, 1.75] and got[2] is None
    # Rectification off (the ablation): every turn keeps g0, and no aligned gap is needed.
    off = rectified_turn_gaps(matches, g0, None)
    assert off[0].tolist() == [0.3] and off[1].tolist() == [1.0, 2.0] and off[2] is None


# ---------------------------------------------------------------------------------------------------------------
# Hand-built correspondence example: target rollout 0 (4 turns) against siblings 1 (3 turns) and 2 (2 turns).
#
# Columns: 0..2 = rollout 1 turns a0..a2, 3..4 = rollout 2 turns b0..b1. Threshold 0.7, top-k 2, proportional W.
#   t0 sims [0.90, 0.50, 0.20, 0.80, 0.30]: eligible a0 (0.90), b0 (0.80) -> kept (0, 3),
#      W = [0.9, 0.8]/1.7 = [0.5294118, 0.4705882], lambda = (0.81 + 0.64)/1.7 * 2/2 = 29/34 = 0.8529412
#   t1 sims [0.85, 0.75, 0.10, 0.80, 0.40]: a0 0.85 beats a1 0.75 (one per sibling); b0 0.80 -> kept (0, 3),
#      W = [0.85, 0.80]/1.65 = [0.5151515, 0.4848485], lambda = (0.7225 + 0.64)/1.65 = 0.8257576
#   t2 sims [0.20, 0.30, 0.90, 0.10, 0.95]: kept (4, 2) (best first),
#      W = [0.95, 0.90]/1.85 = [0.5135135, 0.4864865], lambda = (0.9025 + 0.81)/1.85 = 0.9256757
#   t3 sims [0.60, 0.50, 0.65, 0.40, 0.55]: nothing >= 0.7 -> identity, lambda 0
# Spans with proportional c_t (cosine is scale-free, so cos(c_t, c_t-1) = cos of the raw similarity rows):
#   D1 = 1 - 1.92 / sqrt(1.83 * 2.095)      = 1 - 0.980581 = 0.019419
#   D2 = 1 - 0.945 / sqrt(2.095 * 1.8525)   = 1 - 0.479690 = 0.520310
#   D3 = 1 - 1.4175 / sqrt(1.8525 * 1.495)  = 1 - 0.851772 = 0.148228
#   this trajectory alone: mean 0.229319, population std 0.212375 -> threshold 0.441694: only D2 is above
#   -> spans [(0, 2), (2, 4)]. Pooled with a second trajectory's shifts [0, 0]: mean 0.137591, std 0.199206,
#   threshold 0.336797 -> the same spans.
# Rectified gap of t0 with g0 = [0.2, -0.1], g_a0 = [0.5, 0.1], g_b0 = [-0.3, 0.4]:
#   sum W g = [(0.45 - 0.24)/1.7, (0.09 + 0.32)/1.7] = [0.1235294, 0.2411765]
#   g~ = (5/34) g0 + (29/34) sum W g = [1/34 + 0.1053633, -0.5/34 + 0.2057093] = [0.1347751, 0.1910035]

EX_SIMS = [
    [0.90, 0.50, 0.20, 0.80, 0.30],
    [0.85, 0.75, 0.10, 0.80, 0.40],
    [0.20, 0.30, 0.90, 0.10, 0.95],
    [0.60, 0.50, 0.65, 0.40, 0.55],
]
EX_ROLLOUTS = [1, 1, 1, 2, 2]


def test_hand_built_correspondence_example():
    result = align_trajectory(torch.tensor(EX_SIMS, dtype=F64), EX_ROLLOUTS, profile="proportional")
    assert [c.sources for c in result] == [(0, 3), (0, 3), (4, 2), ()]
    assert result[0].weights.tolist() == pytest.approx([0.5294118, 0.4705882], abs=1e-7)
    assert result[1].weights.tolist() == pytest.approx([0.5151515, 0.4848485], abs=1e-7)
    assert result[2].weights.tolist() == pytest.approx([0.5135135, 0.4864865], abs=1e-7)
    assert [c.quality for c in result] == pytest.approx([29 / 34, 0.8257576, 0.9256757, 0.0], abs=1e-7)
    assert result[3].quality == 0.0
    assert result[2].column.tolist() == pytest.approx([0.0, 0.0, 0.4864865, 0.0, 0.5135135], abs=1e-7)

    shifts = correspondence_shifts(torch.stack([c.distribution for c in result]))
    assert shifts.tolist() == pytest.approx([0.019419, 0.520310, 0.148228], abs=1e-6)
    thr = adaptive_threshold([shifts])
    assert thr == pytest.approx(0.441694, abs=1e-6)
    assert segment_spans(shifts, thr) == [(0, 2), (2, 4)]
    pooled = adaptive_threshold([shifts, torch.zeros(2, dtype=F64)])
    assert pooled == pytest.approx(0.336797, abs=1e-6)
    assert segment_spans(shifts, pooled) == [(0, 2), (2, 4)]

    g = rectified_gap([0.2, -0.1], [[0.5, 0.1], [-0.3, 0.4]], result[0].weights, result[0].quality)
    assert g.tolist() == pytest.approx([0.1347751, 0.1910035], abs=1e-7)
    assert torch.equal(
        rectified_gap([0.2, -0.1], [], result[3].weights, result[3].quality), torch.tensor([0.2, -0.1], dtype=F64)
    )


def test_align_trajectory_shapes():
    sims = torch.tensor(EX_SIMS, dtype=F64)
    shared = align_trajectory(sims, EX_ROLLOUTS, valid=torch.tensor([True, True, True, False, True]))
    per_turn = align_trajectory(sims, EX_ROLLOUTS, valid=torch.tensor([[True, True, True, False, True]] * 4))
    assert [c.sources for c in shared] == [c.sources for c in per_turn] == [(0,), (0,), (4, 2), ()]
    with pytest.raises(ValueError):
        align_trajectory(sims, EX_ROLLOUTS, valid=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError):
        align_trajectory(sims, EX_ROLLOUTS[:4])
    with pytest.raises(ValueError):
        align_trajectory(sims[0], EX_ROLLOUTS)


def test_hand_built_example_action_filter_and_top1():
    # t1 with b0's action inconsistent (cosine 0.5): after top-k, b0 is dropped -> (0,), W = [1], lambda = 0.85/2.
    act = torch.ones(4, 5, dtype=F64)
    act[1, 3] = 0.5
    result = align_trajectory(torch.tensor(EX_SIMS, dtype=F64), EX_ROLLOUTS, action_similarity=act)
    assert result[1].sources == (0,) and result[1].weights.tolist() == [1.0]
    assert result[1].quality == pytest.approx(0.425, abs=1e-12)
    # top-1 with a0's action inconsistent for t1: after top-k -> identity; before selection -> b0 (0.80), since
    # a1 (0.75) is below b0.
    act = torch.ones(5, dtype=F64)
    act[0] = 0.5
    after = align_trajectory(torch.tensor(EX_SIMS, dtype=F64), EX_ROLLOUTS, action_similarity=act, top_k=1)
    before = align_trajectory(
        torch.tensor(EX_SIMS, dtype=F64),
        EX_ROLLOUTS,
        action_similarity=act,
        top_k=1,
        action_filter="before_selection",
    )
    assert [c.sources for c in after] == [(), (), (4,), ()]
    assert [c.sources for c in before] == [(3,), (3,), (4,), ()]
    assert after[1].quality == 0.0 and before[1].quality == pytest.approx(0.8, abs=1e-12)
