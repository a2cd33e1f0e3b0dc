"""The credit-quality scores: the sign-normalised action weight and the Mann-Whitney AUC, against hand counts."""

from __future__ import annotations

import random
from itertools import product

import pytest

from taspo_trl.credit.quality import action_weights, credit_verdict, mann_whitney_auc


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
