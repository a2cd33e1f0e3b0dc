"""Tests written against the surviving mutants of the profile, span and weight stages of
``taspo_trl/credit/alignopsd.py`` (``benchmarks/mutation.sh``; the mutants left and why they are equivalent are in
benchmarks/results/mutation_alignopsd_equivalent_s.md).

Every expected value is a hand calculation of the official formula (the arithmetic is in the docstring) or a
property of the method: the box bounds, the token budget sum_t n_t w_t = N, valid partitions into spans of
``min_turns``..``max_turns`` turns. The refusals' messages are matched in tests/test_alignopsd_mutation_kills.py;
here a refusal is only checked to be a ValueError.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from taspo_trl.credit.alignopsd import (
    adjacent_profile_distances,
    dense_profiles,
    flat_token_weights,
    flat_turn_weights,
    hierarchical_turn_weights,
    mix_density,
    profile_distance,
    project_weighted_box_budget,
    segment_trajectory,
    segmentation_threshold,
    turn_gap,
)

close = pytest.approx
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
