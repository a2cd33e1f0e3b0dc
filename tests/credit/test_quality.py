"""The credit-quality scores: the sign-normalised action weight and the Mann-Whitney AUC, against hand counts."""

from __future__ import annotations

import random
import re
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taspo_trl.credit.quality import (
    BootstrapAUC,
    Interval,
    _percentiles,
    action_weights,
    credit_verdict,
    mann_whitney_auc,
)


@pytest.mark.parametrize(
    ("scores", "labels", "expected"),
    [
        # positives 0.35, 0.8 against negatives 0.1, 0.4: 3 of the 4 pairs ordered right
        ([0.1, 0.4, 0.35, 0.8], [False, False, True, True], 0.75),
        # all tied: every pair counts half
        ([1.0, 1.0, 1.0, 1.0], [True, False, True, False], 0.5),
        # positives 2, 1 against negatives 1, 0: pairs 1 + 1 + 0.5 (the tie) + 1 = 3.5 of 4
        ([2.0, 1.0, 1.0, 0.0], [True, True, False, False], 0.875),
        # the only positive below both negatives
        ([0.0, 1.0, 2.0], [True, False, False], 0.0),
        # 1 positive, 3 negatives, ties with two of them: 0.5 + 0.5 + 1 = 2 of 3
        ([5.0, 5.0, 5.0, 4.0], [True, False, False, False], 2 / 3),
    ],
)
def test_auc_hand_counts(scores, labels, expected):
    assert mann_whitney_auc(scores, labels) == pytest.approx(expected)


def test_auc_matches_pair_counting_on_random_ties():
    rng = random.Random(0)
    for _ in range(20):
        scores = [rng.choice([0.0, 0.5, 1.0, 1.5]) for _ in range(15)]
        labels = [rng.random() < 0.4 for _ in range(15)]
        pos = [s for s, y in zip(scores, labels) if y]
        neg = [s for s, y in zip(scores, labels) if not y]
        if not pos or not neg:
            continue
        pairs = [1.0 if p > n else 0.5 if p == n else 0.0 for p, n in product(pos, neg)]
        assert mann_whitney_auc(scores, labels) == pytest.approx(sum(pairs) / len(pairs))


def test_auc_needs_both_classes():
    assert mann_whitney_auc([0.1, 0.2], [True, True]) is None
    assert mann_whitney_auc([], []) is None
    with pytest.raises(ValueError, match="2 scores for 1 labels"):
        mann_whitney_auc([0.1, 0.2], [True])


def test_action_weights_normalise_the_sign():
    # A failed trajectory (A = -2): the second turn carries more of the blame, the third is given per token.
    assert action_weights([-1.2, -2.8, [-1.0, -3.0]], -2.0) == pytest.approx([0.6, 1.4, 1.0])
    # A success (A = 0.5) under GRPO: every weight is 1.
    assert action_weights([0.5, 0.5], 0.5) == [1.0, 1.0]
    assert action_weights([0.0, 0.0], 0.0) is None


# --- the group bootstrap -----------------------------------------------------------------------------------------

from math import erf, sqrt  # noqa: E402

import numpy as np  # noqa: E402

from taspo_trl.credit.quality import LabelledAction, group_bootstrap_auc, moved_share  # noqa: E402


def _actions(groups: list[list[tuple[float, bool]]], method: str = "m") -> list[LabelledAction]:
    return [LabelledAction(g, {method: w, "grpo": 1.0}, y) for g, group in enumerate(groups) for w, y in group]


def test_a_perfect_separation_in_every_group_has_a_degenerate_interval():
    groups = [[(2.0, True), (0.5, False), (1.5, True)], [(3.0, True), (0.1, False)], [(1.1, True), (1.0, False)]]
    result = group_bootstrap_auc(_actions(groups), ["m"], references=["grpo"], resamples=200)
    auc = result.intervals["m"]["auc"]
    assert (auc.estimate, auc.low, auc.high) == (1.0, 1.0, 1.0)
    diff = result.intervals["m"]["minus_grpo"]  # GRPO's weights are all 1: AUC 0.5
    assert (diff.estimate, diff.low, diff.high) == (0.5, 0.5, 0.5)


def test_one_group_resamples_to_itself():
    groups = [[(0.1, True), (0.4, False), (0.35, True), (0.8, False)]]
    result = group_bootstrap_auc(_actions(groups), ["m"], resamples=50)
    auc = result.intervals["m"]["auc"]
    assert (auc.estimate, auc.low, auc.high) == (0.0, 0.0, 0.0)  # both positives below both negatives
    assert result.kept == 50


