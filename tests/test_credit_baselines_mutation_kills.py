"""Tests written against the mutants of ``taspo_trl.credit.baselines`` that survived ``test_credit_baselines.py``
(benchmarks/mutation.sh; the survivors are in benchmarks/results/mutation_baselines_before.json, the equivalent
ones in benchmarks/results/mutation_baselines_equivalent.md).

They pin down what a caller relies on: the documented defaults (each test says where its default comes from), the
closed ends of the documented ranges, the floating dtype of the output, which tokens a statistic is taken over,
that every option reaches the function that uses it, and the full text of each error message. Every expected value
is worked out by hand in the test's docstring or comments."""

from __future__ import annotations

import math
import re

import pytest
import torch

from taspo_trl.credit.baselines import (
    anchor_state_groups,
    discounted_returns,
    gigpo_advantages,
    gigpo_step_advantages,
    opid_advantages,
    rlsd_advantages,
    rlsd_lambda,
    stepopsd_advantages,
)

F64 = torch.float64
NAN = float("nan")
SQRT2 = math.sqrt(2.0)
SQRT3 = math.sqrt(3.0)


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern that matches ``message`` and nothing longer or shorter."""
    return f"^{re.escape(message)}$"


# --------------------------------------------------------------------------------------------------------------
# shared argument checks (every token-level method): the messages name the argument and both shapes


@pytest.mark.parametrize(
    "advantages,mask,message",
    [
        (torch.zeros(3), torch.ones(3), "mask must be [rows, T], got shape (3,)"),
        (torch.zeros(2, 2), torch.ones(2, 3), "advantages (2, 2) do not match mask (2, 3)"),
    ],
)
def test_token_methods_refuse_a_bad_mask_or_advantage_shape_by_name(
    advantages: torch.Tensor, mask: torch.Tensor, message: str
) -> None:
    """A mask that is not [rows, T], or a [rows, T] A of another shape, is refused with both shapes in the message."""
    with pytest.raises(ValueError, match=exactly(message)):
        rlsd_advantages(advantages, torch.zeros(mask.shape), mask, lam=0.5)
    with pytest.raises(ValueError, match=exactly(message)):
        opid_advantages(advantages, torch.zeros(mask.shape), None, mask)


def test_integer_advantages_are_promoted_to_float32_before_the_gap_is_added() -> None:
    """Integer A (e.g. raw 0/1 rewards) becomes float32, so a fractional gap is not truncated to an int.

    OPID with w_e = 1, A = [2, -1] per row, Delta_episode = 0.5 on every token:
    A' = 2 + 1 * 0.5 = 2.5 and -1 + 0.5 = -0.5 (exact in float32)."""
    mask = torch.ones(2, 2)
    out = opid_advantages(torch.tensor([2, -1]), torch.full((2, 2), 0.5), None, mask, w_episode=1.0)
    assert out.dtype == torch.float32
    assert out.tolist() == [[2.5, 2.5], [-0.5, -0.5]]


# --------------------------------------------------------------------------------------------------------------
# RLSD


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"step": -1}, "step must be >= 0, got -1"),
        ({"step": 0, "lam0": 1.5}, "lam0 must be in [0, 1], got 1.5"),
        ({"step": 0, "decay_steps": 0}, "decay_steps must be > 0, got 0"),
    ],
)
def test_rlsd_lambda_refuses_out_of_range_arguments_by_name(kwargs: dict, message: str) -> None:
    """step < 0, lam0 outside [0, 1] and decay_steps <= 0 (0 would divide by zero) are refused by name."""
    with pytest.raises(ValueError, match=exactly(message)):
        rlsd_lambda(**kwargs)


def test_rlsd_lambda_accepts_lam0_one() -> None:
    """lam0 = 1 is the closed upper end of [0, 1]: lam = 1 * max(0, 1 - (0 + 1) / 4) = 0.75 at the first update."""
    assert rlsd_lambda(0, lam0=1.0, decay_steps=4) == 0.75


@pytest.mark.parametrize(
    "lam,clip_eps,message",
    [
        (1.5, 0.2, "lam must be in [0, 1], got 1.5"),
        (0.5, 1.0, "clip_eps must be in [0, 1), got 1.0"),
    ],
)
def test_rlsd_refuses_lam_outside_closed_unit_interval_and_clip_eps_one(
    lam: float, clip_eps: float, message: str
) -> None:
    """lam must lie in [0, 1]; clip_eps in [0, 1) (eps = 1 would let the factor reach 0 and erase A)."""
    mask = torch.ones(1, 2)
    with pytest.raises(ValueError, match=exactly(message)):
        rlsd_advantages(torch.ones(1), torch.zeros(1, 2), mask, lam=lam, clip_eps=clip_eps)


