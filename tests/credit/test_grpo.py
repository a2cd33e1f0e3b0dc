"""GRPO outcome advantages (paper Sec. 3.1), with TRL's conventions for std and unscorable rows."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taspo_trl.credit.grpo import grpo_outcome_advantages


def test_hand_computed_group_of_four():
    # R = [1, 0, 0.5, 0.5]: mean 0.5, deviations [0.5, -0.5, 0, 0]
    # unbiased var = (0.25 + 0.25) / 3 = 0.1666667, std = 0.4082483
    # A = +-0.5 / (0.4082483 + 1e-4) = +-0.5 / 0.4083483 = +-1.2244449
    adv = grpo_outcome_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), group_size=4)
    assert adv.tolist() == pytest.approx([1.2244449, -1.2244449, 0.0, 0.0], abs=1e-6)


def test_groups_are_consecutive_rows():
    # Group 1 is the example above; group 2 = [2, 2, 2, 2] has std 0 -> all zeros (0 / 1e-4).
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0])
    adv = grpo_outcome_advantages(rewards, group_size=4)
    assert adv.tolist() == pytest.approx([1.2244449, -1.2244449, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], abs=1e-6)
    # Two groups of two: [1, 0] -> mean 0.5, std sqrt(0.5) = 0.7071068, A = +-0.5/0.7072068 = +-0.7070068
    adv2 = grpo_outcome_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), group_size=2)
    assert adv2.tolist() == pytest.approx([0.7070068, -0.7070068, 0.0, 0.0], abs=1e-6)


def test_nan_rewards_are_excluded_and_get_zero():
    # R = [1, NaN, 0, 0]: over the 3 scorable rows mean 1/3, deviations [2/3, -1/3, -1/3]
    # unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3, std = 0.5773503; A = dev / 0.5774503
    # -> [1.1545006, 0, -0.5772503, -0.5772503]
    adv = grpo_outcome_advantages(torch.tensor([1.0, float("nan"), 0.0, 0.0]), group_size=4)
    assert adv.tolist() == pytest.approx([1.1545006, 0.0, -0.5772503, -0.5772503], abs=1e-6)
    # Fewer than two scorable rows: std undefined -> zeros, as TRL does.
    adv = grpo_outcome_advantages(torch.tensor([1.0, float("nan"), float("nan"), float("nan")]), group_size=4)
    assert adv.tolist() == [0.0] * 4


def test_unscaled_and_singleton_groups():
    adv = grpo_outcome_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), group_size=4, scale=False)
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert grpo_outcome_advantages(torch.tensor([3.0, -1.0]), group_size=1).tolist() == [0.0, 0.0]
    assert grpo_outcome_advantages(torch.tensor([1, 0, 0, 1]), group_size=2).dtype == torch.float32


def test_invalid_arguments():
    with pytest.raises(ValueError):
        grpo_outcome_advantages(torch.tensor([1.0, 0.0, 1.0]), group_size=2)
    with pytest.raises(ValueError):
        grpo_outcome_advantages(torch.tensor([[1.0, 0.0]]), group_size=2)
    with pytest.raises(ValueError):
        grpo_outcome_advantages(torch.tensor([1.0, 0.0]), group_size=0)
    with pytest.raises(ValueError):
        grpo_outcome_advantages(torch.tensor([1.0, 0.0]), group_size=2, delta=0.0)
    with pytest.raises(ValueError):
        grpo_outcome_advantages(torch.tensor([1.0, float("inf")]), group_size=2)


reward_st = st.one_of(st.floats(min_value=-10, max_value=10, allow_nan=False), st.just(float("nan")))


@settings(max_examples=100, deadline=None)
@given(
    k=st.integers(min_value=1, max_value=6),
    groups=st.integers(min_value=1, max_value=4),
    data=st.data(),
    shift=st.floats(min_value=-100, max_value=100),
)
def test_group_properties(k, groups, data, shift):
    values = data.draw(st.lists(reward_st, min_size=k * groups, max_size=k * groups))
    rewards = torch.tensor(values, dtype=torch.float64)
    adv = grpo_outcome_advantages(rewards, group_size=k)
    assert bool(torch.isfinite(adv).all())
    assert bool((adv[torch.isnan(rewards)] == 0).all())
    # Matches the formula on each group's scorable rows; sums to zero within a group; shift invariant.
    for g in range(groups):
        r = rewards[g * k:(g + 1) * k]
        a = adv[g * k:(g + 1) * k]
        ok = ~torch.isnan(r)
        if int(ok.sum()) >= 2:
            valid = r[ok]
            expected = (valid - valid.mean()) / (valid.std(unbiased=True) + 1e-4)
            assert torch.allclose(a[ok], expected, atol=1e-9, rtol=0)
        else:
            assert bool((a == 0).all())
        assert abs(float(a.sum())) < 1e-8
    shifted = grpo_outcome_advantages(rewards + shift, group_size=k)
    assert torch.allclose(adv, shifted, atol=1e-6, rtol=0)
    # |A_i| < sqrt(K - 1): (R - mu)/sigma is bounded by (n-1)/sqrt(n) for n samples.
    assert bool((adv.abs() <= math.sqrt(max(k - 1, 1)) + 1e-9).all())


# --------------------------------------------------------------------------------------------------------------
# Tests written against the mutants that survived the credit modules' own tests (benchmarks/mutation.sh; the
# list and the equivalent mutants are in benchmarks/results/mutation.md). Each names what it pins down.


@pytest.mark.parametrize(
    "rewards,group_size,delta,message",
    [
        (torch.zeros(2, 2), 2, 1e-4, r"rewards must be 1-D, got shape \(2, 2\)"),
        (torch.zeros(4), 0, 1e-4, "group_size must be a positive int, got 0"),
        (torch.zeros(3), 2, 1e-4, r"len\(rewards\)=3 is not a multiple of group_size=2"),
        (torch.zeros(4), 2, 0.0, "delta must be > 0, got 0.0"),
        (torch.tensor([1.0, float("inf")]), 2, 1e-4, r"rewards must be finite or NaN \(unscorable\); got an infinite reward"),
    ],
)
def test_grpo_advantages_errors_name_the_bad_input(rewards, group_size, delta, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        grpo_outcome_advantages(rewards, group_size, delta=delta)
