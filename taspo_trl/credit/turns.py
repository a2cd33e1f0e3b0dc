"""Per-turn credit, the value every credit hook returns: for each trajectory, one value per turn, where a turn's
value is a number for all of its policy tokens or a list with one number per response token (TASPO's token-level
unit, AlignOPSD's ablation B, the teacher methods' per-token terms).

``TurnCredit`` holds that nested shape once, so the trainers read it through its methods (``flat``,
``turn_means``, ``scaled``; ``add_to_tokens`` adds a per-token term) rather than each checking which kind of value a
turn has. It is a ``list`` of per-trajectory lists, so indexing, ``len`` and comparison with plain nested lists work
as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

TurnValue = float | list[float]
"""One turn's credit: a number for every policy token of the turn, or one number per response token."""


def _turn_value(value: object) -> TurnValue:
    """A hook's value for one turn as a ``TurnValue``: a number, or a list of numbers (from a list, a tuple, an
    array or a tensor with one entry per token)."""
    if isinstance(value, list):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    listed = value.tolist() if hasattr(value, "tolist") else list(value)
    return [float(v) for v in listed] if isinstance(listed, list) else float(listed)


def _tokens(value: TurnValue) -> list[float]:
    """A turn's values as a list: its per-token values, or its one value."""
    return value if isinstance(value, list) else [value]


class TurnCredit(list):
    """Per trajectory, the credit of each of its turns (``TurnValue``); a ``list`` of lists."""

    def __init__(self, per_trajectory: Iterable[Iterable[TurnValue]] = ()) -> None:
        super().__init__([_turn_value(value) for value in turns] for turns in per_trajectory)

    @classmethod
    def of(cls, credit: Iterable[Iterable[TurnValue]]) -> TurnCredit:
        """``credit`` itself when it already is a ``TurnCredit`` (what the built-in hooks return), else converted."""
        return credit if isinstance(credit, TurnCredit) else cls(credit)

    @classmethod
    def uniform(cls, turn_counts: Iterable[int], value: float = 1.0) -> TurnCredit:
        """``value`` on every turn: GRPO's weights (1) or a fallback trajectory's."""
        return cls([value] * count for count in turn_counts)

    def flat(self) -> list[float]:
        """Every value, trajectory by trajectory and turn by turn (a per-token turn gives all of its tokens)."""
        return [v for turns in self for value in turns for v in _tokens(value)]

    def turn_means(self) -> list[list[float]]:
        """One number per turn: the turn's value, or the mean over its tokens (what Eq. 7's turn-balanced loss
        weighs the turn with)."""
        return [[sum(value) / max(len(value), 1) if isinstance(value, list) else value for value in turns]
                for turns in self]

    def scaled(self, advantages: Sequence[float], offsets: Sequence[Sequence[float]] | None = None) -> TurnCredit:
        """``A_i w_it`` for weights ``w`` (every token of a per-token turn), plus ``offsets[i][t]`` on every token
        of the turn where given (AlignOPSD's invalid-action residual)."""
        if offsets is None:
            return TurnCredit(
                [[advantage * w for w in value] if isinstance(value, list) else advantage * value for value in turns]
                for advantage, turns in zip(advantages, self, strict=True)
            )
        return TurnCredit(
            [[advantage * w + r for w in value] if isinstance(value, list) else advantage * value + r
             for value, r in zip(turns, turn_offsets, strict=True)]
            for advantage, turns, turn_offsets in zip(advantages, self, offsets, strict=True)
        )


def add_to_tokens(credit: list[list[TurnValue]], trajectory: int, turn: int, term: Sequence[float]) -> None:
    """Add a per-token term to one turn of ``credit``, in place; the turn becomes per-token (a one-value turn's
    value is added to every token of ``term``)."""
    value = credit[trajectory][turn]
    if isinstance(value, list):
        credit[trajectory][turn] = [b + x for b, x in zip(value, term)]
    else:
        credit[trajectory][turn] = [value + x for x in term]
