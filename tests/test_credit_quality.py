"""The credit-quality scores: the sign-normalised action weight and the Mann-Whitney AUC, against hand counts."""

from __future__ import annotations

import random
from itertools import product

import pytest

from taspo_trl.credit.quality import action_weights, mann_whitney_auc


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