def test_rlsd_lam_one_uses_only_the_clipped_teacher_ratio() -> None:
    """lam = 1 (the first update's lam with lam0 = 1) is allowed: A_hat = A clip(exp(sign(A) Delta), 0.8, 1.2).

    Default clip_eps 0.2 (the docstring's paper value). A = 1 (sign +1), Delta = [0.1, -1]:
    t0: exp(0.1) = 1.1051709 inside [0.8, 1.2] -> 1.1051709; t1: exp(-1) = 0.3679 -> clipped to 0.8."""
    out = rlsd_advantages(torch.ones(1, dtype=F64), torch.tensor([[0.1, -1.0]], dtype=F64), torch.ones(1, 2), lam=1.0)
    assert out.tolist() == [pytest.approx([1.1051709180756477, 0.8], abs=1e-12)]


def test_rlsd_output_keeps_the_advantages_float32_dtype_with_a_float64_gap() -> None:
    """The module's convention: outputs are in the floating dtype of ``advantages``, whatever the gap's dtype.

    A = 1 (float32), Delta = 0, lam = 0.5: factor 0.5 + 0.5 * exp(0) = 1, so A_hat = 1 on both tokens."""
    out = rlsd_advantages(torch.ones(1), torch.zeros(1, 2, dtype=F64), torch.ones(1, 2), lam=0.5)
    assert out.dtype == torch.float32
    assert out.tolist() == [[1.0, 1.0]]


@pytest.mark.parametrize(
    "delta,message",
    [
        (torch.zeros(2, 2), "delta (2, 2) does not match mask (2, 3)"),
        (torch.tensor([[0.0, NAN, 0.0], [0.0, 0.0, 0.0]]), "delta must be finite on masked (optimised) tokens"),
    ],
)
def test_rlsd_and_stepopsd_name_a_bad_delta(delta: torch.Tensor, message: str) -> None:
    """A gap of the wrong shape, or NaN on an optimised token, is refused naming ``delta`` (and both shapes)."""
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match=exactly(message)):
        rlsd_advantages(torch.ones(2), delta, mask, lam=0.5)
    with pytest.raises(ValueError, match=exactly(message)):
        stepopsd_advantages(1.0, delta, mask)


# --------------------------------------------------------------------------------------------------------------
# OPID


def test_opid_default_weights_are_the_papers_0_001() -> None:
    """Default w_episode = w_step = 0.001 (the docstring's ALFWorld weights).

    A = 1, Delta_episode = 2, Delta_step = 3 on both tokens: A' = 1 + 0.001 * 2 + 0.001 * 3 = 1.005."""
    episode, step = torch.full((1, 2), 2.0, dtype=F64), torch.full((1, 2), 3.0, dtype=F64)
    out = opid_advantages(torch.ones(1, dtype=F64), episode, step, torch.ones(1, 2))
    assert out.tolist() == [pytest.approx([1.005, 1.005], abs=1e-12)]


def test_opid_output_keeps_the_advantages_float32_dtype_with_float64_gaps() -> None:
    """Both gap terms are cast to the advantages' dtype, so float64 gaps leave a float32 output.

    A = 1, w_e = w_s = 0.5, Delta_episode = 1, Delta_step = 2: A' = 1 + 0.5 + 1 = 2.5 (exact in float32)."""
    out = opid_advantages(
        torch.ones(1),
        torch.ones(1, 2, dtype=F64),
        torch.full((1, 2), 2.0, dtype=F64),
        torch.ones(1, 2),
        w_episode=0.5,
        w_step=0.5,
    )
    assert out.dtype == torch.float32
    assert out.tolist() == [[2.5, 2.5]]


@pytest.mark.parametrize("bad", ["delta_episode", "delta_step"])
@pytest.mark.parametrize(
    "kind,message",
    [
        ("shape", "{name} (2, 2) does not match mask (2, 3)"),
        ("nan", "{name} must be finite on masked (optimised) tokens"),
    ],
)
def test_opid_names_which_gap_is_bad(bad: str, kind: str, message: str) -> None:
    """A wrong-shaped or non-finite gap is refused naming the argument it came in (episode or step gap)."""
    mask = torch.ones(2, 3)
    gaps = {"delta_episode": torch.zeros(2, 3), "delta_step": torch.zeros(2, 3)}
    gaps[bad] = torch.zeros(2, 2) if kind == "shape" else torch.tensor([[0.0, 0.0, 0.0], [NAN, 0.0, 0.0]])
    with pytest.raises(ValueError, match=exactly(message.format(name=bad))):
        opid_advantages(torch.ones(2), gaps["delta_episode"], gaps["delta_step"], mask)


