"""Parity of ``taspo_trl.credit.alignopsd`` with the official AlignOPSD code (``mingju-c/Align-OPSD``).

One case or more per stage. Each test says where its expected numbers come from:
* "official fixture": the inputs and expected values of a test in the official repository's ``tests/``
  (file and test named);
* "hand": a hand calculation of the official formula (the arithmetic is in the test);
* "property": a property the official code states or checks at run time, tested with hypothesis.
"""

from __future__ import annotations

import math
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taspo_trl.credit.alignopsd import (
    action_consistent_sources,
    adjacent_profile_distances,
    corrected_token_gap,
    correction_strength,
    correspondence_confidence,
    cosine_profile_distance,
    cross_teacher_logprobs,
    dense_profiles,
    flat_token_weights,
    flat_turn_weights,
    group_outcome_advantage,
    hierarchical_turn_weights,
    invalid_action_residual,
    mix_density,
    normalized_jsd,
    profile_distance,
    project_weighted_box_budget,
    segment_trajectory,
    segmentation_threshold,
    select_sources,
    source_weights,
    structural_eligibility,
    turn_gap,
    webshop_actions_agree,
)

close = pytest.approx


# ---------------------------------------------------------------------------------------------------------------
# Mechanism 1


def test_structural_eligibility_needs_another_rollout_and_thinking_on_both_sides():
    """Hand (official ``build_structural_mask``): rollouts [a, a, b, b]; teacher thinking missing at turn 2,
    student thinking missing at turn 1. B[s, t] = rollout differs & teacher[s] & student[t]."""
    b = structural_eligibility(["a", "a", "b", "b"], [True, True, False, True], [True, False, True, True])
    expected = [
        [False, False, True, True],  # source 0 (rollout a) -> targets of rollout b
        [False, False, True, True],
        [False, False, False, False],  # no teacher thinking at source 2
        [True, False, False, False],  # source 3 -> target 0 only (target 1 has no student thinking)
    ]
    assert b.tolist() == expected


def test_selection_threshold_rollout_cap_and_top_k():
    """Hand (official ``select_sparse_sources``): target 0 of rollout a; sources of rollouts b (0.9, 0.8), c (0.75),
    d (0.6 < tau). Threshold 0.7, one per rollout, top-2 -> [b's 0.9, c's 0.75]; top-3 -> the same two (d fails
    tau, b's 0.8 is capped out)."""
    rollouts = ["a", "b", "b", "c", "d"]
    h = torch.zeros(5, 5)
    h[1:, 0] = torch.tensor([0.9, 0.8, 0.75, 0.6])
    b = structural_eligibility(rollouts, [True] * 5, [True] * 5)
    assert select_sources(h, b, rollouts, threshold=0.7, top_k=2)[0] == (1, 3)
    assert select_sources(h, b, rollouts, threshold=0.7, top_k=3)[0] == (1, 3)
    assert select_sources(h, b, rollouts, threshold=0.95, top_k=3)[0] == ()
    # A similarity equal to the threshold is kept (>=).
    assert select_sources(h, b, rollouts, threshold=0.75, top_k=3)[0] == (1, 3)


def test_action_filter_runs_after_top_k_without_replacement():
    """Hand (official ``action_consistency_mask``): the selected pair whose actions disagree is dropped and NOT
    replaced by the next-best source, even though that one agrees."""
    actions_teacher = ["", "go to desk 1", "open drawer 2", "go to desk 1"]
    actions_student = ["go to desk 1", "", "", ""]
    action_sim = torch.eye(4)
    action_sim[1, 0], action_sim[2, 0], action_sim[3, 0] = 0.95, 0.3, 0.95
    kept = action_consistent_sources([(1, 2), (), (), ()], action_sim, actions_teacher, actions_student, 0.8)
    assert kept == [(1,), (), (), ()]
    # An empty action on either side is never consistent.
    assert action_consistent_sources([(0,), (), (), ()], torch.ones(4, 4), actions_teacher, actions_student) == [(), (), (), ()]


def test_webshop_rule_same_operation_and_identical_click_target():
    """Official fixture rule (``tests/test_action_consistency.py`` / ``action_consistency_mask(webshop=True)``):
    same operation; a click's target must be identical; a search only needs the same operation."""
    assert webshop_actions_agree("click[Buy Now]", "click[ Buy Now ]")
    assert not webshop_actions_agree("click[small]", "click[x-small]")
    assert not webshop_actions_agree("click[small]", "search[small]")
    assert webshop_actions_agree("search[red shoes]", "search[blue shirt]")
    assert not webshop_actions_agree("click[]", "click[]")
    assert not webshop_actions_agree("buy it", "click[buy now]")


def test_issue_example_one_source_alpha():
    """Hand (the issue's "Why" example): one source at s = 0.75, tau = 0.7, alpha_max = 0.8:
    omega = [1], rho = (0.75 - 0.7) / 0.3 = 1/6, alpha = 0.8 / 6 = 0.1333."""
    w = source_weights([0.75], temperature=0.1)
    assert w.tolist() == [1.0]
    rho = correspondence_confidence([0.75], w, threshold=0.7)
    assert rho == close(1 / 6)
    assert correction_strength(rho, alpha_max=0.8) == close(0.1333333, abs=1e-6)


def test_alpha_is_capped_and_zero_for_ablation_a():
    """Hand: rho <= 1 so alpha <= alpha_max; ablation A is alpha_max = 0."""
    assert correction_strength(1.0, alpha_max=0.8) == 0.8
    assert correction_strength(0.5, alpha_max=0.0) == 0.0


def _mixture_fixture():
    """Official fixture (``tests/test_rectification_probability_mixture.py``, ``AggregationTests.example``): three
    sources with token probabilities p, similarities 0.95 + 0.1 log w so that softmax(s / 0.1) = w = [.5, .3, .2]."""
    p = torch.tensor([[0.70, 0.80, 0.95], [0.10, 0.30, 0.90], [0.50, 0.70, 0.80]], dtype=torch.float64)
    w_target = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    sims = 0.95 + 0.1 * w_target.log()
    return p, w_target, sims


def test_probability_mixture_matches_official_fixture():
    """Official fixture (``test_probability_mixture_matches_hand_calculation``): exp(cross[0]) = 0.48."""
    p, w_target, sims = _mixture_fixture()
    w = source_weights(sims, temperature=0.1)
    assert torch.allclose(w, w_target)
    cross = cross_teacher_logprobs(p.log(), w, mode="probability_mixture")
    assert float(cross[0].exp()) == close(0.48, abs=1e-6)
    assert torch.allclose(cross, (w_target[:, None] * p).sum(0).log())


def test_log_mean_matches_official_fixture():
    """Official fixture (``test_legacy_option_preserves_weighted_log_formula``): exp(cross[0]) = 0.36504216."""
    p, _, sims = _mixture_fixture()
    cross = cross_teacher_logprobs(p.log(), source_weights(sims, 0.1), mode="log_mean")
    assert float(cross[0].exp()) == close(0.36504216, abs=1e-6)


def test_equal_sources_are_not_multiplied_by_k():
    """Official fixture (``test_equal_sources_do_not_multiply_scores_by_k``): k equal sources give that score."""
    score = torch.tensor([-2.0, -10000.0], dtype=torch.float64)
    for k in (1, 2, 3):
        cross = cross_teacher_logprobs(score.expand(k, 2), source_weights([1.0] * k), "probability_mixture")
        assert torch.allclose(cross, score)


def test_corrected_gap_against_recomputed_old_logprobs():
    """Official fixture (``test_probability_mixture_matches_hand_calculation``): diagonal probabilities
    [.38, .75, .92], student [.40, .80, .90]. The first token's diagonal gap is negative, the mixture's (0.48)
    positive; the corrected gap is (1 - alpha) log .38 + alpha log .48 - log .40 (hand, alpha = 0.8 / 6)."""
    p, _, sims = _mixture_fixture()
    diagonal = torch.tensor([0.38, 0.75, 0.92], dtype=torch.float64).log()
    student = torch.tensor([0.40, 0.80, 0.90], dtype=torch.float64).log()
    cross = cross_teacher_logprobs(p.log(), source_weights(sims, 0.1))
    assert float(corrected_token_gap(diagonal, student)[0]) < 0 < float(cross[0] - student[0])
    alpha = 0.8 / 6
    gap = corrected_token_gap(diagonal, student, cross, alpha)
    assert float(gap[0]) == close((1 - alpha) * math.log(0.38) + alpha * math.log(0.48) - math.log(0.40))
    # Endpoints (official ``test_zero_alpha_and_full_confidence_endpoints``): alpha 0 is the diagonal gap,
    # alpha 1 the cross gap.
    assert torch.equal(corrected_token_gap(diagonal, student, cross, 0.0), diagonal - student)
    assert torch.allclose(corrected_token_gap(diagonal, student, cross, 1.0), cross - student)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-40, 0), min_size=3, max_size=3),
    st.lists(st.floats(-40, 0), min_size=3, max_size=3),
    st.lists(st.floats(0.7, 1.0), min_size=2, max_size=2),
)
def test_probability_mixture_lies_between_sources_and_above_log_mean(a, b, sims):
    """Property (official ``test_probability_score_is_bounded_by_sources_and_above_log_mean``): the mixture lies
    between the smallest and largest source score and is >= the log-mean (Jensen)."""
    scores = torch.tensor([a, b], dtype=torch.float64)
    w = source_weights(sims, 0.1)
    mixture = cross_teacher_logprobs(scores, w, "probability_mixture")
    assert bool((mixture >= scores.min(0).values - 1e-9).all()) and bool((mixture <= scores.max(0).values + 1e-9).all())
    assert bool((mixture >= cross_teacher_logprobs(scores, w, "log_mean") - 1e-9).all())


# ---------------------------------------------------------------------------------------------------------------
# Mechanism 2: profiles, distances, threshold, spans