def test_replicates_without_both_classes_are_dropped():
    # Group 0 holds the only negative: a replicate without it has no AUC.
    groups = [[(0.0, False), (1.0, True)], [(2.0, True)], [(3.0, True)]]
    result = group_bootstrap_auc(_actions(groups), ["m"], resamples=400, seed=1)
    assert 0 < result.kept < 400
    assert (1 - 1 / 3) ** 3 == pytest.approx(0.296, abs=1e-3)  # P(group 0 never drawn)
    assert result.kept / 400 == pytest.approx(1 - 0.296, abs=0.08)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + erf(x / sqrt(2)))


def _draw_batch(rng: np.random.Generator, groups: int, per_group: int, shift: float, spread: float = 1.5) -> list[LabelledAction]:
    """Weights w = e + s_g * y, e ~ N(0, 1), where the credit's separation s_g ~ N(shift, spread^2) differs from
    group to group (in some tasks a method's credit works, in others not). Any positive beats any negative with
    probability Phi(shift / sqrt(2 + spread^2)), within a group or across two."""
    actions = []
    for g in range(groups):
        separation = rng.normal(shift, spread)
        for _ in range(per_group):
            y = bool(rng.random() < 0.4)
            actions.append(LabelledAction(g, {"m": rng.normal() + separation * y}, y))
    return actions


def test_the_interval_covers_the_true_auc_at_about_the_nominal_rate():
    shift, spread, draws = 0.5, 1.5, 80
    truth = _normal_cdf(shift / sqrt(2 + spread**2))  # 0.597
    rng = np.random.default_rng(0)
    covered = naive = 0
    for draw in range(draws):
        actions = _draw_batch(rng, groups=20, per_group=20, shift=shift, spread=spread)
        auc = group_bootstrap_auc(actions, ["m"], resamples=200, seed=draw).intervals["m"]["auc"]
        covered += auc.low <= truth <= auc.high
        # The same bootstrap treating every action as its own group ignores what a group's actions share.
        singles = [LabelledAction(k, a.weights, a.progress) for k, a in enumerate(actions)]
        single = group_bootstrap_auc(singles, ["m"], resamples=200, seed=draw).intervals["m"]["auc"]
        naive += single.low <= truth <= single.high
    assert 0.85 <= covered / draws <= 1.0, covered
    assert naive / draws < 0.8, naive  # far too narrow: why whole groups are resampled


def test_paired_difference_of_a_method_with_itself_is_exactly_zero():
    rng = np.random.default_rng(3)
    actions = [LabelledAction(a.group, {"m": a.weights["m"], "copy": a.weights["m"]}, a.progress)
               for a in _draw_batch(rng, 10, 6, 1.0)]
    diff = group_bootstrap_auc(actions, ["m"], references=["copy"], resamples=100).intervals["m"]["minus_copy"]
    assert (diff.estimate, diff.low, diff.high) == (0.0, 0.0, 0.0)


def test_bootstrap_settings_are_checked():
    with pytest.raises(ValueError, match="resamples must be >= 1"):
        group_bootstrap_auc([], ["m"], resamples=0)


def test_moved_share_counts_trajectories_whose_weights_are_not_all_one():
    assert moved_share([[1.0, 1.0], [0.9, 1.1], None, [1.0, 1.0 + 1e-9], [1.2]]) == pytest.approx(2 / 4)
    assert moved_share([None]) is None


@pytest.mark.parametrize(
    ("pool", "low", "high", "moved", "expected"),
    [
        ("success", 0.501, 0.666, 1.0, "right way"),  # all above 0.5 on won trajectories: more reward to progress
        ("success", 0.30, 0.45, 1.0, "wrong way"),
        ("success", 0.484, 0.657, 0.68, "no clear effect"),  # holds 0.5
        ("failed", 0.389, 0.477, 1.0, "right way"),  # all below 0.5 on failed ones: less blame to progress
        ("failed", 0.520, 0.635, 1.0, "wrong way"),
        ("failed", 0.354, 0.50, 0.93, "no clear effect"),  # touching 0.5 is not excluding it
        ("success", 0.5, 0.5, 0.0, "no credit moved"),  # GRPO
        ("failed", None, None, None, "no credit moved"),
    ],
)
def test_credit_verdict_reads_the_interval_against_one_half(pool, low, high, moved, expected):
    assert credit_verdict(pool, low, high, moved) == expected


