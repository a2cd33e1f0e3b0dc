"""Scoring a credit method against per-action labels: the normalised action weight and the Mann-Whitney AUC.

Used by ``benchmarks/credit_quality.py``: every method's per-turn advantages on one batch are turned into action
weights, and the AUC says how well those weights separate the actions that made progress from the others.
"""

from __future__ import annotations

from collections.abc import Sequence


def action_weights(turn_advantages: Sequence[float | Sequence[float]], outcome_advantage: float) -> list[float] | None:
    """One weight per turn: the turn's advantage divided by the trajectory's outcome advantage A_i.

    A turn whose advantage is given per response token counts with the mean over its tokens, which is what Eq. 7's
    turn-balanced loss weighs the turn with. Dividing by A_i normalises the sign: a weight above 1 means the turn
    gets more of the outcome credit than GRPO's uniform share, whether A_i rewards (success) or blames (failure).
    GRPO's weights are therefore all 1. ``None`` when A_i is 0: there is no outcome credit to compare against.
    """
    if outcome_advantage == 0.0:
        return None
    means = [sum(a) / len(a) if isinstance(a, Sequence) else float(a) for a in turn_advantages]
    return [m / outcome_advantage for m in means]


def mann_whitney_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """P(score of a positive > score of a negative), ties counted half; ``None`` without both classes.

    Computed from midranks (tied scores share the mean of their ranks), which is the Mann-Whitney U of the
    positives divided by the number of (positive, negative) pairs.
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    positives = sum(bool(label) for label in labels)
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return None
    order = sorted(range(len(scores)), key=lambda k: scores[k])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        midrank = (start + end) / 2 + 1  # ranks start at 1
        for k in order[start : end + 1]:
            ranks[k] = midrank
        start = end + 1
    rank_sum = sum(rank for rank, label in zip(ranks, labels) if label)
    u = rank_sum - positives * (positives + 1) / 2
    return u / (positives * negatives)
