"""Scoring a credit method against per-action labels: the normalised action weight, the Mann-Whitney AUC, and
its interval from a bootstrap over task groups.

Used by ``benchmarks/credit_quality.py``: every method's per-turn advantages on one batch are turned into action
weights, and the AUC says how well those weights separate the actions that made progress from the others. The
actions of one trajectory, and the trajectories of one group of siblings, share a task, a policy sample and (for
TASPO and AlignOPSD) a privileged context, so they are not independent: the interval resamples whole groups.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .turns import TurnCredit, TurnValue


def action_weights(turn_advantages: Sequence[TurnValue], outcome_advantage: float) -> list[float] | None:
    """One weight per turn: the turn's advantage divided by the trajectory's outcome advantage A_i.

    A turn whose advantage is given per response token counts with the mean over its tokens, which is what Eq. 7's
    turn-balanced loss weighs the turn with. Dividing by A_i normalises the sign: a weight above 1 means the turn
    gets more of the outcome credit than GRPO's uniform share, whether A_i rewards (success) or blames (failure).
    GRPO's weights are therefore all 1. ``None`` when A_i is 0: there is no outcome credit to compare against.
    """
    if outcome_advantage == 0.0:
        return None
    means = TurnCredit([turn_advantages]).turn_means()[0]
    return [m / outcome_advantage for m in means]


def mann_whitney_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """P(score of a positive > score of a negative), ties counted half; ``None`` without both classes.

    Computed from midranks (tied scores share the mean of their ranks), which is the Mann-Whitney U of the
    positives divided by the number of (positive, negative) pairs.
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    flags = np.asarray(labels, dtype=bool)
    positives = int(flags.sum())
    negatives = len(flags) - positives
    if positives == 0 or negatives == 0:
        return None
    _, inverse, counts = np.unique(np.asarray(scores, dtype=float), return_inverse=True, return_counts=True)
    midranks = np.cumsum(counts) - (counts - 1) / 2  # ranks start at 1
    u = midranks[inverse][flags].sum() - positives * (positives + 1) / 2
    return float(u / (positives * negatives))


@dataclass(frozen=True)
class LabelledAction:
    """One scored action: its task group (the resampling unit), each method's weight for it, and its label."""

    group: Hashable
    weights: Mapping[str, float]
    progress: bool


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap percentile interval (``None`` bounds when no replicate was defined)."""

    estimate: float | None
    low: float | None
    high: float | None

    def as_dict(self) -> dict[str, float | None]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class BootstrapAUC:
    """``intervals[method]``: ``"auc"`` and, per reference, ``"minus_<reference>"``; ``kept`` of ``resamples``
    replicates had both classes and so an AUC."""

    intervals: dict[str, dict[str, Interval]]
    kept: int
    resamples: int

    def as_dict(self) -> dict[str, object]:
        return {"kept": self.kept, "resamples": self.resamples,
                "methods": {m: {k: v.as_dict() for k, v in entry.items()} for m, entry in self.intervals.items()}}


def _percentiles(values: list[float], level: float) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def group_bootstrap_auc(
    actions: Sequence[LabelledAction],
    methods: Sequence[str],
    references: Sequence[str] = (),
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> BootstrapAUC:
    """Each method's AUC with a percentile interval from a bootstrap that resamples whole task groups, and the
    paired difference AUC(method) - AUC(reference) on the same replicates for every reference in ``references``.

    A replicate draws as many groups as there are, with replacement, and keeps all their actions; a replicate
    missing positives or negatives has no AUC and is dropped (``kept`` in the result says how many were used).
    """
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"resamples must be >= 1 and level in (0, 1), got {resamples} and {level}")
    groups: dict[Hashable, list[LabelledAction]] = {}
    for action in actions:
        groups.setdefault(action.group, []).append(action)
    members = list(groups.values())
    names = list(dict.fromkeys([*methods, *references]))

    def aucs(chosen: Sequence[list[LabelledAction]]) -> dict[str, float | None]:
        pooled = [a for group in chosen for a in group]
        labels = [a.progress for a in pooled]
        return {m: mann_whitney_auc([a.weights[m] for a in pooled], labels) for m in names}

    point = aucs(members)
    rng = np.random.default_rng(seed)
    replicates: list[dict[str, float]] = []
    for _ in range(resamples):
        drawn = aucs([members[k] for k in rng.integers(0, len(members), size=len(members))])
        if all(value is not None for value in drawn.values()):
            replicates.append(drawn)  # type: ignore[arg-type]
    out: dict[str, dict[str, Interval]] = {}
    for method in methods:
        entry = {"auc": Interval(point[method], *_percentiles([r[method] for r in replicates], level))}
        for reference in references:
            if reference == method:
                continue
            estimate = None if point[method] is None or point[reference] is None else point[method] - point[reference]
            diffs = [r[method] - r[reference] for r in replicates]
            entry[f"minus_{reference}"] = Interval(estimate, *_percentiles(diffs, level))
        out[method] = entry
    return BootstrapAUC(out, len(replicates), resamples)


def moved_share(per_trajectory_weights: Sequence[Sequence[float] | None], tolerance: float = 1e-6) -> float | None:
    """The share of trajectories (with a non-zero outcome advantage) whose action weights are not all 1: tells
    "no credit moved" (0) apart from "credit moved, the wrong way" (an AUC on the wrong side with a share above 0)."""
    scored = [w for w in per_trajectory_weights if w is not None]
    if not scored:
        return None
    return sum(any(abs(x - 1.0) > tolerance for x in w) for w in scored) / len(scored)


def credit_verdict(pool: str, low: float | None, high: float | None, moved: float | None) -> str:
    """What an AUC interval says about a method on one pool of trajectories.

    Progress actions should get more of the reward in won trajectories (AUC above 0.5) and less of the blame in
    failed ones (AUC below 0.5). "right way" / "wrong way" when the whole interval lies on that / the other side of
    0.5, "no clear effect" when it holds 0.5, and "no credit moved" when no trajectory's weights moved (``moved``
    0 or ``None``), whatever the interval.
    """
    if pool not in ("success", "failed"):
        raise ValueError(f"pool must be 'success' or 'failed', got {pool!r}")
    if not moved or low is None or high is None:
        return "no credit moved"
    above, below = low > 0.5, high < 0.5
    if not (above or below):
        return "no clear effect"
    return "right way" if above == (pool == "success") else "wrong way"
