"""Turn-balanced loss normalisation (paper Eq. 7, App. A.3)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from taspo_trl.credit.normalization import (
    broadcast_turn_values,
    turn_balanced_loss,
    turn_balanced_token_mask,
    turn_balanced_token_weights,
    turn_row_scales,
)
from taspo_trl.credit.taspo import taspo_weights

PROPS = settings(max_examples=80, deadline=None)

counts_st = st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=8)
loss_st = st.floats(min_value=-5, max_value=5, allow_nan=False)


def _eq7_nested(per_turn_losses):
    """Eq. 7 written literally: mean over trajectories of the mean over turns of the mean over tokens."""
    traj_terms = []
    for turns in per_turn_losses:
        turn_means = [sum(t) / len(t) for t in turns if len(t) > 0]
        traj_terms.append(sum(turn_means) / len(turn_means))
    return sum(traj_terms) / len(traj_terms)


def test_hand_computed_eq7_two_trajectories():
    # Trajectory 1: turns with losses [0.2, 0.4] and [0.9] -> turn means 0.3, 0.9 -> 0.6
    # Trajectory 2: turns [1.0], [0.3, 0.6, 0.0] and an empty turn -> T_2 = 2, means 1.0, 0.3 -> 0.65
    # Eq. 7: (0.6 + 0.65) / 2 = 0.625
    # Token weights: traj 1 -> 1/(2*2) = 0.25 (x2), 1/(2*1) = 0.5; traj 2 -> 0.5, 1/(2*3) = 1/6 (x3), nothing.
    assert turn_balanced_token_weights([2, 1]) == pytest.approx([0.25, 0.5])
    assert turn_balanced_token_weights([1, 3, 0]) == pytest.approx([0.5, 1 / 6, 0.0])
    losses = torch.tensor([0.2, 0.4, 0.9, 1.0, 0.3, 0.6, 0.0])
    weights = torch.cat([turn_balanced_token_mask([2, 1]), turn_balanced_token_mask([1, 3, 0])])
    assert weights.tolist() == pytest.approx([0.25, 0.25, 0.5, 0.5, 1 / 6, 1 / 6, 1 / 6])
    # The fractional mask sums to N_traj = 2, which is TRL's "dapo" normaliser.
    assert float(weights.sum()) == pytest.approx(2.0)
    assert float(turn_balanced_loss(losses, weights, num_trajectories=2)) == pytest.approx(0.625, abs=1e-7)
    assert float((losses * weights).sum() / weights.sum()) == pytest.approx(0.625, abs=1e-7)


@PROPS
@given(counts=counts_st)
def test_token_weights_sum_to_one_per_trajectory(counts):
    assume(any(c > 0 for c in counts))
    per_turn = turn_balanced_token_weights(counts)
    assert len(per_turn) == len(counts)
    assert sum(c * v for c, v in zip(counts, per_turn)) == pytest.approx(1.0, abs=1e-12)
    n_turns = sum(c > 0 for c in counts)
    for c, v in zip(counts, per_turn):
        assert v == (0.0 if c == 0 else pytest.approx(1.0 / (n_turns * c)))
    mask = turn_balanced_token_mask(counts, dtype=torch.float64)
    assert mask.numel() == sum(counts) and float(mask.sum()) == pytest.approx(1.0, abs=1e-12)


def test_no_policy_tokens_gives_zero_weights():
    assert turn_balanced_token_weights([0, 0]) == [0.0, 0.0]
    assert turn_balanced_token_weights([]) == []
    with pytest.raises(ValueError):
        turn_balanced_token_weights([2, -1])


@PROPS
@given(
    trajs=st.lists(
        st.lists(st.lists(loss_st, min_size=0, max_size=5), min_size=1, max_size=4), min_size=1, max_size=4
    )
)
def test_weighted_sum_equals_nested_eq7(trajs):
    assume(all(any(len(t) > 0 for t in turns) for turns in trajs))
    losses, weights = [], []
    for turns in trajs:
        counts = [len(t) for t in turns]
        losses.extend(x for t in turns for x in t)
        weights.append(turn_balanced_token_mask(counts, dtype=torch.float64))
    got = turn_balanced_loss(torch.tensor(losses, dtype=torch.float64), torch.cat(weights), len(trajs))
    assert float(got) == pytest.approx(_eq7_nested(trajs), abs=1e-9)


@PROPS
@given(
    trajs=st.lists(st.lists(st.lists(loss_st, min_size=1, max_size=5), min_size=1, max_size=4), min_size=1,
                   max_size=4),
    n_pad=st.integers(min_value=0, max_value=3),
)
def test_turn_layout_row_scales_equal_eq7(trajs, n_pad):
    # One row per turn, row loss = its token mean, batch loss = mean over rows (padding rows included).
    row_means, row_turns = [], []
    for turns in trajs:
        for t in turns:
            row_means.append(sum(t) / len(t))
            row_turns.append(len(turns))
    row_means += [0.0] * n_pad
    row_turns += [None] * n_pad
    scales = turn_row_scales(row_turns, num_trajectories=len(trajs))
    assert scales[len(scales) - n_pad:] == [0.0] * n_pad
    got = sum(s * m for s, m in zip(scales, row_means)) / len(row_means)
    assert got == pytest.approx(_eq7_nested(trajs), abs=1e-9)


def test_row_scales_hand_example_and_errors():
    # 2 trajectories with T = 2 and T = 1, one padding row: N_row = 4 -> 4/(2*2) = 1, 1, 4/(2*1) = 2, 0.
    assert turn_row_scales([2, 2, 1, None], num_trajectories=2) == [1.0, 1.0, 2.0, 0.0]
    with pytest.raises(ValueError):
        turn_row_scales([2, 2], num_trajectories=0)
    with pytest.raises(ValueError):
        turn_row_scales([0], num_trajectories=1)


def test_broadcast_turn_values():
    out = broadcast_turn_values([1.5, -2.0, 0.25], [2, 0, 3])
    assert out.dtype == torch.float32
    assert out.tolist() == [1.5, 1.5, 0.25, 0.25, 0.25]
    assert broadcast_turn_values(torch.tensor([1.0]), [0]).numel() == 0
    with pytest.raises(ValueError):
        broadcast_turn_values([1.0, 2.0], [3])


def test_turn_balanced_loss_errors():
    with pytest.raises(ValueError):
        turn_balanced_loss(torch.zeros(3), torch.zeros(2), 1)
    with pytest.raises(ValueError):
        turn_balanced_loss(torch.zeros(3), torch.zeros(3), 0)


@PROPS
@given(
    counts=st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=8),
    data=st.data(),
    adv=st.floats(min_value=-5, max_value=5, allow_nan=False),
)
def test_eq7_average_of_taspo_advantages_is_outcome_advantage(counts, data, adv):
    # Algorithm 1 line 20 + Eq. 7: with A~_it = A_i w_it broadcast to every policy token of turn t, the
    # turn-balanced average of the per-token advantages is exactly A_i (each turn has equal mass, weights mean 1).
    scores = data.draw(
        st.lists(st.one_of(st.none(), st.floats(-2, 2)), min_size=len(counts), max_size=len(counts))
    )
    w = taspo_weights(scores, adv)
    per_token_adv = broadcast_turn_values(adv * w, counts, dtype=torch.float64)
    mask = turn_balanced_token_mask(counts, dtype=torch.float64)
    assert float((per_token_adv * mask).sum()) == pytest.approx(adv, abs=1e-9)


# --------------------------------------------------------------------------------------------------------------
# Tests written against the mutants that survived the credit modules' own tests (benchmarks/mutation.sh; the
# list and the equivalent mutants are in benchmarks/results/mutation.md). Each names what it pins down.


def test_turn_row_scales_errors_name_the_bad_value():
    from taspo_trl.credit.normalization import turn_row_scales

    with pytest.raises(ValueError, match=r"^num_trajectories must be > 0, got 0$"):
        turn_row_scales([1, 2], 0)
    with pytest.raises(ValueError, match=r"^a real row needs T_i >= 1, got 0$"):
        turn_row_scales([2, 0, None], 2)