def test_dense_profiles_keep_sub_threshold_sources_and_threshold_sets_validity():
    """Official fixture (``tests/test_correspondence_credit.py``,
    ``test_dense_profiles_use_h_columns_and_all_eligible_sources``): target 2 has sources 0 (0.60) and 1 (0.90);
    its profile is softmax([0.6, 0.9] / 0.1) and valid (best 0.9 >= 0.7); targets 0 and 1 have none."""
    h = torch.tensor([[0.0, 0.0, 0.60], [0.0, 0.0, 0.90], [0.0, 0.0, 0.00]])
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[0, 2] = mask[1, 2] = True
    profiles, valid = dense_profiles(h, mask, threshold=0.70, temperature=0.10)
    assert torch.allclose(profiles[2, :2], torch.softmax(torch.tensor([0.60, 0.90], dtype=torch.float64) / 0.1, 0))
    assert float(profiles[2, 0]) > 0 and float(profiles[2].sum()) == close(1.0)
    assert valid.tolist() == [False, False, True]
    assert torch.equal(profiles[:2], torch.zeros(2, 3, dtype=torch.float64))


def test_profile_exists_but_is_invalid_below_threshold():
    """Official fixture (``test_profile_can_exist_but_be_invalid_on_absolute_similarity``)."""
    h = torch.tensor([[0.0, 0.3], [0.4, 0.0]])
    profiles, valid = dense_profiles(h, torch.tensor([[False, True], [True, False]]), 0.70, 0.10)
    assert torch.allclose(profiles.sum(1), torch.ones(2, dtype=torch.float64))
    assert not bool(valid.any())


def test_jsd_is_symmetric_zero_for_equal_one_for_disjoint_and_a_hand_value():
    """Official fixture (``test_normalized_jsd_is_symmetric_zero_for_equal_and_one_for_disjoint``), plus hand:
    JSD([1, 0], [1/2, 1/2]) = 1/2 (1 log2(1/0.75)) + 1/2 (1/2 log2(0.5/0.75) + 1/2 log2(0.5/0.25)) = 0.31128."""
    assert normalized_jsd([0.2, 0.8, 0.0], [0.2, 0.8, 0.0]) == 0.0
    assert normalized_jsd([1.0, 0.0], [0.0, 1.0]) == close(1.0)
    assert normalized_jsd([1.0, 0.0], [0.5, 0.5]) == close(normalized_jsd([0.5, 0.5], [1.0, 0.0]))
    hand = 0.5 * math.log2(1 / 0.75) + 0.5 * (0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(2.0))
    assert normalized_jsd([1.0, 0.0], [0.5, 0.5]) == close(hand)
    assert hand == close(0.31128, abs=1e-5)


def test_cosine_profile_distance():
    """Official fixture (``test_optional_profile_distances_have_expected_ranges_and_dispatch``): 0 for equal, 1 for
    orthogonal profiles; hand: 1 - 0.5 / (1 * sqrt(0.5)) = 0.29289 for [1, 0] vs [.5, .5]."""
    assert cosine_profile_distance([0.25] * 4, [0.25] * 4) < 1e-6
    assert cosine_profile_distance([1.0, 0.0], [0.0, 1.0]) == close(1.0)
    assert cosine_profile_distance([1.0, 0.0], [0.5, 0.5]) == close(1 - 1 / math.sqrt(2))


def test_mask_change_or_invalid_profile_gives_no_distance():
    """Official fixture (``test_mask_change_or_invalid_profile_cannot_create_semantic_jsd``): every adjacent pair
    changes its eligibility column or has an invalid profile, so no distance counts."""
    profiles = torch.eye(3, dtype=torch.float64)
    valid = torch.tensor([True, True, False])
    structural = torch.eye(3, dtype=torch.bool)
    distances, ok = adjacent_profile_distances(profiles, valid, structural, [[0, 1, 2]])
    assert not bool(ok.any()) and torch.equal(distances, torch.zeros(3, dtype=torch.float64))


def test_adjacent_distance_between_two_valid_profiles_with_the_same_column():
    """Hand: two turns of one rollout with the same eligible sources, profiles [1, 0] and [.5, .5] -> JSD 0.31128
    into turn 1; the first turn has no distance."""
    profiles = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.5, 0.5], [0] * 4, [0] * 4], dtype=torch.float64)
    eligible = torch.zeros(4, 4, dtype=torch.bool)
    eligible[2:, :2] = True
    distances, ok = adjacent_profile_distances(profiles, torch.tensor([True, True, False, False]), eligible, [[0, 1], [2, 3]])
    assert ok.tolist() == [False, True, False, False]
    assert float(distances[1]) == close(0.31128, abs=1e-5)


def test_threshold_is_a_clipped_quantile_and_infinite_without_valid_distances():
    """Official fixture (``test_batch_adaptive_quantile_is_clipped_and_empty_disables_semantics``): median of the
    valid [0.001, 0.5, 0.9] is 0.5 -> clipped to 0.10; nothing valid -> inf. Hand: the 0.8 quantile of
    [0.02, 0.04, 0.06] is 0.02 + 0.8 * 2 * 0.02 = 0.052 (linear interpolation), inside [0.01, 0.10]."""
    d = torch.tensor([0.0, 0.001, 0.5, 0.9])
    assert segmentation_threshold(d, torch.tensor([False, True, True, True]), 0.5, 0.01, 0.10) == 0.10
    assert math.isinf(segmentation_threshold(d, torch.zeros(4, dtype=torch.bool)))
    assert segmentation_threshold([0.02, 0.04, 0.06], [True] * 3) == close(0.052)
    assert segmentation_threshold([0.001, 0.002], [True, True]) == 0.01


def test_segmentation_semantic_guided_and_forced_boundaries():
    """Official fixture (``test_segmentation_classifies_semantic_guided_and_forced_boundaries``): 12 turns,
    distances 0.9 at 3 and 0.4 at 7, threshold 0.5, spans 2..4, fallback 0.1 -> (0,3) (3,7) (7,9) (9,12)."""
    d = torch.zeros(12)
    ok = torch.zeros(12, dtype=torch.bool)
    d[3], ok[3] = 0.9, True
    d[7], ok[7] = 0.4, True
    spans = segment_trajectory(d, ok, threshold=0.5, min_turns=2, max_turns=4, fallback_min=0.1)
    assert spans == [(0, 3), (3, 7), (7, 9), (9, 12)]


def test_segmentation_accepts_the_strongest_candidate_first():
    """Official fixture (``test_semantic_candidates_are_accepted_strongest_first_under_lmin``): candidates 2 (0.6)
    and 3 (0.9); accepting 2 first would block 3, so only 3 is a boundary."""
    d = torch.zeros(7)
    ok = torch.zeros(7, dtype=torch.bool)
    d[2], ok[2] = 0.6, True
    d[3], ok[3] = 0.9, True
    assert segment_trajectory(d, ok, 0.5, min_turns=2, max_turns=7, fallback_min=0.1) == [(0, 3), (3, 7)]


def test_segmentation_short_trajectories_and_random_mode():
    """Hand: one turn is one span; with no candidate, 9 turns and max 8 split at the midpoint-nearest feasible
    position 4 (|4 - 4.5| = |5 - 4.5|, the earlier wins). Random mode (ablation D) keeps the length limits."""
    assert segment_trajectory([0.0], [False], math.inf) == [(0, 1)]
    assert segment_trajectory([0.0] * 9, [False] * 9, math.inf, 2, 8) == [(0, 4), (4, 9)]
    for seed in range(20):
        spans = segment_trajectory([0.0] * 11, [False] * 11, math.inf, 2, 8, mode="random", seed=seed)
        assert spans[0][0] == 0 and spans[-1][1] == 11
        assert all(2 <= b - a <= 8 for a, b in spans)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 4), st.integers(0, 6), st.data())
def test_segmentation_always_partitions_within_the_limits(T, lo, extra, data):
    """Property (official ``segment_trajectories`` run-time checks): a complete ordered partition, no span longer
    than max, none shorter than min when T >= min."""
    hi = 2 * lo - 1 + extra
    d = data.draw(st.lists(st.floats(0, 1), min_size=T, max_size=T))
    ok = data.draw(st.lists(st.booleans(), min_size=T, max_size=T))
    spans = segment_trajectory(d, ok, threshold=0.3, min_turns=lo, max_turns=hi, fallback_min=0.01)
    assert spans[0][0] == 0 and spans[-1][1] == T and all(a < b for a, b in spans)
    assert all(spans[k][1] == spans[k + 1][0] for k in range(len(spans) - 1))
    assert all(b - a <= hi for a, b in spans)
    if T >= lo:
        assert all(b - a >= lo for a, b in spans)


# ---------------------------------------------------------------------------------------------------------------
# Mechanism 2: allocation


def test_turn_gap_is_a_masked_mean():
    """Official fixture (``test_policy_mask_turn_gap_is_mean_not_sum_and_rejects_empty_turn``)."""
    assert turn_gap([1.0, 3.0, 100.0], [True, True, False]) == 2.0
    assert turn_gap([-2.0, 2.0, 9.0], [True, True, False]) == 0.0
    with pytest.raises(ValueError, match="policy-loss token"):
        turn_gap([1.0, 2.0], [False, False])


def test_issue_example_box_projection_and_mixing():
    """Hand (the issue's "Why" example): raw [5, 5/9], counts [1, 9] (budget 10) onto [0, 4]: the shift lambda
    = -1/9 gives [4, 2/3] (4 + 9 * 2/3 = 10); mixing 0.5 gives [2.5, 0.8333]."""
    projected = project_weighted_box_budget([5.0, 5.0 / 9.0], [1.0, 9.0], upper=4.0)
    assert projected.tolist() == close([4.0, 2.0 / 3.0])
    assert mix_density(projected, 0.5).tolist() == close([2.5, 0.8333333])


