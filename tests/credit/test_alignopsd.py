"""Parity of ``taspo_trl.credit.alignopsd`` with the official AlignOPSD code (``mingju-c/Align-OPSD``).

One case or more per stage. Each test says where its expected numbers come from:
* "official fixture": the inputs and expected values of a test in the official repository's ``tests/``
  (file and test named);
* "hand": a hand calculation of the official formula (the arithmetic is in the test);
* "property": a property the official code states or checks at run time, tested with hypothesis.
"""

from __future__ import annotations

import math

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
