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