def test_projection_preserves_the_budget_instead_of_plain_clamping():
    """Official fixture (``test_weighted_box_projection_preserves_budget_instead_of_plain_clamp``), upper 2:
    lambda solves 2 + 9 (5/9 - lambda) = 10 -> lambda = -1/3, [2, 8/9] (hand)."""
    counts = torch.tensor([1.0, 9.0])
    projected = project_weighted_box_budget([5.0, 5.0 / 9.0], counts, upper=2.0)
    assert projected.tolist() == close([2.0, 8.0 / 9.0])
    assert float((counts * projected).sum()) == close(10.0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-3, 50), st.integers(1, 512)), min_size=1, max_size=17),
       st.sampled_from([(0.0, 4.0), (0.0, 1.5), (0.8, 1.2)]))
def test_projection_bounds_and_budget_identity(pairs, box):
    """Property (official ``test_bounded_projection_random_lengths_and_config_validation`` and the run-time
    checks of ``project_weighted_box_budget``): within the box, sum n x = N, order of the raw density kept."""
    lower, upper = box
    raw = torch.tensor([r for r, _ in pairs], dtype=torch.float64)
    counts = torch.tensor([float(c) for _, c in pairs], dtype=torch.float64)
    raw = raw * counts.sum() / (counts * raw).sum()
    x = project_weighted_box_budget(raw, counts, upper=upper, lower=lower)
    assert float(x.min()) >= lower - 1e-9 and float(x.max()) <= upper + 1e-9
    assert float((counts * x).sum()) == close(float(counts.sum()), rel=1e-9)
    order = torch.argsort(raw)
    assert bool((x[order][1:] >= x[order][:-1] - 1e-12).all())


def test_uniform_evidence_gives_grpo_for_any_lengths():
    """Official fixture (``test_full_hierarchy_uniform_evidence_reduces_exactly_to_grpo_for_any_lengths``): equal
    turn scores give weight 1 for any token counts and spans, in every allocation."""
    for spans in ([(0, 1), (1, 3)], [(0, 3)]):
        assert torch.equal(hierarchical_turn_weights([2.0, 2.0, 2.0], [1, 2, 3], spans, mixing=0.75), torch.ones(3, dtype=torch.float64))
    assert torch.equal(flat_turn_weights([-2.0] * 3, [4, 1, 2]), torch.ones(3, dtype=torch.float64))
    assert torch.equal(flat_token_weights([0.5] * 5), torch.ones(5, dtype=torch.float64))


def test_hierarchical_weights_hand_calculation():
    """Hand (official ``compute_correspondence_credit_from_tensors``): two one-turn spans, n = [1, 1], scores
    [3, 0], temperature 1, mixing 1, box [0, 4]: b = softmax([3, 0]) = [0.9526, 0.0474]; q = 1 in each span;
    h = 2 b = [1.9051, 0.0949] (inside the box); w = h. This is the positive trajectory of the official
    ``test_outcome_alignment_reverses_density_preference_for_negative_trajectory``, whose weights sum to 2."""
    w = hierarchical_turn_weights([3.0, 0.0], [1, 1], [(0, 1), (1, 2)], temperature=1.0, mixing=1.0)
    b = 1 / (1 + math.exp(-3))
    assert w.tolist() == close([2 * b, 2 * (1 - b)])
    # The negative trajectory (scores -3, 0) prefers the other turn.
    w_neg = hierarchical_turn_weights([-3.0, 0.0], [1, 1], [(0, 1), (1, 2)], temperature=1.0, mixing=1.0)
    assert float(w_neg[0]) < float(w_neg[1]) and float(w_neg.sum()) == close(2.0)


def test_hierarchical_weights_within_one_span_and_mixing():
    """Hand: one span of two turns, n = [1, 3], scores [1, 0], temperature 0.5, mixing 0.5:
    q = softmax([log 1 + 2, log 3]) = [e^2, 3] / (e^2 + 3); h = 4 q / n; w = 0.5 + 0.5 h."""
    w = hierarchical_turn_weights([1.0, 0.0], [1, 3], [(0, 2)], temperature=0.5, mixing=0.5)
    z = math.exp(2) + 3
    h = [4 * math.exp(2) / z, 4 * 3 / z / 3]
    assert w.tolist() == close([0.5 + 0.5 * h[0], 0.5 + 0.5 * h[1]])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-20, 20), st.integers(1, 64)), min_size=1, max_size=12), st.data())
def test_weights_are_positive_bounded_and_keep_the_token_budget(turns, data):
    """Property (official run-time checks ``mixed turn weights failed to conserve trajectory credit`` and
    ``final turn weights violated their configured bounds``): w in [0.5, 2.5] with the default box and mixing,
    sum_t n_t w_t = N, so A w keeps the sign of A and the token-weighted mean advantage."""
    scores = [s for s, _ in turns]
    counts = [c for _, c in turns]
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(len(turns) - 1, 1)), max_size=4)))) if len(turns) > 1 else []
    bounds = [0, *cuts, len(turns)]
    spans = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    for w in (hierarchical_turn_weights(scores, counts, spans), flat_turn_weights(scores, counts)):
        assert float(w.min()) >= 0.5 - 1e-9 and float(w.max()) <= 2.5 + 1e-9
        n = torch.tensor(counts, dtype=torch.float64)
        assert float((n * w).sum()) == close(float(n.sum()), rel=1e-9)


def test_bounded_weighting_band():
    """Official fixture (``test_bounded_m2_hierarchy_preserves_budget_sign_and_band``): bounded mode keeps
    w in [1 - band mixing, 1 + band mixing]; band 0 gives ones."""
    for band, mixing in [(0.2, 0.5), (0.0, 0.5), (0.2, 1.0)]:
        w = hierarchical_turn_weights([10.0, -10.0, 2.0], [1, 2, 3], [(0, 1), (1, 3)], mixing=mixing, weighting="bounded", band=band)
        assert float(w.min()) >= 1 - band * mixing - 1e-9 and float(w.max()) <= 1 + band * mixing + 1e-9
        n = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
        assert float((n * w).sum()) == close(6.0)
        if band == 0.0:
            assert torch.allclose(w, torch.ones(3, dtype=torch.float64))


def test_flat_token_weights_have_no_mixing():
    """Hand (official ``compute_flat_token_credit``): tokens with scores [log 3, 0], temperature 1:
    q = [3/4, 1/4], h = 2 q = [1.5, 0.5], inside [0, 4]; the token weights are h itself (no mixing)."""
    assert flat_token_weights([math.log(3.0), 0.0]).tolist() == close([1.5, 0.5])


# ---------------------------------------------------------------------------------------------------------------
# Outcome advantage and the invalid-action residual


def test_issue_example_turn_scope_advantage():
    """Hand (the issue's "Why" example; official fixture ``test_turn_normalization_matches_real_turn_statistics``):
    a 1-turn success and a 3-turn failure. Turn scope: statistics over [1, 0, 0, 0], mean 0.25, unbiased std 0.5
    -> [1.5, -0.5]. Trajectory scope: [1, 0], mean 0.5, std 0.7071 -> +-0.7071."""
    assert group_outcome_advantage([1.0, 0.0], [1, 3], "turn").tolist() == close([1.5, -0.5], abs=1e-5)
    assert group_outcome_advantage([1.0, 0.0], [1, 3], "trajectory").tolist() == close([0.70711, -0.70711], abs=1e-5)
    assert group_outcome_advantage([1.0, 0.0], [1, 3], "turn", scale=False).tolist() == close([0.75, -0.25])


def test_trajectory_scope_is_not_weighted_by_turn_count():
    """Official fixture (``test_unique_trajectory_grpo_is_not_weighted_by_turn_count``): rewards 1 (3 turns) and
    -1 (1 turn) -> +-1/sqrt(2). Constant rewards give zeros (``test_turn_normalization_constant_rewards``)."""
    assert group_outcome_advantage([1.0, -1.0], [3, 1], "trajectory").tolist() == close([1 / math.sqrt(2), -1 / math.sqrt(2)], abs=1e-5)
    assert group_outcome_advantage([1.0, 1.0], [1, 3], "turn").tolist() == [0.0, 0.0]


def test_invalid_action_residual():
    """Official fixture (``test_invalid_action_residual_is_separate_and_zero_without_invalid_actions``): zero when
    every action is valid, nonzero at the invalid row. Hand: rows [1, 1, -1, -1], row 1 invalid, c = 0.1:
    pure = [1, 1, -1, -1] / 1.1547; penalised [1, 0.9, -1, -1] has mean -0.025 and std 1.1209; residual =
    penalised - pure."""
    assert invalid_action_residual([1.0, 1.0, -1.0, -1.0], [False] * 4, 0.1).tolist() == [0.0] * 4
    residual = invalid_action_residual([1.0, 1.0, -1.0, -1.0], [False, True, False, False], 0.1)
    pure = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    pure = (pure - pure.mean()) / (pure.std() + 1e-6)
    pen = torch.tensor([1.0, 0.9, -1.0, -1.0], dtype=torch.float64)
    pen = (pen - pen.mean()) / (pen.std() + 1e-6)
    assert torch.allclose(residual, pen - pure)
    assert float(residual[1]) < 0
    # One row: mean 0, std 1 -> residual -c / (1 + eps).
    assert invalid_action_residual([1.0], [True], 0.1).tolist() == close([-0.1 / (1 + 1e-6)])


# --------------------------------------------------------------------------------------------------------------
# Tests written against the mutants of ``taspo_trl/credit/alignopsd.py`` that survived the parity tests above
# (``benchmarks/mutation.sh``; the scores and the equivalent mutants are in benchmarks/results/mutation.md).
#
# Expected values come from hand calculations of the official formulas (the arithmetic is in each docstring), from the
# official configuration (``verl/trainer/config/beyond_timestamps_trainer.yaml`` of ``mingju-c/Align-OPSD``) for the
# defaults, and from the user-facing error messages as written, matched whole.