def test_credit_verdict_names_an_unknown_pool():
    with pytest.raises(ValueError, match="pool must be 'success' or 'failed', got 'won'"):
        credit_verdict("won", 0.6, 0.7, 1.0)


# --------------------------------------------------------------------------------------------------------------
# Tests against the surviving mutants of ``credit/quality.py``: the exact percentile positions of the bootstrap
# interval, the bounds of its settings, seeds and resample counts, references that are the method itself, pools
# without both classes, boundary cases of ``credit_verdict`` and ``moved_share``, and the JSON shape of the results.
#
# Every expected value is worked out by hand in the test's docstring or comment.


def _two_mirrored_groups() -> list[LabelledAction]:
    """Group "a" ranks its positive first (AUC 1), group "b" its negative first (AUC 0); pooled, the positives
    1.0, 0.0 against the negatives 0.0, 1.0 give pairs 0.5 + 1 + 0 + 0.5 = 2 of 4, AUC 0.5. A replicate draws two
    groups: ("a", "a") has AUC 1, ("b", "b") AUC 0, a mixed draw AUC 0.5, and every replicate has both classes."""
    return [
        LabelledAction("a", {"m": 1.0, "flat": 1.0}, True),
        LabelledAction("a", {"m": 0.0, "flat": 1.0}, False),
        LabelledAction("b", {"m": 0.0, "flat": 1.0}, True),
        LabelledAction("b", {"m": 1.0, "flat": 1.0}, False),
    ]


def _varied_groups() -> list[LabelledAction]:
    """Eight groups of three actions with distinct weights, so that different draws give different AUCs."""
    rng = np.random.default_rng(7)
    return [LabelledAction(g, {"m": float(rng.normal())}, k != 1) for g in range(8) for k in range(3)]


# --- the percentile interval ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "low", "high"),
    [
        # tail (1 - 0.95) / 2 * 100 = 2.5: positions 0.025 * 4 = 0.1 and 0.975 * 4 = 3.9 of the sorted list,
        # linearly interpolated: 0 + 0.1 * 10 = 1 and 30 + 0.9 * 10 = 39.
        (0.95, 1.0, 39.0),
        # tail 25: positions 1 and 3, the values 10 and 30.
        (0.5, 10.0, 30.0),
        # tail 40: positions 1.6 and 2.4: 10 + 0.6 * 10 = 16 and 20 + 0.4 * 10 = 24.
        (0.2, 16.0, 24.0),
    ],
)
def test_interval_bounds_are_linear_percentiles_of_the_replicates(level: float, low: float, high: float) -> None:
    """The bounds are the (1 - level) / 2 and (1 + level) / 2 quantiles of the replicates, read at position
    q * (n - 1) of the sorted values with linear interpolation (numpy's default percentile); here the replicates
    are 40, 0, 30, 10, 20 (n = 5, given unsorted)."""
    assert _percentiles([40.0, 0.0, 30.0, 10.0, 20.0], level) == pytest.approx((low, high), rel=1e-12)


def test_no_replicates_give_no_bounds() -> None:
    assert _percentiles([], 0.95) == (None, None)


def test_mirrored_groups_span_the_whole_range_of_replicate_aucs() -> None:
    """Two mirrored groups (``_two_mirrored_groups``): the replicates are AUC 1, 0.5, 0 with probabilities 1/4,
    1/2, 1/4. Of 400 replicates about 100 are 0 and 100 are 1; the 2.5 % bound sits at position 0.025 * 399 = 9.98
    of the sorted replicates, so it is 0 as soon as 11 replicates are 0 (and the 97.5 % bound 1 as soon as 11 are
    1): P(Binomial(400, 1/4) <= 10) is below 1e-30. The flat method ties everything: AUC 0.5 in every replicate."""
    result = group_bootstrap_auc(_two_mirrored_groups(), ["m"], references=["flat"], resamples=400, seed=5)
    assert result.kept == 400
    auc = result.intervals["m"]["auc"]
    assert (auc.estimate, auc.low, auc.high) == (0.5, 0.0, 1.0)
    diff = result.intervals["m"]["minus_flat"]  # the replicate's AUC minus 0.5: -0.5, 0 or 0.5
    assert (diff.estimate, diff.low, diff.high) == (0.0, -0.5, 0.5)