# --------------------------------------------------------------------------------------------------------------
# GiGPO


def test_discounted_returns_refuses_gamma_above_one_by_name() -> None:
    """gamma must lie in [0, 1]; 1.5 is refused with the accepted range in the message."""
    with pytest.raises(ValueError, match=exactly("gamma must be in [0, 1], got 1.5")):
        discounted_returns([1.0], gamma=1.5)


def test_gigpo_length_mismatches_are_refused_with_both_counts() -> None:
    """Two trajectories with one group id, or two observation lists with one reward list, are refused."""
    with pytest.raises(ValueError, match=exactly("2 trajectories but 1 group ids")):
        anchor_state_groups([["a"], ["b"]], [0])
    with pytest.raises(ValueError, match=exactly("2 observation lists but 1 reward lists")):
        gigpo_step_advantages([["a"], ["b"]], [[0.0]], [0, 0])


def test_similarity_grouping_merges_at_exactly_the_threshold() -> None:
    """The docstring's rule is ratio >= threshold: "ab" and "ac" share 1 of 4 characters, ratio 2 * 1 / 4 = 0.5,
    so at threshold 0.5 they are one anchor state; in another task group they are not."""
    assert anchor_state_groups([["ab"], ["ac"]], [0, 0], similarity_threshold=0.5) == [[0], [0]]
    assert anchor_state_groups([["ab"], ["ac"]], [0, 1], similarity_threshold=0.5) == [[0], [1]]


# Two trajectories of one task group that visit the same two states; only trajectory 0 is rewarded at the end.
# Returns (gamma 0.95): trajectory 0 R = [0 + 0.95 * 1, 1] = [0.95, 1], trajectory 1 R = [0, 0].
# Anchor groups: s0 = {0.95, 0} (mean 0.475, unbiased std 0.95 / sqrt 2), s1 = {1, 0} (mean 0.5, std 1 / sqrt 2).
# Episode rows: scores [1, 1, 0, 0] (one per step), mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 1 / sqrt 3.
GIGPO_OBS = [["s0", "s1"], ["s0", "s1"]]
GIGPO_REW = [[0.0, 1.0], [0.0, 0.0]]


def test_gigpo_defaults_are_verl_agents_mean_norm_with_gamma_0_95() -> None:
    """Defaults omega = 1, gamma = 0.95, norm = "mean" (verl-agent's GiGPO launchers and config, per docstrings).

    A_E = score - 0.5 = +-0.5; A_S = R - mean_G: s0 +-0.475, s1 +-0.5. A = A_E + A_S:
    trajectory 0 [0.975, 1.0], trajectory 1 [-0.975, -1.0]."""
    out = gigpo_advantages(GIGPO_OBS, GIGPO_REW, [0, 0])
    assert out[0].tolist() == pytest.approx([0.975, 1.0], abs=1e-12)
    assert out[1].tolist() == pytest.approx([-0.975, -1.0], abs=1e-12)


@pytest.mark.parametrize("kwargs,eps", [({}, 1e-6), ({"eps": 0.5}, 0.5)])
def test_gigpo_mean_std_norm_and_eps_reach_both_terms(kwargs: dict, eps: float) -> None:
    """norm="mean_std" divides both A_E and A_S by std + eps, with eps defaulting to verl-agent's 1e-6.

    A_E = +-0.5 / (1/sqrt 3 + eps); A_S at s0 = +-0.475 / (0.95/sqrt 2 + eps), at s1 = +-0.5 / (1/sqrt 2 + eps)
    (with eps -> 0 these are +-sqrt 3 / 2 and +-1 / sqrt 2), and A = A_E + A_S (omega 1)."""
    a_e = 0.5 / (1 / SQRT3 + eps)
    a_s = [0.475 / (0.95 / SQRT2 + eps), 0.5 / (1 / SQRT2 + eps)]
    out = gigpo_advantages(GIGPO_OBS, GIGPO_REW, [0, 0], norm="mean_std", **kwargs)
    assert out[0].tolist() == pytest.approx([a_e + a_s[0], a_e + a_s[1]], abs=1e-12)
    assert out[1].tolist() == pytest.approx([-a_e - a_s[0], -a_e - a_s[1]], abs=1e-12)