F64 = torch.float64
ALL = torch.ones(2, 2, dtype=torch.bool)


# ---------------------------------------------------------------------------------------------------------------
# Every refusal names what was wrong: the messages are what a user sees, so each is matched whole.

REFUSALS = [
    pytest.param(lambda: select_sources(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), ["a", "b"]),
                 r"similarity must be a square [M, M] matrix, got shape (2, 3)", id="similarity-not-square"),
    pytest.param(lambda: select_sources(torch.zeros(2, 2), ALL, ["a"]),
                 "similarity, eligibility and rollout ids must describe the same M turns", id="select-rollouts"),
    pytest.param(lambda: select_sources(torch.zeros(2, 2), torch.ones(3, 3, dtype=torch.bool), ["a", "b"]),
                 "similarity, eligibility and rollout ids must describe the same M turns", id="select-eligible"),
    pytest.param(lambda: select_sources(torch.zeros(2, 2), ALL, ["a", "b"], threshold=1.0),
                 "similarity threshold must be in [-1, 1), got 1.0", id="threshold-one"),
    pytest.param(lambda: select_sources(torch.zeros(2, 2), ALL, ["a", "b"], threshold=-1.01),
                 "similarity threshold must be in [-1, 1), got -1.01", id="threshold-below"),
    pytest.param(lambda: select_sources(torch.zeros(2, 2), ALL, ["a", "b"], top_k=0),
                 "top_k must be >= 1, got 0", id="top-k"),
    pytest.param(lambda: structural_eligibility(["a", "b"], [True], [True, True]),
                 "thinking validity must have one entry per turn (2)", id="eligibility-teacher"),
    pytest.param(lambda: structural_eligibility(["a", "b"], [True, True], [True]),
                 "thinking validity must have one entry per turn (2)", id="eligibility-student"),
    pytest.param(lambda: action_consistent_sources([()], torch.zeros(1, 2), ["a"], ["a"]),
                 "action_similarity must be a square [M, M] matrix, got shape (1, 2)", id="action-not-square"),
    pytest.param(lambda: action_consistent_sources([()], torch.zeros(1, 1), ["a"], ["a"], threshold=1.5),
                 "action threshold must be in [-1, 1], got 1.5", id="action-threshold-above"),
    pytest.param(lambda: action_consistent_sources([()], torch.zeros(1, 1), ["a"], ["a"], threshold=-1.5),
                 "action threshold must be in [-1, 1], got -1.5", id="action-threshold-below"),
    pytest.param(lambda: source_weights([0.5], temperature=0.0),
                 "aggregation temperature must be a finite number > 0, got 0.0", id="aggregation-temperature-zero"),
    pytest.param(lambda: source_weights([0.5], temperature=math.inf),
                 "aggregation temperature must be a finite number > 0, got inf", id="aggregation-temperature-inf"),
    pytest.param(lambda: correspondence_confidence([0.8, 0.9], [1.0]),
                 "similarities and weights differ in shape: (2,) vs (1,)", id="confidence-shapes"),
    pytest.param(lambda: correspondence_confidence([0.8], [1.0], threshold=1.0),
                 "similarity threshold must be in [-1, 1), got 1.0", id="confidence-threshold"),
    pytest.param(lambda: correction_strength(0.5, alpha_max=1.5), "alpha_max must be in [0, 1], got 1.5", id="alpha-max-above"),
    pytest.param(lambda: correction_strength(0.5, alpha_max=-0.5), "alpha_max must be in [0, 1], got -0.5", id="alpha-max-below"),
    pytest.param(lambda: cross_teacher_logprobs(torch.zeros(1, 2), [1.0], mode="mean"),
                 "aggregation mode must be one of ('probability_mixture', 'log_mean'), got 'mean'", id="aggregation-mode"),
    pytest.param(lambda: cross_teacher_logprobs(torch.zeros(2, 3), [1.0]),
                 "source_logprobs must be [k, L] with k = 1 >= 1, got (2, 3)", id="sources-rows"),
    pytest.param(lambda: cross_teacher_logprobs(torch.zeros(3), [1.0]),
                 "source_logprobs must be [k, L] with k = 1 >= 1, got (3,)", id="sources-1d"),
    pytest.param(lambda: cross_teacher_logprobs(torch.zeros(0, 3), []),
                 "source_logprobs must be [k, L] with k = 0 >= 1, got (0, 3)", id="sources-none"),
    pytest.param(lambda: corrected_token_gap([0.0, 0.0], [0.0, 0.0, 0.0]), "shape mismatch: (2,) vs (3,)", id="gap-shapes"),
    pytest.param(lambda: corrected_token_gap([0.0], [0.0], [0.0], alpha=1.5), "alpha must be in [0, 1], got 1.5", id="alpha-above"),
    pytest.param(lambda: corrected_token_gap([0.0], [0.0], [0.0], alpha=-0.5), "alpha must be in [0, 1], got -0.5", id="alpha-below"),
    pytest.param(lambda: corrected_token_gap([0.0, 0.0], [0.0, 0.0], [0.0, 0.0, 0.0], alpha=0.5),
                 "shape mismatch: (3,) vs (2,)", id="cross-shape"),
    pytest.param(lambda: dense_profiles(torch.zeros(2, 2), torch.ones(3, 3, dtype=torch.bool)),
                 "eligible must have the shape of similarity", id="profiles-eligible"),
    pytest.param(lambda: dense_profiles(torch.zeros(2, 2), ALL, threshold=1.0),
                 "similarity threshold must be in [-1, 1), got 1.0", id="profiles-threshold"),
    pytest.param(lambda: dense_profiles(torch.zeros(2, 2), ALL, temperature=0.0),
                 "profile temperature must be a finite number > 0, got 0.0", id="profile-temperature"),
    pytest.param(lambda: dense_profiles(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)),
                 r"similarity must be a square [M, M] matrix, got shape (2, 3)", id="profiles-not-square"),
    pytest.param(lambda: normalized_jsd([1.0, 0.0], [1.0, 0.0, 0.0]), "shape mismatch: (2,) vs (3,)", id="jsd-shapes"),
    pytest.param(lambda: cosine_profile_distance([1.0, 0.0], [1.0, 0.0, 0.0]), "shape mismatch: (2,) vs (3,)", id="cosine-shapes"),
    pytest.param(lambda: profile_distance([1.0], [1.0], mode="entropy"),
                 "profile distance must be one of ('jsd', 'cosine'), got 'entropy'", id="profile-distance-mode"),
    pytest.param(lambda: segmentation_threshold([0.1], [True], quantile=1.5),
                 "need 0 <= quantile <= 1 and 0 <= low <= high <= 1", id="quantile-above"),
    pytest.param(lambda: segmentation_threshold([0.1], [True], quantile=-0.5),
                 "need 0 <= quantile <= 1 and 0 <= low <= high <= 1", id="quantile-below"),
    pytest.param(lambda: segmentation_threshold([0.1], [True], low=-0.5),
                 "need 0 <= quantile <= 1 and 0 <= low <= high <= 1", id="low-below"),
    pytest.param(lambda: segmentation_threshold([0.1], [True], low=0.2, high=0.1),
                 "need 0 <= quantile <= 1 and 0 <= low <= high <= 1", id="low-above-high"),
    pytest.param(lambda: segmentation_threshold([0.1], [True], high=1.5),
                 "need 0 <= quantile <= 1 and 0 <= low <= high <= 1", id="high-above"),
    pytest.param(lambda: segment_trajectory([0.0], [False], 0.5, min_turns=0, max_turns=8),
                 "need min_turns >= 1 and max_turns >= 2 * min_turns - 1, got 0, 8", id="min-turns"),
    pytest.param(lambda: segment_trajectory([0.0], [False], 0.5, min_turns=2, max_turns=2),
                 "need min_turns >= 1 and max_turns >= 2 * min_turns - 1, got 2, 2", id="max-turns"),
    pytest.param(lambda: segment_trajectory([0.0, 0.0], [False], 0.5), "boundary_valid must have 2 entries", id="boundary-valid"),
    pytest.param(lambda: segment_trajectory([0.0], [False], 0.5, mode="fixed"),
                 "segmentation mode must be one of ('adaptive', 'random'), got 'fixed'", id="segmentation-mode"),
    pytest.param(lambda: turn_gap([1.0, 2.0], [True]),
                 "a turn needs at least one policy-loss token, with a mask shaped like its gap", id="turn-mask-shape"),
    pytest.param(lambda: turn_gap([1.0, math.nan], [True, True]), "the corrected gap must be finite", id="turn-gap-nan"),
    pytest.param(lambda: project_weighted_box_budget([1.0], [1.0, 1.0]), "raw_density and token_counts must align", id="box-align"),
    pytest.param(lambda: project_weighted_box_budget([2.0, -0.0001], [1.0, 1.0]),
                 "raw_density must be finite and nonnegative", id="box-negative"),
    pytest.param(lambda: project_weighted_box_budget([math.inf, 1.0], [1.0, 1.0]),
                 "raw_density must be finite and nonnegative", id="box-infinite"),
    pytest.param(lambda: project_weighted_box_budget([1.0, 1.0], [1.0, 0.0]), "token_counts must be positive", id="box-counts"),
    pytest.param(lambda: project_weighted_box_budget([1.0], [1.0], upper=0.5),
                 "need 0 <= lower <= 1 <= upper < inf, got [0.0, 0.5]", id="box-upper-below-one"),
    pytest.param(lambda: project_weighted_box_budget([1.0], [1.0], lower=1.5, upper=2.0),
                 "need 0 <= lower <= 1 <= upper < inf, got [1.5, 2.0]", id="box-lower-above-one"),
    pytest.param(lambda: project_weighted_box_budget([1.0], [1.0], lower=-0.5),
                 "need 0 <= lower <= 1 <= upper < inf, got [-0.5, 4.0]", id="box-lower-negative"),
    pytest.param(lambda: project_weighted_box_budget([1.0], [1.0], upper=math.inf),
                 "need 0 <= lower <= 1 <= upper < inf, got [0.0, inf]", id="box-upper-inf"),
    pytest.param(lambda: project_weighted_box_budget([1.5, 1.0], [1.0, 1.0]),
                 "raw density does not conserve the token budget sum_t n_t h_t = N", id="box-budget"),
    pytest.param(lambda: mix_density([1.0], mixing=1.5), "mixing coefficient must be in [0, 1], got 1.5", id="mixing-above"),
    pytest.param(lambda: mix_density([1.0], mixing=-0.5), "mixing coefficient must be in [0, 1], got -0.5", id="mixing-below"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, 0.0], [1, 1], [(0, 2)], weighting="bounded", band=1.5),
                 "multiplier band must be in [0, 1], got 1.5", id="band-above"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, 0.0], [1, 1], [(0, 2)], weighting="bounded", band=-0.5),
                 "multiplier band must be in [0, 1], got -0.5", id="band-below"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, 0.0], [1, 1], [(0, 2)], weighting="clipped"),
                 "weighting mode must be 'legacy' or 'bounded', got 'clipped'", id="weighting-mode"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, 0.0], [1], [(0, 2)]),
                 "scores must be finite, one per turn with its token count", id="scores-counts"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, math.nan], [1, 1], [(0, 2)]),
                 "scores must be finite, one per turn with its token count", id="scores-nan"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, 0.0], [1, 1], [(0, 2)], temperature=0.0),
                 "credit temperature must be a finite number > 0, got 0.0", id="credit-temperature"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, 0.0], [1, 1], [(0, 1)]),
                 r"spans must partition the 2 turns, got [(0, 1)]", id="spans-short"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, 0.0], [1, 1], [(1, 2)]),
                 r"spans must partition the 2 turns, got [(1, 2)]", id="spans-late-start"),
    pytest.param(lambda: hierarchical_turn_weights([1.0, 0.0, 2.0], [1, 1, 1], [(0, 1), (2, 3)]),
                 r"spans must partition the 3 turns, got [(0, 1), (2, 3)]", id="spans-gap"),
    pytest.param(lambda: flat_token_weights([1.0, math.inf]), "token scores must be finite", id="token-scores"),
    pytest.param(lambda: flat_token_weights([1.0, 0.0], temperature=-1.0),
                 "credit temperature must be a finite number > 0, got -1.0", id="token-temperature"),
    pytest.param(lambda: flat_token_weights([1.0, 0.0], weighting="clipped"),
                 "weighting mode must be 'legacy' or 'bounded', got 'clipped'", id="token-weighting-mode"),
    pytest.param(lambda: group_outcome_advantage([1.0, 0.0], [1]),
                 "turn_counts must hold one nonnegative count per trajectory", id="turn-counts-length"),
    pytest.param(lambda: group_outcome_advantage([1.0, 0.0], [1, -1]),
                 "turn_counts must hold one nonnegative count per trajectory", id="turn-counts-negative"),
    pytest.param(lambda: group_outcome_advantage([1.0, 0.0], [1, 1], scope="batch"),
                 "normalization scope must be one of ('trajectory', 'turn'), got 'batch'", id="scope"),
    pytest.param(lambda: group_outcome_advantage([1.0, 0.0], [1, 1], epsilon=0.0),
                 "epsilon must be a finite number > 0, got 0.0", id="advantage-epsilon"),
    pytest.param(lambda: invalid_action_residual([1.0, 0.0], [True]), "invalid must have one entry per turn row", id="residual-rows"),
    pytest.param(lambda: invalid_action_residual([1.0], [True], coefficient=-0.1),
                 "coefficient must be >= 0, got -0.1", id="residual-coefficient"),
    pytest.param(lambda: invalid_action_residual([1.0], [True], epsilon=0.0),
                 "epsilon must be a finite number > 0, got 0.0", id="residual-epsilon"),
]