# --- settings, seeds and resample counts ---------------------------------------------------------------------------


_SETTINGS_MESSAGE = "resamples must be >= 1 and level in (0, 1), got {} and {}"


@pytest.mark.parametrize(("resamples", "level"), [(0, 0.95), (-3, 0.95), (10, 0.0), (10, 1.0), (10, 1.5), (10, -0.2)])
def test_bootstrap_settings_outside_their_range_are_refused(resamples: int, level: float) -> None:
    message = _SETTINGS_MESSAGE.format(resamples, level)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        group_bootstrap_auc(_two_mirrored_groups(), ["m"], resamples=resamples, level=level)


def test_a_single_resample_is_allowed() -> None:
    """resamples = 1 is in range: one replicate, so both bounds are its AUC, which is 1, 0.5 or 0 (the mirrored
    groups); the estimate is the pooled 0.5."""
    result = group_bootstrap_auc(_two_mirrored_groups(), ["m"], resamples=1)
    assert (result.kept, result.resamples) == (1, 1)
    auc = result.intervals["m"]["auc"]
    assert auc.estimate == 0.5
    assert auc.low == auc.high
    assert auc.low in (0.0, 0.5, 1.0)


@pytest.mark.parametrize("level", [1e-9, 0.999999])
def test_levels_just_inside_the_open_interval_are_allowed(level: float) -> None:
    result = group_bootstrap_auc(_two_mirrored_groups(), ["m"], resamples=3, level=level)
    assert result.kept == 3


def test_the_default_is_2000_resamples() -> None:
    """Two copies of one group (a positive above a negative): every replicate has AUC 1, none is dropped."""
    actions = [LabelledAction(g, {"m": w}, y) for g in range(2) for w, y in [(1.0, True), (0.0, False)]]
    result = group_bootstrap_auc(actions, ["m"])
    assert (result.kept, result.resamples) == (2000, 2000)
    assert result.as_dict()["resamples"] == 2000


@pytest.mark.parametrize("resamples", [1, 7, 30])
def test_the_result_reports_the_resamples_asked_for(resamples: int) -> None:
    """Identical groups: every replicate has both classes, so all are kept."""
    actions = [LabelledAction(g, {"m": w}, y) for g in range(3) for w, y in [(0.2, True), (0.7, False)]]
    result = group_bootstrap_auc(actions, ["m"], resamples=resamples)
    assert (result.kept, result.resamples) == (resamples, resamples)
    auc = result.intervals["m"]["auc"]
    assert (auc.estimate, auc.low, auc.high) == (0.0, 0.0, 0.0)


def test_a_seed_reproduces_its_interval_and_different_seeds_differ() -> None:
    """Eight groups with distinct weights and 20 replicates: each bound interpolates between two replicate AUCs,
    so two seeds (and two unseeded runs) agree on both bounds only by a coincidence of draws."""
    actions = _varied_groups()
    bounds = {}
    for seed in range(4):
        first = group_bootstrap_auc(actions, ["m"], resamples=20, seed=seed).intervals["m"]["auc"]
        again = group_bootstrap_auc(actions, ["m"], resamples=20, seed=seed).intervals["m"]["auc"]
        assert first == again
        bounds[seed] = (first.low, first.high)
    assert len(set(bounds.values())) == 4


def test_the_default_seed_is_zero() -> None:
    actions = _varied_groups()
    default = group_bootstrap_auc(actions, ["m"], resamples=20)
    assert default == group_bootstrap_auc(actions, ["m"], resamples=20, seed=0)
    assert default != group_bootstrap_auc(actions, ["m"], resamples=20, seed=1)


# --- references and undefined AUCs ---------------------------------------------------------------------------------


def test_a_reference_that_is_the_method_itself_is_skipped_not_the_later_ones() -> None:
    """References ["m", "flat"] for method "m": no "minus_m" entry, and "minus_flat" is still there; one group
    with the positive above the negative: AUC 1, the flat method 0.5, difference 0.5 in every replicate."""
    actions = [LabelledAction(0, {"m": 1.0, "flat": 1.0}, True), LabelledAction(0, {"m": 0.0, "flat": 1.0}, False)]
    entry = group_bootstrap_auc(actions, ["m"], references=["m", "flat"], resamples=5).intervals["m"]
    assert set(entry) == {"auc", "minus_flat"}
    diff = entry["minus_flat"]
    assert (diff.estimate, diff.low, diff.high) == (0.5, 0.5, 0.5)


