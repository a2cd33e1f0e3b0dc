"""Tests written against the mutants of ``taspo_trl/credit/alignopsd.py`` that survived its parity tests
(``benchmarks/mutation.sh``; the scores and the equivalent mutants are in benchmarks/results/mutation_alignopsd.md).

Expected values come from hand calculations of the official formulas (the arithmetic is in each docstring), from
the official configuration (``verl/trainer/config/beyond_timestamps_trainer.yaml`` of ``mingju-c/Align-OPSD``)
for the defaults, and from the user-facing error messages as written, matched whole.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

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