@pytest.mark.parametrize("call,message", REFUSALS)
def test_refusals_name_the_bad_input(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


# Every vector argument names itself when it is not 1-D.
TWO_D = [[0.5, 0.5]]
NOT_1D = [
    pytest.param(lambda: source_weights(TWO_D), "similarities", id="source_weights"),
    pytest.param(lambda: correspondence_confidence(TWO_D, [0.5]), "similarities", id="confidence-similarities"),
    pytest.param(lambda: correspondence_confidence([0.5], TWO_D), "weights", id="confidence-weights"),
    pytest.param(lambda: cross_teacher_logprobs(torch.zeros(1, 2), TWO_D), "weights", id="cross-weights"),
    pytest.param(lambda: corrected_token_gap(TWO_D, [0.0]), "diagonal_logprobs", id="gap-diagonal"),
    pytest.param(lambda: corrected_token_gap([0.0], TWO_D), "student_logprobs", id="gap-student"),
    pytest.param(lambda: corrected_token_gap([0.0, 0.0], [0.0, 0.0], TWO_D, 0.5), "cross_logprobs", id="gap-cross"),
    pytest.param(lambda: normalized_jsd(TWO_D, [0.5]), "left", id="jsd-left"),
    pytest.param(lambda: normalized_jsd([0.5], TWO_D), "right", id="jsd-right"),
    pytest.param(lambda: cosine_profile_distance(TWO_D, [0.5]), "left", id="cosine-left"),
    pytest.param(lambda: cosine_profile_distance([0.5], TWO_D), "right", id="cosine-right"),
    pytest.param(lambda: segmentation_threshold(TWO_D, [[True, True]]), "distances", id="threshold-distances"),
    pytest.param(lambda: segment_trajectory(TWO_D, [True], 0.5), "distances", id="segment-distances"),
    pytest.param(lambda: turn_gap(TWO_D), "gap", id="turn-gap"),
    pytest.param(lambda: project_weighted_box_budget(TWO_D, [1.0]), "raw_density", id="box-raw"),
    pytest.param(lambda: project_weighted_box_budget([1.0], TWO_D), "token_counts", id="box-counts"),
    pytest.param(lambda: mix_density(TWO_D), "projected", id="mix"),
    pytest.param(lambda: hierarchical_turn_weights(TWO_D, [1], [(0, 1)]), "scores", id="hierarchical-scores"),
    pytest.param(lambda: hierarchical_turn_weights([1.0], TWO_D, [(0, 1)]), "token_counts", id="hierarchical-counts"),
    pytest.param(lambda: flat_turn_weights(TWO_D, [1]), "scores", id="flat-scores"),
    pytest.param(lambda: flat_token_weights(TWO_D), "token_scores", id="token-scores"),
    pytest.param(lambda: group_outcome_advantage(TWO_D, [1]), "rewards", id="advantage-rewards"),
    pytest.param(lambda: invalid_action_residual(TWO_D, [[True, True]]), "rewards", id="residual-rewards"),
]


@pytest.mark.parametrize("call,name", NOT_1D)
def test_vector_arguments_name_themselves_when_not_1d(call, name):
    with pytest.raises(ValueError, match=f"^{re.escape(name)} must be 1-D, got shape \\(1, 2\\)$"):
        call()


# ---------------------------------------------------------------------------------------------------------------
# Mechanism 1: defaults of the official configuration, boundaries of the accepted ranges, and the ranking.
# Official defaults (beyond_timestamps_trainer.yaml, thinking_correspondence): similarity_threshold 0.70, top_k 3,
# aggregation_temperature 0.10, alpha_max 0.80, action_filter.similarity_threshold 0.80.


def _one_turn_rollouts(column):
    """M turns, one per rollout, every source eligible for every other target; H[:, 0] = column, else 0."""
    m = len(column)
    h = torch.zeros(m, m, dtype=F64)
    h[:, 0] = torch.tensor(column, dtype=F64)
    return h, ~torch.eye(m, dtype=torch.bool), [chr(ord("a") + k) for k in range(m)]


def test_select_sources_defaults_are_threshold_0_7_and_top_3():
    # sources 1..4 pass tau = 0.7 (0.72 does, 0.69 does not); top 3 of them, best first
    h, b, ids = _one_turn_rollouts([0.0, 0.9, 0.8, 0.75, 0.72, 0.69])
    assert select_sources(h, b, ids) == [(1, 2, 3), (), (), (), (), ()]


def test_select_sources_accepts_top_1_and_threshold_minus_1():
    h, b, ids = _one_turn_rollouts([0.0, 0.9, 0.8, 0.75, 0.72, 0.69])
    assert select_sources(h, b, ids, top_k=1)[0] == (1,)
    # tau = -1 is the lowest threshold allowed: every eligible source passes, H = -1 included
    h = torch.tensor([[0.0, -1.0], [-1.0, 0.0]], dtype=F64)
    assert select_sources(h, ~torch.eye(2, dtype=torch.bool), ["a", "b"], threshold=-1.0, top_k=1) == [(1,), (0,)]


def test_select_sources_keeps_each_rollouts_most_similar_turn_and_ranks_best_first():
    # rollout b has two turns: its later, more similar turn (0.9) represents it, not its first (0.75)
    h = torch.zeros(3, 3, dtype=F64)
    h[:, 0] = torch.tensor([0.0, 0.75, 0.9], dtype=F64)
    b = structural_eligibility(["a", "b", "b"], [True] * 3, [True] * 3)
    assert select_sources(h, b, ["a", "b", "b"])[0] == (2,)
    # three rollouts: both sources kept, the more similar (turn 2) first
    assert select_sources(h, ~torch.eye(3, dtype=torch.bool), ["a", "b", "c"])[0] == (2, 1)


def test_select_sources_reads_a_0_1_float_eligibility_as_booleans():
    h = torch.zeros(3, 3, dtype=F64)
    h[:, 0] = torch.tensor([0.0, 0.75, 0.9], dtype=F64)
    b = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)
    assert select_sources(h, b, ["a", "b", "c"]) == [(2, 1), (), ()]