def test_gigpo_step_advantages_mean_std_default_eps_is_1e_minus_6() -> None:
    """gigpo_step_advantages' own eps default (verl-agent's epsilon 1e-6) under norm="mean_std":
    A_S at s0 = +-0.475 / (0.95/sqrt 2 + 1e-6), at s1 = +-0.5 / (1/sqrt 2 + 1e-6)."""
    a_s = [0.475 / (0.95 / SQRT2 + 1e-6), 0.5 / (1 / SQRT2 + 1e-6)]
    out = gigpo_step_advantages(GIGPO_OBS, GIGPO_REW, [0, 0], norm="mean_std")
    assert [t.tolist() for t in out] == [pytest.approx(a_s, abs=1e-12), pytest.approx([-a_s[0], -a_s[1]], abs=1e-12)]


def test_gigpo_similarity_threshold_reaches_the_step_term() -> None:
    """With similarity_threshold = 0.5, "ab" and "ac" (ratio 0.5) are one anchor state, so the step term is live.

    One step each, rewards 1 and 0: A_E = +-0.5 (rows [1, 0], mean 0.5), A_S = +-0.5 (anchor group {1, 0}),
    A = +-1. Exact matching would keep the states apart (A_S = 0, A = +-0.5)."""
    out = gigpo_advantages([["ab"], ["ac"]], [[1.0], [0.0]], [0, 0], similarity_threshold=0.5)
    assert [t.tolist() for t in out] == [[1.0], [-1.0]]


# --------------------------------------------------------------------------------------------------------------
# StepOPSD


def test_stepopsd_refuses_a_non_finite_advantage_by_name() -> None:
    """A NaN trajectory advantage is refused with its value in the message."""
    with pytest.raises(ValueError, match=exactly("advantage must be finite, got nan")):
        stepopsd_advantages(NAN, torch.zeros(1, 2), torch.ones(1, 2))


def test_stepopsd_of_no_steps_is_an_empty_float64_tensor() -> None:
    """A trajectory with no step rows gives [0, T] float64 advantages (the documented dtype), even for a float32 gap."""
    out = stepopsd_advantages(1.0, torch.zeros(0, 3), torch.zeros(0, 3))
    assert out.dtype == F64
    assert out.shape == (0, 3)


def test_stepopsd_refuses_a_one_dimensional_step_layout() -> None:
    """delta and mask must be [S, T] (one row per step): a single 1-D row is refused with a ValueError, raised by
    the allocation (``gibbs_allocation``) because the step rows it would be split into are 0-D."""
    with pytest.raises(ValueError, match="must be 1-D"):
        stepopsd_advantages(1.0, torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))


def test_stepopsd_step_evidence_is_the_mean_over_masked_tokens_only() -> None:
    """Padding (here NaN, zeroed) does not dilute a step's mean gap.

    A = 2; step 0 has 2 masked tokens with gap ln 2 and one padding token, step 1 three tokens with gap 0.
    e = [ln 2, 0], n = [2, 3], N = 5, temperature 1, eps 0.5 (defaults). w_s = N exp(e_s) / sum_u n_u exp(e_u):
    denominator 2 * 2 + 3 * 1 = 7, so w = [10/7, 5/7] = [1.4286, 0.7143], inside [0.5, 1.5], no clipping.
    A_t = 2 w: step 0 [20/7, 20/7, 0], step 1 [10/7] * 3 (token-weighted mean (40 + 30) / 7 / 5 = 2 = A)."""
    ln2 = math.log(2.0)
    delta = torch.tensor([[ln2, ln2, NAN], [0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = stepopsd_advantages(2.0, delta, mask)
    assert out.tolist() == [pytest.approx([20 / 7, 20 / 7, 0.0], abs=1e-12), pytest.approx([10 / 7] * 3, abs=1e-12)]


@pytest.mark.parametrize(
    "temperature,expected",
    [
        # e = [1, -1], n = [1, 1]: w_s = 2 exp(e_s / 2) / (exp(1/2) + exp(-1/2)) = 2 sigmoid(+-1) = 1.4621, 0.5379
        # (inside [0.5, 1.5]); at the default temperature 1 they would be 2 sigmoid(+-2) = 1.76, 0.24, clipped.
        (2.0, [2 / (1 + math.exp(-1.0)), 2 / (1 + math.exp(1.0))]),
        (math.inf, [1.0, 1.0]),  # the docstring: inf is the uniform budget, i.e. GRPO
    ],
)
def test_stepopsd_temperature_sets_the_budget(temperature: float, expected: list[float]) -> None:
    """The temperature reaches the Gibbs budget b_s ~ n_s exp(e_s / temp). A = 1, one token per step, gaps +-1."""
    out = stepopsd_advantages(1.0, torch.tensor([[1.0], [-1.0]], dtype=F64), torch.ones(2, 1), temperature=temperature)
    assert out[:, 0].tolist() == pytest.approx(expected, abs=1e-12)
