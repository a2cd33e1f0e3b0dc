"""Per-token values regrouped per (trajectory, turn) straight from the batch tensors (``Rows.collect``), in both
row layouts, on hand-built trajectories whose expected groups are written out below."""

from __future__ import annotations

import pytest
import torch

from taspo_trl.rollout.layouts import build_rows
from taspo_trl.rollout.records import Trajectory, Turn


def _turn(prompt: list[int], response: list[int]) -> Turn:
    return Turn(prompt, response, [0.0] * len(response), "", "a", True, "ok", (0, len(response)), "")


def _trajectories() -> list[Trajectory]:
    """Trajectory 0: two turns, the second prompt extends the first turn with one observation token (5);
    trajectory 1: one turn."""
    first = Trajectory(task_spec={}, task="t", initial_observation="", group=0)
    first.turns += [_turn([1, 2], [3, 4]), _turn([1, 2, 3, 4, 5], [6, 7, 8])]
    second = Trajectory(task_spec={}, task="t", initial_observation="", group=0)
    second.turns.append(_turn([9], [10]))
    return [first, second]


def _positions(rows: int, width: int) -> torch.Tensor:
    """Value 100 * row + position at every place of a [rows, width] batch tensor."""
    return (100 * torch.arange(rows)[:, None] + torch.arange(width)[None, :]).double()


@pytest.mark.parametrize(
    "layout,expected",
    [
        # one row per trajectory: row 0 is [3, 4, obs 5, 6, 7, 8], so turn 1 skips position 2
        ("sequence", {(0, 0): [0.0, 1.0], (0, 1): [3.0, 4.0, 5.0], (1, 0): [100.0]}),
        # one row per turn, then two padding rows that belong to no trajectory
        ("turn", {(0, 0): [0.0, 1.0], (0, 1): [100.0, 101.0, 102.0], (1, 0): [200.0]}),
    ],
)
def test_collect_regroups_a_batch_tensor_per_turn(layout, expected):
    rows = build_rows(_trajectories(), layout, pad_to_multiple=5)
    values = _positions(len(rows), 6)
    got = rows.collect(values)
    assert {key: value.tolist() for key, value in got.items()} == expected
    assert all(value.dtype == torch.float64 for value in got.values())


def test_collect_takes_rows_of_their_own_length():
    rows = build_rows(_trajectories(), "sequence")
    ragged = [torch.tensor([0.5, 1.5, 9.0, 2.5, 3.5, 4.5]), torch.tensor([7.0])]
    got = rows.collect(ragged)
    assert got[(0, 1)].tolist() == [2.5, 3.5, 4.5] and got[(1, 0)].tolist() == [7.0]