def test_structural_eligibility_reads_0_1_validity_as_booleans():
    # source 0 has teacher thinking, source 1 none; both targets have student thinking; other rollout only
    out = structural_eligibility(["a", "b"], [1, 0], [1, 1])
    assert out.dtype == torch.bool
    assert out.tolist() == [[False, True], [False, False]]
    out = structural_eligibility(["a", "b"], [1, 1], [0, 1])
    assert out.dtype == torch.bool
    assert out.tolist() == [[False, True], [False, False]]


def test_action_filter_threshold_bounds_and_default_are_inclusive():
    sims = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=F64)  # [source, target]
    selected, acts = [(1,), (0,)], ["go", "go"]
    assert action_consistent_sources(selected, sims, acts, acts, threshold=-1.0) == [(1,), (0,)]
    assert action_consistent_sources(selected, sims, acts, acts, threshold=1.0) == [(), (0,)]
    # the default threshold is 0.80, and a similarity equal to it is kept
    sims = torch.tensor([[0.0, 0.8], [0.79, 0.0]], dtype=F64)
    assert action_consistent_sources(selected, sims, acts, acts) == [(), (0,)]


def test_action_filter_applies_the_webshop_rule_only_when_asked():
    sims = torch.ones(2, 2, dtype=F64)
    selected = [(1,), (0,)]
    teacher, student = ["search[a b]", "search[shoes]"], ["click[x]", "search[boots]"]
    # target 0: teacher search at source 1 vs student click -> dropped; target 1: search vs search -> kept
    assert action_consistent_sources(selected, sims, teacher, student, webshop=True) == [(), (0,)]
    assert action_consistent_sources(selected, sims, teacher, student) == [(1,), (0,)]


def test_webshop_rule_needs_both_arguments_and_both_actions_parsed():
    assert webshop_actions_agree("search[ ]", "search[shoes]") is False
    assert webshop_actions_agree("search[shoes]", "search[ ]") is False
    assert webshop_actions_agree("search[shoes]", "buy now") is False
    assert webshop_actions_agree("buy now", "search[shoes]") is False


def test_source_weights_default_temperature_is_0_1():
    # softmax([0.9, 0.8] / 0.1) = softmax([9, 8]) = [e, 1] / (e + 1)
    e = math.e
    assert source_weights([0.9, 0.8]).tolist() == close([e / (e + 1), 1 / (e + 1)], rel=1e-12)


def test_correspondence_confidence_default_threshold_and_clamp():
    # tau = 0.7: (0.85 - 0.7) / 0.3 = 0.5
    assert correspondence_confidence([0.85], [1.0]) == close(0.5, rel=1e-12)
    # a source below tau contributes 0, not a negative amount: 0.5 * 0 + 0.5 * 0.5
    assert correspondence_confidence([0.4, 0.85], [0.5, 0.5]) == close(0.25, rel=1e-12)
    # a similarity above 1 (cosine rounding) contributes at most 1: (1.5 - 0.5) / 0.5 = 2 -> 1
    assert correspondence_confidence([1.5], [1.0], threshold=0.5) == close(1.0, rel=1e-12)


def test_correction_strength_default_alpha_max_and_full_range():
    assert correction_strength(0.5) == close(0.8 * 0.5, rel=1e-12)
    assert correction_strength(0.25, alpha_max=1.0) == close(0.25, rel=1e-12)
    assert correction_strength(1.5, alpha_max=1.0) == close(1.0, rel=1e-12)


def test_cross_teacher_logprobs_keeps_float64_precision():
    # one source with weight 1: the score is the source's log-probs exactly, in float64 (-0.1 has no float32 twin)
    expected = torch.tensor([-0.1, -0.3], dtype=F64)
    assert torch.equal(cross_teacher_logprobs([[-0.1, -0.3]], [1.0], mode="log_mean"), expected)
    assert torch.equal(cross_teacher_logprobs([[-0.1, -0.3]], [1.0]), expected)


