"""``TurnCredit``: the per-turn credit every hook returns, read through one type (hand-computed values)."""

from __future__ import annotations

import pytest
import torch

from taspo_trl.credit.turns import TurnCredit, add_to_tokens

# Two trajectories: the first has a one-value turn and a per-token turn of three tokens, the second one turn.
NESTED = [[0.5, [1.0, 2.0, 4.0]], [3.0]]


def test_it_is_the_nested_list_it_was_given_with_numbers_made_floats():
    credit = TurnCredit([[1, (2, 3)], [torch.tensor(0.25)], [torch.tensor([1.0, 0.5])]])
    assert credit == [[1.0, [2.0, 3.0]], [0.25], [[1.0, 0.5]]]
    assert type(credit[0][0]) is float and type(credit[1][0]) is float
    assert TurnCredit(NESTED) == NESTED and len(TurnCredit(NESTED)) == 2


def test_of_keeps_a_turn_credit_and_converts_nested_lists():
    credit = TurnCredit(NESTED)
    assert TurnCredit.of(credit) is credit
    converted = TurnCredit.of([[1, 2]])
    assert type(converted) is TurnCredit and converted == [[1.0, 2.0]]


def test_uniform_gives_the_value_on_every_turn():
    assert TurnCredit.uniform([2, 0, 1]) == [[1.0, 1.0], [], [1.0]]
    assert TurnCredit.uniform([1], 0.0) == [[0.0]]


def test_flat_lists_every_token_value_in_order():
    assert TurnCredit(NESTED).flat() == [0.5, 1.0, 2.0, 4.0, 3.0]


def test_turn_means_average_a_per_token_turn():
    assert TurnCredit(NESTED).turn_means() == [[0.5, 7.0 / 3.0], [3.0]]
    assert TurnCredit([[[]]]).turn_means() == [[0.0]]  # a turn without tokens counts 0, not a division by zero


def test_scaled_multiplies_every_value_by_its_trajectorys_advantage():
    assert TurnCredit(NESTED).scaled([2.0, -1.0]) == [[1.0, [2.0, 4.0, 8.0]], [-3.0]]


def test_scaled_with_offsets_adds_each_turns_offset_to_every_token():
    assert TurnCredit(NESTED).scaled([2.0, -1.0], [[0.1, -1.0], [0.0]]) == [[1.1, [1.0, 3.0, 7.0]], [-3.0]]


def test_scaled_refuses_a_missing_advantage():
    with pytest.raises(ValueError):
        TurnCredit(NESTED).scaled([2.0])


def test_add_to_tokens_makes_a_one_value_turn_per_token_and_adds_to_a_per_token_one():
    credit = [[0.5, [1.0, 2.0]], [3.0]]
    add_to_tokens(credit, 0, 0, [0.25, 0.5])
    add_to_tokens(credit, 0, 1, [1.0, -1.0])
    assert credit == [[[0.75, 1.0], [2.0, 1.0]], [3.0]]