def test_a_pool_without_negatives_has_no_auc_and_no_difference() -> None:
    """Only positives: neither method has an AUC, on the pool or on any replicate."""
    actions = [LabelledAction(g, {"m": float(g), "flat": 1.0}, True) for g in range(3)]
    result = group_bootstrap_auc(actions, ["m"], references=["flat"], resamples=10)
    assert result.kept == 0
    assert result.intervals["m"]["auc"] == Interval(None, None, None)
    assert result.intervals["m"]["minus_flat"] == Interval(None, None, None)


# --- the Mann-Whitney AUC ------------------------------------------------------------------------------------------


def test_labels_given_as_zero_and_one_count_like_booleans() -> None:
    """Positives 0.35, 0.8 against negatives 0.1, 0.4: 3 of the 4 pairs ordered right, whether the labels are
    booleans, 0/1 integers or a numpy integer array."""
    scores = [0.1, 0.4, 0.35, 0.8]
    assert mann_whitney_auc(scores, [0, 0, 1, 1]) == 0.75
    assert mann_whitney_auc(scores, np.array([0, 0, 1, 1])) == 0.75
    assert mann_whitney_auc(scores, [False, False, True, True]) == 0.75


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=2, max_size=12).filter(
        lambda pairs: len({y for _, y in pairs}) == 2
    )
)
def test_auc_of_negated_scores_is_one_minus_the_auc(pairs: list[tuple[int, bool]]) -> None:
    """Reversing the order turns every won pair into a lost one and keeps the ties: AUC(-s) = 1 - AUC(s)."""
    scores = [float(s) for s, _ in pairs]
    labels = [y for _, y in pairs]
    forward = mann_whitney_auc(scores, labels)
    backward = mann_whitney_auc([-s for s in scores], labels)
    assert forward is not None and backward is not None
    assert forward + backward == pytest.approx(1.0)


# --- moved_share and credit_verdict --------------------------------------------------------------------------------


def test_a_weight_exactly_at_the_tolerance_has_not_moved() -> None:
    """|1.5 - 1| = 0.5 is not more than the tolerance 0.5; |1.75 - 1| = 0.75 is: 1 of the 2 trajectories moved
    (all numbers exact in binary)."""
    assert moved_share([[1.5], [1.0, 1.75]], tolerance=0.5) == 0.5
    assert moved_share([[1.5, 0.5]], tolerance=0.5) == 0.0


@pytest.mark.parametrize("pool", ["success", "failed"])
def test_an_interval_starting_at_one_half_holds_it(pool: str) -> None:
    """[0.5, 0.7] touches 0.5, so it does not lie above it."""
    assert credit_verdict(pool, 0.5, 0.7, 1.0) == "no clear effect"


@pytest.mark.parametrize(("low", "high"), [(None, 0.7), (0.6, None), (None, 0.3), (0.2, None)])
def test_a_missing_bound_means_no_credit_moved(low: float | None, high: float | None) -> None:
    assert credit_verdict("success", low, high, 1.0) == "no credit moved"
    assert credit_verdict("failed", low, high, 0.5) == "no credit moved"


def test_an_unknown_pool_is_named_in_full() -> None:
    message = "pool must be 'success' or 'failed', got 'won'"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        credit_verdict("won", 0.6, 0.7, 1.0)


# --- the JSON shape ------------------------------------------------------------------------------------------------


def test_an_interval_as_a_dict() -> None:
    assert Interval(0.75, 0.5, None).as_dict() == {"estimate": 0.75, "low": 0.5, "high": None}


def test_a_bootstrap_result_as_a_dict() -> None:
    result = BootstrapAUC(
        {
            "m": {"auc": Interval(0.75, 0.5, 1.0), "minus_flat": Interval(0.25, 0.0, 0.5)},
            "n": {"auc": Interval(None, None, None)},
        },
        kept=9,
        resamples=10,
    )
    assert result.as_dict() == {
        "kept": 9,
        "resamples": 10,
        "methods": {
            "m": {
                "auc": {"estimate": 0.75, "low": 0.5, "high": 1.0},
                "minus_flat": {"estimate": 0.25, "low": 0.0, "high": 0.5},
            },
            "n": {"auc": {"estimate": None, "low": None, "high": None}},
        },
    }