def test_corrected_token_gap_default_alpha_and_no_cross_scores():
    diagonal, student, cross = [-1.0, -2.0], [-1.5, -1.0], [-0.5, -0.5]
    # alpha defaults to 0: the diagonal gap log p_diag - log pi_old
    assert corrected_token_gap(diagonal, student, cross).tolist() == close([0.5, -1.0], rel=1e-12)
    # no source: the diagonal gap whatever alpha is
    assert corrected_token_gap(diagonal, student, None, alpha=0.5).tolist() == close([0.5, -1.0], rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Outcome advantage and the invalid-action residual (hand calculations; mean and unbiased std).


def test_group_outcome_advantage_default_scope_is_turn_rows():
    # rows [1, 1, 1, 0]: mu = 0.75, sigma^2 = (3 * 0.0625 + 0.5625) / 3 = 0.25, sigma = 0.5
    out = group_outcome_advantage([1.0, 0.0], [3, 1])
    assert out.tolist() == close([0.25 / (0.5 + 1e-6), -0.75 / (0.5 + 1e-6)], rel=1e-12)


def test_group_outcome_advantage_zero_turn_trajectories_and_few_rows():
    # a trajectory without turns adds no row: rows [1, 0], mu = 0.5, sigma = sqrt(0.5)
    out = group_outcome_advantage([1.0, 0.0, 0.5], [1, 1, 0])
    s = math.sqrt(0.5) + 1e-6
    assert out.tolist() == close([0.5 / s, -0.5 / s, 0.0], rel=1e-12, abs=1e-15)
    # no rows at all, one row only, or an empty group: zeros
    assert group_outcome_advantage([1.0, 0.0], [0, 0]).tolist() == [0.0, 0.0]
    assert group_outcome_advantage([1.0, 0.0], [1, 0]).tolist() == [0.0, 0.0]
    assert group_outcome_advantage([], []).numel() == 0


def test_group_outcome_advantage_unscaled_and_epsilon():
    # two trajectories, no std division: R - mu
    out = group_outcome_advantage([1.0, 0.0], [1, 1], scope="trajectory", scale=False)
    assert out.tolist() == close([0.5, -0.5], rel=1e-12)
    # sigma = sqrt(0.5); 0.5 / (sqrt(0.5) + 0.5) = 1 / (sqrt(2) + 1) = sqrt(2) - 1
    out = group_outcome_advantage([1.0, 0.0], [1, 1], scope="trajectory", epsilon=0.5)
    assert out.tolist() == close([math.sqrt(2) - 1, 1 - math.sqrt(2)], rel=1e-12)


def test_invalid_action_residual_default_coefficient_unscaled():
    # c = 0.1: penalised rows [0.9, 1.0] centred [-0.05, 0.05]; rows [1, 1] centred [0, 0]
    expected = [-0.05, 0.05]
    assert invalid_action_residual([1.0, 1.0], [True, False], scale=False).tolist() == close(expected, rel=1e-12)
    # the flags are truth values: a count of 2 invalid actions is one penalty
    assert invalid_action_residual([1.0, 1.0], [2, 0], scale=False).tolist() == close(expected, rel=1e-12)


def test_invalid_action_residual_scaled_two_rows_and_one_row():
    # penalised [0.9, 1.0]: centred +-0.05, unbiased std sqrt(2 * 0.05^2) = sqrt(0.005); rows [1, 1]: 0 / eps = 0
    s = math.sqrt(0.005) + 1e-6
    assert invalid_action_residual([1.0, 1.0], [True, False]).tolist() == close([-0.05 / s, 0.05 / s], rel=1e-9)
    # one row: mean 0, std 1, so (0 - 1) / (1 + eps) with c = 1
    assert invalid_action_residual([1.0], [True], coefficient=1.0).tolist() == close([-1.0 / (1.0 + 1e-6)], rel=1e-12)


def test_invalid_action_residual_is_exactly_zero_without_penalty():
    assert invalid_action_residual([1.0, 0.0], [True, False], coefficient=0.0).tolist() == [0.0, 0.0]
    # all actions valid: exactly 0, the rewards are not even read (an infinite one included)
    assert invalid_action_residual([math.inf, 1.0], [False, False]).tolist() == [0.0, 0.0]


# --------------------------------------------------------------------------------------------------------------
# Tests written against the surviving mutants of the profile, span and weight stages of
# ``taspo_trl/credit/alignopsd.py`` (``benchmarks/mutation.sh``; the mutants left and why they are equivalent are in
# benchmarks/results/mutation.md).
#
# Every expected value is a hand calculation of the official formula (the arithmetic is in the docstring) or a
# property of the method: the box bounds, the token budget sum_t n_t w_t = N, valid partitions into spans of
# ``min_turns``..``max_turns`` turns. The refusals' messages are matched in the section above; here a refusal is only
# checked to be a ValueError.


LN3, LN4, LN14_5 = math.log(3.0), math.log(4.0), math.log(14.5)
NONE_VALID = [False] * 10


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# --------------------------------------------------------------------------------------------------------------
# Profiles and their distances


def _three_rollouts(eligible_dtype):
    """H[source, target] of three one-turn rollouts (every off-diagonal pair eligible).

    Target 0: sources 1, 2 at 0.8 and 0.8 - 0.1 ln 3 -> softmax([8, 8 - ln 3]) = [3/4, 1/4]; best 0.8 >= 0.7: valid.
    Target 1: sources 0, 2 at 0.65, 0.6 -> [sigmoid(0.5), sigmoid(-0.5)]; best 0.65 < 0.7: not valid.
    Target 2: sources 0, 1 at 0.9, 0.5 -> [sigmoid(4), sigmoid(-4)]; valid.
    """
    h = torch.tensor([[0.0, 0.65, 0.9], [0.8, 0.0, 0.5], [0.8 - 0.1 * LN3, 0.6, 0.0]], dtype=torch.float64)
    eligible = (1 - torch.eye(3, dtype=torch.long)).to(eligible_dtype)
    want = [[0.0, 0.75, 0.25], [_sigmoid(0.5), 0.0, _sigmoid(-0.5)], [_sigmoid(4.0), _sigmoid(-4.0), 0.0]]
    return h, eligible, want


@pytest.mark.parametrize("eligible_dtype", [torch.bool, torch.long], ids=["bool-mask", "0-1-mask"])
def test_dense_profiles_defaults_are_tau_0_7_and_temperature_0_1(eligible_dtype):
    """The official defaults (similarity threshold 0.7, profile temperature 0.1); a 0/1 integer mask reads as B."""
    h, eligible, want = _three_rollouts(eligible_dtype)
    profiles, valid = dense_profiles(h, eligible)
    assert profiles.tolist() == [close(row, abs=1e-12) for row in want]
    assert valid.tolist() == [True, False, True]


P0, P1, P2 = [1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]
# JSD in bits. (P0, P1): mid [3/4, 1/4, 0]; KL(P0|mid) = log2(4/3), KL(P1|mid) = 0.5 log2(2/3) + 0.5 log2 2;
# JSD = 0.5 (0.4150375 + 0.2075187) = 0.3112781. (P1, P2): mid [1/4, 1/2, 1/4]; both KL = 0.5 -> 0.5.
JSD_01 = 0.5 * (math.log2(4 / 3) + 0.5 * math.log2(2 / 3) + 0.5)
# Cosine distance: 1 - 0.5 / (1 * sqrt(0.5)) = 1 - 1/sqrt 2 for (P0, P1); 1 - 0.25 / 0.5 = 0.5 for (P1, P2).
COS_01 = 1.0 - 1.0 / math.sqrt(2.0)


def test_profile_distance_is_jsd_by_default_and_cosine_on_request():
    assert profile_distance(P0, P1) == close(JSD_01, abs=1e-12)
    assert profile_distance(P0, P1, "jsd") == close(JSD_01, abs=1e-12)
    assert profile_distance(P0, P1, "cosine") == close(COS_01, abs=1e-12)
    assert profile_distance(P1, P2, "cosine") == close(0.5, abs=1e-12)


@pytest.mark.parametrize("mode,want", [("jsd", [0.0, JSD_01, 0.5]), ("cosine", [0.0, COS_01, 0.5])])
def test_adjacent_distances_reach_every_turn_of_a_trajectory(mode, want):
    """Three turns with valid profiles and the same B column: a distance into turns 1 and 2 of the configured kind,
    kept in float64, with a boolean validity."""
    profiles = torch.tensor([P0, P1, P2], dtype=torch.float64)
    distances, ok = adjacent_profile_distances(profiles, torch.ones(3, dtype=torch.bool), torch.ones(3, 3, dtype=torch.bool), [[0, 1, 2]], mode)
    assert distances.dtype == torch.float64 and ok.dtype == torch.bool
    assert distances.tolist() == close(want, abs=1e-12)
    assert ok.tolist() == [False, True, True]


# --------------------------------------------------------------------------------------------------------------
# The segmentation threshold


def test_segmentation_threshold_accepts_the_closed_ends_of_its_ranges():
    """quantile 0 / 1 are the smallest / largest valid distance; low = 0, low = high and high = 1 are allowed."""
    d, ok = [0.02, 0.05, 0.08], [True, True, True]
    assert segmentation_threshold(d, ok, quantile=0.0) == close(0.02)
    assert segmentation_threshold(d, ok, quantile=1.0) == close(0.08)
    assert segmentation_threshold([0.005, 0.05], [True, True], quantile=0.0, low=0.0) == close(0.005)
    assert segmentation_threshold(d, ok, low=0.05, high=0.05) == close(0.05)
    assert segmentation_threshold([0.5], [True], high=1.0) == close(0.5)


@pytest.mark.parametrize("kwargs", [{"quantile": 1.5}, {"high": 1.5}], ids=["quantile-above-1", "high-above-1"])
def test_segmentation_threshold_refuses_values_above_one(kwargs):
    with pytest.raises(ValueError):
        segmentation_threshold([0.05], [True], **kwargs)


def test_segmentation_threshold_reads_a_0_1_mask_as_a_mask():
    """Valid distances 0.02 and 0.04 (the 0.9 is masked out): median 0.03, inside [0.01, 0.10]."""
    assert segmentation_threshold([0.02, 0.9, 0.04], torch.tensor([1, 0, 1]), quantile=0.5) == close(0.03)


# --------------------------------------------------------------------------------------------------------------
# Spans


@pytest.mark.parametrize("min_turns,max_turns", [(0, 8), (2, 2), (3, 4)])
def test_segment_lengths_below_2_min_minus_1_are_refused(min_turns, max_turns):
    with pytest.raises(ValueError):
        segment_trajectory([0.0] * 4, [False] * 4, 0.5, min_turns=min_turns, max_turns=max_turns)


def test_segment_lengths_at_2_min_minus_1_are_allowed():
    """max = 2 min - 1 is the smallest max: (1, 1) splits 2 turns at 1; (2, 3) splits 4 turns at the only feasible 2."""
    assert segment_trajectory([0.0, 0.0], [False, False], math.inf, min_turns=1, max_turns=1) == [(0, 1), (1, 2)]
    assert segment_trajectory([0.0] * 4, [False] * 4, math.inf, min_turns=2, max_turns=3) == [(0, 2), (2, 4)]


def test_boundary_exactly_min_turns_from_both_ends_is_accepted_by_default():
    """Default min 2: the strong boundary into turn 2 of 4 leaves 2 turns on each side."""
    assert segment_trajectory([0.0, 0.0, 0.5, 0.0], [False, False, True, False], 0.1) == [(0, 2), (2, 4)]


def test_turn_1_is_a_candidate_when_min_turns_is_1():
    assert segment_trajectory([0.0, 0.5, 0.0], [False, True, False], 0.1, min_turns=1) == [(0, 1), (1, 3)]


@pytest.mark.parametrize(
    "distance,valid", [(0.9, False), (0.05, True)], ids=["invalid-distance", "distance-equal-to-threshold"]
)
def test_only_valid_distances_strictly_above_the_threshold_are_candidates(distance, valid):
    assert segment_trajectory([0.0, 0.0, distance, 0.0], [False, False, valid, False], 0.05) == [(0, 4)]


def test_default_max_turns_is_8():
    """9 turns, no candidate: split at the feasible position nearest the midpoint 4.5 (tie 4 / 5: the earlier)."""
    assert segment_trajectory([0.0] * 9, [False] * 9, math.inf) == [(0, 4), (4, 9)]


def _ten(values: dict[int, float], valid: set[int]):
    return [values.get(t, 0.0) for t in range(10)], [t in valid for t in range(10)]


@pytest.mark.parametrize(
    "values,valid,want",
    [
        ({3: 0.05, 6: 0.9}, {3}, [(0, 3), (3, 10)]),  # the invalid 0.9 is no guide; the midpoint would give 5
        ({3: 0.02, 4: 0.05}, {3, 4}, [(0, 4), (4, 10)]),  # the highest valid distance, not the first or the lowest
        ({3: 0.01}, {3}, [(0, 3), (3, 10)]),  # a distance equal to fallback_min (default 0.01) still guides
    ],
    ids=["invalid-ignored", "highest-wins", "at-fallback-min"],
)
def test_overlong_span_is_split_at_its_best_valid_distance(values, valid, want):
    """10 turns over max 8 with no candidate (threshold inf): the split goes to the feasible position 2..8 with the
    highest valid distance >= fallback_min; the rest, 7 turns, is within max."""
    d, ok = _ten(values, valid)
    assert segment_trajectory(d, ok, math.inf) == want


def _shuffled(T: int, seed: int) -> list[int]:
    order = list(range(2, T - 1))
    random.Random(seed).shuffle(order)
    return order


def test_random_spans_follow_the_seeded_shuffle():
    """Ablation D with min 2: the feasible positions 2..T-2, shuffled by random.Random(seed), accepted greedily.

    T 6, seed 0: order [2, 4, 3] -> 2, 4 accepted (3 would leave 1 turn) -> [(0,2), (2,4), (4,6)].
    T 6, seed 1: order [3, 4, 2] -> 3 accepted, 4 and 2 leave 1 turn -> [(0,3), (3,6)].
    T 10, seed 0: order [6, 4, 3, 2, 7, 5, 8] -> 6, 4, 2, 8 accepted -> five spans of 2.
    T 10, seed 1: order [5, 8, 7, 4, 2, 6, 3] -> 5, 8, 2 accepted -> [(0,2), (2,5), (5,8), (8,10)].
    The distances play no part.
    """
    assert _shuffled(6, 0) == [2, 4, 3] and _shuffled(6, 1) == [3, 4, 2]  # Python's own shuffle, not ours
    assert _shuffled(10, 0) == [6, 4, 3, 2, 7, 5, 8] and _shuffled(10, 1) == [5, 8, 7, 4, 2, 6, 3]
    assert segment_trajectory([0.0] * 6, [False] * 6, 0.5, mode="random") == [(0, 2), (2, 4), (4, 6)]
    assert segment_trajectory([0.0] * 6, [False] * 6, 0.5, mode="random", seed=1) == [(0, 3), (3, 6)]
    assert segment_trajectory([0.9] * 10, [True] * 10, 0.5, mode="random", seed=0) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert segment_trajectory([0.0] * 10, NONE_VALID, 0.5, mode="random", seed=1) == [(0, 2), (2, 5), (5, 8), (8, 10)]


# --------------------------------------------------------------------------------------------------------------
# Turn gap, projection, mixing


def test_turn_gap_without_mask_is_the_plain_mean():
    assert turn_gap([1.0, 2.0, 3.0]) == close(2.0)


def test_turn_gap_reads_a_0_1_loss_mask_as_a_mask():
    """verl's response masks are 0/1 integers: tokens 0 and 2 -> (1 + 3) / 2."""
    assert turn_gap([1.0, 5.0, 3.0], [1, 0, 1]) == close(2.0)


def test_mix_density_default_mixing_is_one_half_and_0_and_1_are_allowed():
    assert mix_density([2.0, 0.0]).tolist() == close([1.5, 0.5])
    assert mix_density([3.0, 0.0], 0.0).tolist() == [1.0, 1.0]
    assert mix_density([3.0, 0.0], 1.0).tolist() == close([3.0, 0.0])
    with pytest.raises(ValueError):
        mix_density([1.0], 1.5)


@pytest.mark.parametrize(
    "density,counts,kwargs",
    [
        ([2.5, -0.5], [1, 1], {}),  # negative density (budget 2 = N)
        ([math.inf, 1.0], [1, 1], {}),
        ([1.0, 1.0], [1, 0], {}),  # a zero count (budget 1 = N)
        ([1.0, 1.0], [1, 1], {"upper": 0.5}),  # box below 1
        ([1.0, 1.0], [1, 1], {"lower": -0.5}),
        ([1.5, 1.0], [1, 1], {}),  # budget 2.5 != N = 2
        ([1.0 + 1.5e-9], [1], {}),  # off by 1.5e-9 of N = 1: above the 1e-9 relative tolerance
    ],
    ids=["negative", "infinite", "zero-count", "upper-below-1", "lower-negative", "budget", "budget-tolerance"],
)
def test_projection_refuses_what_is_not_a_density_of_budget_n(density, counts, kwargs):
    with pytest.raises(ValueError):
        project_weighted_box_budget(density, counts, **kwargs)


def test_projection_keeps_a_zero_density():
    """[0, 2] with unit counts: budget 2 = N, inside [0, 4]."""
    assert project_weighted_box_budget([0.0, 2.0], [1, 1]).tolist() == [0.0, 2.0]


@pytest.mark.parametrize("bounds", [{"upper": 1.0}, {"lower": 1.0}], ids=["upper-1", "lower-1"])
def test_projection_onto_a_box_touching_1_is_all_ones(bounds):
    """x <= 1 (or x >= 1) with sum_t n_t x_t = N leaves only x = 1."""
    assert project_weighted_box_budget([2.5, 0.5, 0.0], [1, 1, 1], **bounds).tolist() == [1.0, 1.0, 1.0]


def test_projection_onto_a_box_with_lower_1_is_exactly_ones_where_rounding_would_show():
    """Budget 2 (1.0648854961832062) + 5 (0.9618320610687023) + 2 (1.0305343511450382) = 9 = N up to rounding; a
    shift solved in floating point would leave 1 + 2^-52 on the first turn."""
    h = [1.0648854961832062, 0.9618320610687023, 1.0305343511450382]
    assert project_weighted_box_budget(h, [2, 5, 2], lower=1.0).tolist() == [1.0, 1.0, 1.0]


# Densities inside the closed box [0, 4] with sum_t n_t h_t = N up to rounding: each is returned bit for bit (a
# shift solved in floating point would move some coordinates by an ulp, or lift a 0 to ~1.6e-16).
INSIDE = [
    pytest.param([0.1, 0.7, 2.2], [1, 1, 1], id="inside"),
    pytest.param([1.7945619335347434, 2.525679758308157, 0.0, 1.861027190332326, 1.1299093655589123], [4, 2, 8, 1, 7], id="inside-weighted"),
    pytest.param([0.0, 3.748878923766816, 0.0, 2.7623318385650224, 1.6771300448430493], [4, 2, 8, 1, 7], id="at-lower"),
    pytest.param([4.0, 0.53156146179402, 0.5647840531561462, 0.830564784053156, 1.196013289036545], [1, 1, 6, 3, 3], id="at-upper"),
]


@pytest.mark.parametrize("density,counts", INSIDE)
def test_projection_returns_a_density_inside_the_closed_box_as_it_is(density, counts):
    h = torch.tensor(density, dtype=torch.float64)
    assert torch.equal(project_weighted_box_budget(h, counts), h)


# --------------------------------------------------------------------------------------------------------------
# Turn and token weights

# Scores [0, ln 14.5, ln 14.5] with unit counts: q = [1, 14.5, 14.5] / 30, h = 3 q = [0.1, 1.45, 1.45].
# Band 0.2, box [0.8, 1.2]: x_0 = 0.8 at its bound, x_1 = x_2 = (3 - 0.8) / 2 = 1.1 (shift 0.35; 0.1 - 0.35 < 0.8).
# Band 0.5, box [0.5, 1.5]: x = [0.5, 1.25, 1.25] (shift 0.2). Band 1, box [0, 2]: h is inside, x = h.
LOWER_BINDS = [0.0, LN14_5, LN14_5]


def _budget(weights, counts) -> float:
    return float((torch.as_tensor(counts, dtype=torch.float64) * weights).sum())


def test_hierarchical_weights_default_temperature_is_1():
    """Scores [ln 4, 0, 0, 0], spans (0,2) (2,4), unit counts: E = [ln 2, 0], b = softmax(ln 2 + E) = [2/3, 1/3];
    q = [4/5, 1/5] and [1/2, 1/2]; h = 4 b q = [32/15, 8/15, 2/3, 2/3] (inside [0, 4]); w = 1/2 + h/2."""
    w = hierarchical_turn_weights([LN4, 0.0, 0.0, 0.0], [1, 1, 1, 1], [(0, 2), (2, 4)])
    assert w.tolist() == close([47 / 30, 23 / 30, 5 / 6, 5 / 6], abs=1e-12)
    assert _budget(w, [1, 1, 1, 1]) == close(4.0)


def test_hierarchical_weights_divide_the_span_scores_by_the_temperature():
    """Temperature 0.5: E / 0.5 = [ln 4, 0] -> b = [8, 2] / 10; q = [16/17, 1/17] and [1/2, 1/2];
    h = [256/85, 16/85, 2/5, 2/5]; w = 1/2 + h/2."""
    w = hierarchical_turn_weights([LN4, 0.0, 0.0, 0.0], [1, 1, 1, 1], [(0, 2), (2, 4)], temperature=0.5)
    assert w.tolist() == close([0.5 + 128 / 85, 0.5 + 8 / 85, 0.7, 0.7], abs=1e-12)


def test_hierarchical_weights_bounded_default_band_is_0_2_with_its_lower_bound():
    """x = [0.8, 1.1, 1.1] (see LOWER_BINDS), w = 1/2 + x/2."""
    w = hierarchical_turn_weights(LOWER_BINDS, [1, 1, 1], [(0, 3)], weighting="bounded")
    assert w.tolist() == close([0.9, 1.05, 1.05], abs=1e-12)


def test_hierarchical_weights_refuse_nan_scores_and_spans_not_starting_at_0():
    with pytest.raises(ValueError):
        hierarchical_turn_weights([1.0, math.nan], [1, 1], [(0, 2)])
    with pytest.raises(ValueError):
        hierarchical_turn_weights([1.0, 0.0], [1, 1], [(1, 2)])


def test_no_turn_or_token_gives_no_weight():
    assert hierarchical_turn_weights([], [], []).tolist() == []
    assert flat_turn_weights([], []).tolist() == []
    assert flat_token_weights([]).tolist() == []


def test_flat_turn_weights_default_temperature_is_1():
    """Scores [ln 3, 0]: q = [3/4, 1/4], h = [3/2, 1/2], w = 1/2 + h/2."""
    assert flat_turn_weights([LN3, 0.0], [1, 1]).tolist() == close([1.25, 0.75], abs=1e-12)


def test_flat_turn_weights_pass_the_band():
    assert flat_turn_weights(LOWER_BINDS, [1, 1, 1], weighting="bounded").tolist() == close([0.9, 1.05, 1.05], abs=1e-12)
    assert flat_turn_weights(LOWER_BINDS, [1, 1, 1], weighting="bounded", band=0.5).tolist() == close(
        [0.75, 1.125, 1.125], abs=1e-12
    )


def test_flat_token_weights_default_upper_is_4():
    """Scores [10, 0 x 5]: h_0 = 6 e^10 / (e^10 + 5) > 4, so x_0 = 4 and the other five share 2: 0.4 each."""
    w = flat_token_weights([10.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert w.tolist() == close([4.0] + [0.4] * 5, abs=1e-12)


def test_flat_token_weights_divide_by_the_temperature():
    """[ln 4, 0] / 2 = [ln 2, 0]: q = [2/3, 1/3], h = [4/3, 2/3] inside the box, no mixing."""
    assert flat_token_weights([LN4, 0.0], temperature=2.0).tolist() == close([4 / 3, 2 / 3], abs=1e-12)


def test_flat_token_weights_bounded_box():
    """Default band 0.2: [0.8, 1.1, 1.1] (the lower bound binds); band 1 allowed: box [0, 2] holds h as it is."""
    assert flat_token_weights(LOWER_BINDS, weighting="bounded").tolist() == close([0.8, 1.1, 1.1], abs=1e-12)
    assert flat_token_weights(LOWER_BINDS, weighting="bounded", band=1.0).tolist() == close([0.1, 1.45, 1.45], abs=1e-12)
    with pytest.raises(ValueError):
        flat_token_weights(LOWER_BINDS, weighting="bounded", band=1.5)


def test_flat_token_weights_equal_scores_are_exactly_one():
    """One token, and 49 equal tokens (where 49 * (1/49) rounds to 1 - 2^-53 in float64): weights exactly 1."""
    assert flat_token_weights([0.7]).tolist() == [1.0]
    assert flat_token_weights([0.3] * 49).tolist() == [1.0] * 49
